// iattn/backend/cuda/kernels/mean_blocks.hpp: the channel mean of a term w diag(P) S diag(Q) [conv]
// (S a Semiseparable of any form) as one blocked product whose inner dimension runs over the
// (channel, state) pairs k = (j, m) of a chunk of channels [cb, cb + dc): the device form of
// backend/cpu/mean.hpp, for cores that are not shared by a head's channels (Mamba-1: one channel
// per head). With delta = 1 for a strict S (0 otherwise), sigma = s + K - 1 and t' = t - delta,
// every entry with t' >= sigma is
//   sum_c H^c[t, s] = G[t', sigma] = sum_k U[t, k] E_k(sigma+1 .. t') z[sigma, k],
//   U[t, k] = P[t, c] C[t, m],
//   z[sigma, k] = sum_{lag<K} tap_c(lag) Q[s+lag, c] B[s+lag, m] E_k(s+lag+1 .. sigma)
// (the convolution folded into one injection per column; E_k(a..b) the exp of the sum of channel c's
// log-decays of state m over tokens a..b, 1 when empty): an inclusive semiseparable in (t', sigma)
// whose states are the (channel, state) pairs. It is evaluated in 32 x 32 tiles as
// semiseparable_tiles.hpp evaluates one channel:
//   mb_factors  per (token, k): U~ = U E(i0+1 .. t') and V~ = z E(sigma+1 .. j1-1), referred to
//               their tile's edges, and the raw U and z for the diagonal tiles (sums of <= 31 terms)
//   mb_mid      per (tile J, k): mid_IJ = E(j1 .. i0) for every I > J, walking away from J
//   mb_tiles    per tile pair: G = U~ mid V~ below the diagonal, each entry's range summed directly
//               on the diagonal tiles; added, times the term's weight over the channel count, into
//               out[t' + delta, sigma - K + 1]
//   mb_band     per entry of the K - 1 + delta diagonals nearest the main one (where a lag reaches
//               past t'): the channels' sum directly, the strict form's bonus on the diagonal
// Every exp argument is a sum of log-decays over a range (never a difference): <= 0, and
// lambda = -inf gives exact zeros. out must hold zeros (or earlier terms) where the term adds.
#pragma once

#include "head_mean.hpp"  // diag_list
#include "semiseparable_tiles.hpp"  // tile_dim, tile_rows, tile_threads, ss_view

