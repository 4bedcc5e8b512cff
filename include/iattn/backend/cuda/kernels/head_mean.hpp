// iattn/backend/cuda/kernels/head_mean.hpp: the channel means of terms whose core a head's channels
// share (docs/cuda.md, "Structured means"). A term w diag(P) Core_h diag(Q) [conv] has, over the
// channels c of [c0, c1) inside head h,
//   sum_c H^c[t, s] = sum_{lag < K, s + lag <= t} Core_h[t, s + lag] sum_c P[t, c] Q[s + lag, c] tap_c(lag),
// with tap_c(lag) = w[K - 1 - lag, c] (PyTorch tap order; 1 without a convolution): the head's core
// once (its (L, L) matrix, from the node's own materialize) and O(K (c1 - c0)) per entry, instead of
// each channel's (L, L) matrix. A term without a core is a band: Core = I. With abs (one term, no
// convolution) the sum is of |Core_h[t, s]| |P[t, c]| |Q[s, c]| = |H^c[t, s]|.
// head_mean_term adds scale times that sum into acc (or writes it: first), one thread per entry,
// grid-stride; entries above the diagonal get 0 (every core here is lower triangular).
#pragma once

#include "diagonal.hpp"

namespace iattn::cuda_detail {

/// The entrywise product of up to four (Ld, D) diagonals (Ld = L, or 1 for one constant over
/// tokens); none: ones.
template <class T>
struct diag_list {
  static constexpr int capacity = 4;
  const T* f[capacity] = {};
  simt::index rows[capacity] = {};
  int n = 0;
  IATTN_HOST_DEVICE T at(simt::index t, simt::index c, simt::index D) const {
    T v = T(1);
    for (int k = 0; k < n; ++k) v *= f[k][(rows[k] == 1 ? 0 : t) * D + c];
    return v;
  }
};

template <class T>
struct head_mean_args {
  const T* core;  // (L, L) the head's core, or null: the identity
  diag_list<T> post, pre;
  const T* w;  // (K, D) convolution taps, or null (K = 1, tap 1)
  simt::index K, L, D, c0, c1;
  T scale;
  bool abs;
  bool first;
};

template <class T>
IATTN_KERNEL IATTN_BOUNDS(elementwise_threads, 4) void head_mean_term(head_mean_args<T> a, T* acc) {
  simt::grid_stride(a.L * a.L, [&](simt::index i) {
    const simt::index t = i / a.L, s = i - t * a.L;
    T sum = T(0);
    const simt::index lags = simt::min_of(a.K, t - s + 1);  // <= 0 above the diagonal
    for (simt::index lag = 0; lag < lags; ++lag) {
      const simt::index u = s + lag;
      T core = a.core ? a.core[t * a.L + u] : T(t == u ? 1 : 0);
      if (a.abs && core < T(0)) core = -core;
      if (core == T(0)) continue;
      T inner = T(0);
      for (simt::index c = a.c0; c < a.c1; ++c) {
        const T p = a.post.at(t, c, a.D), q = a.pre.at(u, c, a.D);
        if (a.abs)
          inner += (p < T(0) ? -p : p) * (q < T(0) ? -q : q);
        else
          inner += p * q * (a.w ? a.w[(a.K - 1 - lag) * a.D + c] : T(1));
      }
      sum += core * inner;
    }
    acc[i] = a.first ? a.scale * sum : acc[i] + a.scale * sum;
  });
}

}  // namespace iattn::cuda_detail
