// iattn/backend/cpu/simd.hpp: the only header that includes xsimd.
//
// pack<T, W> is a SIMD batch of W lanes; pack<T, 1> is a plain scalar with the same interface, so
// a kernel is written once as a template on W and called with W = width<T> for the body and W = 1
// for the tail. xsimd is used when IATTN_USE_XSIMD is defined (target iattn::simd); without it
// width<T> is 1 and every kernel takes the same code path at width 1, unless a test defines
// IATTN_SIMD_EMULATE_WIDTH (lane arrays of another ISA's width, below). No xsimd type appears in a
// public signature, and this header is never included by a translation unit compiled by nvcc.
//
// xsimd renamed functions between Debian's 8.1 and 11+: hadd -> reduce_add; guarded here.
#pragma once

#include "../../core/config.hpp"

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>

#if defined(IATTN_USE_XSIMD) && IATTN_USE_XSIMD && !defined(__CUDACC__)
#include <xsimd/xsimd.hpp>
#define IATTN_HAS_XSIMD 1
#else
#define IATTN_HAS_XSIMD 0
#endif

// IATTN_SIMD_EMULATE_WIDTH (tests only, without xsimd): see the emulated packs below.
#if IATTN_HAS_XSIMD && defined(IATTN_SIMD_EMULATE_WIDTH)
#error "IATTN_SIMD_EMULATE_WIDTH replaces xsimd's packs: build without IATTN_USE_XSIMD (iattn::iattn, not iattn::simd)"
#endif
#if defined(IATTN_SIMD_EMULATE_WIDTH) && !defined(__CUDACC__)
static_assert(IATTN_SIMD_EMULATE_WIDTH == 4 || IATTN_SIMD_EMULATE_WIDTH == 8 || IATTN_SIMD_EMULATE_WIDTH == 16,
              "IATTN_SIMD_EMULATE_WIDTH: the float lanes of an ISA iattn targets (4, 8 or 16)");
#define IATTN_SIMD_EMULATED 1
#else
#define IATTN_SIMD_EMULATED 0
#endif

