// iattn/backend/cpu/simd.hpp: the only header that includes xsimd.
//
// pack<T, W> is a SIMD batch of W lanes; pack<T, 1> is a plain scalar with the same interface, so
// a kernel is written once as a template on W and called with W = width<T> for the body and W = 1
// for the tail. xsimd is used when IATTN_USE_XSIMD is defined (target iattn::simd); without it
// width<T> is 1 and every kernel
// takes the same code path at width 1. No xsimd type appears in a public signature, and this header
// is never included by a translation unit compiled by nvcc.
//
// xsimd renamed functions between Debian's 8.1 and 11+: hadd -> reduce_add; guarded here.
#pragma once

#include "../../core/config.hpp"

#include <cmath>

#if defined(IATTN_USE_XSIMD) && IATTN_USE_XSIMD && !defined(__CUDACC__)
#include <xsimd/xsimd.hpp>
#define IATTN_HAS_XSIMD 1
#else
#define IATTN_HAS_XSIMD 0
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
  void store(T* p) const { *p = v; }
  friend pack operator+(pack a, pack b) { return {a.v + b.v}; }
  friend pack operator-(pack a, pack b) { return {a.v - b.v}; }
  friend pack operator*(pack a, pack b) { return {a.v * b.v}; }
  friend pack operator/(pack a, pack b) { return {a.v / b.v}; }
  friend pack fma(pack a, pack b, pack c) { return {a.v * b.v + c.v}; }
  friend pack exp(pack a) { return {std::exp(a.v)}; }
  friend pack max(pack a, pack b) { return {a.v < b.v ? b.v : a.v}; }
  friend T reduce_add(pack a) { return a.v; }
};

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
  void store(T* p) const { v.store_unaligned(p); }
  friend pack operator+(pack a, pack b) { return {a.v + b.v}; }
  friend pack operator-(pack a, pack b) { return {a.v - b.v}; }
  friend pack operator*(pack a, pack b) { return {a.v * b.v}; }
  friend pack operator/(pack a, pack b) { return {a.v / b.v}; }
  friend pack fma(pack a, pack b, pack c) { return {xsimd::fma(a.v, b.v, c.v)}; }
  friend pack exp(pack a) { return {xsimd::exp(a.v)}; }
  friend pack max(pack a, pack b) { return {xsimd::max(a.v, b.v)}; }
  friend T reduce_add(pack a) {
#if defined(XSIMD_VERSION_MAJOR) && XSIMD_VERSION_MAJOR < 9
    return xsimd::hadd(a.v);
#else
    return xsimd::reduce_add(a.v);
#endif
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
