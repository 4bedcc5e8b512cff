// iattn/backend/cuda/kernels/flip.hpp: the token reversal J of Flip: out[r, k] = in[rows-1-r, k]
// for a row-major (rows, cols) array, grid-stride. Out of place one thread per entry; in place
// (in == out) one thread per pair of rows' entries, swapped. An (L, D) matrix reversed over tokens
// is reverse_rows(in, out, L, D); an (L, L) matrix turned into J M J (both axes reversed) is its
// flat array reversed, reverse_rows(m, m, L * L, 1).
#pragma once

#include "diagonal.hpp"

namespace iattn::cuda_detail {

template <class T>
IATTN_KERNEL IATTN_BOUNDS(elementwise_threads, 4) void reverse_rows(const T* in, T* out, simt::index rows,
                                                                    simt::index cols) {
  if (in == out) {
    simt::grid_stride((rows / 2) * cols, [&](simt::index i) {
      const simt::index r = i / cols, k = i - r * cols;
      T* a = out + r * cols + k;
      T* b = out + (rows - 1 - r) * cols + k;
      const T t = *a;
      *a = *b;
      *b = t;
    });
  } else {
    simt::grid_stride(rows * cols, [&](simt::index i) {
      const simt::index r = i / cols, k = i - r * cols;
      out[i] = in[(rows - 1 - r) * cols + k];
    });
  }
}

}  // namespace iattn::cuda_detail
