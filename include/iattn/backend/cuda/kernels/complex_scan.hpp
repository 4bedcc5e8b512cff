// iattn/backend/cuda/kernels/complex_scan.hpp: the chunked scan of a ComplexSemiseparable, one
// kernel set for apply, row, col and materialize. Per column j of the input and complex state m
// (channel c = channel_of(j), head h, group g), with e_t = exp(rho_t) (cos theta_t + i sin theta_t):
//   forward:     st = e_t st + in_t x_t;      y_t = Re sum_m out_t[m] st[m]         (in = B, out = C)
//   transposed:  st += in_t x_t;  y_t = Re sum_m out_t[m] st[m];  st = e_t st      (in = C, out = B)
// The transposed form walks the tokens from the last: H^T[s, t] = Re sum_m B_s E(s+1..t) C_t, so
// g_s = C_s x_s + e_{s+1} g_{s+1} and y_s = Re sum_m B_s g_s (no conjugate: the product of complex
// numbers commutes). In both a chunk multiplies the state entering it by the product of its tokens'
// decays, so three passes over chunks of `chunk` tokens in the step order:
//   cs_chunk_states   each chunk from st = 0: its end state e_j and its decay
//                     g_j = exp(sum rho) cis(sum theta) over the chunk's tokens (rho summed from the
//                     chunk's edge, <= 0; theta summed in double from the chunk's edge, then cos and
//                     sin in double: a chunk-relative angle, whatever L)
//   cs_chunk_carry    the state entering chunk j: s_0 = 0, s_{j+1} = g_j s_j + e_j (complex)
//   cs_chunk_outputs  each chunk again from s_j, y_t summed over the states (the lanes' shares
//                     reduced through shared memory, scan_slice tokens at a time)
// Every exp argument is one token's log-magnitude or a sum of them over a chunk (<= 0 when
// rho <= 0; rho = -inf is an exact reset), never a difference.
//
// The columns: apply scans the D channels of X (L, D); row and col one channel's vector (stride 1);
// materialize the identity (x null: column j's input is e_j, every column is channel `channel`), so
// column j of the result is H^c e_j, (L, L) row-major with zeros above the diagonal. A column's
// state is zero before its own token: those tokens are skipped (written as zeros), which halves
// materialize's work. Threads: the lane layout of semiseparable_scan.hpp (W lanes per column, a
// power of two, MS complex states per lane), grid (chunks, column blocks).
#pragma once

#include "semiseparable_scan.hpp"  // scan_slice, chunked_scan.hpp

namespace iattn::cuda_detail {

/// A ComplexSemiseparable's coefficients on the device (ops/complex_semiseparable.hpp's layout).
template <class T>
struct cs_view {
  const T* rho;    // (L or 1, H*N)
  const T* theta;  // (L or 1, H*N)
  const T *Br, *Bi, *Cr, *Ci;  // (L, G*N)
  simt::index L, H, P, G, N;
  bool rho_fixed, theta_fixed;  // one row for every token

  IATTN_HOST_DEVICE simt::index channels() const { return H * P; }
  IATTN_HOST_DEVICE simt::index head(simt::index c) const { return c / P; }
  IATTN_HOST_DEVICE simt::index group(simt::index h) const { return h / (H / G); }
  IATTN_HOST_DEVICE T log_mag(simt::index t, simt::index h, simt::index m) const {
    return rho[(rho_fixed ? 0 : t) * H * N + h * N + m];
  }
  IATTN_HOST_DEVICE T angle(simt::index t, simt::index h, simt::index m) const {
    return theta[(theta_fixed ? 0 : t) * H * N + h * N + m];
  }
};

template <class T>
struct cs_scan_args {
  cs_view<T> s;
  const T* x;            // (L, stride); null: the identity (column j's input is e_j)
  simt::index cols;      // the columns scanned: D (apply), 1 (row, col), a batch of L (materialize)
  simt::index col0;      // the first column's index in x and y (materialize's batches)
  simt::index stride;    // the row stride of x and y
  simt::index channel;   // < 0: column j is channel j; else every column is this channel
  simt::index chunk;     // tokens per chunk
  unsigned lanes;        // W: threads per column, a power of two dividing scan_threads
  bool transposed;       // (H^c)^T: tokens from the last, B and C exchanged, decay after the output

