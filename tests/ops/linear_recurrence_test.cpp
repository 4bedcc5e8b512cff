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

// row of a chain whose core is a LinearRecurrence runs the transposed chain backwards from token t
// in one pass per slab (LinearRecurrence::row_scaled), slabs as wide as the channels split over
// the threads. Against the dense product from plain loops, for a bare recurrence and for
// diag * R * diag * conv with per-token and constant scales, resets and negative decays.
TEMPLATE_TEST_CASE("row of a streaming linear_recurrence chain matches the dense rows", "[linear_recurrence][row]", float,
                   double) {
  using T = TestType;
  const Index D = 200;
  for (Index L : {Index(1), Index(2), Index(40), Index(300)}) {
    INFO("L = " << L);
    Mat<T> a = uniform<T>(L, D, 0.3, 0.99);
    for (Index t = 3; t < L; t += 17) a(t, t % D) = T(0);            // resets
    for (Index t = 5; t < L; t += 11) a(t, (t + 1) % D) *= T(-1);  // negative decays
    const Mat<T> b = normal<T>(L, D), g = normal<T>(L, D), p = normal<T>(1, D), w = normal<T>(4, D);
    auto R = iattn::linear_recurrence(a, b);
    auto chain = iattn::diagonal(g) * iattn::linear_recurrence(a, b) * iattn::diagonal(p) * iattn::causal_conv(w);
    const MatD ad = dd(a), bd = dd(b), gd = dd(g), pd = dd(p), wd = dd(w);
    std::vector<Index> ts = {0, L / 2, L - 1};
    std::vector<MatD> want_r(ts.size(), MatD(D, L)), want_chain(ts.size(), MatD(D, L));
    for (Index c = 0; c < D; ++c) {
      const MatD Rc = dense_linear_recurrence(ad, bd, c);
      // diag(p) Conv: the diagonal's entries times Conv's rows (a dense product of the two, L^3 per
      // channel, was 85 % of this test's time under the sanitizers)
      const MatD Mc = dense_diagonal(pd, c, L).diagonal().asDiagonal() * dense_conv(wd, c, L);
      for (std::size_t k = 0; k < ts.size(); ++k) {
        want_r[k].row(c) = Rc.row(ts[k]);
        want_chain[k].row(c) = gd(ts[k], c) * (Rc.row(ts[k]) * Mc);
      }
    }
#if defined(_OPENMP)
    const int threads0 = omp_get_max_threads();
    for (int threads : {1, 2, 3}) {
      omp_set_num_threads(threads);
#else
    for (int threads : {1}) {
#endif
      INFO("threads = " << threads);
      for (std::size_t k = 0; k < ts.size(); ++k) {
        INFO("t = " << ts[k]);
        check_close(iattn::row(R, ts[k]), want_r[k], tolerance<T>());
        Mat<T> out = Mat<T>::Constant(D, L, T(7));  // entries after t must be overwritten with 0
        iattn::row_into(out, chain, ts[k]);
        check_close(out, want_chain[k], tolerance<T>());
      }
    }
#if defined(_OPENMP)
    omp_set_num_threads(threads0);
#endif
  }
}
