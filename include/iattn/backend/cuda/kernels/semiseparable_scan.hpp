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
  unsigned lanes;      // W: threads per channel, a power of two dividing scan_threads (lane layout)
  // Diagonals folded into the scan, y = diag(out_scale) S diag(in_scale) x (product.hpp): each
  // (rows, D) with rows = L, or 1 for a diagonal constant over tokens; null for none.
  const T* in_scale = nullptr;
  simt::index in_rows = 0;
  const T* out_scale = nullptr;
  simt::index out_rows = 0;

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
// block; grid (chunks, channel blocks). x, y and a per-channel decay are read coalesced, B_t and
// C_t are the same for every channel of a group (broadcast loads), and the outputs C_t . s_t are
// summed in the thread: no shared memory, no barrier. The decay's form is a template parameter:
// the factored decay keeps A's row in registers and multiplies it by dt_t (the chunk's log-decay
// sum is A times the sum of dt); a per-head decay takes one exp per token for all states. The
// chunk states have the lane layout's layout (chunks, D, N): chunk_carry is shared.
inline constexpr simt::index channel_scan_states = 16;  ///< the most states the channel layout holds
inline constexpr simt::index channel_scan_chunk = 32;   ///< its tokens per chunk

/// Minimum resident blocks per SM of the channel layout's kernels: 16 double states, their rates and
/// sums need more than 128 registers.
template <class T>
inline constexpr int channel_scan_min_blocks = sizeof(T) > 4 ? 2 : 4;

enum class ss_decay_form { factored, per_head, per_state };

/// One token's decay of state k, per form: log-decay and its exp.
template <class T, ss_decay_form F, int NS>
struct ss_token_decay {
  T l[NS], e[NS];
  IATTN_DEVICE void load(const ss_view<T>& s, simt::index t, simt::index h, const T (&rate)[NS]) {
    if constexpr (F == ss_decay_form::factored) {
      const T dt = s.lambda[t * s.H + h];
      IATTN_UNROLL
      for (int k = 0; k < NS; ++k) l[k] = dt * rate[k];
      IATTN_UNROLL
      for (int k = 0; k < NS; ++k) e[k] = k < s.N ? simt::exp(l[k]) : T(0);
    } else if constexpr (F == ss_decay_form::per_head) {
      const T lt = s.lambda[t * s.H + h], et = simt::exp(lt);
      IATTN_UNROLL
      for (int k = 0; k < NS; ++k) {
        l[k] = lt;
        e[k] = et;
      }
    } else {
      const T* row = s.lambda + (t * s.H + h) * s.N;
      IATTN_UNROLL
      for (int k = 0; k < NS; ++k) {
        l[k] = k < s.N ? row[k] : T(0);
        e[k] = k < s.N ? simt::exp(l[k]) : T(0);
      }
    }
  }
};

template <class T, ss_decay_form F, int NS>
IATTN_DEVICE void ss_channel_states_run(const ss_scan_args<T>& a, simt::index c, T* end, T* decay) {
  const ss_view<T>& s = a.s;
  const simt::index D = s.channels(), N = s.N, h = s.head(c), g = s.group(h), j = simt::block_idx().x;
  const simt::index t0 = j * a.chunk, t1 = simt::min_of(s.L, t0 + a.chunk);
  T st[NS], sum[NS], rate[NS];
  T dt_sum = T(0);  // the factored form's chunk sum: sum of dt (times A at the end)
  IATTN_UNROLL
  for (int k = 0; k < NS; ++k) {
    st[k] = sum[k] = T(0);
    rate[k] = F == ss_decay_form::factored && k < N ? s.A[h * N + k] : T(0);
  }
  for (simt::index t = t0; t < t1; ++t) {
    const T xt = a.input(t, c);
    const T* Bt = s.B + (t * s.G + g) * N;
    ss_token_decay<T, F, NS> d;
    d.load(s, t, h, rate);
    if constexpr (F == ss_decay_form::factored) dt_sum += s.lambda[t * s.H + h];
    IATTN_UNROLL
    for (int k = 0; k < NS; ++k) {
      if (k < N) {
        st[k] = d.e[k] * st[k] + Bt[k] * xt;
        if constexpr (F != ss_decay_form::factored) sum[k] += d.l[k];
      }
    }
  }
  IATTN_UNROLL
  for (int k = 0; k < NS; ++k) {
    if (k < N) {
      end[(j * D + c) * N + k] = st[k];
      decay[(j * D + c) * N + k] = simt::exp(F == ss_decay_form::factored ? dt_sum * rate[k] : sum[k]);
    }
  }
}

