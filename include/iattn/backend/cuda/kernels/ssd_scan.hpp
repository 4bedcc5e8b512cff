// iattn/backend/cuda/kernels/ssd_scan.hpp: apply of a Semiseparable whose decay is one scalar per
// head and token (Mamba-2, RetNet, mLSTM-like; inclusive form) as chunked matrix products, the
// state-space-duality form. Chunks of ssd_chunk tokens, one block per (chunk, head); with E(a..b)
// the exp of the head's log-decay sum over tokens a..b (1 when empty) and x' = diag(in) x:
//   ssd_chunk_states   the chunk's end state from a zero start, an (N, P) matrix per head:
//                      e[m, p] = sum_s E(s+1..end) B_s[m] x'_s[p], and its total decay E(chunk)
//                      (broadcast over (m, p), for chunk_carry)
//   chunk_carry        the states entering each chunk (chunked_scan.hpp)
//   ssd_chunk_outputs  y_t[p] = out_t (sum_{s<=t} M[t, s] x'_s[p] + E(c0..t) sum_m C_t[m] S_in[m, p]),
//                      M[t, s] = (C_t . B_s) E(s+1..t) the chunk's (chunk, chunk) decayed Gram matrix in
//                      shared memory, shared by the head's P channels
// Every E is the exp of a sum over a range inside the chunk (at most ssd_chunk - 1 terms; never a
// difference), so lambda = -inf gives exact zeros. Work per chunk and head: O(Q^2 N) for M and
// O(Q (Q + N) P) for the outputs, against the per-channel scan's O(Q N P).
#pragma once

#include "chunked_scan.hpp"
#include "semiseparable_scan.hpp"  // ss_scan_args

namespace iattn::cuda_detail {

inline constexpr simt::index ssd_chunk = 64;     ///< tokens per chunk
inline constexpr unsigned ssd_threads = 256;     ///< threads per (chunk, head) block

/// state, decay: (chunks, H N P), entry (h N + m) P + p of chunk j's row. Grid (chunks, H).
template <class T>
IATTN_KERNEL IATTN_BOUNDS(ssd_threads, 2) void ssd_chunk_states(ss_scan_args<T> a, T* state, T* decay) {
  IATTN_SHARED(T, w, [ssd_chunk]);  // E(s+1 .. end) for the chunk's tokens s
  IATTN_SHARED(T, total, [1]);
  const auto& s = a.s;
  const simt::index j = simt::block_idx().x, h = simt::block_idx().y, g = s.group(h);
  const simt::index c0 = j * ssd_chunk, c1 = simt::min_of(s.L, c0 + ssd_chunk), n = c1 - c0;
  const unsigned tid = simt::thread_idx().x;
  for (simt::index u = tid; u <= n; u += ssd_threads) {
    T run = T(0);  // u < n: tokens c0+u+1 .. c1-1; u = n: the whole chunk
    for (simt::index v = (u < n ? c0 + u + 1 : c0); v < c1; ++v) run += s.log_decay(v, h, 0);
    if (u < n) w[u] = simt::exp(run);
    else total[0] = simt::exp(run);
  }
  simt::sync_threads();
  const simt::index N = s.N, P = s.P, pairs = s.H * N * P;
  for (simt::index i = tid; i < N * P; i += ssd_threads) {
    const simt::index m = i / P, p = i - m * P;
    T e = T(0);
    for (simt::index u = 0; u < n; ++u) e += w[u] * s.b(c0 + u, g, m) * a.input(c0 + u, h * P + p);
    state[j * pairs + h * N * P + i] = e;
    decay[j * pairs + h * N * P + i] = total[0];
  }
}

/// y (L, D): the chunk's outputs for the head's P channels, from the states entering each chunk.
/// Grid (chunks, H).
template <class T>
IATTN_KERNEL IATTN_BOUNDS(ssd_threads, 2) void ssd_chunk_outputs(ss_scan_args<T> a, const T* state, T* y) {
  IATTN_SHARED(T, M, [ssd_chunk][ssd_chunk + 1]);  // (C_t . B_s) E(s+1 .. t), s <= t
  IATTN_SHARED(T, lam, [ssd_chunk]);                // the chunk's log-decays
  IATTN_SHARED(T, into, [ssd_chunk]);               // E(c0 .. t)
  const auto& s = a.s;
  const simt::index j = simt::block_idx().x, h = simt::block_idx().y, g = s.group(h);
  const simt::index c0 = j * ssd_chunk, c1 = simt::min_of(s.L, c0 + ssd_chunk), n = c1 - c0;
  const simt::index N = s.N, P = s.P, pairs = s.H * N * P;
  const unsigned tid = simt::thread_idx().x;
  for (simt::index u = tid; u < n; u += ssd_threads) lam[u] = s.log_decay(c0 + u, h, 0);
  simt::sync_threads();
  for (simt::index u = tid; u < n; u += ssd_threads) {
    T run = T(0);
    for (simt::index v = 0; v <= u; ++v) run += lam[v];
    into[u] = simt::exp(run);
  }
  for (simt::index i = tid; i < n * n; i += ssd_threads) {
    const simt::index t = i / n, u = i - t * n;
    T v = T(0);
    if (u <= t) {
      T run = T(0);  // tokens u+1 .. t of the chunk
      for (simt::index k = u + 1; k <= t; ++k) run += lam[k];
      for (simt::index m = 0; m < N; ++m) v += s.c(c0 + t, g, m) * s.b(c0 + u, g, m);
      v *= simt::exp(run);
    }
    M[t][u] = v;
  }
  simt::sync_threads();
  for (simt::index i = tid; i < n * P; i += ssd_threads) {
    const simt::index t = i / P, p = i - t * P, c = h * P + p;
    T acc = T(0);
    for (simt::index u = 0; u <= t; ++u) acc += M[t][u] * a.input(c0 + u, c);
    if (j > 0) {
      T carried = T(0);
      for (simt::index m = 0; m < N; ++m) carried += s.c(c0 + t, g, m) * state[j * pairs + (h * N + m) * P + p];
      acc += into[t] * carried;
    }
    y[(c0 + t) * s.channels() + c] = a.output(acc, c0 + t, c);
  }
}

}  // namespace iattn::cuda_detail
