// iattn/backend/cuda/kernels/chunked_scan.hpp: what the chunked scans (LinearRecurrence,
// Semiseparable) share: their block size, and their middle pass, chunk_carry. Each chunk j
// has been scanned from a zero state (its end state e_j) and knows its total decay g_j (the
// product of its decays: exp of the chunk's log-decay sum for Semiseparable, the running product
// for LinearRecurrence). The state entering chunk j is
//   s_0 = 0,  s_{j+1} = g_j s_j + e_j,
// one sequential pass over the chunks per independent state (channel, or channel and state index),
// written over e in place: afterwards state[j] holds s_j.
#pragma once

#include "diagonal.hpp"

namespace iattn::cuda_detail {

inline constexpr unsigned scan_threads = 128;    ///< threads per block of the per-chunk kernels
inline constexpr simt::index scan_chunk = 64;    ///< tokens per chunk

inline constexpr simt::index carry_batch = 8;  ///< chunks whose e_j, g_j chunk_carry loads together

/// state (chunks, pairs): e_j in, s_j out; decay (chunks, pairs): g_j. One thread per pair; the
/// loads of carry_batch chunks are issued before their dependent chain (their latency overlaps).
template <class T>
IATTN_KERNEL IATTN_BOUNDS(elementwise_threads, 4) void chunk_carry(T* state, const T* decay, simt::index chunks,
                                                                   simt::index pairs) {
  simt::grid_stride(pairs, [&](simt::index p) {
    T s = T(0);
    for (simt::index j0 = 0; j0 < chunks; j0 += carry_batch) {
      T e[carry_batch], g[carry_batch];
      IATTN_UNROLL
      for (simt::index u = 0; u < carry_batch; ++u) {
        const bool in = j0 + u < chunks;
        e[u] = in ? state[(j0 + u) * pairs + p] : T(0);
        g[u] = in ? decay[(j0 + u) * pairs + p] : T(0);
      }
      IATTN_UNROLL
      for (simt::index u = 0; u < carry_batch; ++u) {
        if (j0 + u < chunks) state[(j0 + u) * pairs + p] = s;
        s = g[u] * s + e[u];
      }
    }
  });
}

}  // namespace iattn::cuda_detail
