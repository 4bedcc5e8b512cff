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
//   exp(x), sincos(x, s, c), min_of(a, b)                the math kernels use, host and device
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

/// s = sin x, c = cos x, the same code on the host and the device (no library call: CUDA's
/// sincos keeps a local-memory array for its slow range reduction). x = q pi/2 + r with q the
/// nearest integer to x 2/pi (the 1.5 * 2^52 rounding trick) and r = x - q pi/2 in double by
/// fdlibm's three-part Cody-Waite split of pi/2 (33 significant bits per part: exact products for
/// |q| < 2^20, so |x| up to 1.6e6 reduces to full accuracy); then Cephes' minimax polynomials on
/// [-pi/4, pi/4] in T (about 1 ulp), picked and signed by q mod 4. NaN and infinities give NaN.
template <class T>
IATTN_HOST_DEVICE inline void sincos(T x, T& s, T& c) {
  const double magic = 6755399441055744.0;  // 1.5 * 2^52
  const double xd = double(x);
  const double q = (xd * 0.636619772367581343075535053490057448 + magic) - magic;
  double rd = xd - q * 1.57079632673412561417e+00;
  rd = rd - q * 6.07710050630396597660e-11;
  rd = rd - q * 2.02226624871116645580e-21;
  const T r = T(rd), z = r * r;
  T sp, cp;
  if constexpr (sizeof(T) <= 4) {
    sp = (T(-1.9515295891e-4) * z + T(8.3321608736e-3)) * z + T(-1.6666654611e-1);
    cp = (T(2.443315711809948e-5) * z + T(-1.388731625493765e-3)) * z + T(4.166664568298827e-2);
  } else {
    sp = T(1.58962301576546568060e-10) * z + T(-2.50507477628578072866e-8);
    sp = sp * z + T(2.75573136213857245213e-6);
    sp = sp * z + T(-1.98412698295895385996e-4);
    sp = sp * z + T(8.33333333332211858878e-3);
    sp = sp * z + T(-1.66666666666666307295e-1);
    cp = T(-1.13585365213876817300e-11) * z + T(2.08757008419747316778e-9);
    cp = cp * z + T(-2.75573141792967388112e-7);
    cp = cp * z + T(2.48015872888517045348e-5);
    cp = cp * z + T(-1.38888888888730564116e-3);
    cp = cp * z + T(4.16666666666665929218e-2);
  }
  const T sr = r * z * sp + r, cr = z * z * cp + (T(1) - T(0.5) * z);
  // q mod 4 in {0, 1, 2, 3}: sin x = (S, C, -S, -C)[j], cos x = (C, -S, -C, S)[j].
  const double q4 = q - 4.0 * ((q * 0.25 + magic) - magic);  // in [-2, 2]
  const int j = q4 == q4 ? int(q4 < 0 ? q4 + 4 : q4) & 3 : 0;  // NaN: any j (s and c are NaN)
  const T sign = j >= 2 ? T(-1) : T(1);
  s = sign * ((j & 1) ? cr : sr);
  c = sign * ((j & 1) ? -sr : cr);
}

template <class V>
IATTN_HOST_DEVICE inline V min_of(V a, V b) {
  return b < a ? b : a;
}

}  // namespace iattn::simt
