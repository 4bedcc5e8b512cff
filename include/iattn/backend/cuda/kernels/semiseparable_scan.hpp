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
// slice, none per token). This lane layout serves N > channel_scan_states; smaller states use the
// channel layout below (ss_channel_states / ss_channel_outputs: one thread per channel).
#pragma once

#include "chunked_scan.hpp"
#include "semiseparable_view.hpp"

#include <type_traits>

namespace iattn::cuda_detail {

inline constexpr unsigned scan_slice = 32;  ///< tokens whose outputs are reduced together

template <class T>
struct ss_scan_args {
  ss_view<T> s;
  const T* x;          // (L, D)
  simt::index chunk;   // tokens per chunk
  unsigned lanes;      // W: threads per channel, a power of two dividing scan_threads (lane layout)
  // Diagonals folded into the scan, y = diag(out_scale) S diag(in_scale) x (product.hpp): each
  // (rows, D) with rows = L, or 1 for a diagonal constant over tokens; null for none.
  const T* in_scale = nullptr;
  simt::index in_rows = 0;
  const T* out_scale = nullptr;
  simt::index out_rows = 0;
  bool vec4 = false;  // B, C (and a per-state lambda) rows are 16-byte aligned: float4 reads (channel layout)

  /// The scan's input at (t, c): x[t, c], times in_scale[t, c] when folded.
  IATTN_HOST_DEVICE T input(simt::index t, simt::index c) const {
    const simt::index D = s.channels();
    const T v = x[t * D + c];
    return in_scale ? v * in_scale[(in_rows == 1 ? 0 : t) * D + c] : v;
  }
  /// An output at (t, c), times out_scale[t, c] when folded.
  IATTN_HOST_DEVICE T output(T v, simt::index t, simt::index c) const {
    return out_scale ? v * out_scale[(out_rows == 1 ? 0 : t) * s.channels() + c] : v;
  }
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
    const T xt = a.input(t, p.c);
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
        const T xt = a.input(t, p.c);
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
        y[(ts + i) * D + c] = a.output(sum, ts + i, c);
      }
    }
    simt::sync_threads();
  }
}

// The channel layout, for N <= channel_scan_states (Mamba-1: N = 16): one thread per (chunk,
// channel) holding all of its NS >= N states in registers, scan_threads consecutive channels per
// block; grid (chunks, channel blocks). The outputs C_t . s_t are summed in the thread: no shared
// memory, no barrier. A thread's reads of x and of a per-channel decay scalar (dt, or a per-head
// lambda) are coalesced across the block and issued channel_scan_batch tokens at a time (their
// latency overlaps instead of stalling every token: 1.8x on an H200, performance.md); B_t, C_t (the
// same for every channel of a group) and a per-state lambda row are read as float4 where aligned.
// The decay's form is a template parameter: the factored decay keeps A's row in registers and
// multiplies it by dt_t (the chunk's log-decay sum is A times the sum of dt); a per-head decay
// takes one exp per token for all states. The chunk states have the lane layout's layout
// (chunks, D, N): chunk_carry is shared.
inline constexpr simt::index channel_scan_states = 16;  ///< the most states the channel layout holds
inline constexpr simt::index channel_scan_chunk = 64;   ///< its tokens per chunk

/// Tokens whose x and decay scalar a thread of the channel layout loads together, and the layout's
/// minimum resident blocks per SM: 16 states, their rates, B_t, C_t and a batch of 8 floats take
/// up to 168 registers (3 blocks of 128 threads per SM); double loads 4 at a time (2 blocks).
template <class T>
inline constexpr int channel_scan_batch = sizeof(T) > 4 ? 4 : 8;
template <class T>
inline constexpr int channel_scan_min_blocks = sizeof(T) > 4 ? 2 : 3;

enum class ss_decay_form { factored, per_head, per_state };

/// r[k] = p[k] for k < N, 0 after: float4 loads when vec (p 16-byte aligned, N a multiple of 4).
template <class T, int NS>
IATTN_DEVICE void ss_load_states(const T* p, simt::index N, bool vec, T (&r)[NS]) {
#if defined(__CUDACC__)
  if constexpr (std::is_same_v<T, float> && NS % 4 == 0) {
    if (vec) {
      IATTN_UNROLL
      for (int q = 0; q < NS / 4; ++q) {
        const float4 v = 4 * q < N ? reinterpret_cast<const float4*>(p)[q] : make_float4(0.f, 0.f, 0.f, 0.f);
        r[4 * q] = v.x;
        r[4 * q + 1] = v.y;
        r[4 * q + 2] = v.z;
        r[4 * q + 3] = v.w;
      }
      return;
    }
  }
#endif
  (void)vec;
  IATTN_UNROLL
  for (int k = 0; k < NS; ++k) r[k] = k < N ? p[k] : T(0);
}

