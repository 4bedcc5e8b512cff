// iattn/backend/cuda/kernels/softmax.hpp: SoftmaxAttention (ops/softmax_attention.hpp) on the
// device, every row's softmax with its maximum subtracted (online: the running maximum rescales
// the running sums, so no exp argument is positive):
//   softmax_apply       y[t, c] = sum_s H^c[t, s] x[s, c], one thread per (t, c) (one pass over s)
//   softmax_stats       per row t of head h: the maximum m_t and the sum z_t of exp(score - m_t)
//   softmax_entries     out[t, s] = exp(score - m_t) / z_t inside the mask, 0 outside: materialize
//   softmax_transposed  y_s = sum_t H^c[t, s] x_t (a row of H^T: row() takes it), one thread per s
// score = scale q_t[h] . k_s[h]; the mask is s <= t (causal) or every s. Not flash attention: the
// scores are recomputed where needed (apply O(L^2 dk D)); the transformer is a comparison here.
#pragma once

#include "diagonal.hpp"

#include <cmath>

namespace iattn::cuda_detail {

template <class T>
struct softmax_args {
  const T* Q;  // (L, H*dk)
  const T* K;  // (L, H*dk)
  simt::index L, H, dk, P;
  T scale;
  bool causal;
  IATTN_HOST_DEVICE T score(simt::index h, simt::index t, simt::index s) const {
    const T* q = Q + t * H * dk + h * dk;
    const T* k = K + s * H * dk + h * dk;
    T acc = T(0);
    for (simt::index i = 0; i < dk; ++i) acc += q[i] * k[i];
    return acc * scale;
  }
  IATTN_HOST_DEVICE simt::index row_end(simt::index t) const { return causal ? t + 1 : L; }  // s < row_end
};

/// Channels c0 .. c0 + nc - 1; x, y (L, nc) with row stride `stride`.
template <class T>
IATTN_KERNEL IATTN_BOUNDS(elementwise_threads, 4) void softmax_apply(softmax_args<T> a, simt::index c0, simt::index nc,
                                                                     const T* x, simt::index stride, T* y) {
  simt::grid_stride(a.L * nc, [&](simt::index i) {
    const simt::index t = i / nc, j = i - t * nc, h = (c0 + j) / a.P;
    T m = -T(INFINITY), z = T(0), acc = T(0);
    for (simt::index s = 0; s < a.row_end(t); ++s) {
      const T sc = a.score(h, t, s);
      if (sc > m) {  // a new maximum: the sums so far rescaled (exp of a negative argument)
        const T r = m == -T(INFINITY) ? T(0) : simt::exp(m - sc);
        z *= r;
        acc *= r;
        m = sc;
      }
      const T e = simt::exp(sc - m);
      z += e;
      acc += e * x[s * stride + j];
    }
    y[t * stride + j] = acc / z;
  });
}

template <class T>
IATTN_KERNEL IATTN_BOUNDS(elementwise_threads, 4) void softmax_stats(softmax_args<T> a, simt::index h, T* m, T* z) {
  simt::grid_stride(a.L, [&](simt::index t) {
    T mt = -T(INFINITY), zt = T(0);
    for (simt::index s = 0; s < a.row_end(t); ++s) {
      const T sc = a.score(h, t, s);
      if (sc > mt) {
        zt = mt == -T(INFINITY) ? T(0) : zt * simt::exp(mt - sc);
        mt = sc;
      }
      zt += simt::exp(sc - mt);
    }
    m[t] = mt;
    z[t] = zt;
  });
}

template <class T>
IATTN_KERNEL IATTN_BOUNDS(elementwise_threads, 4) void softmax_entries(softmax_args<T> a, simt::index h, const T* m,
                                                                       const T* z, T* out) {
  simt::grid_stride(a.L * a.L, [&](simt::index i) {
    const simt::index t = i / a.L, s = i - t * a.L;
    out[i] = s < a.row_end(t) ? simt::exp(a.score(h, t, s) - m[t]) / z[t] : T(0);
  });
}

template <class T>
IATTN_KERNEL IATTN_BOUNDS(elementwise_threads, 4) void softmax_transposed(softmax_args<T> a, simt::index h, const T* m,
                                                                          const T* z, const T* x, T* y) {
  simt::grid_stride(a.L, [&](simt::index s) {
    T acc = T(0);
    for (simt::index t = a.causal ? s : 0; t < a.L; ++t) acc += simt::exp(a.score(h, t, s) - m[t]) / z[t] * x[t];
    y[s] = acc;
  });
}

}  // namespace iattn::cuda_detail
