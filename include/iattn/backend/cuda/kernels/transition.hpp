// iattn/backend/cuda/kernels/transition.hpp: the recurrence of a Transition (the delta-rule
// family: DeltaNet, Gated DeltaNet, KDA, RWKV-7, DeltaProduct), one kernel for apply, row, col and
// materialize. Per column j of the input (channel c = channel_of(j), head h) the state is the
// N-vector s (channel c's column of the head's N x P state), with
//   A_t = Diag(e^{lambda_t}) + sum_r b_{t,r} a_{t,r}^T,   A_t^T = Diag(e^{lambda_t}) + sum_r a_{t,r} b_{t,r}^T:
//   forward:     s = A_t s + k_t x_t;           y_t = q_t . s
//   transposed:  s += q_t x_t;  y_t = k_t . s;  s = A_t^T s      (tokens from the last)
// The transposed form follows from H^T[s, t] = k_s^T A_{s+1}^T ... A_t^T q_t: g_s = q_s x_s +
// A_{s+1}^T g_{s+1}, y_s = k_s . g_s. A_t s is e (.) s + sum_r b_r (a_r . s): every dot product of
// the step reads the state before the step. The exp arguments are log-decays (<= 0); a reset
// (lambda = -inf) multiplies by exactly 0. O(L N (R + 2)) per column, sequential over the tokens
// (transition_carry makes apply a chunked scan, below).
//
// The columns: apply scans the D channels of X (L, D); row and col one channel's vector (stride 1);
// materialize the identity (x null: column j's input is e_j, every column is channel `channel`), so
// column j of the result is H^c e_j, (L, L) row-major with zeros above the diagonal; a warp starts
// at its first column's token (the state is zero before it).
// The chunked apply (the columns of X, more than one chunk of C tokens): three passes, each
// parallel over the chunks as well as the columns:
//   1. transition_scan of every chunk from a zero state, its end state E_j (N per column), and of
//      the N unit states e_m of every head with no input: the chunk's transition product
//      Phi_j = A_{end} ... A_{first}, column m the end state of e_m;
//   2. transition_carry: per head, S_0 = 0, S_{j+1} = Phi_j S_j + E_j (N x P, one matrix product
//      per chunk, sequential over the chunks), S_j written over E_j;
//   3. transition_scan of every chunk from S_j, writing the outputs;
// in segments of chunks whose E_j and Phi_j fit a scratch budget (the state carried between them).
// The passes run the recurrence itself (the same products, exact for any coefficients: resets,
// growth, any rank), with (2P + N) N (R + 2) + N^2 P / C multiply-adds per token and head against
// P N (R + 2) in sequence; the sequential depth falls from L tokens to C tokens and L / C products.
//
// Threads: W lanes per column (a power of two <= 32, N <= W MS), MS states per lane in registers
// (4 or 8: few lanes, few shuffles; 16 spills at the 128-register floor), 32 / W columns per warp, transition_threads / W per block;
// each dot product is a warp_sum over the column's W lanes. Every lane of a warp takes part in every shuffle (columns past the end
// compute on zeros).
#pragma once

#include "../simt.hpp"

namespace iattn::cuda_detail {

inline constexpr unsigned transition_threads = 128;

/// A Transition's coefficients on the device (ops/transition.hpp's layout).
template <class T>
struct tr_view {
  const T* lambda;  // (L, H) or (L, H*N)
  const T *a, *b;   // (L, H*R*N)
  const T *q, *k;   // (L, H*N)
  simt::index L, H, P, N, R;
  bool per_key;

