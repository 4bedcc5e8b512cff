// Bad input throws std::invalid_argument naming the argument, its shape and the expected one.
#include "support/test_common.hpp"

using namespace test;
using Catch::Matchers::Contains;

TEST_CASE("operator factories check shapes", "[errors]") {
  using namespace iattn;
  const MatD lam = uniform<double>(6, 8, -1, 0), B = normal<double>(6, 4), C = normal<double>(6, 4);
  SECTION("semiseparable: B with the wrong width") {
    const MatD Bbad = normal<double>(6, 3);
    REQUIRE_THROWS_WITH(semiseparable(lam, Bbad, C, {.heads = 2, .state = 4}),
                        Contains("semiseparable") && Contains("B has shape (6, 3)") && Contains("G*N=4"));
  }
  SECTION("semiseparable: C with the wrong length") {
    const MatD Cbad = normal<double>(5, 4);
    REQUIRE_THROWS_WITH(semiseparable(lam, B, Cbad, {.heads = 2}), Contains("C has shape (5, 4)") && Contains("L=6"));
  }
  SECTION("semiseparable: lambda neither (L, H*N) nor (L, H)") {
    const MatD lbad = uniform<double>(6, 5, -1, 0);
    REQUIRE_THROWS_WITH(semiseparable(lbad, B, C, {.heads = 2}), Contains("lambda has shape (6, 5)") && Contains("H*N=8"));
  }
  SECTION("semiseparable: heads missing, groups not dividing heads") {
    REQUIRE_THROWS_WITH(semiseparable(lam, B, C, {}), Contains("options.heads"));
    REQUIRE_THROWS_WITH(semiseparable(lam, B, C, {.heads = 2, .groups = 3}), Contains("must divide heads = 2"));
  }
  SECTION("semiseparable: bonus with the wrong shape") {
    const MatD u = normal<double>(3, 4);
    REQUIRE_THROWS_WITH(semiseparable(lam, B, C, u, {.heads = 2}), Contains("bonus has shape (3, 4)") && Contains("(H=2, N=4)"));
  }
  SECTION("causal_conv: K = 0") {
    const MatD w(0, 3);
    REQUIRE_THROWS_WITH(causal_conv(w), Contains("causal_conv") && Contains("w has shape (0, 3)") && Contains("K >= 1"));
  }
  SECTION("linear_recurrence: a and b differ") {
    const MatD a = normal<double>(6, 3), b = normal<double>(6, 2);
    REQUIRE_THROWS_WITH(linear_recurrence(a, b), Contains("b has shape (6, 2)") && Contains("(6, 3)"));
  }
  SECTION("group_norm: groups that do not divide D") {
    const MatD w = MatD::Ones(1, 10);
    REQUIRE_THROWS_WITH(group_norm(3, w), Contains("group_norm") && Contains("weight has shape (1, 10)") && Contains("groups = 3"));
    REQUIRE_THROWS_WITH(group_norm<double>(0), Contains("groups is 0"));
  }
  SECTION("softmax_attention: K differs from Q") {
    const MatD Q = normal<double>(5, 4), K = normal<double>(4, 4);
    REQUIRE_THROWS_WITH(softmax_attention(Q, K), Contains("K has shape (4, 4)"));
  }
}

