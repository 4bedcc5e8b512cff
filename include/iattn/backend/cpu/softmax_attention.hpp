// iattn/backend/cpu/softmax_attention.hpp: CPU evaluator of the explicit SoftmaxAttention.
// O(L^2 dk) per head: each row's scores are formed, shifted by the row maximum and normalised.
#pragma once

#include "../../ops/softmax_attention.hpp"
#include "tile.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

namespace iattn::cpu_detail {

/// Row t of head h's attention matrix into w (length L; zero where masked).
template <class T, bool Causal>
void softmax_row(const SoftmaxAttention<T, Causal>& n, Index h, Index t, Index L, T* w) {
  const Index end = Causal ? t + 1 : L;
  T mx = -std::numeric_limits<T>::infinity();
  for (Index s = 0; s < end; ++s) mx = std::max(mx, w[s] = n.score(h, t, s));
  T sum = 0;
  for (Index s = 0; s < end; ++s) sum += (w[s] = std::exp(w[s] - mx));
  for (Index s = 0; s < end; ++s) w[s] /= sum;
  std::fill(w + end, w + L, T(0));
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
  template <bool Transposed>
  static void run(const SoftmaxAttention<T, Causal>& n, const context& cx, Index c0, Index nc, const T* x, T* y) {
    const Index L = cx.L, P = n.head_dim();
    std::fill(y, y + L * nc, T(0));
    std::vector<T> w(static_cast<std::size_t>(L));
    for (Index h = c0 / P; h <= (c0 + nc - 1) / P; ++h) {
      const Index cb = std::max(c0, h * P), ce = std::min(c0 + nc, (h + 1) * P);
      for (Index t = 0; t < L; ++t) {
        softmax_row(n, h, t, L, w.data());
        for (Index s = 0; s < L; ++s) {
          if (w[std::size_t(s)] == T(0)) continue;
          for (Index c = cb; c < ce; ++c) {
            if constexpr (Transposed) y[s * nc + c - c0] += w[std::size_t(s)] * x[t * nc + c - c0];
            else y[t * nc + c - c0] += w[std::size_t(s)] * x[s * nc + c - c0];
          }
        }
      }
    }
  }
};

template <class T, bool Causal>
struct channel_eval<SoftmaxAttention<T, Causal>, T> {
  const SoftmaxAttention<T, Causal>* n;
  Index h, L;
  channel_eval(const SoftmaxAttention<T, Causal>& node, const context& cx, Index c) : n(&node), h(c / node.head_dim()), L(cx.L) {}
  void block(Index i0, Index i1, Index j0, Index j1, tile<T> out) const {
    std::vector<T> w(static_cast<std::size_t>(L));
    for (Index t = i0; t < i1; ++t) {
      softmax_row(*n, h, t, L, w.data());
      for (Index s = j0; s < j1; ++s) out(t - i0, s - j0) = w[std::size_t(s)];
    }
  }
};

}  // namespace iattn::cpu_detail
