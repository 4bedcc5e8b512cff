// iattn/backend/cpu/head_mean.hpp: channel means of expressions whose heads share one core.
//
// Form (as in mean.hpp): a sum of terms  w · diag(P) · Core · diag(Q) · [Conv], the core a node
// whose matrix depends on the channel only through its head h = c / P (a Semiseparable with
// P >= 2 channels per head, any decay form, or row_normalize of one; a Transition, the delta-rule
// family's per-head matrix; a ComplexSemiseparable) or absent (a band term).
// Channel c of head h:
//   H^c[t, s] = Σ_k w_k P_k,t[c] Σ_{lag<K_k} Core_k,h[t, s+lag] Q_k,s+lag[c] tap_k(lag, c)
//             + Σ_b w_b P_b,t[c] Q_b,t[c] tap_b(t-s, c)                  (band: 0 <= t-s < K_b)
// tap(lag, c) = w_conv[K-1-lag, c]. With V_k,lag[s, c] = w_k Q_k,s+lag[c] tap_k(lag, c) / n (zero
// for s + lag >= L), the mean over a set of n channels is, summed over the heads it meets,
//   Σ_k Σ_lag Core_k,h[t, s+lag] · (P_k,h V_k,lag,hᵀ)[t, s]  +  Σ_b Σ_c (w_b/n) P_b Q_b tap_b(t-s)
// one core per head (the node's own stable rank-N tiles, decay_tiles.hpp) and K_k products of rank
// |head ∩ set|: O(L² (N + K P)) per head instead of mean.hpp's O(L² N P).
// Mean of |H^c| (exact): per channel inside each head, vectorised across the head's channels,
//   Σ_c |Σ_k P_k,t[c] Σ_lag Core_k,h[t, s+lag] V_k,lag[s, c] + band^c[t, s]|     O(L² P Σ K) per head;
// with a single core term and no convolution on it (K = 1), off the band of the band terms a
// product of one entry per channel, so the signs factor out exactly:
//   |Core_h[t, s]| · (|P_h| |V_h|ᵀ)[t, s]                                        a rank-P GEMM.
// Work runs for a chunk of heads at a time (coefficients prepared in parallel over heads), then in
// parallel over row blocks of tile_size tokens (longest first), each writing only its rows:
// memory O(L²) for the result plus O(chunk · L · (N + Σ K P)).
#pragma once

#include "../../core/means.hpp"
#include "../../ops/causal_conv.hpp"
#include "../../ops/row_normalize.hpp"
#include "../../ops/complex_semiseparable.hpp"
#include "../../ops/semiseparable.hpp"
#include "../../ops/transition.hpp"
#include "algebra.hpp"
#include "complex_semiseparable.hpp"
#include "mean.hpp"
#include "parallel.hpp"
#include "semiseparable.hpp"
#include "simd.hpp"
#include "tile.hpp"
#include "transition.hpp"

#include <algorithm>
#include <functional>
#include <memory>
#include <type_traits>
#include <vector>

namespace iattn::cpu_detail {

/// The head path's form of an expansion (mean.hpp's expand_terms): every core shared by the heads
/// of P channels.
template <class T>
using head_term = mean_term<T>;

template <class T>
struct head_plan {
  mean_terms<T> terms;
  Index P = 0;  // channels per head, shared by every core
  /// Multiply-adds per (t, s) of the head path against mean.hpp's (channel, state) GEMMs; the
  /// latter is infinite when a core is not a plain Semiseparable.
  bool cheaper_than_channel_gemm(const context& cx) const {
    double heads = 0, gemm = 0;
    bool plain = true;
    for (const auto& t : terms)
      if (t.has_core()) {
        heads += double(cx.D / P) * double(t.state) + double(t.width() * cx.D);
        gemm += double(cx.D) * double(t.state);
        plain = plain && t.plain();
      }
    return !plain || heads < gemm;
  }
};

/// P of expanded terms whose cores the heads share (each core a head core of the same head_dim
/// P >= 2, dividing D); 0 when they do not (or there is no core).
template <class T>
Index shared_head_dim(const mean_terms<T>& terms, const context& cx) {
  Index P = 0;
  for (const auto& t : terms) {
    if (!t.has_core()) continue;
    if (!t.core || t.head_dim < 2 || (P != 0 && t.head_dim != P)) return 0;
    P = t.head_dim;
  }
  return P >= 2 && cx.D % P == 0 ? P : 0;
}

/// The plan of n, or false when n's heads do not share its cores (or it has no core).
template <class T, class Node>
bool make_head_plan(const Node& n, const context& cx, head_plan<T>& plan) {
  plan = {};
  if (!expand_terms<T>(n, cx, plan.terms)) return false;
  plan.P = shared_head_dim(plan.terms, cx);
  return plan.P != 0;
}

/// The head means of one plan over channels [c0, c1): into one (L, L) mean (per_head false), or
/// into (heads met, L, L) slices, each the mean over its own head's channels in the set.
template <class T>
class head_means {
 public:
  head_means(const head_plan<T>& plan, const context& cx, bool abs) : plan_(plan), L_(cx.L), D_(cx.D), abs_(abs) {
    Index cores = 0, widest = 0;
    for (const auto& t : plan.terms) {
      cores += t.has_core() ? 1 : 0;
      if (!t.has_core()) band_ = std::max(band_, t.width());
      if (t.has_core()) widest = std::max(widest, t.width());
    }
    single_ = abs && cores == 1 && widest == 1;
    bufs_.resize(std::size_t(max_threads()));
  }

