// iattn/backend/cuda/simt.hpp: the SIMT interface every CUDA kernel of iattn is written against.
// One source, two executions: under nvcc these are CUDA's built-ins and the kernels are real
// __global__ functions; in any other compiler they are the emulator's (emulator.hpp), which runs a
// block's threads concurrently on std::threads with the same barrier and shared-memory semantics.
//
//   thread_idx(), block_idx(), block_dim(), grid_dim()   CUDA's threadIdx, blockIdx, blockDim, gridDim
//   thread_rank(), lane(), warp()                        linear index in the block, lane, warp
//   grid_stride(n, f)                                    f(i) for this thread's i in [0, n), 1-D launch
//   sync_threads(), sync_warp()                          __syncthreads(), __syncwarp()
//   IATTN_SHARED(T, name, [n][m]);                       __shared__ T name[n][m]; (kernel body only)
//   dynamic_shared<T>()                                  the launch's dynamic shared memory
//   shfl_xor(v, mask, width), shfl_down(v, delta, width) __shfl_xor_sync / __shfl_down_sync, full mask
//   warp_sum(v, width), block_sum(v, scratch)            reductions built on them
//   exp(x), min_of(a, b)                                 the math kernels use, host and device
//   IATTN_BOUNDS(threads, min_blocks)                    __launch_bounds__ (nothing when emulated)
//   IATTN_UNROLL                                         #pragma unroll (nothing when emulated)
//
// Rules the kernels keep (the emulator reports breaking the first three): every thread of a block
// reaches every sync_threads; every lane of a warp takes part in each shuffle (blocks of whole
// warps where shuffles are used); shared arrays are declared at the top of the kernel body; no
// xsimd, Eigen or other host-only header here or in a kernel header.
#pragma once

#include "../../core/host_device.hpp"
#include "config.hpp"

#include <cmath>

#if defined(__CUDACC__)
#include <cuda_runtime.h>
#define IATTN_SHARED(type, name, ...) __shared__ type name __VA_ARGS__
#define IATTN_BOUNDS(threads, min_blocks) __launch_bounds__(threads, min_blocks)
#define IATTN_UNROLL _Pragma("unroll")
#else
#include "emulator.hpp"
#define IATTN_SHARED(type, name, ...) auto& name = ::iattn::simt::emu::shared_static<type __VA_ARGS__>()
#define IATTN_BOUNDS(threads, min_blocks)
#define IATTN_UNROLL
#endif

namespace iattn::simt {

#if defined(__CUDACC__)

IATTN_DEVICE dims thread_idx() { return {threadIdx.x, threadIdx.y, threadIdx.z}; }
IATTN_DEVICE dims block_idx() { return {blockIdx.x, blockIdx.y, blockIdx.z}; }
IATTN_DEVICE dims block_dim() { return {blockDim.x, blockDim.y, blockDim.z}; }
IATTN_DEVICE dims grid_dim() { return {gridDim.x, gridDim.y, gridDim.z}; }
IATTN_DEVICE void sync_threads() { __syncthreads(); }
IATTN_DEVICE void sync_warp() { __syncwarp(); }

template <class V>
IATTN_DEVICE V shfl_xor(V v, int lane_mask, int width = warp_size) {
  return __shfl_xor_sync(0xffffffffu, v, lane_mask, width);
}
template <class V>
IATTN_DEVICE V shfl_down(V v, unsigned delta, int width = warp_size) {
  return __shfl_down_sync(0xffffffffu, v, delta, width);
}
/// The launch's dynamic shared memory (launch_config::shared_bytes), 16-byte aligned.
template <class V>
IATTN_DEVICE V* dynamic_shared() {
  extern __shared__ __align__(16) unsigned char iattn_simt_dynamic_shared[];
  return reinterpret_cast<V*>(iattn_simt_dynamic_shared);
}

#else  // emulated

inline dims thread_idx() { return emu::context().thread; }
inline dims block_idx() { return emu::context().block; }
inline dims block_dim() { return emu::context().run->config().block; }
inline dims grid_dim() { return emu::context().run->config().grid; }
inline void sync_threads() {
  emu::thread_context& c = emu::context();
  c.run->sync_block(c.rank);
}
inline void sync_warp() {
  emu::thread_context& c = emu::context();
  c.run->sync_warp(c.rank);
}

/// Lane (lane ^ lane_mask)'s value; within segments of `width` lanes, a source in a later segment
/// gives the lane's own value (CUDA's rule).
template <class V>
V shfl_xor(V v, int lane_mask, int width = warp_size) {
  const int lane = static_cast<int>(emu::context().rank % warp_size);
  const int src = lane ^ lane_mask;
  return emu::shuffle(v, src >= (lane / width + 1) * width ? -1 : src);
}
/// Lane (lane + delta)'s value; lanes whose source is past their segment of `width` keep theirs.
template <class V>
V shfl_down(V v, unsigned delta, int width = warp_size) {
  const int lane = static_cast<int>(emu::context().rank % warp_size);
  const int src = lane % width + static_cast<int>(delta) >= width ? -1 : lane + static_cast<int>(delta);
  return emu::shuffle(v, src);
}
template <class V>
V* dynamic_shared() {
  return reinterpret_cast<V*>(emu::context().run->dynamic_shared());
}

#endif

IATTN_DEVICE unsigned thread_rank() {
  const dims t = thread_idx(), b = block_dim();
  return t.x + b.x * (t.y + b.y * t.z);
}
IATTN_DEVICE unsigned lane() { return thread_rank() % warp_size; }
IATTN_DEVICE unsigned warp() { return thread_rank() / warp_size; }

/// Calls f(i) for the items i of [0, n) this thread owns in a grid-stride loop (1-D grid and
/// block): i = its global index, then every grid's worth of threads after it.
template <class F>
IATTN_DEVICE void grid_stride(index n, F&& f) {
  const index stride = index(grid_dim().x) * block_dim().x;
  for (index i = index(block_idx().x) * block_dim().x + thread_idx().x; i < n; i += stride) f(i);
}

/// The sum over each segment of `width` lanes (a power of two <= 32), in every lane of it: a
/// butterfly of shfl_xor, so every lane gets the same bits.
template <class V>
IATTN_DEVICE V warp_sum(V v, int width = warp_size) {
  for (int o = width / 2; o > 0; o /= 2) v += shfl_xor(v, o, width);
  return v;
}

/// The sum over the block, in every thread. scratch: shared memory for one value per warp; the
/// block must be whole warps. Two sync_threads; scratch may be reused after it returns.
template <class V>
IATTN_DEVICE V block_sum(V v, V* scratch) {
  v = warp_sum(v);
  if (lane() == 0) scratch[warp()] = v;
  sync_threads();
  const unsigned nwarps = static_cast<unsigned>((block_dim().count() + warp_size - 1) / warp_size);
  V total = V(0);
  for (unsigned w = 0; w < nwarps; ++w) total += scratch[w];
  sync_threads();
  return total;
}

IATTN_HOST_DEVICE inline float exp(float x) {
#if defined(__CUDA_ARCH__)
  return ::expf(x);
#else
  return std::exp(x);
#endif
}
IATTN_HOST_DEVICE inline double exp(double x) {
#if defined(__CUDA_ARCH__)
  return ::exp(x);
#else
  return std::exp(x);
#endif
}

template <class V>
IATTN_HOST_DEVICE inline V min_of(V a, V b) {
  return b < a ? b : a;
}

}  // namespace iattn::simt
