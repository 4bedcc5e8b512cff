// iattn/backend/cuda/kernels/band.hpp: one channel's banded factor B = diag(d) conv(w), the
// matrix B[u, v] = d_u w[K-1-(u-v), c] for 0 <= u - v < K (PyTorch's tap order, as CausalConv):
// a Diagonal is K = 1 without taps, a CausalConv has no d, Mamba's diag(dt) conv(w) has both.
//   band_materialize   out = B, (L, L), zeros outside the band
//   band_multiply      out = M B (right) or B M (left) for M (L, L):
//                        (M B)[t, s] = sum_{lag < K, s+lag < L} M[t, s+lag] d_{s+lag} w[K-1-lag]
//                        (B M)[t, s] = d_t sum_{lag < K, t-lag >= 0} w[K-1-lag] M[t-lag, s]
//                      for a lower-triangular M (lower = true) the sums stop at the diagonal
//                      (s+lag <= t, t-lag >= s): zeros above it, M's entries there never read;
//                      otherwise (a flipped factor) every entry. O(L^2 K) (K <= L); in place
//                      (in == out) only when K == 1
//   band_vector        y = B x (forward) or B^T x (transposed) for one channel's vector, O(L K)
// One thread per output entry, grid-stride.
#pragma once

#include "diagonal.hpp"

namespace iattn::cuda_detail {

template <class T>
struct band_factor {
  const T* d;          // (Ld, D) diagonal or null (ones); Ld = L, or 1 when constant over tokens
  simt::index d_rows;  // Ld
  const T* w;          // (K, D) taps or null (K = 1, tap 1)
  simt::index K, D, c; // width, channels of d and w (their row stride), the channel

  IATTN_HOST_DEVICE T diag(simt::index t) const { return d ? d[(d_rows == 1 ? 0 : t) * D + c] : T(1); }
  IATTN_HOST_DEVICE T tap(simt::index lag) const { return w ? w[(K - 1 - lag) * D + c] : T(1); }
};

template <class T>
IATTN_KERNEL IATTN_BOUNDS(elementwise_threads, 4) void band_materialize(band_factor<T> f, T* out, simt::index L) {
  simt::grid_stride(L * L, [&](simt::index i) {
    const simt::index t = i / L, lag = t - (i - t * L);
    out[i] = (lag >= 0 && lag < f.K) ? f.diag(t) * f.tap(lag) : T(0);
  });
}

template <class T>
IATTN_KERNEL IATTN_BOUNDS(elementwise_threads, 4) void band_multiply(band_factor<T> f, bool left, bool lower, const T* in,
                                                                     T* out, simt::index L) {
  simt::grid_stride(L * L, [&](simt::index i) {
    const simt::index t = i / L, s = i - t * L;
    // A lower-triangular M: the taps that meet its nonzeros (<= 0 above the diagonal); any other
    // M (a flipped factor): every tap inside the matrix.
    const simt::index lags = simt::min_of(f.K, lower ? t - s + 1 : (left ? t + 1 : L - s));
    T acc = T(0);
    if (left) {
      for (simt::index lag = 0; lag < lags; ++lag) acc += f.tap(lag) * in[(t - lag) * L + s];
      if (lags > 0) acc *= f.diag(t);
    } else {
      for (simt::index lag = 0; lag < lags; ++lag) acc += in[i + lag] * f.diag(s + lag) * f.tap(lag);
    }
    out[i] = acc;
  });
}

template <class T>
IATTN_KERNEL IATTN_BOUNDS(elementwise_threads, 4) void band_vector(band_factor<T> f, bool transposed, const T* x, T* y,
                                                                   simt::index L) {
  simt::grid_stride(L, [&](simt::index t) {
    T acc = T(0);
    if (transposed) {  // y_t = sum_lag B[t+lag, t] x_{t+lag}
      const simt::index lags = simt::min_of(f.K, L - t);
      for (simt::index lag = 0; lag < lags; ++lag) acc += f.diag(t + lag) * f.tap(lag) * x[t + lag];
    } else {           // y_t = d_t sum_lag w[K-1-lag] x_{t-lag}
      const simt::index lags = simt::min_of(f.K, t + 1);
      for (simt::index lag = 0; lag < lags; ++lag) acc += f.tap(lag) * x[t - lag];
      acc *= f.diag(t);
    }
    y[t] = acc;
  });
}

}  // namespace iattn::cuda_detail
