// iattn/backend/cuda/kernels/linear_recurrence.hpp: h_t = a_t h_{t-1} + b_t x_t, y_t = h_t per channel,
// as a chunked scan over chunks of `chunk` tokens:
//   lr_chunk_states   per (chunk, channel): the chunk scanned from h = 0 (end state e_j) and the
//                     running product of its decays g_j (no quotient, so a = 0 is an exact reset)
//   chunk_carry       (chunked_scan.hpp) the state entering each chunk
//   lr_chunk_outputs  per (chunk, channel): the chunk scanned again from its entering state, y = h
// One thread per channel (consecutive channels: coalesced rows), grid (chunks, channel blocks).
#pragma once

#include "chunked_scan.hpp"

namespace iattn::cuda_detail {

template <class T>
struct lr_args {
  const T* a;           // (L, D) decays, multiplied as given
  const T* b;           // (L, D) input scales
  const T* x;           // (L, D)
  simt::index L, D, chunk;
};

template <class T>
IATTN_KERNEL IATTN_BOUNDS(scan_threads, 8) void lr_chunk_states(lr_args<T> p,
                                                                T* end,     // (chunks, D): e_j
                                                                T* decay) { // (chunks, D): g_j
  const simt::index c = simt::index(simt::block_idx().y) * scan_threads + simt::thread_idx().x;
  if (c >= p.D) return;
  const simt::index j = simt::block_idx().x, t0 = j * p.chunk, t1 = simt::min_of(p.L, t0 + p.chunk);
  T h = T(0), g = T(1);
  for (simt::index t = t0; t < t1; ++t) {
    const T a = p.a[t * p.D + c];
    h = a * h + p.b[t * p.D + c] * p.x[t * p.D + c];
    g *= a;
  }
  end[j * p.D + c] = h;
  decay[j * p.D + c] = g;
}

template <class T>
IATTN_KERNEL IATTN_BOUNDS(scan_threads, 8) void lr_chunk_outputs(lr_args<T> p,
                                                                 const T* start,  // (chunks, D): s_j
                                                                 T* y) {          // (L, D)
  const simt::index c = simt::index(simt::block_idx().y) * scan_threads + simt::thread_idx().x;
  if (c >= p.D) return;
  const simt::index j = simt::block_idx().x, t0 = j * p.chunk, t1 = simt::min_of(p.L, t0 + p.chunk);
  T h = start[j * p.D + c];
  for (simt::index t = t0; t < t1; ++t) {
    h = p.a[t * p.D + c] * h + p.b[t * p.D + c] * p.x[t * p.D + c];
    y[t * p.D + c] = h;
  }
}

}  // namespace iattn::cuda_detail
