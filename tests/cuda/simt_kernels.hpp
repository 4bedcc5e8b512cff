// tests/cuda/simt_kernels.hpp: small kernels that exercise the SIMT interface itself (indices,
// barriers, static and dynamic shared memory, shuffles, reductions), run by the emulated test and
// by the real-GPU test, and the deliberately broken kernel of the race checks.
#pragma once

#include <iattn/backend/cuda/launch.hpp>

namespace simt_test {

using iattn::simt::index;
namespace simt = iattn::simt;

/// out[i] = in[i] + in[i + 1 within the block, cyclically], through shared memory. With Sync the
/// block meets between the writes and the reads; without it the kernel races (the broken kernel).
template <bool Sync, class T>
IATTN_KERNEL void neighbour_sum(const T* in, T* out, index n) {
  IATTN_SHARED(T, buf, [256]);
  const unsigned tid = simt::thread_idx().x, nt = simt::block_dim().x;
  const index i = index(simt::block_idx().x) * nt + tid;
  buf[tid] = i < n ? in[i] : T(0);
  if constexpr (Sync) simt::sync_threads();
  const T right = buf[(tid + 1) % nt];
  if (i < n) out[i] = buf[tid] + right;
}

/// out[i] = the 2-D block's thread and block indices folded into one number, per thread, and the
/// block sum of `in` through dynamic shared memory (block of whole warps).
template <class T>
IATTN_KERNEL void indices_and_block_sum(const T* in, T* out, T* sums) {
  T* scratch = simt::dynamic_shared<T>();
  const simt::dims t = simt::thread_idx(), b = simt::block_idx(), bd = simt::block_dim(), gd = simt::grid_dim();
  const unsigned rank = simt::thread_rank();
  const index block = b.x + index(gd.x) * b.y;
  const index i = block * index(bd.count()) + rank;
  out[i] = T(t.x + 10 * t.y + 100 * b.x + 1000 * b.y);
  const T s = simt::block_sum(in[i], scratch);
  if (rank == 0) sums[block] = s;
}

/// For each lane: shfl_xor(v, mask, width), shfl_down(v, delta, width) and warp_sum(v, width) of
/// v = in[i], written to out (3 values per thread).
template <class T>
IATTN_KERNEL void shuffles(const T* in, T* out, int mask, unsigned delta, int width) {
  const index i = index(simt::block_idx().x) * simt::block_dim().x + simt::thread_idx().x;
  const T v = in[i];
  out[3 * i] = simt::shfl_xor(v, mask, width);
  out[3 * i + 1] = simt::shfl_down(v, delta, width);
  out[3 * i + 2] = simt::warp_sum(v, width);
}

}  // namespace simt_test
