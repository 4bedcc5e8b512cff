// iattn/backend/cuda/kernels/group_norm.hpp: GroupNorm's statistics and its diagonal.
//   group_norm_stats   per token t and group g, over the group's Dg = D / G channels of v (L, D):
//                        mu = mean (centred norm; 0 for the RMS norm), ss = sum (v - mu)^2,
//                        inv_sigma[t, g] = 1 / sqrt(ss / Dg + eps)
//                      accumulated in double, as the CPU backend does; one thread per (t, g)
//   group_norm_scale   y[t, k] = w[c] inv_sigma[t, g(c)] x[t, k], c = c0 + k, for the W channels
//                      c0 .. c0 + W - 1 (x, y (L, W)); x null: the diagonal itself (x = 1);
//                      w null: weight 1. One thread per entry, grid-stride.
#pragma once

#include "diagonal.hpp"

#include <cmath>

namespace iattn::cuda_detail {

template <class T>
IATTN_KERNEL IATTN_BOUNDS(elementwise_threads, 4) void group_norm_stats(const T* v, simt::index L, simt::index D,
                                                                        simt::index G, double eps, bool centered,
                                                                        T* inv_sigma, T* mean) {
  const simt::index Dg = D / G;
  simt::grid_stride(L * G, [&](simt::index i) {
    const simt::index t = i / G, g = i - t * G;
    const T* p = v + t * D + g * Dg;
    double mu = 0;
    if (centered) {
      for (simt::index k = 0; k < Dg; ++k) mu += double(p[k]);
      mu /= double(Dg);
    }
    double ss = 0;
    for (simt::index k = 0; k < Dg; ++k) ss += (double(p[k]) - mu) * (double(p[k]) - mu);
    inv_sigma[i] = T(1.0 / ::sqrt(ss / double(Dg) + eps));
    if (mean) mean[i] = T(mu);
  });
}

template <class T>
IATTN_KERNEL IATTN_BOUNDS(elementwise_threads, 4) void group_norm_scale(const T* inv_sigma, const T* w, const T* x, T* y,
                                                                        simt::index L, simt::index D, simt::index G,
                                                                        simt::index c0, simt::index W) {
  const simt::index Dg = D / G;
  simt::grid_stride(L * W, [&](simt::index i) {
    const simt::index t = i / W, c = c0 + (i - t * W);
    const T s = (w ? w[c] : T(1)) * inv_sigma[t * G + c / Dg];
    y[i] = x ? s * x[i] : s;
  });
}

}  // namespace iattn::cuda_detail
