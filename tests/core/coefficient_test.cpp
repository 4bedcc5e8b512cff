// The ownership rule: factories own their operands (an lvalue copied once, an rvalue moved, an
// expression evaluated once); iattn::ref(m) references contiguous row-major storage with no copy.
#include "support/test_common.hpp"

using namespace test;

template <class M>
concept can_ref = requires(M&& m) { iattn::ref(std::forward<M>(m)); };

TEST_CASE("coefficients own lvalues, rvalues and expressions; ref() references", "[coefficient]") {
  using namespace iattn;
  MatD d = normal<double>(5, 3);
  auto copied = diagonal(d);  // lvalue: copied once
  REQUIRE(copied.d().owning());
  REQUIRE(copied.d().data() != d.data());
  auto referenced = diagonal(ref(d));  // explicit zero-copy reference
  REQUIRE_FALSE(referenced.d().owning());
  REQUIRE(referenced.d().data() == d.data());
  const double before = d(2, 1);
  d(2, 1) = 42;  // a referenced coefficient sees the change, an owned one does not
  REQUIRE(materialize(referenced, 1)(2, 2) == 42);
  REQUIRE(materialize(copied, 1)(2, 2) == before);

  MatD moved_from = d;
  const double* storage = moved_from.data();
  auto moved = diagonal(std::move(moved_from));  // rvalue: moved in, no copy
  REQUIRE(moved.d().owning());
  REQUIRE(moved.d().data() == storage);
  auto expr = diagonal(d * 2.0);  // expression: evaluated once, owned
  REQUIRE(expr.d().owning());
  d(2, 1) = 0;
  REQUIRE(materialize(moved, 1)(2, 2) == 42);
  REQUIRE(materialize(expr, 1)(2, 2) == 84);

  const Eigen::MatrixXd colmajor = d;  // column-major lvalue: copied into the row-major layout
  auto cm = diagonal(colmajor);
  REQUIRE(cm.d().owning());
  check_close(materialize(cm, 2), materialize(diagonal(d), 2), 0.0);

  // copies of an operator share owned storage
  auto copy = moved;
  REQUIRE(copy.d().data() == moved.d().data());

  // ref() of a block of whole rows references it; of a column-major or strided object it throws
  auto rows = diagonal(ref(d.middleRows(1, 3)));
  REQUIRE(rows.d().data() == d.data() + 3);
  REQUIRE(rows.length() == 3);
  REQUIRE_THROWS_WITH(diagonal(ref(colmajor)), Catch::Matchers::Contains("iattn::ref") &&
                                                   Catch::Matchers::Contains("(5, 3)") &&
                                                   Catch::Matchers::Contains("not contiguous row-major"));
  REQUIRE_THROWS_AS(diagonal(ref(d.leftCols(2))), std::invalid_argument);
  // a temporary matrix cannot be referenced (it would dangle): ref(MatD(...)) does not compile;
  // lvalues and temporary views of live storage can
  STATIC_REQUIRE_FALSE(can_ref<MatD>);
  STATIC_REQUIRE(can_ref<const MatD&>);
  STATIC_REQUIRE(can_ref<decltype(d.middleRows(1, 3))>);
}

namespace {
// The example: an expression built in a helper from the helper's own locals.
template <class T>
auto gate_conv(const Mat<T>& z, const Mat<T>& w) {
  Mat<T> silu_z = z.array() / (1 + (-z.array()).exp());
  Mat<T> taps = w;  // another local, passed as an lvalue
  return iattn::diagonal(silu_z) * iattn::causal_conv(taps);  // both die here: the operator owns copies
}

template <class T>
auto decayed_scan(const Mat<T>& lambda_in, const Mat<T>& B_in, const Mat<T>& C_in, const Mat<T>& gate_in) {
  // Every operand is a local lvalue: the returned expression must not reference any of them.
  const Mat<T> lambda = lambda_in, B = B_in, C = C_in, gate = gate_in;
  return iattn::diagonal(gate) * iattn::semiseparable(lambda, B, C, {.heads = lambda.cols()});
}
}  // namespace

TEMPLATE_TEST_CASE("an expression built from a function's locals stays valid", "[coefficient]", float, double) {
  using T = TestType;
  const Index L = 37, D = 5, K = 4;
  const Mat<T> z = normal<T>(L, D), w = normal<T>(K, D), x = normal<T>(L, D);
  const auto H = gate_conv(z, w);
  // Overwrite the heap the helper's locals used, so a dangling reference would read garbage.
  std::vector<Mat<T>> noise;
  for (int i = 0; i < 8; ++i) noise.push_back(Mat<T>::Constant(L, D, T(1e30)));
  // Dense oracle with plain loops: y_t[c] = silu(z_t[c]) * sum_k w[k, c] x_{t-K+1+k}[c]
  Mat<double> expect(L, D);
  for (Index t = 0; t < L; ++t)
    for (Index c = 0; c < D; ++c) {
      double acc = 0;
      for (Index k = 0; k < K; ++k)
        if (t - K + 1 + k >= 0) acc += double(w(k, c)) * double(x(t - K + 1 + k, c));
      const double zz = z(t, c);
      expect(t, c) = zz / (1 + std::exp(-zz)) * acc;
    }
  check_close(iattn::apply(H, x), expect, tolerance<T>());

  const Mat<T> lambda = uniform<T>(L, D, -1, 0), B = normal<T>(L, 1), C = normal<T>(L, 1), gate = normal<T>(L, D);
  const auto S = decayed_scan<T>(lambda, B, C, gate);
  noise.push_back(Mat<T>::Constant(L, D, T(-1e30)));
  // Dense oracle: gate_t[c] * sum... = gate_t[c] C_t exp(sum_{k=s+1..t} lambda_k[c]) B_s
  for (Index c : {Index(0), Index(2)}) {
    Mat<double> dense = Mat<double>::Zero(L, L);
    for (Index t = 0; t < L; ++t)
      for (Index s = 0; s <= t; ++s) {
        double sum = 0;
        for (Index k = s + 1; k <= t; ++k) sum += lambda(k, c);
        dense(t, s) = double(gate(t, c)) * double(C(t, 0)) * std::exp(sum) * double(B(s, 0));
      }
    check_close(iattn::materialize(S, c), dense, tolerance<T>());
  }
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
