// iattn/backend/cuda/kernels/diagonal.hpp: y = diag(d) x for every channel: y[t, c] = d[t, c] x[t, c],
// one thread per entry, grid-stride.
#pragma once

#include "../simt.hpp"

namespace iattn::cuda_detail {

/// Threads per block of the elementwise kernels (diagonal, causal convolution, chunk carry).
inline constexpr unsigned elementwise_threads = 256;

template <class T>
struct diagonal_args {
  const T* d;            // (Ld, D): Ld = L, or 1 for a diagonal constant over tokens
  simt::index d_rows;    // Ld
  const T* x;            // (L, D)
  T* y;                  // (L, D)
  simt::index L, D;
};

template <class T>
IATTN_KERNEL IATTN_BOUNDS(elementwise_threads, 4) void diagonal_apply(diagonal_args<T> a) {
  simt::grid_stride(a.L * a.D, [&](simt::index i) {
    const simt::index t = i / a.D, c = i - t * a.D;
    a.y[i] = a.d[(a.d_rows == 1 ? 0 : t) * a.D + c] * a.x[i];
  });
}

}  // namespace iattn::cuda_detail
