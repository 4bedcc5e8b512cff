// iattn/backend/cuda/kernels/storage16.hpp: the CUDA backend's 16-bit storage types and their
// conversions, one source for the GPU and the emulator (free of Eigen and of CUDA's headers):
//
//   float16          IEEE 754 binary16, CUDA's __half layout: sign, 5 exponent bits, 10 mantissa bits
//   bfloat16         the upper half of a binary32, CUDA's __nv_bfloat16 layout: 8 exponent, 7 mantissa
//   to_float(v)      v's exact value as a float (every 16-bit value is a float)
//   round_to<S>(f)   f rounded to the nearest S, ties to even; beyond S's largest finite value ±inf
//                    (float16: |f| >= 65520; bfloat16: above 3.3961e38), NaN stays a (quiet) NaN
//   widen_values<S>, narrow_values<S>   kernels: a (n) array of S to float and back, grid-stride
//
// They are storage only (docs/cuda.md, "16-bit storage"): the backend reads them into float,
// computes in float and rounds once on the way out. The conversions are integer code, so the GPU
// and the emulator give the same bits (CUDA's __float2half_rn and __float2bfloat16_rn round the same
// way: ties to even).
#pragma once

#include "diagonal.hpp"  // elementwise_threads, simt

#include <cstdint>
#include <bit>
#include <type_traits>

namespace iattn {

/// IEEE 754 binary16 storage (CUDA's __half layout). Convert with to_float and round_to<float16>.
struct float16 {
  std::uint16_t bits = 0;
};
/// bfloat16 storage: the upper 16 bits of a binary32 (CUDA's __nv_bfloat16 layout).
struct bfloat16 {
  std::uint16_t bits = 0;
};

/// float16 or bfloat16.
template <class T>
inline constexpr bool is_storage16_v = std::is_same_v<T, float16> || std::is_same_v<T, bfloat16>;

namespace cuda_detail {
IATTN_HOST_DEVICE inline std::uint32_t float_bits(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  return std::bit_cast<std::uint32_t>(f);
#endif
}
IATTN_HOST_DEVICE inline float bits_float(std::uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  return std::bit_cast<float>(u);
#endif
}
}  // namespace cuda_detail

IATTN_HOST_DEVICE inline float to_float(bfloat16 v) { return cuda_detail::bits_float(std::uint32_t(v.bits) << 16); }

IATTN_HOST_DEVICE inline float to_float(float16 v) {
  const std::uint32_t sign = std::uint32_t(v.bits & 0x8000u) << 16;
  const std::uint32_t e = (v.bits >> 10) & 0x1Fu, m = v.bits & 0x3FFu;
  if (e == 0x1F) return cuda_detail::bits_float(sign | 0x7F800000u | (m << 13));  // inf, NaN (payload kept)
  if (e != 0) return cuda_detail::bits_float(sign | ((e + 112u) << 23) | (m << 13));
  // zero or subnormal: m 2^-24, exact in float
  const float a = static_cast<float>(m) * 5.9604644775390625e-8f;
  return sign ? -a : a;
}

/// f rounded to the nearest S, ties to even (see the header comment).
template <class S>
IATTN_HOST_DEVICE inline S round_to(float f);

template <>
IATTN_HOST_DEVICE inline bfloat16 round_to<bfloat16>(float f) {
  const std::uint32_t u = cuda_detail::float_bits(f);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return bfloat16{std::uint16_t((u >> 16) | 0x40u)};  // NaN, quieted
  // Adding 0x7FFF plus the kept part's lowest bit rounds to nearest, ties to even; a carry out of
  // the mantissa steps the exponent (to inf above the largest finite value).
  return bfloat16{std::uint16_t((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16)};
}

template <>
IATTN_HOST_DEVICE inline float16 round_to<float16>(float f) {
  const std::uint32_t u = cuda_detail::float_bits(f);
  const std::uint16_t sign = std::uint16_t((u >> 16) & 0x8000u);
  const std::uint32_t a = u & 0x7FFFFFFFu;
  if (a > 0x7F800000u) return float16{std::uint16_t(sign | 0x7E00u | ((a >> 13) & 0x3FFu))};  // NaN, quieted
  if (a >= 0x477FF000u) return float16{std::uint16_t(sign | 0x7C00u)};  // >= 65520 (and inf): inf
  if (a >= 0x38800000u) {  // >= 2^-14: a normal float16
    std::uint32_t h = ((a >> 23) - 112u) << 10 | ((a >> 13) & 0x3FFu);
    const std::uint32_t rest = a & 0x1FFFu;
    if (rest > 0x1000u || (rest == 0x1000u && (h & 1u))) ++h;  // a carry steps the exponent
    return float16{std::uint16_t(sign | h)};
  }
  // Below 2^-14: a subnormal float16, round(|f| 2^24) units of 2^-24. |f| < 2^-25 rounds to 0 (the
  // float subnormals among them).
  const std::uint32_t e = a >> 23;
  if (e < 102) return float16{sign};
  const std::uint32_t m = (a & 0x7FFFFFu) | 0x800000u, shift = 126u - e;  // |f| 2^24 = m 2^-shift, shift in [14, 24]
  std::uint32_t q = m >> shift;
  const std::uint32_t rest = m & ((1u << shift) - 1u), half = 1u << (shift - 1u);
  if (rest > half || (rest == half && (q & 1u))) ++q;  // 0x400 is the smallest normal: still right
  return float16{std::uint16_t(sign | q)};
}

namespace cuda_detail {

/// dst[i] = to_float(src[i]), i < n.
template <class S>
IATTN_KERNEL IATTN_BOUNDS(elementwise_threads, 4) void widen_values(const S* src, float* dst, simt::index n) {
  simt::grid_stride(n, [&](simt::index i) { dst[i] = to_float(src[i]); });
}
/// dst[i] = round_to<S>(src[i]), i < n.
template <class S>
IATTN_KERNEL IATTN_BOUNDS(elementwise_threads, 4) void narrow_values(const float* src, S* dst, simt::index n) {
  simt::grid_stride(n, [&](simt::index i) { dst[i] = round_to<S>(src[i]); });
}

}  // namespace cuda_detail
}  // namespace iattn
