// iattn/backend/cuda/kernels/linear_recurrence_tiles.hpp: materialize of a LinearRecurrence,
// channel c's (L, L) matrix H[t, s] = (prod_{k=s+1..t} a_k) b_s for s <= t, one 32 x 32 tile per
// block (threads (32, 8), four rows each), as the Semiseparable tiles but with the decays
// multiplied as given (a = 0 and negative a are exact; nothing is divided). With P(a..b) the
// product of a over tokens a..b (1 when empty), a row tile I = [i0, i0 + 32) and a column tile
// J = [j0, j1) strictly left of it:
//   H[t, s] = (P(i0+1..t) mid) (P(s+1..j1-1) b_s),   mid = P(j1..i0)
// mid multiplies the whole tiles between J and I from their products (lr_tile_totals) and
// a_{i0}; every product runs over a range from a tile edge. A diagonal tile multiplies each
// entry's range (s+1..t, at most 31 tokens) directly; tiles right of the diagonal are zero.
#pragma once

#include "semiseparable_tiles.hpp"

namespace iattn::cuda_detail {

template <class T>
struct lr_tile_args {
  const T* a;  // (L, D) decays
  const T* b;  // (L, D) input scales
  simt::index L, D, c;
  IATTN_HOST_DEVICE T a_at(simt::index t) const { return a[t * D + c]; }
  IATTN_HOST_DEVICE T b_at(simt::index t) const { return b[t * D + c]; }
};

/// total[k] = product of a over tile k's tokens (channel c): (tiles).
template <class T>
IATTN_KERNEL IATTN_BOUNDS(256, 4) void lr_tile_totals(lr_tile_args<T> p, T* total, simt::index tiles) {
  simt::grid_stride(tiles, [&](simt::index k) {
    const simt::index t0 = k * tile_dim, t1 = simt::min_of(p.L, t0 + simt::index(tile_dim));
    T prod = T(1);
    for (simt::index t = t0; t < t1; ++t) prod *= p.a_at(t);
    total[k] = prod;
  });
}

template <class T>
IATTN_KERNEL IATTN_BOUNDS(tile_threads, 4) void lr_materialize_tiles(lr_tile_args<T> p,
                                                                    const T* total,  // (tiles)
                                                                    T* out) {        // (L, L)
  IATTN_SHARED(T, row, [tile_dim]);  // off the diagonal: P(i0+1..t) mid; on it: a_t
  IATTN_SHARED(T, col, [tile_dim]);  // off the diagonal: P(s+1..j1-1) b_s; on it: b_s
  const unsigned tx = simt::thread_idx().x, ty = simt::thread_idx().y;
  const simt::index L = p.L, I = simt::block_idx().y, J = simt::block_idx().x;
  const simt::index i0 = I * tile_dim, j0 = J * tile_dim, j1 = j0 + tile_dim;
  if (J > I) {  // above the diagonal: zero (the whole block returns, no barrier skipped)
    for (unsigned r = ty; r < tile_dim; r += tile_rows)
      if (i0 + r < L && j0 + tx < L) out[(i0 + r) * L + j0 + tx] = T(0);
    return;
  }
  const bool diagonal = I == J;
  if (ty == 0) {  // row factors
    const simt::index t = i0 + tx;
    T v = T(0);
    if (t < L) {
      if (diagonal) {
        v = p.a_at(t);
      } else {
        T mid = p.a_at(i0);
        for (simt::index k = J + 1; k < I; ++k) mid *= total[k];
        T run = T(1);
        for (simt::index k = i0 + 1; k <= t; ++k) run *= p.a_at(k);
        v = run * mid;
      }
    }
    row[tx] = v;
  } else if (ty == 1) {  // column factors
    const simt::index s = j0 + tx;
    T v = T(0);
    if (s < L) {
      v = p.b_at(s);
      if (!diagonal)  // J is a whole tile left of I: j1 <= i0 < L
        for (simt::index k = s + 1; k < j1; ++k) v *= p.a_at(k);
    }
    col[tx] = v;
  }
  simt::sync_threads();
  IATTN_UNROLL
  for (unsigned q = 0; q < tile_dim / tile_rows; ++q) {
    const unsigned r = ty + q * tile_rows;
    const simt::index t = i0 + r, s = j0 + tx;
    if (t >= L || s >= L) continue;
    T v;
    if (!diagonal) {
      v = row[r] * col[tx];
    } else if (s > t) {
      v = T(0);
    } else {
      v = col[tx];  // b_s
      for (unsigned k = tx + 1; k <= r; ++k) v *= row[k];
    }
    out[t * L + s] = v;
  }
}

}  // namespace iattn::cuda_detail