namespace iattn::simd {

template <class T, int W>
struct pack;

/// Width 1: a scalar.
template <class T>
struct pack<T, 1> {
  T v;
  static pack load(const T* p) { return {*p}; }
  static pack broadcast(T x) { return {x}; }
  /// Lane k holds x0 + k.
  static pack iota(T x0) { return {x0}; }
  void store(T* p) const { *p = v; }
  friend pack operator+(pack a, pack b) { return {a.v + b.v}; }
  friend pack operator-(pack a, pack b) { return {a.v - b.v}; }
  friend pack operator*(pack a, pack b) { return {a.v * b.v}; }
  friend pack operator/(pack a, pack b) { return {a.v / b.v}; }
  friend pack fma(pack a, pack b, pack c) { return {a.v * b.v + c.v}; }
  friend pack exp(pack a) { return {std::exp(a.v)}; }
  friend pack exp2(pack a) { return {std::exp2(a.v)}; }
  template <int G>
  friend void exp2_n(pack (&z)[G]) {
    for (int k = 0; k < G; ++k) z[k].v = std::exp2(z[k].v);
  }
  template <int G>
  friend void exp2_bounded_n(pack (&z)[G]) {
    exp2_n(z);
  }
  /// As the packs' (x86's maxps / minps): the second operand where either is NaN, so a kernel's
  /// width-1 tail treats NaN as its body lanes do.
  friend pack max(pack a, pack b) { return {a.v > b.v ? a.v : b.v}; }
  friend pack min(pack a, pack b) { return {a.v < b.v ? a.v : b.v}; }
  /// a >= b ? x : y, lane by lane.
  friend pack select_ge(pack a, pack b, pack x, pack y) { return {a.v >= b.v ? x.v : y.v}; }
  friend pack log(pack a) { return {std::log(a.v)}; }
  friend T reduce_add(pack a) { return a.v; }
  void pin() {}
};

/// The float exponentials' polynomials, for a float or a batch of floats (fma found by lookup or
/// ADL): the hardware packs and the emulated ones evaluate the same operations.
namespace poly {
using std::fma;
/// 2^f for |f| <= 1/2: 1 + f q(f), q of degree 4 (the fit described at exp2_f32_n).
template <class B>
B exp2_short(B f) {
  B q = fma(B(1.32647285e-3f), f, B(9.67151299e-3f));
  q = fma(q, f, B(5.55073358e-2f));
  q = fma(q, f, B(2.40222424e-1f));
  q = fma(q, f, B(6.93147004e-1f));
  return fma(q, f, B(1.f));
}
/// 2^f for |f| <= 1/2 (a little more is fine) for exp: 1 + f q(f) with q of degree 5, one degree
/// more than exp2's, so that exp keeps 1.1e-7 after its two-step reduction (max relative error
/// 1e-7 on 2^f, mean bias 1e-10).
template <class B>
B exp2_long(B f) {
  B q = fma(B(1.5353362e-4f), f, B(1.3398875e-3f));
  q = fma(q, f, B(9.6184369e-3f));
  q = fma(q, f, B(5.5503324e-2f));
  q = fma(q, f, B(2.4022648e-1f));
  q = fma(q, f, B(6.9314718e-1f));
  return fma(q, f, B(1.f));
}
}  // namespace poly

#if IATTN_HAS_XSIMD
template <class T>
inline constexpr int width = int(xsimd::batch<T>::size);

template <class T, int W>
  requires(W > 1 && W == width<T>)
struct pack<T, W> {
  using batch = xsimd::batch<T>;
  batch v;
  static pack load(const T* p) { return {batch::load_unaligned(p)}; }
  static pack broadcast(T x) { return {batch(x)}; }
  static pack iota(T x0) {
    alignas(64) T a[W];
    for (int k = 0; k < W; ++k) a[k] = x0 + T(k);
    return {batch::load_aligned(a)};
  }
  void store(T* p) const { v.store_unaligned(p); }
  /// Keeps the value in a register: the compiler may no longer fold its load into each use (GCC
  /// does so in small register-blocked products, turning one load per pack into one per use).
  void pin() {
#if defined(__GNUC__) && (defined(__x86_64__) || defined(__i386__))
    __asm__("" : "+v"(v.data));
#endif
  }
  friend pack operator+(pack a, pack b) { return {a.v + b.v}; }
  friend pack operator-(pack a, pack b) { return {a.v - b.v}; }
  friend pack operator*(pack a, pack b) { return {a.v * b.v}; }
  friend pack operator/(pack a, pack b) { return {a.v / b.v}; }
  friend pack fma(pack a, pack b, pack c) { return {xsimd::fma(a.v, b.v, c.v)}; }
  /// e^a. float: the short kernel below; double: xsimd's, its argument clamped at -1000 (where the
  /// result is 0 anyway), because xsimd's reduction converts the argument to an integer and -inf
  /// has none (undefined behaviour that clang's UBSan reports). NaN passes the clamp unchanged.
  friend pack exp(pack a) {
    if constexpr (std::is_same_v<T, float>) return {exp_f32(a.v)};
    else return {xsimd::exp(clamp_low(a.v, T(-1000)))};
  }
  /// 2^a. float: the short kernel below; double: xsimd's, clamped likewise.
  friend pack exp2(pack a) {
    if constexpr (std::is_same_v<T, float>) return {exp2_f32(a.v)};
    else return {xsimd::exp2(clamp_low(a.v, T(-1500)))};
  }
  /// z[k] = 2^z[k] for G packs, each step of the float kernel applied to all G before the next, so
  /// the G dependency chains interleave in program order and the core overlaps them without
  /// needing a deep out-of-order window. Same results as exp2 to the last bit (tested).
  template <int G>
  friend void exp2_n(pack (&z)[G]) {
    if constexpr (std::is_same_v<T, float>) exp2_f32_n<true>(z);
    else
      for (int k = 0; k < G; ++k) z[k] = exp2(z[k]);
  }
  /// exp2_n for arguments known to lie in [-125, 0] (finite), a decay's log2 in the scans' common
  /// case: the same bits with no clamp, and 2^n added into the exponent field as an integer instead
  /// of multiplied (the result is normal there, so the two agree exactly). Two operations fewer in
  /// the scan's hottest loop. Outside [-125, 0], NaN included, the result is undefined.
  template <int G>
  friend void exp2_bounded_n(pack (&z)[G]) {
    if constexpr (std::is_same_v<T, float>) {
      const batch magic(12582912.f);  // 1.5 * 2^23
      batch t[G], f[G];
      for (int k = 0; k < G; ++k) t[k] = z[k].v + magic;
      for (int k = 0; k < G; ++k) f[k] = z[k].v - (t[k] - magic);
      for (int k = 0; k < G; ++k) z[k].v = add_exponent(poly::exp2_short(f[k]), t[k]);
    } else {
      exp2_n(z);
    }
  }
  static batch clamp_low(batch a, T lo) { return xsimd::select(a < batch(lo), batch(lo), a); }
  friend pack max(pack a, pack b) { return {xsimd::max(a.v, b.v)}; }
  friend pack min(pack a, pack b) { return {xsimd::min(a.v, b.v)}; }
  friend pack select_ge(pack a, pack b, pack x, pack y) { return {xsimd::select(a.v >= b.v, x.v, y.v)}; }
  friend pack log(pack a) { return {xsimd::log(a.v)}; }
  friend T reduce_add(pack a) {
#if defined(XSIMD_VERSION_MAJOR) && XSIMD_VERSION_MAJOR < 9
    return xsimd::hadd(a.v);
#else
    return xsimd::reduce_add(a.v);
#endif
  }