  IATTN_HOST_DEVICE simt::index head(simt::index c) const { return c / P; }
  IATTN_HOST_DEVICE T log_decay(simt::index t, simt::index h, simt::index m) const {
    return per_key ? lambda[(t * H + h) * N + m] : lambda[t * H + h];
  }
  /// Row t of a (or b) for head h and rank r: N values.
  IATTN_HOST_DEVICE const T* lowrank(const T* m, simt::index t, simt::index h, simt::index r) const {
    return m + ((t * H + h) * R + r) * N;
  }
};

template <class T>
struct tr_scan_args {
  tr_view<T> s;
  const T* x;           // (L, stride); null: the identity (column j's input is e_j)
  simt::index cols;     // the columns scanned: D (apply), 1 (row, col), a batch of L (materialize)
  simt::index col0;     // the first column's index in x and y
  simt::index stride;   // the row stride of x and y
  simt::index channel;  // < 0: column j is channel col0 + j; else every column is this channel
  unsigned lanes;       // W: threads per column, a power of two <= 32
  bool transposed;      // (H^c)^T: tokens from the last, q and k exchanged, A_t^T
  // The chunked apply's passes (blockIdx.y: the chunk; the defaults: one chunk of L tokens):
  simt::index chunk = 0;     // C, tokens per chunk (0: L)
  simt::index chunk0 = 0;    // the first chunk of this launch (blockIdx.y counts from it)
  const T* init = nullptr;   // (chunks, cols, N): the state entering each chunk (null: zero)
  T* fin = nullptr;          // (chunks, cols, N): the state after each chunk, or null
  bool unit_start = false;   // column j is head j / N's unit state e_{j % N}, no input (Phi)

