// iattn/backend/cuda/kernels/lower_product.hpp: out = A B for (L, L) A, B: the materialize of a
// product of two non-band factors (e.g. S * LinearRecurrence), the general fallback. For
// lower-triangular A and B (lower = true), O(L^3 / 6):
//   out[t, s] = sum_{u = s..t} A[t, u] B[u, s]   for s <= t, zero above the diagonal;
// otherwise (a flipped factor) the full product, u over 0..L-1, O(L^3).
// One 32 x 32 tile of out per block (threads (32, 8), four rows each), the tiles K = J..I (all K
// when not lower) of A's row strip and B's column strip through shared memory; for lower factors
// the entries of A and B above their diagonals are never used (u runs over s..t only), so they
// need not be zero.
#pragma once

#include "semiseparable_tiles.hpp"

namespace iattn::cuda_detail {

template <class T>
IATTN_KERNEL IATTN_BOUNDS(tile_threads, 4) void lower_product_tiles(const T* A, const T* B, T* out, simt::index L,
                                                                         bool lower) {
  IATTN_SHARED(T, as, [tile_dim][tile_dim + 1]);  // A[i0 + r, k0 + k]
  IATTN_SHARED(T, bs, [tile_dim][tile_dim + 1]);  // B[k0 + k, j0 + x]
  const unsigned tx = simt::thread_idx().x, ty = simt::thread_idx().y;
  const simt::index I = simt::block_idx().y, J = simt::block_idx().x;
  const simt::index i0 = I * tile_dim, j0 = J * tile_dim;
  if (lower && J > I) {  // above the diagonal: zero (the whole block returns, no barrier skipped)
    for (unsigned r = ty; r < tile_dim; r += tile_rows)
      if (i0 + r < L && j0 + tx < L) out[(i0 + r) * L + j0 + tx] = T(0);
    return;
  }
  T acc[tile_dim / tile_rows];
  IATTN_UNROLL
  for (unsigned q = 0; q < tile_dim / tile_rows; ++q) acc[q] = T(0);
  const simt::index tiles = (L + tile_dim - 1) / tile_dim;
  for (simt::index K = lower ? J : 0; K <= (lower ? I : tiles - 1); ++K) {
    const simt::index k0 = K * tile_dim;
    IATTN_UNROLL
    for (unsigned q = 0; q < tile_dim / tile_rows; ++q) {
      const unsigned r = ty + q * tile_rows;
      as[r][tx] = (i0 + r < L && k0 + tx < L) ? A[(i0 + r) * L + k0 + tx] : T(0);
      bs[r][tx] = (k0 + r < L && j0 + tx < L) ? B[(k0 + r) * L + j0 + tx] : T(0);
    }
    simt::sync_threads();
    IATTN_UNROLL
    for (unsigned q = 0; q < tile_dim / tile_rows; ++q) {
      const unsigned r = ty + q * tile_rows;
      const simt::index t = i0 + r, s = j0 + tx;
      // u = k0 + k over [s, t] within this tile
      const simt::index lo = lower && s > k0 ? s - k0 : 0,
                        hi = simt::min_of(lower ? t - k0 + 1 : L - k0, simt::index(tile_dim));
      for (simt::index k = lo; k < hi; ++k) acc[q] += as[r][k] * bs[k][tx];
    }
    simt::sync_threads();
  }
  IATTN_UNROLL
  for (unsigned q = 0; q < tile_dim / tile_rows; ++q) {
    const simt::index t = i0 + ty + q * tile_rows, s = j0 + tx;
    if (t < L && s < L) out[t * L + s] = lower && s > t ? T(0) : acc[q];
  }
}

}  // namespace iattn::cuda_detail