TEST_CASE("each shape check names the argument that is wrong", "[errors]") {
  using namespace iattn;
  using Catch::Matchers::Contains;
  // The cases: L = 16, H = 1, N = 2 (lambda per state pins N), one bad argument each.
  const MatD lam = uniform<double>(16, 2, -1, 0), B = normal<double>(16, 2), C = normal<double>(16, 2);
  SECTION("B with 3 columns: B is named, not C") {
    const MatD B3 = normal<double>(16, 3);
    REQUIRE_THROWS_WITH(semiseparable(lam, B3, C, {.heads = 1}),
                        Contains("B has shape (16, 3) but expected (L=16, G*N=2)"));
  }
  SECTION("C with 3 columns: C is named") {
    const MatD C3 = normal<double>(16, 3);
    REQUIRE_THROWS_WITH(semiseparable(lam, B, C3, {.heads = 1}),
                        Contains("C has shape (16, 3) but expected (L=16, G*N=2)"));
  }
  SECTION("lambda 15 rows long: lambda is named, with L from B and C") {
    const MatD l15 = uniform<double>(15, 2, -1, 0);
    REQUIRE_THROWS_WITH(semiseparable(l15, B, C, {.heads = 1}), Contains("lambda has shape (15, 2)") && Contains("L=16"));
  }
  SECTION("B 15 rows long: B is named") {
    const MatD B15 = normal<double>(15, 2);
    REQUIRE_THROWS_WITH(semiseparable(lam, B15, C, {.heads = 1}), Contains("B has shape (15, 2) but expected (L=16"));
  }
  SECTION("C 15 rows long: C is named") {
    const MatD C15 = normal<double>(15, 2);
    REQUIRE_THROWS_WITH(semiseparable(lam, B, C15, {.heads = 1}), Contains("C has shape (15, 2) but expected (L=16"));
  }
  SECTION("one decay per head: B and C disagree and nothing decides, both are named") {
    const MatD lh = uniform<double>(16, 1, -1, 0), B3 = normal<double>(16, 3);
    REQUIRE_THROWS_WITH(semiseparable(lh, B3, C, {.heads = 1, .head_dim = 4}),
                        Contains("B (16, 3) and C (16, 2) disagree") && Contains("options.state"));
    // options.state decides: then the one that disagrees with it is named
    REQUIRE_THROWS_WITH(semiseparable(lh, B3, C, {.heads = 1, .head_dim = 4, .state = 2}),
                        Contains("B has shape (16, 3)"));
  }
  SECTION("all three disagree on L") {
    const MatD l15 = uniform<double>(15, 2, -1, 0), B14 = normal<double>(14, 2);
    REQUIRE_THROWS_WITH(semiseparable(l15, B14, C, {.heads = 1}), Contains("disagree on L"));
  }
  SECTION("factored decay: dt and A named") {
    const MatD dt = uniform<double>(16, 1, 0, 1), A = -uniform<double>(1, 2, 0.5, 1);
    const MatD dt15 = uniform<double>(15, 1, 0, 1), A3 = -uniform<double>(1, 3, 0.5, 1);
    REQUIRE_THROWS_WITH(semiseparable(factored_decay(dt15, A), B, C, {.heads = 1}),
                        Contains("factored_decay dt has shape (15, 1) but expected (L=16, H=1)"));
    REQUIRE_THROWS_WITH(semiseparable(factored_decay(dt, A3), B, C, {.heads = 1, .state = 2}),
                        Contains("factored_decay A has shape (1, 3) but expected (H=1, N=2)"));
    // A's width pins N: a B of the wrong width is the one named
    const MatD B3 = normal<double>(16, 3);
    REQUIRE_THROWS_WITH(semiseparable(factored_decay(dt, A), B3, C, {.heads = 1}), Contains("B has shape (16, 3)"));
  }
  SECTION("wkv: w, k and u named by the majority on D") {
    const MatD w = -uniform<double>(1, 4, 0, 1), k = normal<double>(6, 4), u = normal<double>(1, 4);
    const MatD w3 = -uniform<double>(1, 3, 0, 1), k3 = normal<double>(6, 3), u3 = normal<double>(1, 3);
    REQUIRE_THROWS_WITH(wkv(w3, k, u), Contains("wkv: w has shape (1, 3)"));
    REQUIRE_THROWS_WITH(wkv(w, k3, u), Contains("wkv: k has shape (6, 3)") && Contains("D=4"));
    REQUIRE_THROWS_WITH(wkv(w, k, u3), Contains("wkv: u has shape (1, 3)"));
    const MatD w5 = -uniform<double>(5, 4, 0, 1);
    REQUIRE_THROWS_WITH(wkv(w5, k, u), Contains("wkv: w has shape (5, 4) but expected (L=6, D=4)"));
  }
}

