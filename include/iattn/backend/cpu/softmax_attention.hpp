// iattn/backend/cpu/softmax_attention.hpp: CPU evaluator of the explicit SoftmaxAttention.
// O(L^2 dk) per head: a row's scores are dot products over the key dimension in SIMD packs (four
// keys at a time), shifted by the row maximum, exponentiated in packs and normalised.
//
// apply forms each row once and accumulates its weighted value rows in packs over the channels.
// materialize and the tile evaluators take a head's row statistics (the maximum score m_t and
// 1 / sum_s exp(score - m_t), computed once per head and shared by the evaluators of its channels
// alive at the same time), so a tile costs its own entries' scores only: before, every 64 x 64 tile
// formed its 64 rows over all L columns, and the channel mean of a 512-wide layer (4 heads) at
// L = 512 took 34 s (17 ms now). A causal node is also a head-shared core of the channel means
// (mean.hpp).
#pragma once

#include "../../ops/softmax_attention.hpp"
#include "simd.hpp"
#include "tile.hpp"

#include <algorithm>
#include <cmath>
#include <memory>
#include <mutex>
#include <tuple>
#include <utility>
#include <vector>

namespace iattn::cpu_detail {

/// w[s - j0] = scale * q_t[h] . k_s[h] for s in [j0, j1): packs over the key dimension, four keys
/// at a time (four independent sums).
template <class T, bool Causal>
void softmax_scores(const SoftmaxAttention<T, Causal>& n, Index h, Index t, Index j0, Index j1, T* w) {
  constexpr int W = simd::width<T>;
  using P = simd::pack<T, W>;
  const Index dk = n.key_dim(), dv = dk / W * W;
  const T* q = n.Q().row(t) + h * dk;
  const T sc = n.scale();
  Index s = j0;
  for (; s + 4 <= j1; s += 4) {
    const T* k[4] = {n.K().row(s) + h * dk, n.K().row(s + 1) + h * dk, n.K().row(s + 2) + h * dk, n.K().row(s + 3) + h * dk};
    P acc[4] = {P::broadcast(T(0)), P::broadcast(T(0)), P::broadcast(T(0)), P::broadcast(T(0))};
    for (Index i = 0; i < dv; i += W) {
      const P qv = P::load(q + i);
      for (int j = 0; j < 4; ++j) acc[j] = fma(qv, P::load(k[j] + i), acc[j]);
    }
    for (int j = 0; j < 4; ++j) {
      T v = reduce_add(acc[j]);
      for (Index i = dv; i < dk; ++i) v += q[i] * k[j][i];
      w[s + j - j0] = sc * v;
    }
  }
  for (; s < j1; ++s) {
    const T* k = n.K().row(s) + h * dk;
    w[s - j0] = sc * simd::sum_packs<T>(dk, [&](auto wd, Index i) {
      using Q = simd::pack<T, decltype(wd)::value>;
      return Q::load(q + i) * Q::load(k + i);
    });
  }
}

/// Row t's statistics over its end >= 1 columns: the maximum score m and 1 / sum_s exp(score - m);
/// w (end values) left holding exp(score - m).
template <class T, bool Causal>
std::pair<T, T> softmax_stats(const SoftmaxAttention<T, Causal>& n, Index h, Index t, Index end, T* w) {
  softmax_scores(n, h, t, 0, end, w);
  const T m = *std::max_element(w, w + end);
  const T sum = simd::sum_packs<T>(end, [&](auto wd, Index i) {
    using Q = simd::pack<T, decltype(wd)::value>;
    const Q e = exp(Q::load(w + i) - Q::broadcast(m));
    e.store(w + i);
    return e;
  });
  return {m, T(1) / sum};
}

/// Row t of head h's attention matrix into w (length L >= 1; zero where masked).
template <class T, bool Causal>
void softmax_row(const SoftmaxAttention<T, Causal>& n, Index h, Index t, Index L, T* w) {
  const Index end = Causal ? t + 1 : L;
  const T inv = softmax_stats(n, h, t, end, w).second;
  simd::for_packs<T>(end, [&](auto wd, Index i) {
    using Q = simd::pack<T, decltype(wd)::value>;
    (Q::load(w + i) * Q::broadcast(inv)).store(w + i);
  });
  std::fill(w + end, w + L, T(0));
}

/// Head h's row statistics over L tokens: every row's maximum score and the inverse of its sum of
/// exp(score - maximum), computed on first use (ready()) by whichever evaluator asks first.
template <class T, bool Causal>
class softmax_head {
 public:
  softmax_head(const SoftmaxAttention<T, Causal>& n, Index L, Index h) : n_(&n), L_(L), h_(h) {}

