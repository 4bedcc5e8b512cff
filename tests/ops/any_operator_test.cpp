// AnyOperator: erased expressions and compositions of erased factors against the dense oracles
// (plain-loop factor matrices multiplied in double), every evaluation function.
#include "support/expressions.hpp"

#include <iattn/any_operator.hpp>

using namespace test;

namespace {

/// Every evaluation function of H against the dense per-channel matrices dense(c), in T's tolerance.
template <class T, class Op, class F>
void check_all(const Op& H, F&& dense, Index L, Index D, Index P, double tol) {
  using namespace iattn;
  const Mat<T> x = normal<T>(L, D);
  check_close(apply(H, x), dense_apply(dense, dd(x)), tol);
  Mat<T> y = Mat<T>::Constant(1, 1, T(7));
  apply_into(y, H, x);
  check_close(y, dense_apply(dense, dd(x)), tol);
  MatD mean = MatD::Zero(L, L), mean_abs = MatD::Zero(L, L);
  for (Index c = 0; c < D; ++c) {
    const MatD Hc = dense(c);
    mean += Hc / double(D);
    mean_abs += Hc.cwiseAbs() / double(D);
    if (c == 0 || c == D - 1) {
      check_close(materialize(H, c), Hc, tol);
      check_close(block(H, c, {L / 3, L}, {0, L / 2 + 1}), Hc.block(L / 3, 0, L - L / 3, L / 2 + 1), tol);
    }
  }
  check_close(materialize_mean(H), mean, tol);
  check_close(materialize_mean(H, {.abs = true}), mean_abs, tol);
  const Tensor3<T> all = materialize_all(H);
  for (Index c : {Index(0), D - 1})
    check_close(Eigen::Map<const Mat<T>>(all.data() + c * L * L, L, L), dense(c), tol);
  for (Index t : {Index(0), L / 2, L - 1}) {
    const Mat<T> r = row(H, t), k = col(H, t);
    for (Index c : {Index(0), D - 1}) {
      check_close(r.row(c), dense(c).row(t), tol);
      check_close(k.row(c), dense(c).col(t).transpose(), tol);
    }
  }
  if (P > 0) {
    const Tensor3<T> hm = materialize_head_means(H);
    REQUIRE(hm.dims[0] == D / P);
    MatD h0 = MatD::Zero(L, L);
    for (Index c = 0; c < P; ++c) h0 += dense(c) / double(P);
    check_close(Eigen::Map<const Mat<T>>(hm.data(), L, L), h0, tol);
  }
}

}  // namespace

TEMPLATE_TEST_CASE("an erased expression evaluates as the concrete one", "[any]", float, double) {
  using T = TestType;
  const Index D = 5, N = 3;
  for (Index L : {Index(1), Index(7), Index(70), Index(130)}) {
    INFO("L = " << L);
    const mamba1<T> m(L, D, N);
    const iattn::AnyOperator<T> H = iattn::erase(m.expr());
    CHECK(H.length() == L);
    CHECK(H.channels() == D);
    CHECK(H.structure().lower);
    CHECK_FALSE(H.structure().upper);
    CHECK(H.structure().head_dim == 1);
    check_all<T>(H, [&](Index c) { return m.dense(c); }, L, D, 1, 10 * tolerance<T>());
  }
}