TEMPLATE_TEST_CASE("a positive log-decay is rejected where it enters", "[errors][decay]", float, double) {
  using namespace iattn;
  using Catch::Matchers::Contains;
  using T = TestType;
  // The case: lambda = +3 at L = 300 overflowed silently into infinities.
  Mat<T> lam = uniform<T>(300, 2, -1, 0);
  const Mat<T> B = normal<T>(300, 1), C = normal<T>(300, 1);
  lam(123, 1) = T(3);
  REQUIRE_THROWS_AS(semiseparable(lam, B, C, {.heads = 2}), std::domain_error);
  REQUIRE_THROWS_WITH(semiseparable(lam, B, C, {.heads = 2}),
                      Contains("lambda[123, 1] = 3") && Contains("positive log-decay") && Contains("allow_growth"));
  // -inf (a reset), 0 (no decay) and NaN (propagated, not rejected) pass
  Mat<T> ok = uniform<T>(300, 2, -1, 0);
  ok(5, 0) = -std::numeric_limits<T>::infinity();
  ok(6, 1) = T(0);
  ok(7, 1) = std::numeric_limits<T>::quiet_NaN();
  REQUIRE_NOTHROW(semiseparable(ok, B, C, {.heads = 2}));
  // The opt-out: growing states on purpose, evaluated as asked (exact at a short length)
  const Index L = 6;
  Mat<T> grow = Mat<T>::Constant(L, 1, T(0.5));
  const Mat<T> b = Mat<T>::Ones(L, 1), c = Mat<T>::Ones(L, 1);
  const auto S = semiseparable(grow, b, c, {.heads = 1, .allow_growth = true});
  const Mat<T> m = materialize(S, 0);
  for (Index t = 0; t < L; ++t)
    for (Index s = 0; s <= t; ++s) REQUIRE(std::abs(double(m(t, s)) - std::exp(0.5 * double(t - s))) <= 1e-5 * std::exp(0.5 * double(t - s)));
  // Factored decay: dt > 0 with A > 0, and dt < 0 with A < 0, name dt's index and A's entry
  const Mat<T> dt = uniform<T>(20, 2, 0.1, 1), Bn = normal<T>(20, 3), Cn = normal<T>(20, 3);
  Mat<T> A = -uniform<T>(2, 3, 0.5, 1);
  REQUIRE_NOTHROW(semiseparable(factored_decay(dt, A), Bn, Cn, {.heads = 2}));
  A(1, 2) = T(0.25);
  REQUIRE_THROWS_WITH(semiseparable(factored_decay(dt, A), Bn, Cn, {.heads = 2}),
                      Contains("factored_decay dt[0, 1]") && Contains("A[1, 2] = 0.25"));
  Mat<T> dtneg = dt;
  dtneg(9, 0) = T(-0.5);
  REQUIRE_THROWS_WITH(semiseparable(factored_decay(dtneg, Mat<T>(-A.cwiseAbs())), Bn, Cn, {.heads = 2}),
                      Contains("factored_decay dt[9, 0] = -0.5"));
  REQUIRE_NOTHROW(semiseparable(factored_decay(dtneg, A), Bn, Cn, {.heads = 2, .allow_growth = true}));
}

TEST_CASE("evaluation entry points check their arguments", "[errors]") {
  using namespace iattn;
  const MatD lam = uniform<double>(6, 8, -1, 0), B = normal<double>(6, 4), C = normal<double>(6, 4);
  auto S = semiseparable(lam, B, C, {.heads = 2});
  SECTION("apply: X with the wrong shape") {
    const MatD x = normal<double>(5, 2);
    REQUIRE_THROWS_WITH(apply(S, x), Contains("apply: X has shape (5, 2) but expected (L=6, D=2)"));
    const MatD x2 = normal<double>(6, 3);
    REQUIRE_THROWS_AS(apply(S, x2), std::invalid_argument);
  }
  SECTION("materialize: channel out of range, L missing or contradicting") {
    REQUIRE_THROWS_WITH(materialize(S, 2), Contains("channel c = 2 is out of range [0, 2)"));
    REQUIRE_THROWS_WITH(materialize(S, -1), Contains("out of range"));
    const MatD w = normal<double>(4, 2);
    REQUIRE_THROWS_WITH(materialize(causal_conv(w), 0), Contains("does not fix the length L"));
    REQUIRE_THROWS_WITH(materialize(S, 0, 7), Contains("L is 7 but the expression has length 6"));
  }
  SECTION("row, col, block: indices out of range") {
    REQUIRE_THROWS_WITH(row(S, 6), Contains("t = 6 is out of range"));
    REQUIRE_THROWS_WITH(col(S, -1), Contains("s = -1 is out of range"));
    REQUIRE_THROWS_WITH(block(S, 0, {2, 1}, {0, 1}), Contains("rows = [2, 1)"));
    REQUIRE_THROWS_WITH(block(S, 0, {0, 1}, {0, 9}), Contains("cols = [0, 9)"));
  }
  SECTION("bind: X with the wrong shape") {
    const MatD gw = MatD::Ones(1, 2), x = normal<double>(6, 3);
    REQUIRE_THROWS_WITH(bind(group_norm(1, gw) * S, x), Contains("bind: X has shape (6, 3)"));
  }
}

TEST_CASE("an empty sequence gives an empty result", "[errors]") {
  using namespace iattn;
  const MatD x(0, 3);
  const MatD dc = MatD::Ones(1, 3), w = MatD::Ones(2, 3);
  const MatD y = apply(diagonal(dc) * causal_conv(w), x);
  REQUIRE(y.rows() == 0);
  REQUIRE(y.cols() == 3);
  REQUIRE(materialize(causal_conv(w), 0, 0).size() == 0);
}
