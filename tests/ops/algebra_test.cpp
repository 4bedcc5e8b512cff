// Algebra nodes: sum, scalar scale, identity, flip, row_normalize, against dense oracles.
#include "support/test_common.hpp"

using namespace test;

TEMPLATE_TEST_CASE("algebra nodes match their dense definitions", "[algebra]", float, double) {
  using T = TestType;
  using namespace iattn;
  const Index D = 4;
  for (Index L : lengths) {
    INFO("L = " << L);
    const Mat<T> a = uniform<T>(L, D, 0.2, 0.95), b = uniform<T>(L, D, 0.1, 1.0), d = normal<T>(L, D);
    const Mat<T> x = normal<T>(L, D);
    auto R = linear_recurrence(a, b);
    const double tol = tolerance<T>();
    for (Index c : {Index(0), D - 1}) {
      const MatD Rd = dense_linear_recurrence(dd(a), dd(b), c), Dd = dense_diagonal(dd(d), c, L);
      check_close(materialize(R + diagonal(d), c), Rd + Dd, tol);
      check_close(materialize(2.5 * R, c), 2.5 * Rd, tol);
      check_close(materialize(R * 0.5, c), 0.5 * Rd, tol);
      check_close(materialize(identity() * R, c), Rd, tol);
      check_close(materialize(R + identity(), c), Rd + MatD::Identity(L, L), tol);
      check_close(materialize(flip(R), c), dense_flip(Rd), tol);
      MatD Rn = Rd;
      for (Index t = 0; t < L; ++t) Rn.row(t) /= Rd.row(t).sum();
      check_close(materialize(row_normalize(R), c), Rn, tol);
    }
    auto oracle = [&](Index c) {
      const MatD Rd = dense_linear_recurrence(dd(a), dd(b), c);
      MatD Rn = Rd;
      for (Index t = 0; t < L; ++t) Rn.row(t) /= Rd.row(t).sum();
      return MatD(dense_flip(Rd) + 3.0 * Rn - dense_diagonal(dd(d), c, L));
    };
    check_close(apply(flip(R) + 3.0 * row_normalize(R) + (-1.0) * diagonal(d), x), dense_apply(oracle, dd(x)), tol);
  }
}

TEST_CASE("flip(flip(A)) is A; flip makes a causal operator anti-causal", "[algebra]") {
  using namespace iattn;
  const Index L = 100, D = 3;
  const MatD lam = uniform<double>(L, D * 4, -1, 0), B = normal<double>(L, 4), C = normal<double>(L, 4);
  auto S = semiseparable(lam, B, C, {.heads = D});
  STATIC_REQUIRE(is_lower_v<decltype(S)>);
  STATIC_REQUIRE(is_upper_v<decltype(flip(S))>);
  STATIC_REQUIRE(is_lower_v<decltype(flip(flip(S)))>);
  const MatD M = materialize(S, 1), F = materialize(flip(S), 1);
  check_close(materialize(flip(flip(S)), 1), M, 1e-14);
  for (Index t = 0; t < L; ++t)
    for (Index s = 0; s < t; ++s) REQUIRE(F(s, t) == F(s, t));  // finite
  REQUIRE(MatD(F.triangularView<Eigen::StrictlyLower>()).cwiseAbs().maxCoeff() == 0.0);
  const MatD x = normal<double>(L, D);
  check_close(apply(flip(flip(S)), x), apply(S, x), 1e-13);
}

TEST_CASE("product and sum reject operands of different sizes", "[algebra][errors]") {
  using namespace iattn;
  const MatD d1 = normal<double>(5, 3), d2 = normal<double>(6, 3), d3 = normal<double>(5, 4);
  REQUIRE_THROWS_WITH(diagonal(d1) * diagonal(d2), Catch::Matchers::Contains("product") && Catch::Matchers::Contains("length L"));
  REQUIRE_THROWS_WITH(diagonal(d1) + diagonal(d3), Catch::Matchers::Contains("sum") && Catch::Matchers::Contains("channel count D"));
}
