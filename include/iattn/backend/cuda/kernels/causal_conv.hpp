// iattn/backend/cuda/kernels/causal_conv.hpp: the depthwise causal convolution in PyTorch's tap order,
//   y[t, c] = sum_{k < K, t-K+1+k >= 0} w[k, c] x[t-K+1+k, c],
// one thread per output entry, grid-stride, O(K) reads each (short and long kernels alike).
#pragma once

#include "diagonal.hpp"

namespace iattn::cuda_detail {

template <class T>
struct causal_conv_args {
  const T* w;           // (K, D) taps
  simt::index K;
  const T* x;           // (L, D)
  T* y;                 // (L, D)
  simt::index L, D;
};

template <class T>
IATTN_KERNEL IATTN_BOUNDS(elementwise_threads, 4) void causal_conv_apply(causal_conv_args<T> a) {
  simt::grid_stride(a.L * a.D, [&](simt::index i) {
    const simt::index t = i / a.D, c = i - t * a.D;
    const simt::index k0 = a.K - 1 - t > 0 ? a.K - 1 - t : 0;  // taps before token 0 read zeros
    T acc = T(0);
    for (simt::index k = k0; k < a.K; ++k) acc += a.w[k * a.D + c] * a.x[(t - a.K + 1 + k) * a.D + c];
    a.y[i] = acc;
  });
}

}  // namespace iattn::cuda_detail