  IATTN_HOST_DEVICE simt::index channel_of(simt::index j) const { return channel < 0 ? col0 + j : channel; }
  IATTN_HOST_DEVICE simt::index head_of(simt::index j) const {
    return unit_start ? j / s.N : s.head(channel_of(j));
  }
  IATTN_HOST_DEVICE T input(simt::index t, simt::index j) const {
    if (unit_start) return T(0);
    return x ? x[t * stride + col0 + j] : (t == col0 + j ? T(1) : T(0));
  }
};

template <class T, int MS>
IATTN_KERNEL IATTN_BOUNDS(transition_threads, 4) void transition_scan(tr_scan_args<T> a, T* y) {  // y (L, stride) or null
  const tr_view<T>& v = a.s;
  const unsigned W = a.lanes, tid = simt::thread_idx().x, lane = tid % W;
  const simt::index per_block = transition_threads / W;
  const simt::index j = simt::index(simt::block_idx().x) * per_block + tid / W;
  const bool valid = j < a.cols;
  const simt::index h = valid ? a.head_of(j) : 0, N = v.N, L = v.L;
  const simt::index C = a.chunk > 0 ? a.chunk : L, ch = simt::index(simt::block_idx().y);
  const simt::index first = (a.chunk0 + ch) * C, last = simt::min_of(L, first + C);  // this chunk's tokens
  // The warp's first column: forward over the identity, no state is non-zero before its token.
  const simt::index warp_first = simt::index(simt::block_idx().x) * per_block + (tid / simt::warp_size) * (simt::warp_size / W);
  const simt::index start =
      !a.x && !a.unit_start && !a.transposed ? simt::min_of(L, a.col0 + warp_first) : first;
  if (valid && y)
    for (simt::index t = first + lane; t < start; t += W) y[t * a.stride + a.col0 + j] = T(0);
  T st[MS], inc[MS];
  const simt::index at = (ch * a.cols + j) * N;  // this column's state in init and fin
  IATTN_UNROLL
  for (int u = 0; u < MS; ++u) {
    const simt::index m = lane + simt::index(u) * W;
    st[u] = !valid || m >= N ? T(0) : a.init ? a.init[at + m] : a.unit_start && m == j % N ? T(1) : T(0);
  }
  for (simt::index n = start; n < last; ++n) {
    const simt::index t = a.transposed ? L - 1 - n : n;
    const T xt = valid ? a.input(t, j) : T(0);
    const T* in = (a.transposed ? v.q : v.k) + (t * v.H + h) * N;   // the input's direction
    const T* out = (a.transposed ? v.k : v.q) + (t * v.H + h) * N;  // the output's
    T part = T(0);
    if (a.transposed) {
      IATTN_UNROLL
      for (int u = 0; u < MS; ++u) {
        const simt::index m = lane + simt::index(u) * W;
        if (valid && m < N) {
          st[u] += in[m] * xt;
          part += out[m] * st[u];
        }
      }
      const T yt = simt::warp_sum(part, int(W));
      if (valid && lane == 0 && y) y[t * a.stride + a.col0 + j] = yt;
    }
    // s = e (.) s + sum_r dir_r (other_r . s): forward dir = b, other = a; transposed the reverse.
    IATTN_UNROLL
    for (int u = 0; u < MS; ++u) inc[u] = T(0);
    for (simt::index r = 0; r < v.R; ++r) {
      const T* dot = v.lowrank(a.transposed ? v.b : v.a, t, h, r);
      const T* dir = v.lowrank(a.transposed ? v.a : v.b, t, h, r);
      T d = T(0);
      IATTN_UNROLL
      for (int u = 0; u < MS; ++u) {
        const simt::index m = lane + simt::index(u) * W;
        if (valid && m < N) d += dot[m] * st[u];
      }
      d = simt::warp_sum(d, int(W));
      IATTN_UNROLL
      for (int u = 0; u < MS; ++u) {
        const simt::index m = lane + simt::index(u) * W;
        if (valid && m < N) inc[u] += dir[m] * d;
      }
    }
    part = T(0);
    IATTN_UNROLL
    for (int u = 0; u < MS; ++u) {
      const simt::index m = lane + simt::index(u) * W;
      if (valid && m < N) {
        st[u] = simt::exp(v.log_decay(t, h, m)) * st[u] + inc[u];
        if (!a.transposed) {
          st[u] += in[m] * xt;
          part += out[m] * st[u];
        }
      }
    }
    if (!a.transposed) {
      const T yt = simt::warp_sum(part, int(W));
      if (valid && lane == 0 && y) y[t * a.stride + a.col0 + j] = a.x || t >= a.col0 + j ? yt : T(0);
    }
  }
  if (a.fin) {
    IATTN_UNROLL
    for (int u = 0; u < MS; ++u) {
      const simt::index m = lane + simt::index(u) * W;
      if (valid && m < N) a.fin[at + m] = st[u];
    }
  }
}

inline constexpr unsigned transition_carry_threads = 128;
inline constexpr simt::index transition_carry_cols = 8;  ///< value columns per block of transition_carry

/// Pass 2 of the chunked apply: for head blockIdx.y and its value columns p0 .. p0 + pc - 1
/// (p0 = blockIdx.x * transition_carry_cols), S_{j+1} = Phi_j S_j + E_j over a segment of chunks:
/// carried (D, N) holds the state entering the segment on entry and the state after it on return
/// (column c = h P + p, key m at [c N + m]); state (chunks, D, N) holds E_j on entry and S_j on
/// return (at [(j D + c) N + m]); phi (chunks, H N, N), Phi_j[m][m'] at [(j H + h) N + m') N + m].
/// Dynamic shared memory: two (pc, N) states.
template <class T>
IATTN_KERNEL IATTN_BOUNDS(transition_carry_threads, 2) void transition_carry(T* state, const T* phi, T* carried,
                                                                             simt::index chunks, simt::index H,
                                                                             simt::index P, simt::index N) {
  const simt::index h = simt::index(simt::block_idx().y), p0 = simt::index(simt::block_idx().x) * transition_carry_cols;
  const simt::index pc = simt::min_of(transition_carry_cols, P - p0), D = H * P, tid = simt::thread_idx().x;
  T* cur = simt::dynamic_shared<T>();  // (pc, N): S_j
  T* nxt = cur + transition_carry_cols * N;
  T* mine = carried + (h * P + p0) * N;  // this block's (pc, N) columns of the carried state
  for (simt::index e = tid; e < pc * N; e += transition_carry_threads) cur[e] = mine[e];
  simt::sync_threads();
  for (simt::index j = 0; j < chunks; ++j) {
    const T* ph = phi + (j * H + h) * N * N;
    for (simt::index e = tid; e < pc * N; e += transition_carry_threads) {
      const simt::index p = e / N, m = e % N, at = (j * D + h * P + p0 + p) * N + m;
      T s = state[at];  // E_j
      state[at] = cur[e];
      const T* sp = cur + p * N;
      for (simt::index k = 0; k < N; ++k) s += ph[k * N + m] * sp[k];
      nxt[e] = s;
    }
    simt::sync_threads();
    T* swap = cur;
    cur = nxt;
    nxt = swap;
  }
  for (simt::index e = tid; e < pc * N; e += transition_carry_threads) mine[e] = cur[e];
}

}  // namespace iattn::cuda_detail