  // j below is a column of the launch, 0 <= j < cols; col0 + j its column in x and y.
  IATTN_HOST_DEVICE simt::index channel_of(simt::index j) const { return channel < 0 ? col0 + j : channel; }
  IATTN_HOST_DEVICE T input(simt::index t, simt::index j) const {
    return x ? x[t * stride + col0 + j] : (t == col0 + j ? T(1) : T(0));
  }
  /// The first token whose state can be non-zero: the column's own token for the identity, read
  /// forward.
  IATTN_HOST_DEVICE simt::index first(simt::index j) const { return x || transposed ? 0 : col0 + j; }
  /// Chunk k's tokens [t0, t1), walked up (forward) or down (transposed).
  IATTN_HOST_DEVICE void chunk_tokens(simt::index k, simt::index& t0, simt::index& t1) const {
    if (!transposed) {
      t0 = k * chunk;
      t1 = simt::min_of(s.L, t0 + chunk);
    } else {
      t1 = s.L - k * chunk;
      t0 = t1 > chunk ? t1 - chunk : 0;
    }
  }
};

/// e^{rho + i theta} = (re, im).
template <class T>
IATTN_DEVICE void cs_decay(T rho, T theta, T& re, T& im) {
  T sn, cs;
  simt::sincos(theta, sn, cs);
  const T mag = simt::exp(rho);
  re = mag * cs;
  im = mag * sn;
}

/// Where a thread of the scan kernels works: column j (valid when j < cols) and its channel's head
/// and group, its lane, chunk k's tokens [t0, t1).
struct cs_place {
  simt::index j, h, g, k, t0, t1;
  unsigned lane;
  bool valid;
};
template <class T>
IATTN_DEVICE cs_place cs_locate(const cs_scan_args<T>& a) {
  const unsigned tid = simt::thread_idx().x, per_block = scan_threads / a.lanes;
  cs_place p;
  p.j = simt::index(simt::block_idx().y) * per_block + tid / a.lanes;
  p.lane = tid % a.lanes;
  p.valid = p.j < a.cols;
  p.h = p.valid ? a.s.head(a.channel_of(p.j)) : 0;
  p.g = a.s.group(p.h);
  p.k = simt::block_idx().x;
  a.chunk_tokens(p.k, p.t0, p.t1);
  return p;
}

/// One step of state m at token t: st updated, the step's share of y_t returned.
template <class T>
IATTN_DEVICE T cs_step(const cs_scan_args<T>& a, simt::index t, simt::index h, simt::index g, simt::index m, T xt,
                       T& sr, T& si) {
  const cs_view<T>& s = a.s;
  const simt::index i = (t * s.G + g) * s.N + m;
  const T inr = (a.transposed ? s.Cr : s.Br)[i] * xt, ini = (a.transposed ? s.Ci : s.Bi)[i] * xt;
  const T outr = (a.transposed ? s.Br : s.Cr)[i], outi = (a.transposed ? s.Bi : s.Ci)[i];
  T er, ei;
  cs_decay(s.log_mag(t, h, m), s.angle(t, h, m), er, ei);
  if (!a.transposed) {
    const T nr = er * sr - ei * si + inr;
    si = er * si + ei * sr + ini;
    sr = nr;
    return outr * sr - outi * si;
  }
  sr += inr;
  si += ini;
  const T y = outr * sr - outi * si;
  const T nr = er * sr - ei * si;
  si = er * si + ei * sr;
  sr = nr;
  return y;
}

template <class T, int MS>
IATTN_KERNEL IATTN_BOUNDS(scan_threads, 4) void cs_chunk_states(cs_scan_args<T> a,
                                                                T* end_re, T* end_im,  // (chunks, cols, N)
                                                                T* dec_re, T* dec_im) {
  const cs_place p = cs_locate(a);
  if (!p.valid) return;  // no barrier in this kernel
  const simt::index N = a.s.N, from = a.first(p.j);
  T sr[MS], si[MS], rho[MS];
  double theta[MS];
  IATTN_UNROLL
  for (int q = 0; q < MS; ++q) sr[q] = si[q] = rho[q] = T(0), theta[q] = 0.0;
  for (simt::index n = 0; n < p.t1 - p.t0; ++n) {
    const simt::index t = a.transposed ? p.t1 - 1 - n : p.t0 + n;
    const bool live = t >= from;  // the identity's column j is zero before token j (forward only)
    const T xt = live ? a.input(t, p.j) : T(0);
    IATTN_UNROLL
    for (int q = 0; q < MS; ++q) {
      const simt::index m = p.lane + simt::index(q) * a.lanes;
      if (m < N) {
        if (live) (void)cs_step(a, t, p.h, p.g, m, xt, sr[q], si[q]);
        rho[q] += a.s.log_mag(t, p.h, m);
        theta[q] += double(a.s.angle(t, p.h, m));
      }
    }
  }
  IATTN_UNROLL
  for (int q = 0; q < MS; ++q) {
    const simt::index m = p.lane + simt::index(q) * a.lanes;
    if (m < N) {
      const simt::index i = (p.k * a.cols + p.j) * N + m;
      double sn, cs;
      simt::sincos(theta[q], sn, cs);
      const T mag = simt::exp(rho[q]);
      end_re[i] = sr[q];
      end_im[i] = si[q];
      dec_re[i] = mag * T(cs);
      dec_im[i] = mag * T(sn);
    }
  }
}

/// state (chunks, pairs), real and imaginary: e_j in, s_j out; decay (chunks, pairs): g_j. One
/// thread per (column, state) pair.
template <class T>
IATTN_KERNEL IATTN_BOUNDS(elementwise_threads, 4) void cs_chunk_carry(T* state_re, T* state_im, const T* dec_re,
                                                                      const T* dec_im, simt::index chunks,
                                                                      simt::index pairs) {
  simt::grid_stride(pairs, [&](simt::index p) {
    T sr = T(0), si = T(0);
    for (simt::index k = 0; k < chunks; ++k) {
      const simt::index i = k * pairs + p;
      const T er = state_re[i], ei = state_im[i], gr = dec_re[i], gi = dec_im[i];
      state_re[i] = sr;
      state_im[i] = si;
      const T nr = gr * sr - gi * si + er;
      si = gr * si + gi * sr + ei;
      sr = nr;
    }
  });
}

template <class T, int MS>
IATTN_KERNEL IATTN_BOUNDS(scan_threads, 4) void cs_chunk_outputs(cs_scan_args<T> a,
                                                                 const T* start_re,  // (chunks, cols, N): s_j
                                                                 const T* start_im,
                                                                 T* y) {             // (L, stride)
  IATTN_SHARED(T, part, [scan_slice][scan_threads]);  // part[i][tid]: tid's share of y at the slice's i-th step
  const cs_place p = cs_locate(a);
  const simt::index N = a.s.N, n_steps = p.t1 - p.t0, from = p.valid ? a.first(p.j) : 0;
  const unsigned tid = simt::thread_idx().x, W = a.lanes, per_block = scan_threads / W;
  T sr[MS], si[MS];
  IATTN_UNROLL
  for (int q = 0; q < MS; ++q) {
    const simt::index m = p.lane + simt::index(q) * W;
    const simt::index i = (p.k * a.cols + p.j) * N + m;
    sr[q] = p.valid && m < N ? start_re[i] : T(0);
    si[q] = p.valid && m < N ? start_im[i] : T(0);
  }
  for (simt::index ns = 0; ns < n_steps; ns += scan_slice) {
    const simt::index ne = simt::min_of(n_steps, ns + simt::index(scan_slice));
    for (simt::index n = ns; n < ne; ++n) {
      const simt::index t = a.transposed ? p.t1 - 1 - n : p.t0 + n;
      T acc = T(0);
      if (p.valid && t >= from) {
        const T xt = a.input(t, p.j);
        IATTN_UNROLL
        for (int q = 0; q < MS; ++q) {
          const simt::index m = p.lane + simt::index(q) * W;
          if (m < N) acc += cs_step(a, t, p.h, p.g, m, xt, sr[q], si[q]);
        }
      }
      part[n - ns][tid] = acc;
    }
    simt::sync_threads();
    // y at the slice's steps for the block's columns: the sum of the column's W shares.
    const simt::index outputs = (ne - ns) * per_block;
    for (simt::index o = tid; o < outputs; o += scan_threads) {
      const simt::index i = o / per_block, cc = o - i * per_block;
      const simt::index j = simt::index(simt::block_idx().y) * per_block + cc;
      if (j < a.cols) {
        T sum = T(0);
        for (unsigned l = 0; l < W; ++l) sum += part[i][cc * W + l];
        const simt::index n = ns + i, t = a.transposed ? p.t1 - 1 - n : p.t0 + n;
        y[t * a.stride + a.col0 + j] = sum;
      }
    }
    simt::sync_threads();
  }
}

}  // namespace iattn::cuda_detail