 private:
  // 2^z for float lanes, the hot path of every decay. z is clamped to [-127, 128] (NaN passes
  // through: min and max keep their second operand when one is NaN) and split as n + f, n an
  // integer (nearest, ties to even) and |f| <= 1/2, by one addition: t = z + 1.5 * 2^23 rounds z
  // to an integer n held in t's low mantissa bits (t - 1.5 * 2^23 = n exactly, f = z - n
  // exactly). 2^f = 1 + f q(f) with q of degree 4, a relative minimax fit made for this library:
  // 9.1e-8 on [-1/2, 1/2], 1.7e-7 (about 3 ulp) evaluated in float, mean bias -1e-9.
  // 2^n is n + 127 shifted into the exponent field: n = -127 gives the bit pattern 0, so every
  // z <= -127 (decays below 2^-127, lambda = -inf included) is exactly 0; z = 0 gives exactly 1;
  // n = 128 gives +inf; NaN stays NaN.
  template <bool ClampHigh, int G>
  static void exp2_f32_n(pack (&z)[G]) {
    const batch magic(12582912.f);  // 1.5 * 2^23
    batch t[G], f[G];
    for (int k = 0; k < G; ++k) {
      z[k].v = xsimd::max(batch(-127.f), z[k].v);
      if constexpr (ClampHigh) z[k].v = xsimd::min(batch(128.f), z[k].v);
    }
    for (int k = 0; k < G; ++k) t[k] = z[k].v + magic;
    for (int k = 0; k < G; ++k) f[k] = z[k].v - (t[k] - magic);
    for (int k = 0; k < G; ++k) z[k].v = poly::exp2_short(f[k]) * exponent_of(t[k]);
  }
  static batch exp2_f32(batch z) {
    pack p[1] = {{z}};
    exp2_f32_n<true>(p);
    return p[0].v;
  }
  // e^x = 2^n 2^f with n = nearest(x log2 e) and f = (x - n ln 2) log2 e, the reduction done in two
  // steps (ln 2 = hi + lo, hi with 9 trailing zero bits, so n hi is exact): the error stays that of
  // 2^f whatever |x|, as in a libm, instead of growing with the rounding of x log2 e.
  static batch exp_f32(batch x) {
    x = xsimd::min(batch(88.8f), xsimd::max(batch(-88.8f), x));  // keeps r finite at +-inf
    const batch n = xsimd::nearbyint(xsimd::min(batch(128.f), xsimd::max(batch(-127.f), x * batch(1.44269504f))));
    batch r = xsimd::fma(n, batch(-0.693145752f), x);
    r = xsimd::fma(n, batch(-1.42860677e-6f), r);
    const batch f = r * batch(1.44269504f);
    const auto bits = (xsimd::to_int(n) + 127) << 23;
#if defined(XSIMD_VERSION_MAJOR) && XSIMD_VERSION_MAJOR < 9
    return poly::exp2_long(f) * xsimd::bitwise_cast<batch>(bits);
#else
    return poly::exp2_long(f) * xsimd::bitwise_cast<float>(bits);
#endif
  }
  // t = z + 1.5 * 2^23 rounded to an integer holds n = t - 1.5 * 2^23 in its low mantissa bits
  // (two's complement for n < 0); shifted left by 23 they become n in the exponent field and
  // everything above them shifts out. exponent_of: the float 2^n for n in [-127, 128] (bit pattern
  // 0, i.e. 0.0, at n = -127; +inf at 128). add_exponent: p 2^n by an integer addition, exact when
  // p 2^n is a normal float (p in [2^-1/2, 2^1/2] and n in [-125, 0]).
  using ibatch = xsimd::batch<int32_t>;
#if defined(XSIMD_VERSION_MAJOR) && XSIMD_VERSION_MAJOR < 9
  static ibatch bits_of(batch a) { return xsimd::bitwise_cast<ibatch>(a); }
  static batch from_bits(ibatch a) { return xsimd::bitwise_cast<batch>(a); }
#else
  static ibatch bits_of(batch a) { return xsimd::bitwise_cast<int32_t>(a); }
  static batch from_bits(ibatch a) { return xsimd::bitwise_cast<float>(a); }
#endif
  static batch exponent_of(batch t) { return from_bits((bits_of(t) << 23) + ibatch(127 << 23)); }
  static batch add_exponent(batch p, batch t) { return from_bits(bits_of(p) + (bits_of(t) << 23)); }
};
#elif IATTN_SIMD_EMULATED
// Emulated packs (tests only): IATTN_SIMD_EMULATE_WIDTH = F float lanes (F * 4 / sizeof(T) lanes of
// T, so 16 gives AVX-512's 16 floats and 8 doubles) as plain arrays, every operation lane by lane.
// A machine without that ISA then runs every kernel's wide path, its panel heights, register
// blocks, tails and padding, at that width (docs/decisions.md, "Widths 1, 4, 8 and 16 on every
// machine"). The float exponentials are the hardware packs' kernels lane by lane (the same bits),
// the double ones the standard library's. Never for speed.
template <class T>
inline constexpr int width = IATTN_SIMD_EMULATE_WIDTH * 4 / int(sizeof(T)) > 1
                                 ? IATTN_SIMD_EMULATE_WIDTH * 4 / int(sizeof(T))
                                 : 1;

template <class T, int W>
  requires(W > 1 && W == width<T>)
struct pack<T, W> {
  T v[W];
  template <class F>
  static pack map(F f) {
    pack r;
    for (int k = 0; k < W; ++k) r.v[k] = f(k);
    return r;
  }
  static pack load(const T* p) {
    return map([&](int k) { return p[k]; });
  }
  static pack broadcast(T x) {
    return map([&](int) { return x; });
  }
  static pack iota(T x0) {
    return map([&](int k) { return x0 + T(k); });
  }
  void store(T* p) const {
    for (int k = 0; k < W; ++k) p[k] = v[k];
  }
  void pin() {}
  friend pack operator+(pack a, pack b) {
    return map([&](int k) { return a.v[k] + b.v[k]; });
  }
  friend pack operator-(pack a, pack b) {
    return map([&](int k) { return a.v[k] - b.v[k]; });
  }
  friend pack operator*(pack a, pack b) {
    return map([&](int k) { return a.v[k] * b.v[k]; });
  }
  friend pack operator/(pack a, pack b) {
    return map([&](int k) { return a.v[k] / b.v[k]; });
  }
  friend pack fma(pack a, pack b, pack c) {
    return map([&](int k) { return std::fma(a.v[k], b.v[k], c.v[k]); });
  }
  friend pack exp(pack a) {
    return map([&](int k) {
      if constexpr (std::is_same_v<T, float>) return exp_f32(a.v[k]);
      else return std::exp(a.v[k]);
    });
  }
  friend pack exp2(pack a) {
    return map([&](int k) {
      if constexpr (std::is_same_v<T, float>) return exp2_f32(a.v[k], true);
      else return std::exp2(a.v[k]);
    });
  }
  template <int G>
  friend void exp2_n(pack (&z)[G]) {
    for (int g = 0; g < G; ++g) z[g] = exp2(z[g]);
  }
  template <int G>
  friend void exp2_bounded_n(pack (&z)[G]) {
    if constexpr (std::is_same_v<T, float>)
      for (int g = 0; g < G; ++g)
        for (int k = 0; k < W; ++k) {
          const float t = z[g].v[k] + magic, f = z[g].v[k] - (t - magic);
          z[g].v[k] = from_bits(bits_of(poly::exp2_short(f)) + (bits_of(t) << 23));
        }
    else
      exp2_n(z);
  }
  // As the hardware's max and min (x86's maxps / minps): the second operand where either is NaN.
  friend pack max(pack a, pack b) {
    return map([&](int k) { return hw_max(a.v[k], b.v[k]); });
  }
  friend pack min(pack a, pack b) {
    return map([&](int k) { return hw_min(a.v[k], b.v[k]); });
  }
  friend pack select_ge(pack a, pack b, pack x, pack y) {
    return map([&](int k) { return a.v[k] >= b.v[k] ? x.v[k] : y.v[k]; });
  }
  friend pack log(pack a) {
    return map([&](int k) { return std::log(a.v[k]); });
  }
  friend T reduce_add(pack a) {
    T s = a.v[0];
    for (int k = 1; k < W; ++k) s += a.v[k];
    return s;
  }

