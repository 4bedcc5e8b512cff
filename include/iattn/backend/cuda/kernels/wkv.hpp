// iattn/backend/cuda/kernels/wkv.hpp: RWKV's normalised WKV matrix (ops/wkv.hpp) on the device,
// in the log domain with running maxima, as the CPU backend evaluates it (no positive exp
// argument; keys of any spread):
//   score[t, s] = sum_{r=s+1..t-1} w_r + k_s (s < t),  score[t, t] = u + k_t,
//   H[t, s] = exp(score[t, s] - ell_t),  ell_t = log sum_{s<=t} exp(score[t, s]).
//   wkv_scan        one thread per channel, tokens in order: the state of the tokens before t,
//                   a = sum_{s<t} e^{score'[t,s] - m} x_s and b = the same without x (score'
//                   without the bonus), rescaled at each step to the running maximum m; then
//                   y_t = (e^{m-q} a + e^{u+k_t-q} x_t) / (e^{m-q} b + e^{u+k_t-q}), q = max(m, u+k_t),
//                   and ell_t = q + log(e^{m-q} b + e^{u+k_t-q}). Either output may be null.
//   chunked apply   (more than one chunk of C tokens) three passes: wkv_scan of every (chunk,
//                   channel) from an empty state, its end state (m, a, b) and the chunk's decay
//                   sum W_j (chunk-relative); wkv_carry, per channel in chunk order, the state
//                   entering each chunk, s_{j+1} = (s_j with its maximum raised by W_j) merged with
//                   e_j, both referred to the larger maximum (exp arguments <= 0); wkv_scan of every
//                   chunk from s_j, writing y.
//   wkv_transposed  one thread: y_s = sum_{t>=s} H[t, s] x_t for one channel (a row of H), from
//                   the ell_t of wkv_scan, last token first: g_s = sum_{t>s} e^{sum_{r=s+1..t-1} w_r
//                   - ell_t} x_t kept as a value and a log-scale
//   wkv_materialize one thread per column s, tokens t = s..L-1 in order (the decay sum grows one
//                   term per step, from s: no cancellation), zeros above the diagonal
#pragma once

#include "diagonal.hpp"

#include <cmath>

