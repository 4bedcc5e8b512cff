// iattn/backend/cuda/kernels/vector_scan.hpp: y = H x or y = H^T x for ONE channel's matrix of a
// Semiseparable or a LinearRecurrence and a vector x of length L: what row(H, t) (H^T e_t) and
// col(H, s) (H e_s) run, factor by factor, in O(L N). Per state m of the channel, with st the
// state carried from token to token in the step order (forward: t = 0..L-1; transposed:
// t = L-1..0), dec_t = exp(lambda_t) (S) or a_t (LR), and the coefficient `in` / `out` (forward:
// B / C; transposed: C / B; LR: b / 1 and 1 / b):
//   forward, inclusive:   st = dec_t st + in_t x_t;  y_t += out_t st
//   strict (both ways):   y_t += out_t (st + bonus in_t x_t);  st = dec_t st + in_t x_t
//   transposed, inclusive: st += in_t x_t;  y_t += out_t st;  st = dec_t st
// (transposed inclusive: y_s = B_s g_s, g_s = C_s x_s + dec_{s+1} g_{s+1}; transposed strict:
// y_s = B_s (q_{s+1} + bonus C_s x_s), q_s = C_s x_s + dec_s q_{s+1}.) In every mode a chunk
// multiplies the state entering it by the product of its tokens' decays, so the chunked scan of
// chunked_scan.hpp applies, over chunks numbered in the step order:
//   scan_vector_states   per (chunk, state): the chunk from st = 0, its end state e_j, and its
//                        decay g_j (S: exp of the chunk's log-decay sum, from its edge; LR: the
//                        running product; no quotient, so a = 0 and lambda = -inf are exact)
//   chunk_carry          (chunked_scan.hpp) the state entering each chunk, pairs = N
//   scan_vector_outputs  per (chunk, state): the chunk again from its entering state, each
//                        token's share part[t, m]
//   vector_sum_states    y_t = sum_m part[t, m]
// One thread per (chunk, state), grid-stride, consecutive threads on consecutive states; no
// shared memory and no barrier.
#pragma once

#include "chunked_scan.hpp"
#include "semiseparable_view.hpp"

namespace iattn::cuda_detail {

/// Channel c of a Semiseparable as the vector scan reads it.
template <class T>
struct ss_vector_source {
  ss_view<T> s;
  simt::index h, g;  // the channel's head and group
  bool transposed;
  using total_type = T;  // the log-decay sum

  IATTN_HOST_DEVICE simt::index length() const { return s.L; }
  IATTN_HOST_DEVICE simt::index states() const { return s.N; }
  IATTN_HOST_DEVICE bool strict() const { return s.strict; }
  IATTN_HOST_DEVICE T decay(simt::index t, simt::index m) const { return simt::exp(s.log_decay(t, h, m)); }
  IATTN_HOST_DEVICE T total_begin() const { return T(0); }
  IATTN_HOST_DEVICE T total_add(T acc, simt::index t, simt::index m) const { return acc + s.log_decay(t, h, m); }
  IATTN_HOST_DEVICE T total_end(T acc) const { return simt::exp(acc); }
  IATTN_HOST_DEVICE T in(simt::index t, simt::index m) const { return transposed ? s.c(t, g, m) : s.b(t, g, m); }
  IATTN_HOST_DEVICE T out(simt::index t, simt::index m) const { return transposed ? s.b(t, g, m) : s.c(t, g, m); }
  IATTN_HOST_DEVICE T bonus(simt::index m) const { return s.bonus_of(h, m); }
};

/// Channel c of a LinearRecurrence (N = 1, C = 1, decays multiplied as given).
template <class T>
struct lr_vector_source {
  const T* a;  // (L, D)
  const T* b;  // (L, D)
  simt::index L, D, c;
  bool transposed;

