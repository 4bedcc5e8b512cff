// iattn/backend/cpu/mean.hpp: materialize_mean as blocked GEMMs whose inner dimension runs over
// channels and states together.
//
// An expression that is a sum of terms  w * diag(P) * Core * diag(Q) * [Conv]  (Core a Semiseparable,
// a LinearRecurrence or nothing; Diagonal, bound GroupNorm, scalar scales, identities and sums are
// distributed into that form by expand_mean) has the channel mean
//   mean_c H^c = sum over terms of (w / D) sum_c P^c Core^c Q^c Conv^c.
// For a term with a core, column s' of Core Q Conv is the core applied to the K-sparse input
// sum_lag tap(lag) Q[s'+lag] e_{s'+lag}. Folded into one state injection at sigma = s' + K - 1,
//   z_sigma[(c,m)] = sum_lag tap(lag, c) Q[s'+lag, c] B[s'+lag, m] E(s'+lag+1 .. sigma)[c,m],
// every entry at least K-1 (strict form: K) below the diagonal is an entry of the inclusive
//   G[t', sigma] = sum_{c,m} U[t', (c,m)] E(sigma+1 .. t')[c,m] z_sigma[(c,m)],  t' >= sigma,
// with U[t'] = P[t'+delta] C[t'+delta] (delta = 1 for the strict form, 0 otherwise), written to
// out[t' + delta, sigma - K + 1]. G is evaluated in blocks of mean_block tokens:
//   below the diagonal block: Ut_I diag(E(j1 .. i0)) Vt_J^T for every J < I, one GEMM per row block;
//   inside the diagonal block: running products of the per-token decays;
// the inner dimension (c, m) a chunk of at most 1024 at a time. The remaining K-1 (strict: K)
// diagonals nearest the main one are summed directly. Exp arguments are sums of log-decays, never
// differences; lambda = -inf gives exact zeros. Everything else (Flip, RowNormalize, Wkv, softmax,
// products of two cores, convolutions wider than max_mean_conv) takes the tile path of evaluate.hpp.
#pragma once

#include "../../ops/causal_conv.hpp"
#include "../../ops/diagonal.hpp"
#include "../../ops/group_norm.hpp"
#include "../../ops/identity.hpp"
#include "../../ops/linear_recurrence.hpp"
#include "../../ops/product.hpp"
#include "../../ops/scaled.hpp"
#include "../../ops/semiseparable.hpp"
#include "../../ops/sum.hpp"
#include "decay_tiles.hpp"
#include "parallel.hpp"
#include "simd.hpp"
#include "tile.hpp"

#include <algorithm>
#include <type_traits>
#include <vector>