  void ready() const {
    std::call_once(once_, [&] {
      mx_.resize(std::size_t(L_));
      inv_.resize(std::size_t(L_));
      std::vector<T> w(static_cast<std::size_t>(L_));
      for (Index t = 0; t < L_; ++t)
        std::tie(mx_[std::size_t(t)], inv_[std::size_t(t)]) = softmax_stats(*n_, h_, t, Causal ? t + 1 : L_, w.data());
    });
  }

  /// Row t's probabilities over columns [j0, j1) into w (zero where masked); ready() first.
  void probabilities(Index t, Index j0, Index j1, T* w) const {
    const Index end = std::clamp<Index>(Causal ? t + 1 : j1, j0, j1);
    softmax_scores(*n_, h_, t, j0, end, w);
    const T mx = mx_[std::size_t(t)], inv = inv_[std::size_t(t)];
    simd::for_packs<T>(end - j0, [&](auto wd, Index i) {
      using Q = simd::pack<T, decltype(wd)::value>;
      (exp(Q::load(w + i) - Q::broadcast(mx)) * Q::broadcast(inv)).store(w + i);
    });
    std::fill(w + (end - j0), w + (j1 - j0), T(0));
  }

 private:
  const SoftmaxAttention<T, Causal>* n_;
  Index L_, h_;
  mutable std::once_flag once_;
  mutable std::vector<T> mx_, inv_;
};

/// The row statistics of (node, head), shared by every evaluator of that head alive at the same
/// time (tile.hpp's shared_while_held, keyed by the node and its coefficients' storage).
template <class T, bool Causal>
std::shared_ptr<softmax_head<T, Causal>> shared_softmax_head(const SoftmaxAttention<T, Causal>& n, Index L, Index h) {
  using key = std::tuple<const void*, Index, Index, const void*, const void*>;
  return shared_while_held<softmax_head<T, Causal>>(key{&n, h, L, n.Q().data(), n.K().data()},
                                                    [&] { return std::make_shared<softmax_head<T, Causal>>(n, L, h); });
}

template <class T, bool Causal>
struct slab_eval<SoftmaxAttention<T, Causal>> {
  static void apply(const SoftmaxAttention<T, Causal>& n, const context& cx, Index c0, Index nc, const T* x, T* y) {
    run<false>(n, cx, c0, nc, x, y);
  }
  static void apply_t(const SoftmaxAttention<T, Causal>& n, const context& cx, Index c0, Index nc, const T* x, T* y) {
    run<true>(n, cx, c0, nc, x, y);
  }

 private:
  /// y = A x (or A^T x) on the slab's channels, row by row of each head it meets: row t's
  /// probabilities w, then y_t += sum_s w_s x_s (transposed: y_s += w_s x_t) in packs over the
  /// head's channels.
  template <bool Transposed>
  static void run(const SoftmaxAttention<T, Causal>& n, const context& cx, Index c0, Index nc, const T* x, T* y) {
    const Index L = cx.L, P = n.head_dim();
    std::fill(y, y + L * nc, T(0));
    if (L == 0 || nc == 0) return;
    std::vector<T> w(static_cast<std::size_t>(L));
    for (Index h = c0 / P; h <= (c0 + nc - 1) / P; ++h) {
      const Index cb = std::max(c0, h * P) - c0, m = std::min(c0 + nc, (h + 1) * P) - c0 - cb;
      for (Index t = 0; t < L; ++t) {
        softmax_row(n, h, t, L, w.data());
        for (Index s = 0; s < (Causal ? t + 1 : L); ++s) {
          const T ws = w[std::size_t(s)];
          if (ws == T(0)) continue;
          T* dst = y + (Transposed ? s : t) * nc + cb;
          const T* src = x + (Transposed ? t : s) * nc + cb;
          simd::for_packs<T>(m, [&](auto wd, Index i) {
            using Q = simd::pack<T, decltype(wd)::value>;
            fma(Q::broadcast(ws), Q::load(src + i), Q::load(dst + i)).store(dst + i);
          });
        }
      }
    }
  }
};

template <class T, bool Causal>
struct channel_eval<SoftmaxAttention<T, Causal>, T> {
  std::shared_ptr<softmax_head<T, Causal>> head;
  channel_eval(const SoftmaxAttention<T, Causal>& node, const context& cx, Index c)
      : head(shared_softmax_head(node, cx.L, c / node.head_dim())) {
    head->ready();
  }
  void block(Index i0, Index i1, Index j0, Index j1, tile<T> out) const {
    for (Index t = i0; t < i1; ++t) head->probabilities(t, j0, j1, &out(t - i0, 0));
  }
};

}  // namespace iattn::cpu_detail
