// Built without xsimd and without OpenMP: the kernels take the width-1 path. Same oracles.
#include "support/expressions.hpp"

#include <cmath>
#include <limits>

using namespace test;

TEST_CASE("width-1 path: no xsimd", "[scalar]") {
  STATIC_REQUIRE(iattn::simd::width<float> == 1);
  STATIC_REQUIRE(iattn::simd::width<double> == 1);
}

TEMPLATE_TEST_CASE("width-1 pack: max and min as the hardware packs (x86's rule)", "[scalar]", float, double) {
  // The second operand where either is NaN, as maxps / minps: a kernel's width-1 tail then treats
  // NaN as its body lanes do.
  using S = iattn::simd::pack<TestType, 1>;
  const TestType nan = std::numeric_limits<TestType>::quiet_NaN(), x = TestType(1.5);
  CHECK(std::isnan(max(S{x}, S{nan}).v));
  CHECK(max(S{nan}, S{x}).v == x);
  CHECK(std::isnan(min(S{x}, S{nan}).v));
  CHECK(min(S{nan}, S{x}).v == x);
  CHECK(max(S{x}, S{TestType(-2)}).v == x);
  CHECK(min(S{x}, S{TestType(-2)}).v == TestType(-2));
  CHECK(!std::signbit(max(S{TestType(-0.0)}, S{TestType(0.0)}).v));  // equal: the second
  CHECK(std::signbit(min(S{TestType(0.0)}, S{TestType(-0.0)}).v));
}

TEMPLATE_TEST_CASE("width-1 path matches the oracles", "[scalar]", float, double) {
  using T = TestType;
  for (Index L : {Index(1), Index(7), Index(257)}) {
    const mamba1<T> m(L, 3, 5);
    const Mat<T> x = normal<T>(L, 3);
    const MatD y = iattn::apply(m.expr(), x).template cast<double>();
    for (Index c = 0; c < 3; ++c) {
      check_close(iattn::materialize(m.expr(), c), m.dense(c), tolerance<T>());
      check_close(y.col(c), MatD(m.dense(c) * dd(x).col(c)), tolerance<T>());
    }
    const Mat<T> lam = uniform<T>(L, 2, -1, 0), B = normal<T>(L, 6), C = normal<T>(L, 6), u = normal<T>(2, 3);
    auto S = iattn::semiseparable(lam, B, C, u, {.heads = 2, .head_dim = 2, .groups = 2});
    for (Index c = 0; c < 4; ++c) {
      const MatD ud = dd(u);
      check_close(iattn::materialize(S, c), dense_semiseparable(dd(lam), dd(B), dd(C), 2, 2, 2, c, true, &ud), tolerance<T>());
    }
  }
}