namespace iattn::cpu_detail {

/// One term w * diag(post) * core * diag(pre) * conv of a channel-mean expansion.
template <class T>
struct mean_term {
  double weight = 1;
  Matrix<T> post, pre;  ///< diagonal entries, (L, D) or (1, D); empty means ones
  const Semiseparable<T>* S = nullptr;
  const LinearRecurrence<T>* R = nullptr;
  const CausalConv<T>* conv = nullptr;
  bool has_core() const { return S != nullptr || R != nullptr; }
  bool trivial() const { return !has_core() && conv == nullptr && post.size() == 0 && pre.size() == 0; }
};
template <class T>
using mean_terms = std::vector<mean_term<T>>;

inline constexpr std::size_t max_mean_terms = 64;  ///< beyond this the expansion is not worth it
inline constexpr Index max_mean_conv = 16;         ///< widest convolution folded into a core's injection
inline constexpr Index mean_block = 32;            ///< tokens per block of G

template <class N>
struct is_sum_node : std::false_type {};
template <class A, class B>
struct is_sum_node<Sum<A, B>> : std::true_type {};
template <class N>
struct is_product_node : std::false_type {};
template <class A, class B>
struct is_product_node<Product<A, B>> : std::true_type {};
template <class N>
struct is_scaled_node : std::false_type {};
template <class A>
struct is_scaled_node<Scaled<A>> : std::true_type {};

/// Entrywise product of two diagonals stored as (L, D) or (1, D); empty means ones.
template <class T>
Matrix<T> diag_product(const Matrix<T>& a, const Matrix<T>& b) {
  if (a.size() == 0) return b;
  if (b.size() == 0) return a;
  if (a.rows() == b.rows()) return a.cwiseProduct(b);
  Matrix<T> r = a.rows() == 1 ? b : a;
  r.array().rowwise() *= (a.rows() == 1 ? a : b).row(0).array();
  return r;
}

/// Expands n into out; false when n is not a sum of terms of the form above.
template <class T, class Node>
bool expand_mean(const Node& n, const context& cx, mean_terms<T>& out) {
  out.clear();
  mean_term<T> one;
  if constexpr (std::is_same_v<Node, Diagonal<T>>) {
    one.post = n.d().map();
  } else if constexpr (std::is_same_v<Node, GroupNorm<T>>) {
    if (!n.bound()) return false;
    one.post.resize(cx.L, cx.D);
    for (Index t = 0; t < cx.L; ++t)
      for (Index c = 0; c < cx.D; ++c) one.post(t, c) = n.value(t, c, cx.D);
  } else if constexpr (std::is_same_v<Node, Identity>) {
  } else if constexpr (std::is_same_v<Node, Semiseparable<T>>) {
    one.S = &n;
  } else if constexpr (std::is_same_v<Node, LinearRecurrence<T>>) {
    one.R = &n;
  } else if constexpr (std::is_same_v<Node, CausalConv<T>>) {
    one.conv = &n;
  } else if constexpr (is_scaled_node<Node>::value) {
    if (!expand_mean<T>(n.inner(), cx, out)) return false;
    for (auto& t : out) t.weight *= n.factor();
    return true;
  } else if constexpr (is_sum_node<Node>::value) {
    mean_terms<T> b;
    if (!expand_mean<T>(n.left(), cx, out) || !expand_mean<T>(n.right(), cx, b)) return false;
    for (auto& t : b) out.push_back(std::move(t));
    return out.size() <= max_mean_terms;
  } else if constexpr (is_product_node<Node>::value) {
    mean_terms<T> a, b;
    if (!expand_mean<T>(n.left(), cx, a) || !expand_mean<T>(n.right(), cx, b)) return false;
    if (a.size() * b.size() > max_mean_terms) return false;
    for (const auto& x : a)
      for (const auto& y : b) {
        mean_term<T> r;
        if (x.conv) {  // a convolution must be the rightmost factor
          if (!y.trivial()) return false;
          r = x;
        } else if (x.has_core()) {
          if (y.has_core()) return false;
          r.post = x.post;
          r.S = x.S;
          r.R = x.R;
          r.pre = diag_product(x.pre, diag_product(y.post, y.pre));
          r.conv = y.conv;
        } else {  // x is a diagonal: it joins y's left-hand diagonal
          r.post = diag_product(x.post, y.post);
          r.S = y.S;
          r.R = y.R;
          r.pre = y.pre;
          r.conv = y.conv;
        }
        r.weight = x.weight * y.weight;
        if (r.has_core() && r.conv && r.conv->width() > max_mean_conv) return false;
        out.push_back(std::move(r));
      }
    return true;
  } else {
    return false;
  }
  out.push_back(std::move(one));
  return true;
}

/// Reads a diagonal stored as (L, D), (1, D) or empty (ones).
template <class T>
T diag_at(const Matrix<T>& d, Index t, Index c) {
  return d.size() == 0 ? T(1) : d(d.rows() == 1 ? 0 : t, c);
}

// The mean of one term with a core, accumulated into out (see the header comment).
template <class T, class Policy>
class mean_core_term {
 public:
  mean_core_term(const mean_term<T>& term, const context& cx) : term_(term), L_(cx.L), D_(cx.D) {
    N_ = term.S ? term.S->state() : 1;
    strict_ = term.S && term.S->strict();
    delta_ = strict_ ? 1 : 0;
    K_ = term.conv ? term.conv->width() : 1;
    scale_ = T(term.weight / double(D_));
    const Index target = std::clamp<Index>((Index(1) << 22) / std::max<Index>(L_, 1), 64, 1024);
    Dc_ = std::clamp<Index>(target / N_, 1, D_);
  }

