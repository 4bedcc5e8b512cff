// iattn/backend/cpu/wkv_mean.hpp: the channel mean of  s · diag(r) · Wkv  (RWKV-4's time mixing;
// r and s optional) as blocked products whose inner dimension runs over the channels.
//
// Blocks of b = wkv_mean_block tokens. For t in block I = [i0, i1) and s in an earlier block
// J = [j0, j1), with P_I(t) = Σ_{i0<=r<t} w_r, R_J(s) = Σ_{s<r<j1} w_r and G(J, I) = Σ_{j1<=r<i0} w_r
// (a sum of whole blocks' totals: every cumulative sum is block-relative),
//   H^c[t, s] = r_t exp(k_s + R_J(s) + G(J, I) + P_I(t) − ℓ_t) = A_t · exp(D_IJ) · B_s,
//   A_t  = r_t exp(P_I(t) − ℓ_t − α_I),     α_I = max_{t∈I} (P_I(t) − ℓ_t),
//   B_s  = exp(k_s + R_J(s) − m_J),          m_J = max_{s∈J} (k_s + R_J(s)),
//   D_IJ = G(J, I) + m_J + α_I = max_{s∈J} score[t*, s] − ℓ_{t*} <= 0   (t* the row giving α_I),
// per channel. No exponent is positive (D_IJ is clamped at 0 against rounding), and each factor
// bounds the entry, so a factor that underflows belongs to an entry smaller still. Per block pair,
// the mean of those entries is a product of A_I with B_J scaled by exp(D_IJ) (gemm.hpp): L²n/2
// multiply-adds for n channels, against the tile path's L²n/2 scalar exps. Two levels: superblocks
// of 64 tokens against the earlier superblocks (64 × 64 products: the per-pair scaling and exps are
// 1/64 of the work), and 16-token blocks against the earlier blocks of their own superblock.
// Diagonal blocks are summed directly, vectorised across channels: per (t, s) the channels'
// r_t exp(k_s + Σ_{s<r<t} w_r − ℓ_t), the decay sum running backwards from t (b/2 exps per entry
// and channel). ℓ_t is apply_t's forward pass (double), as in the tiles. A reset (w = −inf) gives
// exact zeros through the factors. The mean of |H^c| takes |r| (every other factor is positive).
#pragma once

#include "../../ops/diagonal.hpp"
#include "../../ops/product.hpp"
#include "../../ops/scaled.hpp"
#include "../../ops/wkv.hpp"
#include "gemm.hpp"
#include "parallel.hpp"
#include "simd.hpp"
#include "wkv.hpp"

#include <algorithm>
#include <cmath>
#include <type_traits>
#include <vector>