/// One chunk of one channel: Out = false scans from a zero state and writes e_j and g_j (state,
/// decay); Out = true scans from s_j (state) and writes the chunk's outputs (y).
template <class T, ss_decay_form F, int NS, bool Out, bool Strict>
IATTN_DEVICE void ss_channel_run(const ss_scan_args<T>& a, simt::index c, T* state, T* decay, T* y) {
  const ss_view<T>& s = a.s;
  const simt::index D = s.channels(), N = s.N, H = s.H, h = s.head(c), g = s.group(h), j = simt::block_idx().x;
  const simt::index t0 = j * a.chunk, t1 = simt::min_of(s.L, t0 + a.chunk);
  constexpr bool scalar_decay = F != ss_decay_form::per_state;  // dt or a per-head lambda per token
  T st[NS], rate[NS], bonus[NS], sum[NS];
  T scalar_sum = T(0);  // the chunk's sum of the decay scalar (factored: times A at the end)
  IATTN_UNROLL
  for (int k = 0; k < NS; ++k) {
    st[k] = Out && k < N ? state[(j * D + c) * N + k] : T(0);
    rate[k] = F == ss_decay_form::factored && k < N ? s.A[h * N + k] : T(0);
    bonus[k] = Out && Strict && k < N ? s.bonus_of(h, k) : T(0);
    sum[k] = T(0);
  }
  for (simt::index tb = t0; tb < t1; tb += channel_scan_batch<T>) {
    T xb[channel_scan_batch<T>], sb[channel_scan_batch<T>];
    const int valid = int(simt::min_of(t1 - tb, simt::index(channel_scan_batch<T>)));
    const T* xp = a.x + tb * D + c;
    const T* lp = s.lambda + tb * H + h;
    IATTN_UNROLL
    for (int u = 0; u < channel_scan_batch<T>; ++u) {  // independent loads, all in flight together
      const int v = u < valid ? u : valid - 1;
      xb[u] = xp[v * D];
      sb[u] = scalar_decay ? lp[v * H] : T(0);
    }
    if (a.in_scale) {
      const T* ip = a.in_scale + (a.in_rows == 1 ? 0 : tb * D) + c;
      const simt::index step = a.in_rows == 1 ? 0 : D;
      IATTN_UNROLL
      for (int u = 0; u < channel_scan_batch<T>; ++u) xb[u] *= ip[(u < valid ? u : valid - 1) * step];
    }
    IATTN_UNROLL
    for (int u = 0; u < channel_scan_batch<T>; ++u) {
      const simt::index t = tb + u;
      if (t >= t1) break;
      T l[NS], e[NS], b[NS];
      if constexpr (F == ss_decay_form::factored) {
        IATTN_UNROLL
        for (int k = 0; k < NS; ++k) {
          l[k] = sb[u] * rate[k];
          e[k] = simt::exp(l[k]);
        }
      } else if constexpr (F == ss_decay_form::per_head) {
        const T et = simt::exp(sb[u]);
        IATTN_UNROLL
        for (int k = 0; k < NS; ++k) {
          l[k] = sb[u];
          e[k] = et;
        }
      } else {
        ss_load_states<T, NS>(s.lambda + (t * H + h) * N, N, a.vec4, l);
        IATTN_UNROLL
        for (int k = 0; k < NS; ++k) e[k] = simt::exp(l[k]);
      }
      ss_load_states<T, NS>(s.B + (t * s.G + g) * N, N, a.vec4, b);
      if constexpr (Out) {
        T cv[NS];
        ss_load_states<T, NS>(s.C + (t * s.G + g) * N, N, a.vec4, cv);
        T acc = T(0);
        IATTN_UNROLL
        for (int k = 0; k < NS; ++k) {
          if (k < N) {
            const T bx = b[k] * xb[u];
            if constexpr (Strict) acc += cv[k] * (st[k] + bonus[k] * bx);  // the state before token t
            st[k] = e[k] * st[k] + bx;
            if constexpr (!Strict) acc += cv[k] * st[k];
          }
        }
        y[t * D + c] = a.output(acc, t, c);
      } else {
        scalar_sum += sb[u];
        IATTN_UNROLL
        for (int k = 0; k < NS; ++k) {
          if (k < N) {
            st[k] = e[k] * st[k] + b[k] * xb[u];
            if constexpr (!scalar_decay) sum[k] += l[k];
          }
        }
      }
    }
  }
  if constexpr (!Out) {
    IATTN_UNROLL
    for (int k = 0; k < NS; ++k) {
      if (k < N) {
        const T total = F == ss_decay_form::factored ? scalar_sum * rate[k]
                        : F == ss_decay_form::per_head ? scalar_sum
                                                       : sum[k];
        state[(j * D + c) * N + k] = st[k];
        decay[(j * D + c) * N + k] = simt::exp(total);
      }
    }
  }
}

/// e_j and g_j of each (chunk, channel), as ss_chunk_states in the lane layout. One kernel per decay
/// form F (the host picks it, semiseparable.hpp): each is allocated the registers its form needs.
template <class T, int NS, ss_decay_form F>
IATTN_KERNEL IATTN_BOUNDS(scan_threads, channel_scan_min_blocks<T>) void ss_channel_states(ss_scan_args<T> a, T* end,
                                                                                          T* decay) {
  const simt::index c = simt::index(simt::block_idx().y) * scan_threads + simt::thread_idx().x;
  if (c >= a.s.channels()) return;  // no barrier in this kernel
  ss_channel_run<T, F, NS, false, false>(a, c, end, decay, nullptr);
}

/// Each chunk's outputs from s_j, as ss_chunk_outputs in the lane layout; one kernel per decay form,
/// the strict form dispatched inside.
template <class T, int NS, ss_decay_form F>
IATTN_KERNEL IATTN_BOUNDS(scan_threads, channel_scan_min_blocks<T>) void ss_channel_outputs(ss_scan_args<T> a,
                                                                                           const T* start, T* y) {
  const simt::index c = simt::index(simt::block_idx().y) * scan_threads + simt::thread_idx().x;
  if (c >= a.s.channels()) return;
  T* from = const_cast<T*>(start);  // only read when Out
  if (a.s.strict) ss_channel_run<T, F, NS, true, true>(a, c, from, nullptr, y);
  else ss_channel_run<T, F, NS, true, false>(a, c, from, nullptr, y);
}

}  // namespace iattn::cuda_detail
