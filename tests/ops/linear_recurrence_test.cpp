// LinearRecurrence against the dense oracle and against the recurrence itself; a = 0 resets and
// negative decays.
#include "support/test_common.hpp"

using namespace test;

TEMPLATE_TEST_CASE("linear_recurrence matches the dense oracle", "[linear_recurrence]", float, double) {
  using T = TestType;
  const Index D = 21;
  for (Index L : lengths) {
    INFO("L = " << L);
    Mat<T> a = uniform<T>(L, D, 0.3, 0.99);
    for (Index t = 3; t < L; t += 17) a(t, t % D) = T(0);   // resets
    for (Index t = 5; t < L; t += 11) a(t, (t + 1) % D) *= T(-1);  // negative decays
    const Mat<T> b = normal<T>(L, D), x = normal<T>(L, D);
    auto R = iattn::linear_recurrence(a, b);
    for (Index c : {Index(0), Index(10), D - 1})
      check_close(iattn::materialize(R, c), dense_linear_recurrence(dd(a), dd(b), c), tolerance<T>());
    check_close(iattn::apply(R, x), dense_apply([&](Index c) { return dense_linear_recurrence(dd(a), dd(b), c); }, dd(x)),
                tolerance<T>());
  }
}

TEST_CASE("linear_recurrence apply is the recurrence h_t = a_t h_{t-1} + b_t x_t", "[linear_recurrence]") {
  const Index L = 300, D = 4;
  const MatD a = uniform<double>(L, D, 0, 1), b = normal<double>(L, D), x = normal<double>(L, D);
  MatD y(L, D);
  for (Index c = 0; c < D; ++c) {
    double h = 0;
    for (Index t = 0; t < L; ++t) y(t, c) = h = a(t, c) * h + b(t, c) * x(t, c);
  }
  check_close(iattn::apply(iattn::linear_recurrence(a, b), x), y, 1e-13);
}