namespace iattn::cpu_detail {

/// Tokens per block of the Wkv mean (diagonal blocks and the products inside a superblock), and
/// per superblock (the products between superblocks).
inline constexpr Index wkv_mean_block = 16, wkv_mean_super = 64;

/// s · diag(r) · Wkv as matched in an expression (r null: no receptance).
template <class T>
struct wkv_mean_form {
  const Wkv<T>* wkv = nullptr;
  const coefficient<T>* r = nullptr;
  double scale = 1;
};

template <class T, class Node>
bool match_wkv_mean(const Node& n, wkv_mean_form<T>& f) {
  if constexpr (std::is_same_v<Node, Wkv<T>>) {
    f.wkv = &n;
    return true;
  } else if constexpr (std::is_same_v<Node, Product<Diagonal<T>, Wkv<T>>>) {
    f.r = &n.left().d();
    f.wkv = &n.right();
    return true;
  } else if constexpr (requires { n.factor(); n.inner(); }) {
    f.scale *= n.factor();
    return match_wkv_mean<T>(n.inner(), f);
  } else {
    return false;
  }
}

namespace wkv_mean_detail {
/// out[i] = e^{x[i]} in T for x <= 0 formed in double: the exponent is rounded to T first, so a
/// float result takes float's exp (twice the lanes of double's). The rounding moves e^x by at most
/// |x| e^x ulp(1) <= 0.37 ulp(1): nothing an entry bounded by e^x notices.
template <class T>
void exp_to(const double* x, T* out, Index n) {
  for (Index i = 0; i < n; ++i) out[i] = T(x[i]);
  simd::for_packs<T>(n, [&](auto w, Index i) {
    using P = simd::pack<T, decltype(w)::value>;
    exp(P::load(out + i)).store(out + i);
  });
}

/// The factors of one block size b over the L tokens, for g channels (row-major (t, j)):
///   A (L, g): r_t e^{P_I(t) − ℓ_t − α_I};  alpha (nb, g): α_I
///   Bp: per block, B_J packed in the kernel's panels (gemm_pack_a of b rows: zeros past the end)
///   m (nb, g): m_J;  tot (nb, g): Σ_{r∈J} w_r.
template <class T>
struct level {
  Index b = 0, nb = 0, padded = 0;
  std::vector<double> alpha, m, tot;
  std::vector<T> A, Bp;
  void resize(Index bs, Index L, Index g) {
    b = bs;
    nb = (L + b - 1) / b;
    padded = gemm_padded_rows<T>(b);
    const auto G = std::size_t(g);
    alpha.resize(std::size_t(nb) * G);
    m.resize(std::size_t(nb) * G);
    tot.resize(std::size_t(nb) * G);
    A.resize(std::size_t(L) * G);
    Bp.resize(std::size_t(nb * padded) * G);
  }
};
}  // namespace wkv_mean_detail

/// Mean over channels [c0, c1) of H^c (|H^c| with abs) for H = s · diag(r) · Wkv, (L, L).
template <class T>
Matrix<T> wkv_mean(const wkv_mean_form<T>& f, Index L, Index c0, Index c1, bool abs) {
  using wkv_mean_detail::exp_to;
  constexpr Index b = wkv_mean_block, bsup = wkv_mean_super;
  constexpr double ninf = wkv_detail::ninf;
  Matrix<T> out = Matrix<T>::Zero(L, L);
  if (L == 0 || c1 <= c0) return out;
  const Wkv<T>& n = *f.wkv;
  const Index group = 64;
  const Index chunk = std::min<Index>(c1 - c0, 256);  // a block's scaled panels stay in L1/L2
  const double scale = f.scale / double(c1 - c0);
  const T alpha = T(scale);
  std::vector<double> ell, kd, wd, rd;  // (L, g): ℓ, k, w, r (|r| with abs) in double
  wkv_mean_detail::level<T> fine, coarse;
  struct scratch {
    std::vector<double> a, b, c;
    std::vector<T> t1, t2;
  };
  std::vector<scratch> scr(static_cast<std::size_t>(max_threads()));
  for (Index cc = c0; cc < c1; cc += chunk) {
    const Index g = std::min(chunk, c1 - cc);
    const auto G = std::size_t(g);
    ell.resize(std::size_t(L) * G);
    kd.resize(std::size_t(L) * G);
    wd.resize(std::size_t(L) * G);
    rd.resize(std::size_t(L) * G);
    fine.resize(b, L, g);
    coarse.resize(bsup, L, g);
    // ℓ, in groups of channels (apply_t's forward pass); k, w, r gathered once.
    parallel_for((g + group - 1) / group, [&](Index q) {
      const Index j0 = q * group;
      wkv_detail::log_norms_group(n, L, cc + j0, std::min(group, g - j0), ell.data() + j0, g);
    });
    parallel_for(L, [&](Index t) {
      for (Index j = 0; j < g; ++j) {
        kd[std::size_t(t * g + j)] = double(n.k()(t, cc + j));
        wd[std::size_t(t * g + j)] = double(n.decay(t, cc + j));
        const double r = f.r ? double((*f.r)(f.r->rows() == 1 ? 0 : t, cc + j)) : 1.0;
        rd[std::size_t(t * g + j)] = abs ? std::abs(r) : r;
      }
    });
    // Per block of each level: A and α (prefix sums forward), B, m and the total (suffix sums
    // backward).
    auto factors = [&](wkv_mean_detail::level<T>& lv) {
      parallel_for(lv.nb, [&](Index I) {
        scratch& sc = scr[std::size_t(thread_index())];
        const Index i0 = I * lv.b, i1 = std::min(L, i0 + lv.b), nI = i1 - i0;
        double* v = sized(sc.a, lv.b * g);  // P_I(t) − ℓ_t, then k_s + R_J(s)
        double* acc = sized(sc.b, g);
        T* e = sized(sc.t1, lv.b * g);
        double* mx = lv.alpha.data() + I * g;
        std::fill(acc, acc + g, 0.0);
        std::fill(mx, mx + g, ninf);
        for (Index t = i0; t < i1; ++t) {
          double* vt = v + (t - i0) * g;
          const double* el = ell.data() + t * g;
          const double* w = wd.data() + t * g;
          for (Index j = 0; j < g; ++j) {
            vt[j] = acc[j] - el[j];
            mx[j] = std::max(mx[j], vt[j]);
            acc[j] += w[j];
          }
        }
        std::copy(acc, acc + g, lv.tot.data() + I * g);
        for (Index t = i0; t < i1; ++t)
          for (Index j = 0; j < g; ++j) v[(t - i0) * g + j] -= mx[j];
        exp_to(v, e, nI * g);
        for (Index t = i0; t < i1; ++t) {
          T* a = lv.A.data() + t * g;
          const double* r = rd.data() + t * g;
          for (Index j = 0; j < g; ++j) a[j] = T(r[j]) * e[(t - i0) * g + j];
        }
        double* mj = lv.m.data() + I * g;
        std::fill(acc, acc + g, 0.0);
        std::fill(mj, mj + g, ninf);
        for (Index s = i1 - 1; s >= i0; --s) {
          double* vs = v + (s - i0) * g;
          const double* k = kd.data() + s * g;
          const double* w = wd.data() + s * g;
          for (Index j = 0; j < g; ++j) {
            vs[j] = k[j] + acc[j];
            mj[j] = std::max(mj[j], vs[j]);
            acc[j] += w[j];
          }
        }
        for (Index s = i0; s < i1; ++s)
          for (Index j = 0; j < g; ++j) v[(s - i0) * g + j] -= mj[j];
        exp_to(v, e, nI * g);
        gemm_pack_a(e, g, nI, g, lv.Bp.data() + I * lv.padded * g);  // B_J once for all its products
      });
    };
    factors(fine);
    if (L > bsup) factors(coarse);
    // The diagonal blocks of the fine level, directly: per row t the decay sum runs back from t.
    parallel_for(fine.nb, [&](Index I) {
      scratch& sc = scr[std::size_t(thread_index())];
      const Index i0 = I * b, i1 = std::min(L, i0 + b);
      double* x = sized(sc.a, 2 * g);
      double* run = x + g;  // Σ_{s<q<t} w_q
      T* e = sized(sc.t1, g);
      T* rt = sized(sc.t2, g);
      for (Index t = i0; t < i1; ++t) {
        const double* el = ell.data() + t * g;
        const double* r = rd.data() + t * g;
        for (Index j = 0; j < g; ++j) rt[j] = T(r[j]);
        std::fill(run, run + g, 0.0);
        T* orow = out.data() + t * L;
        for (Index s = t; s >= i0; --s) {
          const double* k = kd.data() + s * g;
          if (s == t)
            for (Index j = 0; j < g; ++j) x[j] = double(n.u()(0, cc + j)) + k[j] - el[j];
          else
            for (Index j = 0; j < g; ++j) x[j] = k[j] + run[j] - el[j];
          exp_to(x, e, g);
          orow[s] += T(scale * double(simd::sum_packs<T>(g, [&](auto w, Index j) {
                       using P = simd::pack<T, decltype(w)::value>;
                       return P::load(rt + j) * P::load(e + j);
                     })));
          if (s < t) {
            const double* w = wd.data() + s * g;
            for (Index j = 0; j < g; ++j) run[j] += w[j];
          }
        }
      }
    });
    // Products between blocks of one level: row block I against the column blocks J of [J0, I),
    // each B_J scaled by exp(D_IJ) into the kernel's panels, times A_I's rows read in place.
    auto products = [&](const wkv_mean_detail::level<T>& lv, Index I, Index J0) {
      constexpr Index MR = gemm_mr<T>, W = simd::width<T>;
      scratch& sc = scr[std::size_t(thread_index())];
      const Index i0 = I * lv.b, i1 = std::min(L, i0 + lv.b);
      T* bs = sized(sc.t1, lv.padded * g);
      T* et = sized(sc.t2, g);
      double* Gs = sized(sc.c, 2 * g);  // G(J, I), then D_IJ
      double* dsum = Gs + g;
      std::fill(Gs, Gs + g, 0.0);
      const double* aI = lv.alpha.data() + I * g;
      for (Index J = I - 1; J >= J0; --J) {
        const double* mj = lv.m.data() + J * g;
        simd::for_packs<double>(g, [&](auto w, Index j) {
          using P = simd::pack<double, decltype(w)::value>;
          min(P::load(Gs + j) + P::load(mj + j) + P::load(aI + j), P::broadcast(0.0)).store(dsum + j);
        });
        exp_to(dsum, et, g);
        const T* src = lv.Bp.data() + J * lv.padded * g;
        for (Index p0 = 0; p0 < lv.padded; p0 += MR) {  // each panel: only the packs that hold rows
          const Index lanes = std::min(MR, (lv.b - p0 + W - 1) / W * W);
          for (Index p = 0; p < g; ++p) {
            const T ep = et[p];
            T* dst = bs + p0 * g + p * MR;
            const T* from = src + p0 * g + p * MR;
            for (Index r = 0; r < lanes; ++r) dst[r] = from[r] * ep;
          }
        }
        gemm_tile_add<T>(lv.b, i1 - i0, g, bs, MR * g, lv.A.data() + i0 * g, g, out.data() + i0 * L + J * lv.b, L, alpha);
        const double* tj = lv.tot.data() + J * g;
        for (Index j = 0; j < g; ++j) Gs[j] += tj[j];
      }
    };
    // Fine blocks against the earlier fine blocks of their superblock; superblocks against the
    // earlier superblocks (longest first).
    constexpr Index per = bsup / b;
    const Index nsup = (L + bsup - 1) / bsup;
    parallel_for(fine.nb + nsup, [&](Index q) {
      if (q < nsup) {
        const Index I = nsup - 1 - q;
        if (I > 0) products(coarse, I, 0);
      } else {
        const Index I = q - nsup;
        products(fine, I, I / per * per);
      }
    });
  }
  return out;
}

}  // namespace iattn::cpu_detail
