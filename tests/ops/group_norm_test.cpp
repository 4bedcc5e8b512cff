// GroupNorm: apply is the norm's linear part with statistics from its input; bind fixes them;
// the centred norm's offset completes the layer output; unbound evaluation throws.
#include "support/test_common.hpp"

using namespace test;

namespace {
// Reference group norm (plain loops): returns the full normalised output and the linear part.
void reference(const MatD& v, Index G, double eps, bool centered, const MatD& w, MatD& full, MatD& linear) {
  const Index L = v.rows(), D = v.cols(), Dg = D / G;
  full.resize(L, D);
  linear.resize(L, D);
  for (Index t = 0; t < L; ++t)
    for (Index g = 0; g < G; ++g) {
      double mu = 0, ss = 0;
      if (centered) {
        for (Index i = 0; i < Dg; ++i) mu += v(t, g * Dg + i);
        mu /= double(Dg);
      }
      for (Index i = 0; i < Dg; ++i) ss += (v(t, g * Dg + i) - mu) * (v(t, g * Dg + i) - mu);
      const double sigma = std::sqrt(ss / double(Dg) + eps);
      for (Index i = 0; i < Dg; ++i) {
        const Index c = g * Dg + i;
        full(t, c) = w(0, c) * (v(t, c) - mu) / sigma;
        linear(t, c) = w(0, c) * v(t, c) / sigma;
      }
    }
}
}  // namespace

TEMPLATE_TEST_CASE("group_norm: apply, bind, materialize and offset", "[group_norm]", float, double) {
  using T = TestType;
  const Index D = 12;
  for (bool centered : {false, true})
    for (Index G : {Index(1), Index(3)})
      for (Index L : lengths) {
        INFO("centered " << centered << ", G = " << G << ", L = " << L);
        const Mat<T> v = normal<T>(L, D, 2.0), w = uniform<T>(1, D, 0.5, 1.5);
        auto n = iattn::group_norm(G, w, {.eps = 1e-5, .centered = centered});
        MatD full, linear;
        reference(dd(v), G, 1e-5, centered, dd(w), full, linear);
        check_close(iattn::apply(n, v), linear, tolerance<T>());
        auto b = iattn::bind(n, v);
        REQUIRE(b.bound());
        REQUIRE_FALSE(n.bound());
        check_close(iattn::apply(b, v), linear, tolerance<T>());
        check_close(iattn::apply(b, v) + iattn::offset(b), full, tolerance<T>());
        if (L <= 257) {
          const Index c = D - 1;
          MatD M = MatD::Zero(L, L);
          for (Index t = 0; t < L; ++t) M(t, t) = linear(t, c) / double(v(t, c));
          check_close(iattn::materialize(b, c), M, 10 * tolerance<T>());
        }
      }
}

TEST_CASE("group_norm without a weight adapts to D; statistics of a bound norm stay fixed", "[group_norm]") {
  const Index L = 5, D = 6;
  const MatD v = normal<double>(L, D), v2 = normal<double>(L, D);
  auto n = iattn::group_norm<double>(2);
  auto b = iattn::bind(n, v);
  REQUIRE(b.channels() == D);
  // bound: the same diagonal whatever the input
  const MatD scale = iattn::apply(b, MatD::Ones(L, D));
  check_close(iattn::apply(b, v2), scale.cwiseProduct(v2), 1e-14);
  // unbound: statistics follow the input
  check_close(iattn::apply(n, v2), iattn::apply(iattn::bind(n, v2), v2), 1e-14);
}

TEST_CASE("materializing an unbound GroupNorm throws", "[group_norm][errors]") {
  const MatD w = MatD::Ones(1, 4), d = normal<double>(6, 4);
  auto H = iattn::group_norm(2, w) * iattn::diagonal(d);
  REQUIRE_THROWS_AS(iattn::materialize(H, 0), std::invalid_argument);
  REQUIRE_THROWS_WITH(iattn::materialize(H, 0), Catch::Matchers::Contains("unbound GroupNorm"));
  REQUIRE_THROWS_AS(iattn::row(H, 0), std::invalid_argument);
  REQUIRE_THROWS_AS(iattn::col(H, 0), std::invalid_argument);
  REQUIRE_THROWS_AS(iattn::materialize_mean(H), std::invalid_argument);
  REQUIRE_THROWS_AS(iattn::block(H, 0, {0, 2}, {0, 2}), std::invalid_argument);
  REQUIRE_NOTHROW(iattn::materialize(iattn::bind(H, normal<double>(6, 4)), 0));
}
