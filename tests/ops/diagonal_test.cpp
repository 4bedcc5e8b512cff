// Diagonal against the dense oracle: per-token (L, D) and constant (1, D) diagonals.
#include "support/test_common.hpp"

using namespace test;

TEMPLATE_TEST_CASE("diagonal matches the dense oracle", "[diagonal]", float, double) {
  using T = TestType;
  const Index D = 19;  // a SIMD tail across channels
  for (Index L : lengths) {
    INFO("L = " << L);
    const Mat<T> d = normal<T>(L, D), x = normal<T>(L, D);
    auto H = iattn::diagonal(d);
    for (Index c : {Index(0), Index(7), D - 1}) // a (1, D) coefficient (L = 1) reads as token-constant, so L is passed explicitly
      check_close(iattn::materialize(H, c, L), dense_diagonal(dd(d), c, L), tolerance<T>());
    check_close(iattn::apply(H, x), dense_apply([&](Index c) { return dense_diagonal(dd(d), c, L); }, dd(x)), tolerance<T>());
  }
}

TEMPLATE_TEST_CASE("a (1, D) diagonal is constant over tokens and adapts to L", "[diagonal]", float, double) {
  using T = TestType;
  const Index D = 5;
  const Mat<T> d = normal<T>(1, D);
  auto H = iattn::diagonal(d);
  REQUIRE(H.length() == iattn::any);
  for (Index L : lengths) {
    const Mat<T> x = normal<T>(L, D);
    check_close(iattn::apply(H, x), dense_apply([&](Index c) { return dense_diagonal(dd(d), c, L); }, dd(x)), tolerance<T>());
    check_close(iattn::materialize(H, 3, L), dense_diagonal(dd(d), 3, L), tolerance<T>());
  }
}