  void accumulate(Matrix<T>& out) {
    const Index M = Dc_ * N_;
    lam_.resize(L_, M);
    uf_.resize(L_, M);
    bf_.resize(L_, M);
    vz_.resize(L_, M);
    ut_.resize(L_, M);
    vt_.resize(L_, M);
    const Index nb = (L_ + mean_block - 1) / mean_block;
    blk_.resize(nb, M);
    wbuf_.assign(std::size_t(max_threads()), std::vector<T>());
    for (Index c0 = 0; c0 < D_; c0 += Dc_) {
      dc_ = std::min(Dc_, D_ - c0);
      m_ = dc_ * N_;
      fill(c0);
      band(c0, out);
      inject(c0);
      parallel_for(nb, [&](Index b) { edges(b); });
      parallel_for(nb, [&](Index k) { row_block(nb - 1 - k, out); });  // longest rows first
    }
  }

 private:
  using P1 = simd::pack<T, 1>;
  template <int W>
  using Pk = simd::pack<T, W>;

  // Inner index i = j * N + m for channel c0 + j and state m.
  void fill(Index c0) {
    const auto* S = term_.S;
    const auto* R = term_.R;
    parallel_for(L_, [&](Index t) {
      T* lam = lam_.row(t).data();
      T* uf = uf_.row(t).data();
      T* bf = bf_.row(t).data();
      for (Index j = 0; j < dc_; ++j) {
        const Index c = c0 + j, o = j * N_;
        const T post = diag_at(term_.post, t, c), pre = diag_at(term_.pre, t, c);
        if (S) {
          const Index h = S->head_of(c), g = S->group_of_head(h) * N_;
          const T* B = S->B().row(t) + g;
          const T* C = S->C().row(t) + g;
          for (Index m = 0; m < N_; ++m) {
            lam[o + m] = S->log_decay(t, h, m);
            uf[o + m] = post * C[m];
            bf[o + m] = pre * B[m];
          }
        } else {
          lam[o] = R->a()(t, c);
          uf[o] = post;
          bf[o] = pre * R->b()(t, c);
        }
      }
    });
  }

  T tap(Index lag, Index c) const { return term_.conv ? term_.conv->tap(lag, c) : T(1); }
  T bonus(Index c, Index m) const {
    return term_.S && term_.S->has_bonus() ? term_.S->bonus()(term_.S->head_of(c), m) : T(0);
  }

  // dst[i] = Policy::factor(src[i]) over the chunk's m_ entries.
  void factor_row(const T* src, T* dst) const {
    simd::for_packs<T>(m_, [&](auto w, Index i) {
      using P = Pk<decltype(w)::value>;
      Policy::factor(P::load(src + i)).store(dst + i);
    });
  }

  // The Kb = K - 1 + delta diagonals nearest the main one, summed directly:
  //   out[t, s'] += scale sum_c sum_{lag: s'+lag <= t} tap(lag, c) (P S^c Q)[t, s'+lag].
  void band(Index c0, Matrix<T>& out) {
    const Index Kb = K_ - 1 + delta_;
    if (Kb == 0) return;
    parallel_for(L_, [&](Index t) {
      std::vector<T> acc(static_cast<std::size_t>(m_), T(1)), f(static_cast<std::size_t>(m_)), sv(std::size_t(Kb * dc_), T(0));
      const T* uf = uf_.row(t).data();
      for (Index ls = 0; ls < Kb && ls <= t; ++ls) {  // s = t - ls
        const Index s = t - ls;
        if ((!strict_ && ls >= 1) || (strict_ && ls >= 2)) {  // acc = E(s+1 .. t) (strict: .. t-1)
          factor_row(lam_.row(s + 1).data(), f.data());
          for (Index i = 0; i < m_; ++i) acc[std::size_t(i)] *= f[std::size_t(i)];
        }
        const T* bf = bf_.row(s).data();
        for (Index j = 0; j < dc_; ++j) {
          T v = 0;
          for (Index m = 0; m < N_; ++m) {
            const Index i = j * N_ + m;
            const T e = (strict_ && ls == 0) ? bonus(c0 + j, m) : acc[std::size_t(i)];
            v += uf[i] * e * bf[i];
          }
          sv[std::size_t(ls * dc_ + j)] = v;
        }
      }
      for (Index sp = std::max<Index>(0, t - Kb + 1); sp <= t; ++sp) {
        T v = 0;
        for (Index lag = 0; lag < K_ && sp + lag <= t; ++lag) {
          const Index ls = t - sp - lag;
          if (ls >= Kb) continue;
          for (Index j = 0; j < dc_; ++j) v += tap(lag, c0 + j) * sv[std::size_t(ls * dc_ + j)];
        }
        out(t, sp) += scale_ * v;
      }
    });
  }

