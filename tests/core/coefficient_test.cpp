// The lifetime rule: lvalues with row-major contiguous storage are referenced; rvalues, expressions
// and other layouts are owned (evaluated once).
#include "support/test_common.hpp"

using namespace test;

TEST_CASE("coefficients reference lvalues and own everything else", "[coefficient]") {
  using namespace iattn;
  MatD d = normal<double>(5, 3);
  auto ref = diagonal(d);
  REQUIRE_FALSE(ref.d().owning());
  REQUIRE(ref.d().data() == d.data());
  d(2, 1) = 42;  // a referenced coefficient sees the change
  REQUIRE(materialize(ref, 1)(2, 2) == 42);

  auto owned = diagonal(MatD(d));  // rvalue: owned
  REQUIRE(owned.d().owning());
  auto expr = diagonal(d * 2.0);  // expression: evaluated once, owned
  REQUIRE(expr.d().owning());
  d(2, 1) = 0;
  REQUIRE(materialize(owned, 1)(2, 2) == 42);
  REQUIRE(materialize(expr, 1)(2, 2) == 84);

  const Eigen::MatrixXd colmajor = d;  // column-major lvalue: copied into the row-major layout
  auto cm = diagonal(colmajor);
  REQUIRE(cm.d().owning());
  check_close(materialize(cm, 2), materialize(diagonal(d), 2), 0.0);

  // copies of an operator share owned storage
  auto copy = owned;
  REQUIRE(copy.d().data() == owned.d().data());
}

TEST_CASE("apply accepts column-major inputs and maps", "[coefficient]") {
  using namespace iattn;
  const MatD lam = uniform<double>(9, 2, -1, 0), B = normal<double>(9, 1), C = normal<double>(9, 1);
  auto S = semiseparable(lam, B, C, {.heads = 2});
  const MatD x = normal<double>(9, 2);
  const Eigen::MatrixXd xc = x;
  const Eigen::Map<const MatD> xm(x.data(), 9, 2);
  check_close(apply(S, xc), apply(S, x), 0.0);
  check_close(apply(S, xm), apply(S, x), 0.0);
}
