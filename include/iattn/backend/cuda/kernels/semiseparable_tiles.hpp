// iattn/backend/cuda/kernels/semiseparable_tiles.hpp: materialize(S, c), channel c's (L, L) matrix,
// one 32 x 32 tile per block (threads (32, 8), four rows each), in the stable block form of
// docs/design.md section 5, factored. With sigma = 1 in the strict form and 0 otherwise, E(a..b)
// the exp of the sum of lambda over tokens a..b (1 when empty), a row tile I = [i0, i0 + 32) and a
// column tile J = [j0, j1) strictly left of it:
//   H[t, s] = sum_m C~_t[m] mid_IJ[m] B~_s[m],  C~_t = C_t E(i0+1-sigma..t-sigma),
//             B~_s = B_s E(s+1..j1-1),          mid_IJ = E(j1..i0-sigma)
// Three kernels: ss_tile_factors writes C~ and B~ for every token, (L, N) each (each a sum from the
// token's tile edge, at most 31 terms); ss_tile_totals each tile's lambda sum; ss_tile_mid every
// mid_IJ, walking I away from J and adding whole tiles' totals (and, inclusive, lambda_{i0}). The
// matrix is then written in 64 x 64 macro tiles (2 x 2 tiles): ss_materialize_macro writes those
// strictly below the diagonal band as a rank-N product (C~ rows, B~ columns times each tile
// pair's mid: one exp per (token, state) and per (tile pair, state), none per entry; 16 entries per
// thread) and those above it as zeros; ss_materialize_tiles writes the diagonal band's tiles.
// Every sum runs over a range, none is a difference, so every exp argument is <= 0 for
// lambda <= 0 and lambda = -inf gives exact zeros. A diagonal tile sums each entry's range
// (s+1..t-sigma, at most 31 tokens) directly; tiles right of the diagonal are zero. The states go
// through shared memory 32 at a time, so N is unbounded.
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

/// ct[t, m] = C~_t[m], bt[t, m] = B~_t[m] of head h (its group's B and C): (L, N) each, t's tile
/// the row tile for C~ and the column tile for B~.
template <class T>
IATTN_KERNEL IATTN_BOUNDS(256, 4) void ss_tile_factors(ss_view<T> s, simt::index h, T* ct, T* bt) {
  const simt::index g = s.group(h), sigma = s.strict ? 1 : 0;
  simt::grid_stride(s.L * s.N, [&](simt::index i) {
    const simt::index t = i / s.N, m = i - t * s.N;
    const simt::index t0 = t / tile_dim * tile_dim, t1 = simt::min_of(s.L, t0 + simt::index(tile_dim));
    T sum = T(0);
    for (simt::index k = t0 + 1 - sigma; k <= t - sigma; ++k) sum += s.log_decay(k, h, m);
    ct[i] = s.c(t, g, m) * simt::exp(sum);
    sum = T(0);
    for (simt::index k = t + 1; k < t1; ++k) sum += s.log_decay(k, h, m);
    bt[i] = s.b(t, g, m) * simt::exp(sum);
  });
}

/// mid[(I tiles + J) N + m] = E(j1..i0-sigma) for every tile pair J < I of head h: one thread per
/// (J, m) walks I = J+1, J+2, ... adding each passed tile's total (a sum from J's edge). The loads of
/// 4 tiles (totals and edge lambdas) are issued before their dependent chain.
template <class T>
IATTN_KERNEL IATTN_BOUNDS(256, 4) void ss_tile_mid(ss_view<T> s, simt::index h, const T* total, simt::index tiles,
                                                   T* mid) {
  constexpr simt::index batch = 4;
  simt::grid_stride(tiles * s.N, [&](simt::index i) {
    const simt::index J = i / s.N, m = i - J * s.N, N = s.N;
    T run = T(0);  // lambda over the whole tiles J+1 .. I-1
    for (simt::index I0 = J + 1; I0 < tiles; I0 += batch) {
      T edge[batch], tot[batch];
      IATTN_UNROLL
      for (simt::index u = 0; u < batch; ++u) {
        const simt::index I = simt::min_of(I0 + u, tiles - 1);
        edge[u] = s.strict ? T(0) : s.log_decay(I * simt::index(tile_dim), h, m);
        tot[u] = total[I * N + m];
      }
      IATTN_UNROLL
      for (simt::index u = 0; u < batch; ++u) {
        if (I0 + u < tiles) mid[((I0 + u) * tiles + J) * N + m] = simt::exp(run + edge[u]);
        run += tot[u];
      }
    }
  });
}

