// iattn/backend/cuda/kernels/row_normalize.hpp: RowNormalize's elementwise passes, grid-stride,
// one thread per entry:
//   fill_value    v[i] = value                       (the ones that A is applied to: r = A 1)
//   divide_rows   out[i] = in[i] / r[i / cols]       (a (rows, cols) array divided row by row;
//                                                     cols = 1: entry by entry); in == out allowed
// A zero in r divides by zero (IEEE inf or nan), as the CPU backend and the layer itself do.
#pragma once

#include "diagonal.hpp"

namespace iattn::cuda_detail {

template <class T>
IATTN_KERNEL IATTN_BOUNDS(elementwise_threads, 4) void fill_value(T* v, simt::index n, T value) {
  simt::grid_stride(n, [&](simt::index i) { v[i] = value; });
}

template <class T>
IATTN_KERNEL IATTN_BOUNDS(elementwise_threads, 4) void divide_rows(const T* in, const T* r, T* out, simt::index n,
                                                                   simt::index cols) {
  simt::grid_stride(n, [&](simt::index i) { out[i] = in[i] / r[i / cols]; });
}

}  // namespace iattn::cuda_detail