  /// out: (L, L) zeroed, or (heads, L, L) zeroed with per_head.
  void run(const context& cx, Index c0, Index c1, T* out, bool per_head) {
    const Index P = plan_.P, h0 = c0 / P, h1 = (c1 - 1) / P + 1;
    double bytes = 0;
    for (const auto& t : plan_.terms) bytes += double(sizeof(T)) * double(L_) * double((t.width() + 1) * P + 3 * t.state);
    const Index chunk = std::clamp<Index>(Index((double(Index(1) << 26)) / std::max(bytes, 1.0)), 1, h1 - h0);
    const Index nb = (L_ + tile_size - 1) / tile_size;
    for (Index hc = h0; hc < h1; hc += chunk) {
      const Index nh = std::min(chunk, h1 - hc);
      heads_.clear();
      heads_.resize(std::size_t(nh));
      parallel_for(nh, [&](Index i) {
        const Index h = hc + i, a = std::max(c0, h * P), e = std::min(c1, (h + 1) * P);
        prepare(cx, a, e - a, T(1) / T(per_head ? e - a : c1 - c0), heads_[std::size_t(i)]);
      });
      parallel_for(nb, [&](Index k) {
        const Index I = nb - 1 - k;
        for (Index i = 0; i < nh; ++i)
          row_block(I, heads_[std::size_t(i)], out + (per_head ? (hc + i - h0) * L_ * L_ : 0));
      });
    }
  }

 private:
  // One head's factors over its n channels of the set, per term: p (L, n) = P (band terms:
  // w P Q / count); v (K L, n) = V_lag[s] at row lag L + s (band terms: (K, n) taps), kept for
  // the abs forms; vp: each V_lag packed once for gemm.hpp's kernel (|V_lag| in the single-core abs
  // form, whose left factor is pa = |p|).
  struct head_data {
    Index n = 0;
    std::vector<std::unique_ptr<head_core<T>>> cores;
    std::vector<Matrix<T>> p, v, pa;
    std::vector<std::vector<T>> vp;
  };
  struct buffers {
    std::vector<T> panel, prod;
    std::vector<Index> ld;
  };

