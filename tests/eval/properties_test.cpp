// Evaluation properties on model-shaped expressions: apply = materialize x, row/col/block equal the
// materialized matrix, materialize_mean is the mean, causality, bind then materialize equals the
// forward, and materialize(A*B) = materialize(A) materialize(B).
#include "support/expressions.hpp"

using namespace test;
using Catch::Matchers::Contains;

namespace {

template <class H>
void check_properties(const H& h, const MatD& x, double tol, bool causal) {
  using namespace iattn;
  const Index L = x.rows(), D = x.cols();
  const MatD y = apply(h, x);
  std::vector<MatD> M(static_cast<std::size_t>(D));
  MatD mean = MatD::Zero(L, L);
  for (Index c = 0; c < D; ++c) {
    M[std::size_t(c)] = materialize(h, c);
    mean += M[std::size_t(c)] / double(D);
    INFO("channel " << c);
    check_close(M[std::size_t(c)] * x.col(c), y.col(c), tol);  // apply = materialize x
    if (causal) REQUIRE(MatD(M[std::size_t(c)].triangularView<Eigen::StrictlyUpper>()).cwiseAbs().maxCoeff() == 0.0);
  }
  check_close(materialize_mean(h), mean, tol);
  for (Index t : {Index(0), L / 3, L - 1}) {
    const MatD r = row(h, t), k = col(h, t);
    for (Index c = 0; c < D; ++c) {
      check_close(r.row(c), M[std::size_t(c)].row(t), tol);
      check_close(k.row(c), M[std::size_t(c)].col(t).transpose(), tol);
    }
  }
  // The write-into forms: the same values, every entry written (outputs start as NaN), the
  // caller's storage kept when its shape already fits.
  const double nan = std::numeric_limits<double>::quiet_NaN();
  MatD Y(1, 1);
  apply_into(Y, h, x);
  check_close(Y, y, tol);  // a bound GroupNorm: fused slabs here, apply composes the factors
  const double* storage = Y.data();
  Y.setConstant(nan);
  apply_into(Y, h, x);
  REQUIRE(Y.data() == storage);
  check_close(Y, y, tol);
  MatD xa = x;
  REQUIRE_THROWS_WITH(apply_into(xa, h, xa), Contains("apply_into: Y is X"));
  MatD Mc = MatD::Constant(L, L, nan);
  materialize_into(Mc, h, D - 1);
  check_close(Mc, M[std::size_t(D - 1)], 0.0);
  MatD R = MatD::Constant(D, L, nan), K = MatD::Constant(D, L, nan);
  row_into(R, h, L - 1);
  col_into(K, h, 0);
  check_close(R, MatD(row(h, L - 1)), 0.0);
  check_close(K, MatD(col(h, 0)), 0.0);
  REQUIRE_THROWS_WITH(row_into(R, h, L), Contains("row_into: t = " + std::to_string(L) + " is out of range"));
  if (L >= 3) {
    const range rows{L / 3, L}, cols{1, std::max<Index>(2, 2 * L / 3)};
    check_close(block(h, D - 1, rows, cols), M[std::size_t(D - 1)].block(rows.begin, cols.begin, rows.size(), cols.size()), tol);
  }
}

}  // namespace

TEST_CASE("properties: Mamba-1 composite", "[properties]") {
  for (Index L : {Index(1), Index(7), Index(64), Index(130)}) {
    INFO("L = " << L);
    const mamba1<double> m(L, 5, 16);
    check_properties(m.expr(), normal<double>(L, 5), 1e-10, true);
    check_properties(m.expr_dense(), normal<double>(L, 5), 1e-10, true);
    check_close(iattn::materialize(m.expr(), 2), m.dense(2), 1e-10);
    check_close(iattn::materialize(m.expr_dense(), 2), m.dense(2), 1e-10);
  }
}

TEST_CASE("properties: Mamba-1 composite in float", "[properties]") {
  // 21 channels: two full 8-lane packs and a tail of 5 in the channel-vectorised scan
  const mamba1<float> m(200, 21, 16);
  const Mat<float> x = normal<float>(200, 21);
  const MatD y = iattn::apply(m.expr(), x).cast<double>(), yd = iattn::apply(m.expr_dense(), x).cast<double>();
  for (Index c = 0; c < 21; ++c) {
    check_close(y.col(c), MatD(m.dense(c) * dd(x).col(c)), 1e-4);
    check_close(yd.col(c), MatD(m.dense(c) * dd(x).col(c)), 1e-4);
  }
  const MatD r = iattn::row(m.expr(), 150).cast<double>(), k = iattn::col(m.expr(), 40).cast<double>();
  for (Index c : {Index(0), Index(9), Index(20)}) {
    check_close(r.row(c), m.dense(c).row(150), 1e-4);
    check_close(k.row(c), m.dense(c).col(40).transpose(), 1e-4);
  }
}

TEST_CASE("properties: bound Mamba-2 expression (GroupNorm)", "[properties][bind]") {
  for (Index L : {Index(1), Index(7), Index(100)}) {
    INFO("L = " << L);
    const mamba2<double> m(L, 4, 3, 2, 8);
    const MatD x = normal<double>(L, m.D);
    auto h = m.expr();
    auto hb = iattn::bind(h, x);
    // bind then materialize equals the forward
    const MatD y = iattn::apply(h, x);
    for (Index c = 0; c < m.D; ++c) check_close(iattn::materialize(hb, c) * x.col(c), y.col(c), 1e-10);
    check_properties(hb, x, 1e-10, true);
  }
}

TEST_CASE("properties: RWKV-like row-normalised strict form", "[properties]") {
  for (Index L : {Index(1), Index(7), Index(100)}) {
    const rwkv<double> m(L, 3);
    check_properties(m.expr(), normal<double>(L, 3), 1e-10, true);
    // rows of the normalised part sum to one
    const MatD R = iattn::materialize(iattn::row_normalize(iattn::semiseparable(m.lam, m.kexp, m.ones, m.u, {.heads = 3, .groups = 3})), 1);
    for (Index t = 0; t < L; ++t) REQUIRE(std::abs(R.row(t).sum() - 1.0) < 1e-12);
  }
}

TEST_CASE("properties: bidirectional (forward + flipped backward)", "[properties]") {
  for (Index L : {Index(2), Index(70)}) {
    const bidir<double> m(L, 3, 4);
    check_properties(m.expr(), normal<double>(L, 3), 1e-10, false);
    check_close(iattn::materialize(m.expr(), 1), m.f.dense(1) + dense_flip(m.b.dense(1)), 1e-10);
  }
}

TEST_CASE("materialize(A*B) = materialize(A) materialize(B) on composites", "[properties]") {
  const Index L = 90;
  const mamba1<double> a(L, 3, 4), b(L, 3, 6);
  const auto A = a.expr(), B = b.expr();
  for (Index c = 0; c < 3; ++c)
    check_close(iattn::materialize(A * B, c), iattn::materialize(A, c) * iattn::materialize(B, c), 1e-10);
}