namespace iattn::cuda_detail {

template <class T>
struct mb_args {
  ss_view<T> s;
  diag_list<T> post, pre;  // P (left of S) and Q (right of S)
  const T* w;              // (K, D) convolution taps (PyTorch order), or null (K = 1, tap 1)
  simt::index K, L, D;
  simt::index cb, Mc;      // the chunk's first channel; Mc = its channels times N
  simt::index tiles;       // ceil(L / 32)
  IATTN_HOST_DEVICE simt::index delta() const { return s.strict ? 1 : 0; }
  IATTN_HOST_DEVICE T tap(simt::index lag, simt::index c) const { return w ? w[(K - 1 - lag) * D + c] : T(1); }
  /// lambda of pair k at token v.
  IATTN_HOST_DEVICE T lam(simt::index v, simt::index k) const {
    const simt::index c = cb + k / s.N;
    return s.log_decay(v, s.head(c), k - k / s.N * s.N);
  }
};

/// ut, vt, ur, zr: (L, Mc) each. One thread per (token, k).
template <class T>
IATTN_KERNEL IATTN_BOUNDS(elementwise_threads, 4) void mb_factors(mb_args<T> a, T* ut, T* vt, T* ur, T* zr) {
  simt::grid_stride(a.L * a.Mc, [&](simt::index i) {
    const simt::index tau = i / a.Mc, k = i - tau * a.Mc, N = a.s.N;
    const simt::index c = a.cb + k / N, m = k - k / N * N, h = a.s.head(c), g = a.s.group(h);
    const simt::index i0 = tau / tile_dim * tile_dim, i1 = simt::min_of(a.L, i0 + simt::index(tile_dim));
    // the row side: t' = tau, token t = tau + delta
    const simt::index t = tau + a.delta();
    const T u = t < a.L ? a.post.at(t, c, a.D) * a.s.c(t, g, m) : T(0);
    T run = T(0);
    for (simt::index v = i0 + 1; v <= tau; ++v) run += a.s.log_decay(v, h, m);
    ur[i] = u;
    ut[i] = u * simt::exp(run);
    // the column side: sigma = tau, the injection of column s = sigma - K + 1
    T z = T(0);
    if (tau >= a.K - 1) {
      const simt::index s0 = tau - (a.K - 1);
      for (simt::index lag = 0; lag < a.K; ++lag) {
        const simt::index src = s0 + lag;
        T r = T(0);
        for (simt::index v = src + 1; v <= tau; ++v) r += a.s.log_decay(v, h, m);
        z += a.tap(lag, c) * a.pre.at(src, c, a.D) * a.s.b(src, g, m) * simt::exp(r);
      }
    }
    run = T(0);
    for (simt::index v = tau + 1; v < i1; ++v) run += a.s.log_decay(v, h, m);
    zr[i] = z;
    vt[i] = z * simt::exp(run);
  });
}

/// mid[(I tiles + J) Mc + k] = E_k(j1 .. i0) for every tile pair J < I: one thread per (J, k) walks
/// I = J+1, J+2, ... adding each passed tile's log-decays (a sum from J's edge).
template <class T>
IATTN_KERNEL IATTN_BOUNDS(elementwise_threads, 4) void mb_mid(mb_args<T> a, T* mid) {
  simt::grid_stride(a.tiles * a.Mc, [&](simt::index i) {
    const simt::index J = i / a.Mc, k = i - J * a.Mc;
    T run = T(0);  // lambda over the whole tiles J+1 .. I-1
    for (simt::index I = J + 1; I < a.tiles; ++I) {
      const simt::index i0 = I * simt::index(tile_dim), i1 = simt::min_of(a.L, i0 + simt::index(tile_dim));
      mid[(I * a.tiles + J) * a.Mc + k] = simt::exp(run + a.lam(i0, k));
      for (simt::index v = i0; v < i1; ++v) run += a.lam(v, k);
    }
  });
}

/// One 32 x 32 tile of G per block: grid (tiles, tiles), J = x (columns sigma), I = y (rows t');
/// threads (32, 8), four rows each; blocks above the diagonal return.
template <class T>
IATTN_KERNEL IATTN_BOUNDS(tile_threads, 4) void mb_tiles(mb_args<T> a, const T* ut, const T* vt, const T* ur,
                                                       const T* zr, const T* mid, T scale, T* out) {
  IATTN_SHARED(T, cs, [tile_dim][tile_dim + 1]);  // U~ mid (off the diagonal) or U: [row][k]
  IATTN_SHARED(T, bs, [tile_dim][tile_dim + 1]);  // V~ or z: [column][k]
  IATTN_SHARED(T, ls, [tile_dim][tile_dim + 1]);  // diagonal tiles: lambda [token][k]
  const unsigned tx = simt::thread_idx().x, ty = simt::thread_idx().y, tid = ty * tile_dim + tx;
  const simt::index I = simt::block_idx().y, J = simt::block_idx().x;
  if (J > I) return;  // the whole block returns: no barrier skipped
  const simt::index i0 = I * tile_dim, j0 = J * tile_dim, L = a.L, Mc = a.Mc;
  const bool diagonal = I == J;
  T acc[tile_dim / tile_rows];
  IATTN_UNROLL
  for (unsigned q = 0; q < tile_dim / tile_rows; ++q) acc[q] = T(0);
  for (simt::index k0 = 0; k0 < Mc; k0 += tile_dim) {
    for (unsigned e = tid; e < tile_dim * tile_dim; e += tile_threads) {
      const unsigned r = e / tile_dim, kk = e % tile_dim;
      const simt::index k = k0 + kk, t = i0 + r, sc = j0 + r;  // row t', column sigma
      T cv = T(0), bv = T(0), lv = T(0);
      if (k < Mc) {
        if (diagonal) {
          if (t < L) {
            cv = ur[t * Mc + k];
            bv = zr[t * Mc + k];
            lv = a.lam(t, k);
          }
        } else {
          if (t < L) cv = ut[t * Mc + k] * mid[(I * a.tiles + J) * Mc + k];
          bv = vt[sc * Mc + k];  // J is a whole tile left of I: sc < L
        }
      }
      cs[r][kk] = cv;
      bs[r][kk] = bv;
      ls[r][kk] = lv;
    }
    simt::sync_threads();
    const simt::index nk = simt::min_of(Mc - k0, simt::index(tile_dim));
    IATTN_UNROLL
    for (unsigned q = 0; q < tile_dim / tile_rows; ++q) {
      const unsigned r = ty + q * tile_rows;
      const simt::index t = i0 + r, sc = j0 + tx;
      if (!diagonal) {
        for (simt::index kk = 0; kk < nk; ++kk) acc[q] += cs[r][kk] * bs[tx][kk];
      } else if (t < L && sc <= t) {
        for (simt::index kk = 0; kk < nk; ++kk) {
          T run = T(0);  // lambda over sc+1 .. t, within the tile
          for (simt::index v = sc + 1; v <= t; ++v) run += ls[v - i0][kk];
          acc[q] += cs[r][kk] * simt::exp(run) * bs[tx][kk];
        }
      }
    }
    simt::sync_threads();
  }
  IATTN_UNROLL
  for (unsigned q = 0; q < tile_dim / tile_rows; ++q) {
    const simt::index t = i0 + ty + q * tile_rows, sc = j0 + tx;  // G[t', sigma]
    const simt::index row = t + a.delta(), col = sc - (a.K - 1);
    if (row < L && col >= 0 && sc <= t) out[row * L + col] += scale * acc[q];
  }
}

/// The entries (t, t - d) for d < K - 1 + delta: one thread per (t, d).
template <class T>
IATTN_KERNEL IATTN_BOUNDS(elementwise_threads, 4) void mb_band(mb_args<T> a, simt::index dc, T scale, T* out) {
  const simt::index width = a.K - 1 + a.delta(), N = a.s.N;
  simt::grid_stride(a.L * width, [&](simt::index i) {
    const simt::index t = i / width, s = t - (i - t * width);
    if (s < 0) return;
    T sum = T(0);
    for (simt::index c = a.cb; c < a.cb + dc; ++c) {
      const simt::index h = a.s.head(c), g = a.s.group(h);
      const T p = a.post.at(t, c, a.D);
      for (simt::index lag = 0; lag < a.K && s + lag <= t; ++lag) {
        const simt::index u = s + lag;
        T core = T(0);
        for (simt::index m = 0; m < N; ++m) {
          T w;
          if (a.s.strict && u == t) {
            w = a.s.bonus_of(h, m);
          } else {
            T run = T(0);  // lambda over u+1 .. t-delta
            for (simt::index v = u + 1; v <= t - a.delta(); ++v) run += a.s.log_decay(v, h, m);
            w = simt::exp(run);
          }
          core += a.s.c(t, g, m) * w * a.s.b(u, g, m);
        }
        sum += p * a.tap(lag, c) * a.pre.at(u, c, a.D) * core;
      }
    }
    out[t * a.L + s] += scale * sum;
  });
}

}  // namespace iattn::cuda_detail
