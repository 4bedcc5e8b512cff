// iattn/backend/cuda/kernels/semiseparable_scan.hpp: apply of a Semiseparable as a chunked scan.
// Per channel c (head h, group g) and state m, with s the state (N values per channel):
//   inclusive:  s_t = exp(lambda_t) s_{t-1} + B_t x_t[c],   y_t[c] = C_t . s_t
//   strict:     y_t[c] = C_t . (s_{t-1} + bonus_h * B_t x_t[c]),  s_t as above
// Three passes over chunks of `chunk` tokens:
//   ss_chunk_states   each chunk scanned from s = 0: its end state e_j, and its decay
//                     g_j = exp(sum of the chunk's log-decays) (a sum from the chunk's edge, <= 0)
//   chunk_carry       (chunked_scan.hpp) s_j, the state entering chunk j
//   ss_chunk_outputs  each chunk scanned again from s_j, y_t = C_t . s_t summed over the states
// Every exp argument is one token's log-decay or a sum of them over a chunk: never positive when
// lambda <= 0, never a difference (lambda = -inf is an exact reset).
//
// Threads: W = lanes per channel (a power of two, N <= W MS), MS states per thread (template:
// registers), scan_threads / W channels per block; grid (chunks, channel blocks). The outputs
// reduce the W lanes' shares through shared memory, scan_slice tokens at a time (two barriers per
// slice, none per token).
#pragma once

#include "chunked_scan.hpp"
#include "semiseparable_view.hpp"

namespace iattn::cuda_detail {

inline constexpr unsigned scan_slice = 32;  ///< tokens whose outputs are reduced together

template <class T>
struct ss_scan_args {
  ss_view<T> s;
  const T* x;          // (L, D)
  simt::index chunk;   // tokens per chunk
  unsigned lanes;      // W: threads per channel, a power of two dividing scan_threads
};

/// Where a thread of the scan kernels works: channel c (valid when c < D), its lane in the
/// channel, the channel's head and group, and the chunk's tokens [t0, t1).
struct ss_place {
  simt::index c, h, g, t0, t1, j;
  unsigned lane;
  bool valid;
};
template <class T>
IATTN_DEVICE ss_place ss_locate(const ss_scan_args<T>& a) {
  const unsigned tid = simt::thread_idx().x, per_block = scan_threads / a.lanes;
  ss_place p;
  p.c = simt::index(simt::block_idx().y) * per_block + tid / a.lanes;
  p.lane = tid % a.lanes;
  p.valid = p.c < a.s.channels();
  p.h = p.valid ? a.s.head(p.c) : 0;
  p.g = a.s.group(p.h);
  p.j = simt::block_idx().x;
  p.t0 = p.j * a.chunk;
  p.t1 = simt::min_of(a.s.L, p.t0 + a.chunk);
  return p;
}

template <class T, int MS>
IATTN_KERNEL IATTN_BOUNDS(scan_threads, 4) void ss_chunk_states(ss_scan_args<T> a,
                                                                T* end,     // (chunks, D, N): e_j
                                                                T* decay) { // (chunks, D, N): g_j
  const ss_place p = ss_locate(a);
  if (!p.valid) return;  // no barrier in this kernel
  const ss_view<T>& s = a.s;
  const simt::index D = s.channels(), N = s.N;
  T st[MS], sum[MS];
  IATTN_UNROLL
  for (int k = 0; k < MS; ++k) st[k] = sum[k] = T(0);
  for (simt::index t = p.t0; t < p.t1; ++t) {
    const T xt = a.x[t * D + p.c];
    IATTN_UNROLL
    for (int k = 0; k < MS; ++k) {
      const simt::index m = p.lane + simt::index(k) * a.lanes;
      if (m < N) {
        const T l = s.log_decay(t, p.h, m);
        st[k] = simt::exp(l) * st[k] + s.b(t, p.g, m) * xt;
        sum[k] += l;
      }
    }
  }
  IATTN_UNROLL
  for (int k = 0; k < MS; ++k) {
    const simt::index m = p.lane + simt::index(k) * a.lanes;
    if (m < N) {
      end[(p.j * D + p.c) * N + m] = st[k];
      decay[(p.j * D + p.c) * N + m] = simt::exp(sum[k]);
    }
  }
}

template <class T, int MS>
IATTN_KERNEL IATTN_BOUNDS(scan_threads, 4) void ss_chunk_outputs(ss_scan_args<T> a,
                                                                 const T* start,  // (chunks, D, N): s_j
                                                                 T* y) {          // (L, D)
  IATTN_SHARED(T, part, [scan_slice][scan_threads]);  // part[i][tid]: tid's share of y[t + i, its channel]
  const ss_place p = ss_locate(a);
  const ss_view<T>& s = a.s;
  const simt::index D = s.channels(), N = s.N;
  const unsigned tid = simt::thread_idx().x, W = a.lanes, per_block = scan_threads / W;
  T st[MS];
  IATTN_UNROLL
  for (int k = 0; k < MS; ++k) {
    const simt::index m = p.lane + simt::index(k) * W;
    st[k] = p.valid && m < N ? start[(p.j * D + p.c) * N + m] : T(0);
  }
  for (simt::index ts = p.t0; ts < p.t1; ts += scan_slice) {
    const simt::index te = simt::min_of(p.t1, ts + simt::index(scan_slice));
    for (simt::index t = ts; t < te; ++t) {
      T acc = T(0);
      if (p.valid) {
        const T xt = a.x[t * D + p.c];
        IATTN_UNROLL
        for (int k = 0; k < MS; ++k) {
          const simt::index m = p.lane + simt::index(k) * W;
          if (m < N) {
            const T bx = s.b(t, p.g, m) * xt, cm = s.c(t, p.g, m);
            if (s.strict) acc += cm * (st[k] + s.bonus_of(p.h, m) * bx);  // the state before token t
            st[k] = simt::exp(s.log_decay(t, p.h, m)) * st[k] + bx;
            if (!s.strict) acc += cm * st[k];
          }
        }
      }
      part[t - ts][tid] = acc;
    }
    simt::sync_threads();
    // y[t, c] for the slice's tokens and the block's channels: the sum of the channel's W shares.
    const simt::index outputs = (te - ts) * per_block;
    for (simt::index o = tid; o < outputs; o += scan_threads) {
      const simt::index i = o / per_block, cc = o - i * per_block;
      const simt::index c = simt::index(simt::block_idx().y) * per_block + cc;
      if (c < D) {
        T sum = T(0);
        for (unsigned l = 0; l < W; ++l) sum += part[i][cc * W + l];
        y[(ts + i) * D + c] = sum;
      }
    }
    simt::sync_threads();
  }
}

}  // namespace iattn::cuda_detail