  // vz[sigma] = z_sigma for sigma >= K-1 (zero below), by Horner from the oldest lag:
  //   z = (..(tap(0) Q B[s']) f[s'+1] + tap(1) Q B[s'+1]) f[s'+2] + .. + tap(K-1) Q B[sigma].
  void inject(Index c0) {
    std::vector<T> taps(std::size_t(K_ * m_));
    for (Index lag = 0; lag < K_; ++lag)
      for (Index j = 0; j < dc_; ++j)
        for (Index m = 0; m < N_; ++m) taps[std::size_t(lag * m_ + j * N_ + m)] = tap(lag, c0 + j);
    parallel_for(L_, [&](Index sigma) {
      T* z = vz_.row(sigma).data();
      if (sigma < K_ - 1) {
        std::fill(z, z + m_, T(0));
        return;
      }
      std::vector<T> f(static_cast<std::size_t>(m_));
      const Index s0 = sigma - (K_ - 1);  // s' of this injection; the oldest tap decays the most
      const T* bf = bf_.row(s0).data();
      for (Index i = 0; i < m_; ++i) z[i] = taps[std::size_t(i)] * bf[i];
      for (Index lag = 1; lag < K_; ++lag) {
        const Index s = s0 + lag;
        factor_row(lam_.row(s).data(), f.data());
        const T* tk = taps.data() + lag * m_;
        bf = bf_.row(s).data();
        for (Index i = 0; i < m_; ++i) z[i] = z[i] * f[std::size_t(i)] + tk[i] * bf[i];
      }
    });
  }

  // Block b: ut forward from its first token, vt backward from its last, blk = its whole decay.
  void edges(Index b) {
    const Index b0 = b * mean_block, b1 = std::min(L_, b0 + mean_block);
    std::vector<T> acc(static_cast<std::size_t>(m_), Policy::template neutral<T>()), f(static_cast<std::size_t>(m_));
    for (Index t = b0; t < b1; ++t) {
      if (t > b0) combine(acc.data(), lam_.row(t).data());
      factor_row(acc.data(), f.data());
      T* ut = ut_.row(t).data();
      if (t + delta_ < L_) {
        const T* u = uf_.row(t + delta_).data();
        for (Index i = 0; i < m_; ++i) ut[i] = u[i] * f[std::size_t(i)];
      } else {
        std::fill(ut, ut + m_, T(0));
      }
    }
    std::fill(acc.begin(), acc.end(), Policy::template neutral<T>());
    for (Index s = b1 - 1; s >= b0; --s) {
      factor_row(acc.data(), f.data());
      const T* z = vz_.row(s).data();
      T* vt = vt_.row(s).data();
      for (Index i = 0; i < m_; ++i) vt[i] = z[i] * f[std::size_t(i)];
      combine(acc.data(), lam_.row(s).data());
    }
    std::copy(acc.begin(), acc.end(), blk_.row(b).data());
  }

  void combine(T* acc, const T* d) const {
    simd::for_packs<T>(m_, [&](auto w, Index i) {
      using P = Pk<decltype(w)::value>;
      Policy::combine(P::load(acc + i), P::load(d + i)).store(acc + i);
    });
  }

