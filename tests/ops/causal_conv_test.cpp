// CausalConv against the dense oracle and against PyTorch's Conv1d(padding=K-1)[..., :L] formula
// written out directly; short and long kernels (K = L).
#include "support/test_common.hpp"

using namespace test;

TEMPLATE_TEST_CASE("causal_conv matches the dense oracle", "[causal_conv]", float, double) {
  using T = TestType;
  const Index D = 11;
  for (Index L : lengths)
    for (Index K : {Index(1), Index(4), L}) {
      INFO("L = " << L << ", K = " << K);
      const Mat<T> w = normal<T>(K, D), x = normal<T>(L, D);
      auto M = iattn::causal_conv(w);
      for (Index c : {Index(0), D - 1}) check_close(iattn::materialize(M, c, L), dense_conv(dd(w), c, L), tolerance<T>());
      check_close(iattn::apply(M, x), dense_apply([&](Index c) { return dense_conv(dd(w), c, L); }, dd(x)), tolerance<T>());
    }
}

TEST_CASE("causal_conv follows PyTorch's depthwise Conv1d(padding=K-1)[..., :L]", "[causal_conv]") {
  const Index L = 9, D = 3, K = 4;
  const MatD w = normal<double>(K, D), x = normal<double>(L, D);
  // y_t[c] = sum_{k<K} w[k, c] x_{t-K+1+k}[c], x zero before the start
  MatD y = MatD::Zero(L, D);
  for (Index t = 0; t < L; ++t)
    for (Index c = 0; c < D; ++c)
      for (Index k = 0; k < K; ++k)
        if (t - K + 1 + k >= 0) y(t, c) += w(k, c) * x(t - K + 1 + k, c);
  check_close(iattn::apply(iattn::causal_conv(w), x), y, 1e-13);
}

// A sum of scaled convolutions as the first factor of a chain (Griffin's document-masked conv,
// sum_k diag(s_k) Lag_k) is formed per token inside the scan's pass (row_ops::conv_sum), and a
// LinearRecurrence core streams slabs as wide as the channels split over the threads
// (stream_width). Every thread count gives another slab split; each must match the dense product.
TEMPLATE_TEST_CASE("a sum of scaled convolutions streams into a scan at every slab split", "[causal_conv][streaming]", float,
                   double) {
  using T = TestType;
  const Index D = 300;
  for (Index L : {Index(1), Index(5), Index(257)}) {
    INFO("L = " << L);
    // Griffin's terms: lag k only (taps (k+1, D), row 0 ones), scaled by w[3-k] where a document
    // boundary does not mask it; a general conv with channel zeros; a conv with an all-zero lag.
    const Mat<T> w = normal<T>(4, D);
    std::vector<Index> seg(static_cast<std::size_t>(L));
    for (Index t = 0; t < L; ++t) seg[std::size_t(t)] = t < 100 ? t : (t - 100) % 37;  // boundaries at 100, 137, ...
    std::vector<Mat<T>> scale, taps;
    for (Index k = 0; k < 3; ++k) {
      Mat<T> s(L, D), lag = Mat<T>::Zero(k + 1, D);
      lag.row(0).setOnes();
      for (Index t = 0; t < L; ++t)
        for (Index c = 0; c < D; ++c) s(t, c) = seg[std::size_t(t)] >= k ? w(3 - k, c) : T(0);
      scale.push_back(s), taps.push_back(lag);
    }
    Mat<T> general = normal<T>(3, D), hole = normal<T>(4, D);
    for (Index c = 0; c < D; c += 7) general(1, c) = T(0);
    hole.row(2).setZero();  // lag 1 zero on every channel: a structural zero the pass skips
    scale.push_back(normal<T>(1, D)), taps.push_back(general);
    scale.push_back(uniform<T>(L, D, 0.5, 1.5)), taps.push_back(hole);
    const Mat<T> a = uniform<T>(L, D, 0.2, 0.99), b = normal<T>(L, D), g = normal<T>(L, D), r = normal<T>(1, D);
    const Mat<T> x = normal<T>(L, D);
    auto term = [&](std::size_t k) { return iattn::diagonal(scale[k]) * iattn::causal_conv(taps[k]); };
    auto mix = term(0) + term(1) + term(2) + term(3) + term(4);
    // the oracle from plain loops: mix(t, s) = sum_k s_k[t] taps_k[t - s]; the products applied to
    // x one channel at a time (matrix-vector), the full dense product for three channels
    auto dense_mix = [&](Index c) {
      MatD M = MatD::Zero(L, L);
      for (std::size_t k = 0; k < scale.size(); ++k) {
        const Index K = taps[k].rows();
        for (Index t = 0; t < L; ++t)
          for (Index s = std::max(Index(0), t - K + 1); s <= t; ++s)
            M(t, s) += double(scale[k](scale[k].rows() == 1 ? 0 : t, c)) * double(taps[k](K - 1 - (t - s), c));
      }
      return M;
    };
    const MatD ad = dd(a), bd = dd(b), gd = dd(g), xd = dd(x);
    MatD want(L, D), want_inner(L, D);
    const std::vector<Index> ts = {0, L / 2, L - 1};  // rows: the transposed chain, backwards from t
    std::vector<MatD> want_row(ts.size(), MatD(D, L)), want_inner_row(ts.size(), MatD(D, L));
    for (Index c = 0; c < D; ++c) {
      const MatD R = dense_linear_recurrence(ad, bd, c), M = dense_mix(c);
      const Eigen::VectorXd xc = xd.col(c);
      want.col(c) = gd.col(c).cwiseProduct(R * (M * xc));
      want_inner.col(c) = R * (M * (xc * double(r(0, c))));
      for (std::size_t k = 0; k < ts.size(); ++k) {
        want_row[k].row(c) = gd(ts[k], c) * (R.row(ts[k]) * M);
        want_inner_row[k].row(c) = (R.row(ts[k]) * M) * double(r(0, c));
      }
    }
    auto dense_chain = [&](Index c) {
      return MatD(dense_diagonal(gd, c, L) * dense_linear_recurrence(ad, bd, c) * dense_mix(c));
    };
    auto chain = iattn::diagonal(g) * iattn::linear_recurrence(a, b) * mix;
    // the sum after a diagonal: not the first factor, so formed by whole-slab passes
    auto inner = iattn::linear_recurrence(a, b) * mix * iattn::diagonal(r);
    for (Index c : {Index(0), Index(151), D - 1}) check_close(iattn::materialize(chain, c, L), dense_chain(c), tolerance<T>());
#if defined(_OPENMP)
    const int threads0 = omp_get_max_threads();
    for (int threads : {1, 2, 3, 4}) {
      omp_set_num_threads(threads);
#else
    for (int threads : {1}) {
#endif
      INFO("threads = " << threads);
      check_close(iattn::apply(chain, x), want, tolerance<T>());
      Mat<T> y = Mat<T>::Constant(L, D, T(7));
      iattn::apply_into(y, chain, x);
      check_close(y, want, tolerance<T>());
      check_close(iattn::apply(inner, x), want_inner, tolerance<T>());
      for (std::size_t k = 0; k < ts.size(); ++k) {
        INFO("row t = " << ts[k]);
        Mat<T> out = Mat<T>::Constant(D, L, T(7));  // entries after t must be overwritten with 0
        iattn::row_into(out, chain, ts[k]);
        check_close(out, want_row[k], tolerance<T>());
        check_close(iattn::row(inner, ts[k]), want_inner_row[k], tolerance<T>());
      }
    }
#if defined(_OPENMP)
    omp_set_num_threads(threads0);
#endif
  }
}