/// The 32 x 32 tiles of the diagonal band: the 2 x 2 tiles of each diagonal macro tile (grid
/// (2, 2, macros): I = 2 z + y, J = 2 z + x; tiles past the last are skipped), which hold the
/// matrix's diagonal (direct sums), the tiles above it (zeros) and one whole tile below it.
template <class T>
IATTN_KERNEL IATTN_BOUNDS(tile_threads, 4) void ss_materialize_tiles(ss_view<T> s, simt::index c,
                                                                    const T* ct,   // (L, N): C~
                                                                    const T* bt,   // (L, N): B~
                                                                    const T* mid,  // (tiles, tiles, N)
                                                                    simt::index tiles,
                                                                    T* out) {      // (L, L)
  IATTN_SHARED(T, cs, [tile_dim][tile_dim + 1]);  // C~ mid (off the diagonal) or C: [row][state]
  IATTN_SHARED(T, bs, [tile_dim][tile_dim + 1]);  // B~ or B: [column][state]
  IATTN_SHARED(T, ls, [tile_dim][tile_dim + 1]);  // diagonal tiles: lambda [token][state]
  const unsigned tx = simt::thread_idx().x, ty = simt::thread_idx().y, tid = ty * tile_dim + tx;
  const simt::index L = s.L, N = s.N;
  const simt::index I = 2 * simt::index(simt::block_idx().z) + simt::block_idx().y,
                    J = 2 * simt::index(simt::block_idx().z) + simt::block_idx().x;
  if (I >= tiles || J >= tiles) return;  // the last macro tile's missing half (no barrier skipped)
  const simt::index i0 = I * tile_dim, j0 = J * tile_dim;
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
      } else if (m < N) {  // J is a whole tile left of I: sc < L
        if (t < L) cv = ct[t * N + m] * mid[(I * tiles + J) * N + m];
        bv = bt[sc * N + m];
      }
      cs[r][mm] = cv;
      bs[r][mm] = bv;
      ls[r][mm] = lv;
    }
    simt::sync_threads();
    const simt::index nm = simt::min_of(N - m0, simt::index(tile_dim));
    IATTN_UNROLL
    for (unsigned q = 0; q < tile_dim / tile_rows; ++q) {
      const unsigned r = ty + q * tile_rows;
      const simt::index t = i0 + r, sc = j0 + tx;
      if (!diagonal) {
        for (simt::index mm = 0; mm < nm; ++mm) acc[q] += cs[r][mm] * bs[tx][mm];
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

inline constexpr unsigned macro_dim = 2 * tile_dim;  ///< macro tile edge: 2 x 2 tiles
inline constexpr unsigned macro_side = 16;            ///< threads (16, 16): 4 x 4 entries each
inline constexpr unsigned macro_states = 16;          ///< states staged in shared memory at a time

/// The macro tiles off the diagonal band: grid (macros, macros), threads (16, 16). Below the band
/// (MJ < MI): H[t, s] = sum_m C~_t[m] mid_{I(t) J(s)}[m] B~_s[m], the columns' B~ multiplied by the
/// mid of each of the macro row's two tiles in shared memory; thread (x, y) writes rows y + 16 q
/// and columns x + 16 p (q, p < 4). Above it (MJ > MI): zeros. The band itself returns.
template <class T>
IATTN_KERNEL IATTN_BOUNDS(macro_side * macro_side, 3) void ss_materialize_macro(ss_view<T> s,
                                                                               const T* ct,   // (L, N): C~
                                                                               const T* bt,   // (L, N): B~
                                                                               const T* mid,  // (tiles, tiles, N)
                                                                               simt::index tiles,
                                                                               T* out) {      // (L, L)
  IATTN_SHARED(T, cs, [macro_dim][macro_states + 1]);     // C~ [row][state]
  IATTN_SHARED(T, bs, [2][macro_dim][macro_states + 1]);  // B~ mid for the macro row's tile a: [a][column][state]
  const unsigned tx = simt::thread_idx().x, ty = simt::thread_idx().y, tid = ty * macro_side + tx;
  constexpr unsigned threads = macro_side * macro_side;
  const simt::index L = s.L, N = s.N, MI = simt::block_idx().y, MJ = simt::block_idx().x;
  const simt::index i0 = MI * macro_dim, j0 = MJ * macro_dim;
  if (MJ == MI) return;  // the diagonal band: ss_materialize_tiles
  if (MJ > MI) {         // above the band: zeros
    for (unsigned e = tid; e < macro_dim * macro_dim; e += threads) {
      const simt::index t = i0 + e / macro_dim, sc = j0 + e % macro_dim;
      if (t < L && sc < L) out[t * L + sc] = T(0);
    }
    return;
  }
  // Below the band: every column is < L (j0 + 64 <= i0 < L), rows may pass L in the last macro row.
  T acc[4][4];
  IATTN_UNROLL
  for (int q = 0; q < 4; ++q) {
    IATTN_UNROLL
    for (int p = 0; p < 4; ++p) acc[q][p] = T(0);
  }
  for (simt::index m0 = 0; m0 < N; m0 += macro_states) {
    for (unsigned e = tid; e < macro_dim * macro_states; e += threads) {
      const unsigned r = e / macro_states, mm = e % macro_states;
      const simt::index m = m0 + mm, t = i0 + r, sc = j0 + r, J = 2 * MJ + r / tile_dim;
      const bool in = m < N;
      cs[r][mm] = in && t < L ? ct[t * N + m] : T(0);
      const T b = in ? bt[sc * N + m] : T(0);
      IATTN_UNROLL
      for (int a = 0; a < 2; ++a) {
        const simt::index I = 2 * MI + a;
        bs[a][r][mm] = in && I < tiles ? b * mid[(I * tiles + J) * N + m] : T(0);
      }
    }
    simt::sync_threads();
    const simt::index nm = simt::min_of(N - m0, simt::index(macro_states));
    for (simt::index mm = 0; mm < nm; ++mm) {
      T cv[4], bv[2][4];
      IATTN_UNROLL
      for (int q = 0; q < 4; ++q) cv[q] = cs[ty + macro_side * q][mm];
      IATTN_UNROLL
      for (int p = 0; p < 4; ++p) {
        bv[0][p] = bs[0][tx + macro_side * p][mm];
        bv[1][p] = bs[1][tx + macro_side * p][mm];
      }
      IATTN_UNROLL
      for (int q = 0; q < 4; ++q) {
        IATTN_UNROLL
        for (int p = 0; p < 4; ++p) acc[q][p] += cv[q] * bv[q / 2][p];  // rows 0-31: tile 2 MI; 32-63: 2 MI + 1
      }
    }
    simt::sync_threads();
  }
  IATTN_UNROLL
  for (int q = 0; q < 4; ++q) {
    const simt::index t = i0 + ty + macro_side * q;
    if (t < L) {
      IATTN_UNROLL
      for (int p = 0; p < 4; ++p) out[t * L + j0 + tx + macro_side * p] = acc[q][p];
    }
  }
}

}  // namespace iattn::cuda_detail
