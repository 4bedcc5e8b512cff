// iattn/backend/cuda/kernels/copy.hpp: copy_strided, dst[i * stride] = src[i] for i < n, grid-stride,
// one thread per entry: a vector into a column (stride = the row length) or a row (stride 1) of a
// row-major tile (block, cuda.hpp).
#pragma once

#include "diagonal.hpp"

namespace iattn::cuda_detail {

template <class T>
IATTN_KERNEL IATTN_BOUNDS(elementwise_threads, 4) void copy_strided(const T* src, simt::index n, T* dst,
                                                                    simt::index stride) {
  simt::grid_stride(n, [&](simt::index i) { dst[i * stride] = src[i]; });
}

}  // namespace iattn::cuda_detail