template <class T, ss_decay_form F, int NS>
IATTN_DEVICE void ss_channel_outputs_run(const ss_scan_args<T>& a, simt::index c, const T* start, T* y) {
  const ss_view<T>& s = a.s;
  const simt::index D = s.channels(), N = s.N, h = s.head(c), g = s.group(h), j = simt::block_idx().x;
  const simt::index t0 = j * a.chunk, t1 = simt::min_of(s.L, t0 + a.chunk);
  T st[NS], rate[NS], bonus[NS];
  IATTN_UNROLL
  for (int k = 0; k < NS; ++k) {
    st[k] = k < N ? start[(j * D + c) * N + k] : T(0);
    rate[k] = F == ss_decay_form::factored && k < N ? s.A[h * N + k] : T(0);
    bonus[k] = k < N ? s.bonus_of(h, k) : T(0);
  }
  for (simt::index t = t0; t < t1; ++t) {
    const T xt = a.input(t, c);
    const T* Bt = s.B + (t * s.G + g) * N;
    const T* Ct = s.C + (t * s.G + g) * N;
    ss_token_decay<T, F, NS> d;
    d.load(s, t, h, rate);
    T acc = T(0);
    IATTN_UNROLL
    for (int k = 0; k < NS; ++k) {
      if (k < N) {
        const T bx = Bt[k] * xt;
        if (s.strict) acc += Ct[k] * (st[k] + bonus[k] * bx);  // the state before token t
        st[k] = d.e[k] * st[k] + bx;
        if (!s.strict) acc += Ct[k] * st[k];
      }
    }
    y[t * D + c] = a.output(acc, t, c);
  }
}

/// e_j and g_j of each (chunk, channel), as ss_chunk_states in the lane layout.
template <class T, int NS>
IATTN_KERNEL IATTN_BOUNDS(scan_threads, channel_scan_min_blocks<T>) void ss_channel_states(ss_scan_args<T> a, T* end, T* decay) {
  const simt::index c = simt::index(simt::block_idx().y) * scan_threads + simt::thread_idx().x;
  if (c >= a.s.channels()) return;  // no barrier in this kernel
  if (a.s.A) ss_channel_states_run<T, ss_decay_form::factored, NS>(a, c, end, decay);
  else if (a.s.per_state) ss_channel_states_run<T, ss_decay_form::per_state, NS>(a, c, end, decay);
  else ss_channel_states_run<T, ss_decay_form::per_head, NS>(a, c, end, decay);
}

/// Each chunk's outputs from s_j, as ss_chunk_outputs in the lane layout.
template <class T, int NS>
IATTN_KERNEL IATTN_BOUNDS(scan_threads, channel_scan_min_blocks<T>) void ss_channel_outputs(ss_scan_args<T> a, const T* start, T* y) {
  const simt::index c = simt::index(simt::block_idx().y) * scan_threads + simt::thread_idx().x;
  if (c >= a.s.channels()) return;
  if (a.s.A) ss_channel_outputs_run<T, ss_decay_form::factored, NS>(a, c, start, y);
  else if (a.s.per_state) ss_channel_outputs_run<T, ss_decay_form::per_state, NS>(a, c, start, y);
  else ss_channel_outputs_run<T, ss_decay_form::per_head, NS>(a, c, start, y);
}

}  // namespace iattn::cuda_detail
