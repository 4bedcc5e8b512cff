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
