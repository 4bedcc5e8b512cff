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

TEST_CASE("group_norm: bound_to forms the diagonal once; inconsistent statistics are refused", "[group_norm][errors]") {
  const Index L = 9, D = 12, G = 3;
  const MatD v = normal<double>(L, D, 2.0), w = uniform<double>(1, D, 0.5, 1.5);
  const auto n = iattn::group_norm(G, w, {.centered = true});
  const auto b = iattn::bind(n, v);
  MatD full, linear;
  reference(v, G, 1e-5, true, w, full, linear);
  // scale()(t, c) = w[c] / sigma_t[g(c)], the diagonal apply reads
  check_close(b.scale().cwiseProduct(v), linear, 1e-13);
  for (Index t = 0; t < L; ++t)
    for (Index c = 0; c < D; ++c) REQUIRE(b.scale()(t, c) == b.value(t, c, D));
  // statistics whose shapes disagree with the norm, named with their shapes
  auto s = n.compute(v.data(), L, D);
  auto bad = s;
  bad.inv_sigma.resize(L, G + 1);
  REQUIRE_THROWS_AS(n.bound_to(bad), std::invalid_argument);
  REQUIRE_THROWS_WITH(n.bound_to(bad), Catch::Matchers::Contains("inv_sigma (9, 4)") && Catch::Matchers::Contains("groups = 3"));
  bad = s;
  bad.channels = 10;  // not divisible by 3 and not the weight's 12
  REQUIRE_THROWS_WITH(n.bound_to(bad), Catch::Matchers::Contains("D = 10"));
  bad = s;
  bad.mean.resize(L - 1, G);
  REQUIRE_THROWS_WITH(n.bound_to(bad), Catch::Matchers::Contains("mean (8, 3)"));
  // channels left 0: the weight's D
  bad = s;
  bad.channels = 0;
  REQUIRE(n.bound_to(bad).channels() == D);
  check_close(n.bound_to(bad).scale(), b.scale(), 0.0);
  // a bound norm applied to another width is refused by the drivers, not read out of bounds
  REQUIRE_THROWS_AS(iattn::apply(iattn::group_norm<double>(G).bound_to(iattn::group_norm<double>(G).compute(v.data(), L, D)),
                                 MatD(normal<double>(L, 6))),
                    std::invalid_argument);
}

TEMPLATE_TEST_CASE("group_norm: a bound norm inside a scan's chain (Mamba-2's gated norm)", "[group_norm]", float, double) {
  using T = TestType;
  using namespace iattn;
  // H = diag(z) N S diag(dt): the norm joins the scan's row scalings, the caller's matrices stream
  const Index H = 3, P = 4, N = 5, D = H * P;
  for (Index L : lengths) {
    if (L > 257) continue;
    INFO("L = " << L);
    const Mat<T> lam = uniform<T>(L, H, -0.6, -0.05), B = normal<T>(L, N), C = normal<T>(L, N), z = normal<T>(L, D),
                 dt = uniform<T>(L, D, 0.1, 1.0), x = normal<T>(L, D), nw = uniform<T>(1, D, 0.5, 1.5);
    const auto S = semiseparable(lam, B, C, {.heads = H, .head_dim = P, .groups = 1});
    const auto body = S * diagonal(dt);
    const auto nb = bind(group_norm(H, nw, {.eps = 1e-6}), apply(body, x));
    const auto e = diagonal(z) * nb * body;
    auto oracle = [&](Index c) {
      MatD m = dense_semiseparable(dd(lam), dd(B), dd(C), H, P, 1, c);
      for (Index t = 0; t < L; ++t)
        for (Index s = 0; s < L; ++s)
          m(t, s) *= double(z(t, c)) * double(nw(0, c)) * double(nb.stats().inv_sigma(t, c / P)) * double(dt(s, c));
      return m;
    };
    const MatD want = dense_apply(oracle, dd(x));
    check_close(apply(e, x), want, 10 * tolerance<T>());
    Mat<T> y;
    apply_into(y, e, x);
    check_close(y, want, 10 * tolerance<T>());
    const MatD r = dd(row(e, L - 1));
    for (Index c : {Index(0), D - 1}) check_close(r.row(c), oracle(c).row(L - 1), 10 * tolerance<T>());
  }
}