  void prepare(const context& cx, Index c0, Index n, T scale, head_data& d) const {
    const auto& terms = plan_.terms;
    d.n = n;
    d.cores.resize(terms.size());
    d.p.resize(terms.size());
    d.v.resize(terms.size());
    d.vp.resize(terms.size());
    std::vector<T> sp, sq;
    Matrix<T> q;
    for (std::size_t k = 0; k < terms.size(); ++k) {
      const head_term<T>& tm = terms[k];
      const Index K = tm.width();
      const T w = T(tm.weight) * scale;
      auto tap = [&](Index lag, Index j) { return tm.conv ? tm.conv->tap(lag, c0 + j) : T(1); };
      Matrix<T>& p = d.p[k];
      Matrix<T>& v = d.v[k];
      p.resize(L_, n);
      for (Index t = 0; t < L_; ++t) {
        const T* a = tm.post.row(t, D_, c0, n, sp);
        const T* b = tm.has_core() ? nullptr : tm.pre.row(t, D_, c0, n, sq);
        for (Index j = 0; j < n; ++j) p(t, j) = (a ? a[j] : T(1)) * (b ? b[j] * w : tm.has_core() ? T(1) : w);
      }
      if (tm.has_core()) {
        d.cores[k] = tm.core(cx, c0);
        q.resize(L_, n);
        for (Index t = 0; t < L_; ++t) {
          const T* r = tm.pre.row(t, D_, c0, n, sq);
          for (Index j = 0; j < n; ++j) q(t, j) = w * (r ? r[j] : T(1));
        }
        v.resize(K * L_, n);
        for (Index lag = 0; lag < K; ++lag)
          for (Index s = 0; s < L_; ++s)
            for (Index j = 0; j < n; ++j) v(lag * L_ + s, j) = s + lag < L_ ? q(s + lag, j) * tap(lag, j) : T(0);
        if (single_) {
          d.pa.push_back(p.cwiseAbs());
          q = v.cwiseAbs();
        }
        if (!abs_ || single_) {  // V_lag (or |V_lag|) packed for the products
          const Matrix<T>& src = single_ ? q : v;
          const Index rows = gemm_padded_rows<T>(L_);
          T* vp = sized(d.vp[k], K * rows * n);
          for (Index lag = 0; lag < K; ++lag) gemm_pack_a(src.data() + lag * L_ * n, n, L_, n, vp + lag * rows * n);
        }
        if (!abs_) v.resize(0, 0);
      } else {
        v.resize(K, n);
        for (Index lag = 0; lag < K; ++lag)
          for (Index j = 0; j < n; ++j) v(lag, j) = tap(lag, j);
      }
    }
  }

  // Rows [i0, i1) of block I for one head: the cores' rows (columns [0, i1), padded with K - 1
  // zero columns for the shifted reads), then the mean's entries of these rows.
  void row_block(Index I, const head_data& d, T* out) {
    const Index i0 = I * tile_size, i1 = std::min(L_, i0 + tile_size), ni = i1 - i0;
    buffers& b = bufs_[std::min(std::size_t(thread_index()), bufs_.size() - 1)];
    const auto& terms = plan_.terms;
    b.ld.assign(terms.size(), 0);
    Index total = 0;
    for (std::size_t k = 0; k < terms.size(); ++k)
      if (terms[k].has_core()) total += ni * (b.ld[k] = i1 + terms[k].width() - 1);
    T* panel = sized(b.panel, total);
    std::vector<const T*> cores(terms.size(), nullptr);
    for (std::size_t k = 0, off = 0; k < terms.size(); ++k) {
      if (!terms[k].has_core()) continue;
      T* pk = panel + off;
      off += std::size_t(ni * b.ld[k]);
      for (Index r = 0; r < ni; ++r) std::fill(pk + r * b.ld[k] + i1, pk + (r + 1) * b.ld[k], T(0));
      d.cores[k]->block(i0, i1, 0, i1, tile<T>{pk, ni, i1, b.ld[k]});
      cores[k] = pk;
    }
    if (!abs_) {
      for (std::size_t k = 0; k < terms.size(); ++k)
        if (terms[k].has_core()) products(i0, i1, d.p[k], d.vp[k], terms[k].width(), cores[k], b.ld[k], d.n, out, b);
      for (Index t = i0; t < i1; ++t) band_rows(t, d, out);
      return;
    }
    Index from = 0;  // entries with t - s >= from of a single core take the product form
    if (single_) {
      std::size_t k = 0;
      while (!terms[k].has_core()) ++k;
      products(i0, i1, d.pa[0], d.vp[k], 1, cores[k], b.ld[k], d.n, out, b, band_);
      from = band_;
    }
    for (Index t = i0; t < i1; ++t)
      for (Index s = single_ ? std::max<Index>(0, t - from + 1) : 0; s <= t; ++s)
        out[t * L_ + s] += abs_entry(t, s, i0, d, cores, b.ld);
  }