  IATTN_HOST_DEVICE simt::index length() const { return L; }
  IATTN_HOST_DEVICE simt::index states() const { return 1; }
  IATTN_HOST_DEVICE bool strict() const { return false; }
  IATTN_HOST_DEVICE T decay(simt::index t, simt::index) const { return a[t * D + c]; }
  IATTN_HOST_DEVICE T total_begin() const { return T(1); }
  IATTN_HOST_DEVICE T total_add(T acc, simt::index t, simt::index) const { return acc * a[t * D + c]; }
  IATTN_HOST_DEVICE T total_end(T acc) const { return acc; }
  IATTN_HOST_DEVICE T in(simt::index t, simt::index) const { return transposed ? T(1) : b[t * D + c]; }
  IATTN_HOST_DEVICE T out(simt::index t, simt::index) const { return transposed ? b[t * D + c] : T(1); }
  IATTN_HOST_DEVICE T bonus(simt::index) const { return T(0); }
};

/// The tokens of chunk j in the step order: [t0, t1), walked up (forward) or down (transposed).
struct vector_chunk {
  simt::index t0, t1;
};
IATTN_HOST_DEVICE inline vector_chunk vector_chunk_of(simt::index j, simt::index L, bool transposed) {
  if (!transposed) return {j * scan_chunk, simt::min_of(L, (j + 1) * scan_chunk)};
  const simt::index t1 = L - j * scan_chunk;
  return {t1 > scan_chunk ? t1 - scan_chunk : 0, t1};
}

/// One step of the scan at token t for state m: updates st, returns token t's share of y_t.
template <class Src, class T>
IATTN_DEVICE T vector_step(const Src& src, simt::index t, simt::index m, T xt, T& st) {
  const T ix = src.in(t, m) * xt;
  if (src.strict()) {
    const T y = src.out(t, m) * (st + src.bonus(m) * ix);
    st = src.decay(t, m) * st + ix;
    return y;
  }
  if (!src.transposed) {
    st = src.decay(t, m) * st + ix;
    return src.out(t, m) * st;
  }
  st += ix;
  const T y = src.out(t, m) * st;
  st = src.decay(t, m) * st;
  return y;
}

template <class Src, class T>
IATTN_KERNEL IATTN_BOUNDS(elementwise_threads, 4) void scan_vector_states(Src src, const T* x,
                                                                         T* end,     // (chunks, N): e_j
                                                                         T* decay) { // (chunks, N): g_j
  const simt::index N = src.states(), L = src.length(), chunks = (L + scan_chunk - 1) / scan_chunk;
  simt::grid_stride(chunks * N, [&](simt::index i) {
    const simt::index j = i / N, m = i - j * N;
    const vector_chunk k = vector_chunk_of(j, L, src.transposed);
    T st = T(0);
    auto total = src.total_begin();
    for (simt::index n = 0; n < k.t1 - k.t0; ++n) {
      const simt::index t = src.transposed ? k.t1 - 1 - n : k.t0 + n;
      (void)vector_step(src, t, m, x[t], st);
      total = src.total_add(total, t, m);
    }
    end[i] = st;
    decay[i] = src.total_end(total);
  });
}

template <class Src, class T>
IATTN_KERNEL IATTN_BOUNDS(elementwise_threads, 4) void scan_vector_outputs(Src src, const T* x,
                                                                          const T* start,  // (chunks, N): s_j
                                                                          T* part) {       // (L, N)
  const simt::index N = src.states(), L = src.length(), chunks = (L + scan_chunk - 1) / scan_chunk;
  simt::grid_stride(chunks * N, [&](simt::index i) {
    const simt::index j = i / N, m = i - j * N;
    const vector_chunk k = vector_chunk_of(j, L, src.transposed);
    T st = start[i];
    for (simt::index n = 0; n < k.t1 - k.t0; ++n) {
      const simt::index t = src.transposed ? k.t1 - 1 - n : k.t0 + n;
      part[t * N + m] = vector_step(src, t, m, x[t], st);
    }
  });
}

/// y_t = sum_m part[t, m].
template <class T>
IATTN_KERNEL IATTN_BOUNDS(elementwise_threads, 4) void vector_sum_states(const T* part, simt::index N, T* y,
                                                                        simt::index L) {
  simt::grid_stride(L, [&](simt::index t) {
    T acc = T(0);
    for (simt::index m = 0; m < N; ++m) acc += part[t * N + m];
    y[t] = acc;
  });
}

}  // namespace iattn::cuda_detail
