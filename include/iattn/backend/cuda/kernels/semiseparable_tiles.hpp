// iattn/backend/cuda/kernels/semiseparable_tiles.hpp: materialize(S, c), channel c's (L, L) matrix,
// one 32 x 32 tile per block (threads (32, 8), four rows each), in the stable block form of
// docs/design.md section 5. With sigma = 1 in the strict form and 0 otherwise, E(a..b) the
// exp of the sum of lambda over tokens a..b (1 when empty), a row tile I = [i0, i0 + 32) and a
// column tile J = [j0, j1) strictly left of it:
//   H[t, s] = sum_m C~_t[m] mid[m] B~_s[m],  C~_t = C_t E(i0+1-sigma..t-sigma),
//             B~_s = B_s E(s+1..j1-1),       mid = E(j1..i0-sigma)
// mid sums the whole tiles between J and I from their totals (ss_tile_totals: each a sum from a
// tile's edge) and, inclusive, lambda_{i0}. Every sum runs over a range, none is a difference, so
// every exp argument is <= 0 for lambda <= 0 and lambda = -inf gives exact zeros. A diagonal tile
// sums each entry's range (s+1..t-sigma, at most 31 tokens) directly; tiles right of the diagonal
// are zero. The states go through shared memory 32 at a time.
#pragma once

#include "semiseparable_view.hpp"

namespace iattn::cuda_detail {

inline constexpr unsigned tile_dim = 32;   ///< tile edge; threads (tile_dim, tile_rows)
inline constexpr unsigned tile_rows = 8;   ///< thread rows per tile: each thread writes 4 rows
inline constexpr unsigned tile_threads = tile_dim * tile_rows;

/// total[k, m] = sum of lambda over tile k's tokens for head h: (tiles, N).
template <class T>
IATTN_KERNEL IATTN_BOUNDS(256, 4) void ss_tile_totals(ss_view<T> s, simt::index h, T* total, simt::index tiles) {
  simt::grid_stride(tiles * s.N, [&](simt::index i) {
    const simt::index k = i / s.N, m = i - k * s.N;
    const simt::index t0 = k * tile_dim, t1 = simt::min_of(s.L, t0 + simt::index(tile_dim));
    T sum = T(0);
    for (simt::index t = t0; t < t1; ++t) sum += s.log_decay(t, h, m);
    total[i] = sum;
  });
}

template <class T>
IATTN_KERNEL IATTN_BOUNDS(tile_threads, 4) void ss_materialize_tiles(ss_view<T> s, simt::index c,
                                                                    const T* total,  // (tiles, N)
                                                                    T* out) {        // (L, L)
  IATTN_SHARED(T, cs, [tile_dim][tile_dim + 1]);  // C~ (off the diagonal) or C: [row][state]
  IATTN_SHARED(T, bs, [tile_dim][tile_dim + 1]);  // B~ or B: [column][state]
  IATTN_SHARED(T, ls, [tile_dim][tile_dim + 1]);  // diagonal tiles: lambda [token][state]
  IATTN_SHARED(T, mid, [tile_dim]);
  const unsigned tx = simt::thread_idx().x, ty = simt::thread_idx().y, tid = ty * tile_dim + tx;
  const simt::index L = s.L, N = s.N, I = simt::block_idx().y, J = simt::block_idx().x;
  const simt::index i0 = I * tile_dim, j0 = J * tile_dim, j1 = j0 + tile_dim;
  const simt::index h = s.head(c), g = s.group(h), sigma = s.strict ? 1 : 0;
  if (J > I) {  // above the diagonal: zero (the whole block returns, no barrier skipped)
    for (unsigned r = ty; r < tile_dim; r += tile_rows)
      if (i0 + r < L && j0 + tx < L) out[(i0 + r) * L + j0 + tx] = T(0);
    return;
  }
  const bool diagonal = I == J;
  T acc[tile_dim / tile_rows];
  IATTN_UNROLL
  for (unsigned q = 0; q < tile_dim / tile_rows; ++q) acc[q] = T(0);
  for (simt::index m0 = 0; m0 < N; m0 += tile_dim) {
    for (unsigned e = tid; e < tile_dim * tile_dim; e += tile_threads) {
      const unsigned r = e / tile_dim, mm = e % tile_dim;
      const simt::index m = m0 + mm, t = i0 + r, sc = j0 + r;  // row token t, column token sc
      T cv = T(0), bv = T(0), lv = T(0);
      if (diagonal) {
        if (t < L && m < N) {
          cv = s.c(t, g, m);
          bv = s.b(t, g, m);
          lv = s.log_decay(t, h, m);
        }
      } else if (m < N) {
        if (t < L) {
          T sum = T(0);
          for (simt::index k = i0 + 1 - sigma; k <= t - sigma; ++k) sum += s.log_decay(k, h, m);
          cv = s.c(t, g, m) * simt::exp(sum);
        }
        T sum = T(0);  // J is a whole tile left of I: sc < L
        for (simt::index k = sc + 1; k < j1; ++k) sum += s.log_decay(k, h, m);
        bv = s.b(sc, g, m) * simt::exp(sum);
      }
      cs[r][mm] = cv;
      bs[r][mm] = bv;
      ls[r][mm] = lv;
    }
    if (!diagonal && ty == 0) {
      const simt::index m = m0 + tx;
      T v = T(0);
      if (m < N) {
        T sum = sigma ? T(0) : s.log_decay(i0, h, m);
        for (simt::index k = J + 1; k < I; ++k) sum += total[k * N + m];
        v = simt::exp(sum);
      }
      mid[tx] = v;
    }
    simt::sync_threads();
    const simt::index nm = simt::min_of(N - m0, simt::index(tile_dim));
    IATTN_UNROLL
    for (unsigned q = 0; q < tile_dim / tile_rows; ++q) {
      const unsigned r = ty + q * tile_rows;
      const simt::index t = i0 + r, sc = j0 + tx;
      if (!diagonal) {
        for (simt::index mm = 0; mm < nm; ++mm) acc[q] += cs[r][mm] * mid[mm] * bs[tx][mm];
      } else if (t < L && sc <= t) {
        for (simt::index mm = 0; mm < nm; ++mm) {
          T w;
          if (sc == t && sigma) {
            w = s.bonus_of(h, m0 + mm);
          } else {
            T run = T(0);  // lambda over sc+1 .. t-sigma, within the tile
            for (simt::index k = sc + 1; k <= t - sigma; ++k) run += ls[k - i0][mm];
            w = simt::exp(run);
          }
          acc[q] += cs[r][mm] * w * bs[tx][mm];
        }
      }
    }
    simt::sync_threads();
  }
  IATTN_UNROLL
  for (unsigned q = 0; q < tile_dim / tile_rows; ++q) {
    const simt::index t = i0 + ty + q * tile_rows, sc = j0 + tx;
    if (t < L && sc < L) out[t * L + sc] = (diagonal && sc > t) ? T(0) : acc[q];
  }
}

}  // namespace iattn::cuda_detail