  // out[t, s] += Σ_lag core[t, s+lag] (p V_lagᵀ)[t, s] for rows [i0, i1), s <= t; with abs
  // (from >= 0): += |core[t, s]| (p vᵀ)[t, s] for t - s >= from only. vp: the packed V_lag
  // (gemm.hpp: p's rows read in place). Columns in chunks of 128 (whole panels).
  void products(Index i0, Index i1, const Matrix<T>& p, const std::vector<T>& vp, Index K, const T* core, Index ld,
                Index n, T* out, buffers& b, Index from = -1) const {
    const Index ni = i1 - i0, cw = 128, rows = gemm_padded_rows<T>(L_);
    static_assert(128 % gemm_mr<T> == 0, "column chunks start on whole panels");
    for (Index q0 = 0; q0 < i1; q0 += cw) {
      const Index nq = std::min(cw, i1 - q0);
      T* prod = sized(b.prod, K * ni * nq);
      std::fill(prod, prod + K * ni * nq, T(0));
      for (Index lag = 0; lag < K; ++lag)
        gemm_tile_add(nq, ni, n, vp.data() + lag * rows * n + q0 * n, gemm_mr<T> * n, p.data() + i0 * n, n,
                      prod + lag * ni * nq, nq, T(1));
      for (Index t = std::max(i0, q0); t < i1; ++t) {
        const Index r = t - i0, count = std::min(q0 + nq, from >= 0 ? t - from + 1 : t + 1) - q0;
        if (count <= 0) continue;
        T* o = out + t * L_ + q0;
        for (Index lag = 0; lag < K; ++lag) {
          const T* c = core + r * ld + q0 + lag;
          const T* m = prod + lag * ni * nq + r * nq;
          simd::for_packs<T>(count, [&](auto w, Index s) {
            using Pk = simd::pack<T, decltype(w)::value>;
            Pk cv = Pk::load(c + s);
            if (from >= 0) cv = max(cv, Pk::broadcast(T(0)) - cv);
            fma(cv, Pk::load(m + s), Pk::load(o + s)).store(o + s);
          });
        }
      }
    }
  }

  // Row t of the band terms: out[t, t - dd] += Σ_c p_b[t, c] tap_b(dd, c).
  void band_rows(Index t, const head_data& d, T* out) const {
    const auto& terms = plan_.terms;
    for (std::size_t k = 0; k < terms.size(); ++k) {
      if (terms[k].has_core()) continue;
      const T* p = d.p[k].row(t).data();
      for (Index dd = 0; dd < terms[k].width() && dd <= t; ++dd) {
        const T* tp = d.v[k].row(dd).data();
        out[t * L_ + t - dd] += simd::sum_packs<T>(d.n, [&](auto w, Index j) {
          using Pk = simd::pack<T, decltype(w)::value>;
          return Pk::load(p + j) * Pk::load(tp + j);
        });
      }
    }
  }

  // Σ_c |H^c[t, s]| / count over the head's channels, from the cores' rows and the factors.
  T abs_entry(Index t, Index s, Index i0, const head_data& d, const std::vector<const T*>& cores,
              const std::vector<Index>& ld) const {
    const auto& terms = plan_.terms;
    const Index r = t - i0, n = d.n;
    return simd::sum_packs<T>(n, [&](auto w, Index j) {
      using Pk = simd::pack<T, decltype(w)::value>;
      Pk y = Pk::broadcast(T(0));
      for (std::size_t k = 0; k < terms.size(); ++k) {
        const T* p = d.p[k].data() + t * n + j;
        if (terms[k].has_core()) {
          const T* c = cores[k] + r * ld[k] + s;
          const T* v = d.v[k].data() + s * n + j;
          Pk acc = Pk::broadcast(T(0));
          for (Index lag = 0; lag < terms[k].width(); ++lag) acc = fma(Pk::broadcast(c[lag]), Pk::load(v + lag * L_ * n), acc);
          y = fma(Pk::load(p), acc, y);
        } else if (t - s < terms[k].width()) {
          y = fma(Pk::load(p), Pk::load(d.v[k].data() + (t - s) * n + j), y);
        }
      }
      return max(y, Pk::broadcast(T(0)) - y);
    });
  }

  const head_plan<T>& plan_;
  Index L_, D_;
  bool abs_, single_ = false;
  Index band_ = 0;  // widest band term
  std::vector<head_data> heads_;
  std::vector<buffers> bufs_;
};

}  // namespace iattn::cpu_detail