namespace iattn::cuda_detail {

template <class T>
struct wkv_args {
  const T* w;               // (Lw, D) log-decays, Lw = L or 1
  simt::index w_rows;
  const T* k;               // (L, D) log-weights of the keys
  const T* u;               // (1, D) log-bonus
  simt::index D;            // the coefficients' channels (their row stride)
  simt::index L;
  IATTN_HOST_DEVICE T decay(simt::index t, simt::index c) const { return w[(w_rows == 1 ? 0 : t) * D + c]; }
};

template <class T>
IATTN_HOST_DEVICE inline T wkv_exp(T v) {  // exp of a non-positive argument (-inf gives 0)
  return simt::exp(v);
}

/// The chunked apply's states: (chunks, nc) arrays of the running maximum m, the sums a (num) and
/// b (den) referred to it, and the chunk's decay sum W (written by the first pass only).
template <class T>
struct wkv_states {
  T *m, *num, *den, *wsum;
};

/// Channels c0 .. c0 + nc - 1; x and y (L, nc) with row stride `stride` (D for apply, 1 for one
/// channel's vector; y may be null); ell (L) for nc = 1, or null. Chunked (chunk > 0 and shorter
/// than L): one thread per (chunk, channel), the chunk's tokens only, from init's state (init.m
/// null: empty) into fin's (fin.m null: not kept).
template <class T>
IATTN_KERNEL IATTN_BOUNDS(elementwise_threads, 4) void wkv_scan(wkv_args<T> a, simt::index c0, simt::index nc,
                                                                const T* x, simt::index stride, T* y, T* ell,
                                                                simt::index chunk, wkv_states<T> init,
                                                                wkv_states<T> fin) {
  const simt::index C = chunk > 0 ? chunk : a.L, chunks = (a.L + C - 1) / C;
  simt::grid_stride(nc * chunks, [&](simt::index i) {
    const simt::index j = i % nc, ch = i / nc, c = c0 + j;
    const T neg_inf = -T(INFINITY);
    T m = init.m ? init.m[i] : neg_inf, num = init.m ? init.num[i] : T(0), den = init.m ? init.den[i] : T(0);
    T wsum = T(0);
    const simt::index last = simt::min_of(a.L, ch * C + C);
    for (simt::index t = ch * C; t < last; ++t) {
      const T kt = a.k[t * a.D + c], bonus = a.u[c] + kt;
      const T xt = x ? x[t * stride + j] : T(0);
      const T q = m > bonus ? m : bonus;
      const T e1 = m == neg_inf ? T(0) : wkv_exp(m - q), e2 = wkv_exp(bonus - q);
      const T d = e1 * den + e2;
      if (y) y[t * stride + j] = (e1 * num + e2 * xt) / d;
      if (ell) ell[t] = q + std::log(d);
      // the state for t + 1: every earlier score gains w_t, and token t joins with score k_t
      const T wt = a.decay(t, c), mw = m + wt;
      wsum += wt;
      const T m2 = mw > kt ? mw : kt;
      const T f1 = (m == neg_inf || mw == neg_inf) ? T(0) : wkv_exp(mw - m2), f2 = wkv_exp(kt - m2);
      num = f1 * num + f2 * xt;
      den = f1 * den + f2;
      m = m2;
    }
    if (fin.m) {
      fin.m[i] = m;
      fin.num[i] = num;
      fin.den[i] = den;
      fin.wsum[i] = wsum;
    }
  });
}

/// Pass 2 of the chunked apply: per channel j < nc, the state entering each chunk, written over
/// the chunk's own end state (s.m, s.num, s.den; s.wsum read): s_0 empty, s_{j+1} = s_j with
/// every score raised by W_j, merged with e_j.
template <class T>
IATTN_KERNEL IATTN_BOUNDS(elementwise_threads, 4) void wkv_carry(wkv_states<T> s, simt::index chunks, simt::index nc) {
  simt::grid_stride(nc, [&](simt::index j) {
    const T neg_inf = -T(INFINITY);
    T m = neg_inf, num = T(0), den = T(0);
    for (simt::index ch = 0; ch < chunks; ++ch) {
      const simt::index i = ch * nc + j;
      const T me = s.m[i], ne = s.num[i], de = s.den[i];
      s.m[i] = m;
      s.num[i] = num;
      s.den[i] = den;
      const T mw = m == neg_inf ? neg_inf : m + s.wsum[i];  // -inf stays (no -inf + inf)
      const T top = mw > me ? mw : me;
      if (top == neg_inf) {  // both empty (or every score reset)
        m = neg_inf;
        num = den = T(0);
        continue;
      }
      const T f1 = mw == neg_inf ? T(0) : wkv_exp(mw - top), f2 = me == neg_inf ? T(0) : wkv_exp(me - top);
      num = f1 * num + f2 * ne;
      den = f1 * den + f2 * de;
      m = top;
    }
  });
}

/// One channel's transposed vector: y_s = sum_{t>=s} H[t, s] x_t.
template <class T>
IATTN_KERNEL IATTN_BOUNDS(elementwise_threads, 4) void wkv_transposed(wkv_args<T> a, simt::index c, const T* ell,
                                                                      const T* x, T* y) {
  if (simt::block_idx().x != 0 || simt::thread_idx().x != 0) return;
  const T neg_inf = -T(INFINITY);
  T g = T(0), gamma = neg_inf;  // g_s e^{gamma}: sum_{t>s} e^{sum_{r=s+1..t-1} w_r - ell_t} x_t
  for (simt::index s = a.L - 1; s >= 0; --s) {
    const T ks = a.k[s * a.D + c];
    T out = wkv_exp(a.u[c] + ks - ell[s]) * x[s];
    if (gamma != neg_inf) out += g * simt::exp(ks + gamma);  // e^{k_s + gamma} g (k_s + gamma <= 0: H <= 1)
    y[s] = out;
    // g_{s-1}: token s joins (e^{-ell_s} x_s), the rest gain w_s
    const T p = -ell[s], r = gamma == neg_inf ? neg_inf : a.decay(s, c) + gamma;
    const T top = p > r ? p : r;
    if (top == neg_inf) continue;
    g = wkv_exp(p - top) * x[s] + (r == neg_inf ? T(0) : wkv_exp(r - top) * g);
    gamma = top;
  }
}

template <class T>
IATTN_KERNEL IATTN_BOUNDS(elementwise_threads, 4) void wkv_materialize(wkv_args<T> a, simt::index c, const T* ell,
                                                                       T* out) {
  const simt::index L = a.L;
  simt::grid_stride(L, [&](simt::index s) {
    for (simt::index t = 0; t < s; ++t) out[t * L + s] = T(0);
    const T ks = a.k[s * a.D + c];
    out[s * L + s] = wkv_exp(a.u[c] + ks - ell[s]);
    T score = ks;  // score[t, s] for t = s + 1: no decay yet
    for (simt::index t = s + 1; t < L; ++t) {
      if (t > s + 1) score += a.decay(t - 1, c);
      out[t * L + s] = wkv_exp(score - ell[t]);
    }
  });
}

}  // namespace iattn::cuda_detail