TEMPLATE_TEST_CASE("a product of erased factors takes the rewrites by run-time structure", "[any]", float, double) {
  using T = TestType;
  using namespace iattn;
  using A = AnyOperator<T>;
  const Index D = 4, N = 2;
  for (Index L : {Index(3), Index(65), Index(200)}) {
    INFO("L = " << L);
    const mamba1<T> m(L, D, N);
    // each factor erased on its own, then composed and erased again, as the Python package does
    const A g = erase(diagonal(m.g)), S = erase(m.S()), dt = erase(diagonal(m.dt)), skip = erase(diagonal(m.Dskip));
    const A sig = erase(diagonal(m.sig)), conv = erase(causal_conv(m.w));
    CHECK(conv.structure().band == m.K);
    CHECK(g.structure().diagonal());
    const A inner = erase(erase(S * dt) + skip);
    CHECK(inner.structure().lower);
    const A H = erase(erase(erase(g * inner) * sig) * conv);
    CHECK(H.structure().lower);
    CHECK(H.structure().band == 0);
    check_all<T>(H, [&](Index c) { return m.dense(c); }, L, D, 1, 10 * tolerance<T>());

    // the anti-causal and the dense cases: flip(S) * S has no structure, (conv * S) a band on the left
    const A F = erase(flip(S));
    CHECK(F.structure().upper);
    CHECK_FALSE(F.structure().lower);
    const A FS = erase(F * S), CS = erase(conv * S), two = erase(2.5 * erase(S + F));
    CHECK_FALSE(FS.structure().lower);
    CHECK_FALSE(FS.structure().upper);
    auto dS = [&](Index c) { return dense_semiseparable(dd(m.lam), dd(m.B), dd(m.C), D, 1, 1, c); };
    check_all<T>(FS, [&](Index c) { return MatD(dense_flip(dS(c)) * dS(c)); }, L, D, 1, 10 * tolerance<T>());
    check_all<T>(CS, [&](Index c) { return MatD(dense_conv(dd(m.w), c, L) * dS(c)); }, L, D, 1, 10 * tolerance<T>());
    check_all<T>(two, [&](Index c) { return MatD(2.5 * (dS(c) + dense_flip(dS(c)))); }, L, D, 1, 10 * tolerance<T>());
  }
}

TEMPLATE_TEST_CASE("an erased GroupNorm computes its statistics in apply and asks for bind elsewhere", "[any]", float, double) {
  using T = TestType;
  using namespace iattn;
  const mamba2<T> m(33, 2, 3, 1, 2);
  const auto concrete = m.expr();
  const AnyOperator<T> H = erase(concrete);
  const AnyOperator<T> parts = erase(erase(group_norm(m.G, m.gw)) * erase(diagonal(m.z)));
  CHECK_FALSE(H.bound());
  CHECK_FALSE(parts.bound());
  const Mat<T> x = normal<T>(m.L, m.D);
  check_close(apply(H, x), apply(concrete, x), tolerance<T>());
  check_close(apply(parts, x), apply(group_norm(m.G, m.gw) * diagonal(m.z), x), tolerance<T>());
  REQUIRE_THROWS_WITH(materialize(H, 0), Catch::Contains("bind(H, X) first"));
  REQUIRE_THROWS_WITH(materialize(parts, 0), Catch::Contains("bind(H, X) first"));
  const AnyOperator<T> Hb = bind(H, x), pb = bind(parts, x);
  CHECK(Hb.bound());
  CHECK(pb.bound());
  check_close(materialize(Hb, 1), materialize(bind(concrete, x), 1), tolerance<T>());
  check_close(apply(pb, x), apply(parts, x), tolerance<T>());
  check_close(materialize_mean(Hb), materialize_mean(bind(concrete, x)), tolerance<T>());
}

TEST_CASE("erased operands keep the shape checks and their messages", "[any][errors]") {
  using namespace iattn;
  const Mat<double> a = uniform<double>(10, 3, 0.1, 0.9), b = uniform<double>(12, 3, 0.1, 0.9);
  const AnyOperator<double> A = erase(linear_recurrence(a, a)), B = erase(diagonal(b));
  REQUIRE_THROWS_WITH(A * B, Catch::Contains("the length L"));
  REQUIRE_THROWS_WITH(apply(A, Mat<double>(9, 3)), Catch::Contains("X has shape (9, 3) but expected (L=10, D=3)"));
  REQUIRE_THROWS_WITH(materialize(A, 3), Catch::Contains("out of range"));
  REQUIRE_THROWS_WITH(materialize_head_means(A), Catch::Contains("has no heads"));
  const Mat<double> w = uniform<double>(4, 3, -1, 1);
  const AnyOperator<double> conv = erase(causal_conv(w));
  REQUIRE_THROWS_WITH(materialize(conv, 0), Catch::Contains("pass it as the last argument"));
  check_close(materialize(conv, 1, 6), dense_conv(dd(w), 1, 6), 1e-15);
}