 private:
  // float: the hardware packs' kernels above, lane by lane, the same operations in the same order
  // (so the same bits); double: the standard library's.
  static constexpr float magic = 12582912.f;  // 1.5 * 2^23
  // x86's NaN rule, as the width-1 pack keeps it
  static T hw_max(T a, T b) { return max(pack<T, 1>{a}, pack<T, 1>{b}).v; }
  static T hw_min(T a, T b) { return min(pack<T, 1>{a}, pack<T, 1>{b}).v; }
  static std::uint32_t bits_of(float a) { return std::bit_cast<std::uint32_t>(a); }
  static float from_bits(std::uint32_t a) { return std::bit_cast<float>(a); }
  static float exp2_f32(float z, bool clamp_high) {
    z = hw_max(-127.f, z);
    if (clamp_high) z = hw_min(128.f, z);
    const float t = z + magic, f = z - (t - magic);
    return poly::exp2_short(f) * from_bits((bits_of(t) << 23) + (127u << 23));
  }
  static float exp_f32(float x) {
    x = hw_min(88.8f, hw_max(-88.8f, x));
    const float n = std::nearbyint(hw_min(128.f, hw_max(-127.f, x * 1.44269504f)));
    float r = std::fma(n, -0.693145752f, x);
    r = std::fma(n, -1.42860677e-6f, r);
    const float f = r * 1.44269504f;
    // the truncating conversion's result for NaN (x86's cvttps2dq), without the undefined cast
    const std::int32_t ni = std::isnan(n) ? std::numeric_limits<std::int32_t>::min() : std::int32_t(n);
    return poly::exp2_long(f) * from_bits((std::uint32_t(ni) + 127u) << 23);
  }
};
#else
template <class T>
inline constexpr int width = 1;
#endif

/// Name of the instruction set the packs use, for benchmark reports.
inline const char* isa_name() {
#if IATTN_HAS_XSIMD
  return xsimd::default_arch::name();
#elif IATTN_SIMD_EMULATED
  return "emulated packs (tests only)";
#else
  return "scalar (no xsimd)";
#endif
}

/// Calls body(std::integral_constant<int, W>{}, i) for i = 0, W, 2W, ... while a full pack fits,
/// then body(std::integral_constant<int, 1>{}, i) for the tail: one loop body, two widths.
template <class T, class Body>
inline void for_packs(Index n, Body&& body) {
  constexpr int W = width<T>;
  Index i = 0;
  if constexpr (W > 1)
    for (; i + W <= n; i += W) body(std::integral_constant<int, W>{}, i);
  for (; i < n; ++i) body(std::integral_constant<int, 1>{}, i);
}

/// Returns the sum over i of body(w, i), where body returns a pack of the width it is called with:
/// full packs accumulate in one register, reduced once; the tail adds width-1 packs.
template <class T, class Body>
inline T sum_packs(Index n, Body&& body) {
  constexpr int W = width<T>;
  auto acc = pack<T, W>::broadcast(T(0));
  Index i = 0;
  for (; i + W <= n; i += W) acc = acc + body(std::integral_constant<int, W>{}, i);
  T s = reduce_add(acc);
  if constexpr (W > 1)
    for (; i < n; ++i) s += body(std::integral_constant<int, 1>{}, i).v;
  return s;
}

}  // namespace iattn::simd
