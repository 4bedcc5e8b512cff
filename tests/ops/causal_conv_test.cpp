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
