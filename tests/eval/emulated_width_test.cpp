// The emulated packs (simd.hpp, IATTN_SIMD_EMULATE_WIDTH) that let any machine run every kernel at
// a pack width its ISA lacks (16 floats without AVX-512, 8 with it): their widths, and each operation
// lane by lane against the width-1 pack (a plain scalar) or x86's rule. tests/CMakeLists.txt compiles
// this file with the kernels' own tests into emulated_width_test, whose other files then check the
// kernels at that width against their oracles.
#if defined(IATTN_CATCH2_V3)
#include <catch2/catch_all.hpp>
#else
#include <catch2/catch.hpp>
#endif

#include <iattn/backend/cpu/simd.hpp>

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <type_traits>

namespace {

using iattn::simd::pack;
using iattn::simd::width;

template <class T>
void check_lanes(const pack<T, width<T>>& p, const T (&expected)[width<T>]) {
  for (int k = 0; k < width<T>; ++k) {
    INFO("lane " << k);
    if (std::isnan(expected[k])) CHECK(std::isnan(p.v[k]));
    else CHECK(p.v[k] == expected[k]);
  }
}

}  // namespace

TEST_CASE("emulated packs: the widths asked for", "[emulated]") {
#if !IATTN_SIMD_EMULATED
  FAIL("built without IATTN_SIMD_EMULATE_WIDTH (or with xsimd): the kernels run at the native width");
#else
  STATIC_REQUIRE(width<float> == IATTN_SIMD_EMULATE_WIDTH);
  STATIC_REQUIRE(width<double> == IATTN_SIMD_EMULATE_WIDTH / 2);
  CHECK(std::string(iattn::simd::isa_name()).find("emulated") != std::string::npos);
#endif
}

TEMPLATE_TEST_CASE("emulated packs: every operation lane by lane", "[emulated]", float, double) {
  using T = TestType;
  constexpr int W = width<T>;
  STATIC_REQUIRE(W > 1);
  using P = pack<T, W>;
  using S = pack<T, 1>;
  const T nan = std::numeric_limits<T>::quiet_NaN(), inf = std::numeric_limits<T>::infinity();
  T a[W], b[W], c[W];
  for (int k = 0; k < W; ++k) {
    a[k] = T(0.37) * T(k) - T(2.1);
    b[k] = T(1.3) - T(0.21) * T(k * k % 7);
    c[k] = T(k % 3) - T(0.5);
  }
  a[1] = nan, b[2] = nan, a[3] = -inf, b[4] = -inf;  // NaN and -inf in both operands' lanes
  const P pa = P::load(a), pb = P::load(b), pc = P::load(c);

  auto same = [&](const P& p, auto op) {  // p against op applied to the scalar lanes of a, b, c
    T e[W];
    for (int k = 0; k < W; ++k) e[k] = op(S{a[k]}, S{b[k]}, S{c[k]}).v;
    check_lanes<T>(p, e);
  };
  same(pa + pb, [](S x, S y, S) { return x + y; });
  same(pa - pb, [](S x, S y, S) { return x - y; });
  same(pa * pb, [](S x, S y, S) { return x * y; });
  same(pa / pb, [](S x, S y, S) { return x / y; });
  same(fma(pa, pb, pc), [](S x, S y, S z) { return S{std::fma(x.v, y.v, z.v)}; });
  same(select_ge(pa, pb, pc, pa), [](S x, S y, S z) { return select_ge(x, y, z, x); });
  same(log(pc * pc + P::broadcast(T(0.25))), [](S, S, S z) { return log(z * z + S{T(0.25)}); });
  // max and min as x86's maxps / minps (the hardware packs'): the second operand where either is NaN
  same(max(pa, pb), [](S x, S y, S) { return S{x.v > y.v ? x.v : y.v}; });
  same(min(pa, pb), [](S x, S y, S) { return S{x.v < y.v ? x.v : y.v}; });

  // The exponentials: the float kernels of the hardware packs (2e-7 relative, exact 0 below 2^-127,
  // exact 1 at 0, inf and NaN kept), the standard library's in double; exp2_n and the bounded form
  // give exp2's bits.
  T in[W];
  double worst = 0;
  for (double x0 = -87.0; x0 <= 80.0; x0 += 0.0123) {
    for (int k = 0; k < W; ++k) in[k] = T(x0 + k * 1e-4);
    const P e = exp(P::load(in)), e2 = exp2(P::load(in));
    for (int k = 0; k < W; ++k) {
      worst = std::max(worst, std::abs(double(e.v[k]) / std::exp(double(in[k])) - 1));
      worst = std::max(worst, std::abs(double(e2.v[k]) / std::exp2(double(in[k])) - 1));
    }
  }
  CHECK(worst < (std::is_same_v<T, float> ? 2e-7 : 1e-15));
  const T special[] = {T(0), -inf, T(-2000), nan, inf, T(-1e-30)};
  for (int k = 0; k < W; ++k) in[k] = special[k % 6];
  for (const P e : {exp(P::load(in)), exp2(P::load(in))})
    for (int k = 0; k < W; ++k) {
      INFO("x = " << in[k]);
      if (k % 6 == 0 || k % 6 == 5) CHECK(e.v[k] == T(1));
      if (k % 6 == 1 || k % 6 == 2) CHECK(e.v[k] == T(0));
      if (k % 6 == 3) CHECK(std::isnan(e.v[k]));
      if (k % 6 == 4) CHECK(std::isinf(e.v[k]));
    }
  for (double x0 = -125.0; x0 <= 0; x0 += 0.37) {
    for (int k = 0; k < W; ++k) in[k] = T(std::max(-125.0, x0 + k * 0.011));
    P z[2] = {P::load(in), P::load(in)};
    exp2_n(z);
    const P e2 = exp2(P::load(in));
    P zb[1] = {P::load(in)};
    exp2_bounded_n(zb);
    for (int k = 0; k < W; ++k) {
      INFO("x = " << in[k]);
      CHECK(z[0].v[k] == e2.v[k]);
      CHECK(z[1].v[k] == e2.v[k]);
      CHECK(zb[0].v[k] == e2.v[k]);
    }
  }

  T out[W + 2];
  out[W] = out[W + 1] = T(7);
  P::iota(T(3)).store(out);  // writes W lanes, no more
  for (int k = 0; k < W; ++k) CHECK(out[k] == T(3 + k));
  CHECK(out[W] == T(7));
  CHECK(reduce_add(P::iota(T(1))) == T(W * (W + 1) / 2));
  CHECK(reduce_add(P::broadcast(T(0.5))) == T(W) / 2);
}
