// iattn/backend/cpu/causal_conv.hpp: CPU evaluator of CausalConv. apply is a direct depthwise
// convolution vectorised across channels, O(L*K) per channel (long kernels included); a tile is the
// band of the Toeplitz matrix.
#pragma once

#include "../../ops/causal_conv.hpp"
#include "simd.hpp"
#include "tile.hpp"

#include <algorithm>
#include <vector>

namespace iattn::cpu_detail {

template <class T>
struct slab_eval<CausalConv<T>> {
  // y_t = sum_{lag < K, lag <= t} w[K-1-lag] x_{t-lag}
  static void apply(const CausalConv<T>& n, const context& cx, Index c0, Index nc, const T* x, T* y) {
    const Index K = n.width();
    for (Index t = 0; t < cx.L; ++t) {
      T* yt = y + t * nc;
      std::fill(yt, yt + nc, T(0));
      for (Index lag = 0; lag < std::min(K, t + 1); ++lag) accumulate(n.w().row(K - 1 - lag) + c0, x + (t - lag) * nc, yt, nc);
    }
  }
  // y_s = sum_{lag < K, s+lag < L} w[K-1-lag] x_{s+lag}
  static void apply_t(const CausalConv<T>& n, const context& cx, Index c0, Index nc, const T* x, T* y) {
    const Index K = n.width();
    for (Index s = 0; s < cx.L; ++s) {
      T* ys = y + s * nc;
      std::fill(ys, ys + nc, T(0));
      for (Index lag = 0; lag < std::min(K, cx.L - s); ++lag) accumulate(n.w().row(K - 1 - lag) + c0, x + (s + lag) * nc, ys, nc);
    }
  }
  static void accumulate(const T* w, const T* x, T* y, Index nc) {
    simd::for_packs<T>(nc, [&](auto v, Index j) {
      using P = simd::pack<T, decltype(v)::value>;
      fma(P::load(w + j), P::load(x + j), P::load(y + j)).store(y + j);
    });
  }
};

template <class T>
struct channel_eval<CausalConv<T>, T> {
  std::vector<T> taps;  // taps[lag] = w[K-1-lag, c]
  channel_eval(const CausalConv<T>& n, const context&, Index c) : taps(std::size_t(n.width())) {
    for (Index lag = 0; lag < n.width(); ++lag) taps[std::size_t(lag)] = n.tap(lag, c);
  }
  Index width() const { return Index(taps.size()); }
  T tap(Index lag) const { return taps[std::size_t(lag)]; }
  void block(Index i0, Index i1, Index j0, Index j1, tile<T> out) const {
    for (Index t = i0; t < i1; ++t)
      for (Index s = j0; s < j1; ++s) {
        const Index lag = t - s;
        out(t - i0, s - j0) = (lag >= 0 && lag < width()) ? tap(lag) : T(0);
      }
  }
};

}  // namespace iattn::cpu_detail
