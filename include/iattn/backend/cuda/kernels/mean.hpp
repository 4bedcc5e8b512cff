// iattn/backend/cuda/kernels/mean.hpp: the channel means' accumulation: a channel's (L, L) matrix
// m added into the running mean, acc = (first ? 0 : acc) + scale * m (or scale * |m|), one thread
// per entry, grid-stride.
#pragma once

#include "diagonal.hpp"

namespace iattn::cuda_detail {

template <class T>
IATTN_KERNEL IATTN_BOUNDS(elementwise_threads, 4) void mean_accumulate(T* acc, const T* m, simt::index n, T scale,
                                                                       bool abs, bool first) {
  simt::grid_stride(n, [&](simt::index i) {
    const T v = abs && m[i] < T(0) ? -m[i] : m[i];
    acc[i] = first ? scale * v : acc[i] + scale * v;
  });
}

}  // namespace iattn::cuda_detail