  // Row block I of G: the GEMM against every column block J < I, then the diagonal block.
  void row_block(Index I, Matrix<T>& out) {
    const Index i0 = I * mean_block, i1 = std::min(L_, i0 + mean_block), M = Dc_ * N_;
    std::vector<T> acc(static_cast<std::size_t>(m_)), f(static_cast<std::size_t>(m_));
    if (i0 > K_ - 1) {
      // parallel_for runs serially inside an enclosing parallel region, where the team index may
      // exceed this call's thread count: clamp it.
      std::vector<T>& wb = wbuf_[std::min(std::size_t(thread_index()), wbuf_.size() - 1)];
      if (wb.size() < std::size_t(L_ * M)) wb.resize(std::size_t(L_ * M));
      std::copy(lam_.row(i0).data(), lam_.row(i0).data() + m_, acc.begin());  // E(j1 .. i0) for J = I-1
      for (Index J = I - 1; J >= 0; --J) {
        const Index j0 = J * mean_block;
        factor_row(acc.data(), f.data());
        for (Index s = j0; s < j0 + mean_block; ++s) {
          const T* vt = vt_.row(s).data();
          T* w = wb.data() + s * M;
          for (Index i = 0; i < m_; ++i) w[i] = vt[i] * f[std::size_t(i)];
        }
        combine(acc.data(), blk_.row(J).data());
      }
      const Index r0 = i0 + delta_, nr = std::min(i1 + delta_, L_) - r0, nc = i0 - (K_ - 1);
      if (nr > 0) {
        Eigen::Map<Matrix<T>, 0, Eigen::OuterStride<>> dst(out.data() + r0 * L_, nr, nc, Eigen::OuterStride<>(L_));
        Eigen::Map<const Matrix<T>, 0, Eigen::OuterStride<>> W(wb.data() + (K_ - 1) * M, nc, m_, Eigen::OuterStride<>(M));
        dst.noalias() += (scale_ * ut_.block(i0, 0, nr, m_)) * W.transpose();
      }
    }
    // Diagonal block: G[t', sigma] for i0 <= sigma <= t' < i1, by running products.
    for (Index sigma = std::max(i0, K_ - 1); sigma < i1; ++sigma) {
      std::copy(vz_.row(sigma).data(), vz_.row(sigma).data() + m_, acc.begin());
      for (Index tp = sigma; tp < i1 && tp + delta_ < L_; ++tp) {
        if (tp > sigma) {
          factor_row(lam_.row(tp).data(), f.data());
          for (Index i = 0; i < m_; ++i) acc[std::size_t(i)] *= f[std::size_t(i)];
        }
        const T* u = uf_.row(tp + delta_).data();
        const T v = simd::sum_packs<T>(m_, [&](auto w, Index i) {
          using P = Pk<decltype(w)::value>;
          return P::load(u + i) * P::load(acc.data() + i);
        });
        out(tp + delta_, sigma - (K_ - 1)) += scale_ * v;
      }
    }
  }

  const mean_term<T>& term_;
  Index L_, D_, N_, K_, Dc_, dc_ = 0, m_ = 0, delta_;
  bool strict_;
  T scale_;
  Matrix<T> lam_, uf_, bf_, vz_, ut_, vt_, blk_;
  std::vector<std::vector<T>> wbuf_;
};

/// A term without a core: diag(post) * [conv], a band of width K.
template <class T>
void mean_band_term(const mean_term<T>& term, const context& cx, Matrix<T>& out) {
  const Index K = term.conv ? term.conv->width() : 1;
  const T scale = T(term.weight / double(cx.D));
  parallel_for(cx.L, [&](Index t) {
    for (Index lag = 0; lag < K && lag <= t; ++lag) {
      T v = 0;
      for (Index c = 0; c < cx.D; ++c) v += diag_at(term.post, t, c) * (term.conv ? term.conv->tap(lag, c) : T(1));
      out(t, t - lag) += scale * v;
    }
  });
}

/// The channel mean of a sum of terms, (L, L).
template <class T>
Matrix<T> mean_of_terms(const mean_terms<T>& terms, const context& cx) {
  Matrix<T> out = Matrix<T>::Zero(cx.L, cx.L);
  if (cx.L == 0 || cx.D == 0) return out;
  for (const auto& term : terms) {
    if (!term.has_core())
      mean_band_term(term, cx, out);
    else if (term.S)
      mean_core_term<T, log_decay>(term, cx).accumulate(out);
    else
      mean_core_term<T, linear_decay>(term, cx).accumulate(out);
  }
  return out;
}

}  // namespace iattn::cpu_detail
