// SoftmaxAttention against a dense softmax written with plain loops (causal and bidirectional).
#include "support/test_common.hpp"

using namespace test;

namespace {
MatD dense_softmax(const MatD& Q, const MatD& K, Index H, Index P, Index c, bool causal) {
  const Index L = Q.rows(), dk = Q.cols() / H, h = c / P;
  MatD A = MatD::Zero(L, L);
  for (Index t = 0; t < L; ++t) {
    const Index end = causal ? t + 1 : L;
    double mx = -1e300, sum = 0;
    std::vector<double> sc(static_cast<std::size_t>(end));
    for (Index s = 0; s < end; ++s) {
      double v = 0;
      for (Index i = 0; i < dk; ++i) v += Q(t, h * dk + i) * K(s, h * dk + i);
      sc[std::size_t(s)] = v / std::sqrt(double(dk));
      mx = std::max(mx, sc[std::size_t(s)]);
    }
    for (Index s = 0; s < end; ++s) sum += std::exp(sc[std::size_t(s)] - mx);
    for (Index s = 0; s < end; ++s) A(t, s) = std::exp(sc[std::size_t(s)] - mx) / sum;
  }
  return A;
}
}  // namespace

TEMPLATE_TEST_CASE("softmax_attention matches a dense softmax", "[softmax]", float, double) {
  using T = TestType;
  const Index H = 2, P = 3, dk = 4, D = H * P;
  for (Index L : {Index(1), Index(2), Index(7), Index(64), Index(257)}) {
    INFO("L = " << L);
    const Mat<T> Q = normal<T>(L, H * dk, 2.0), K = normal<T>(L, H * dk, 2.0), x = normal<T>(L, D);
    auto A = iattn::softmax_attention(Q, K, {.heads = H, .head_dim = P});
    auto Ab = iattn::softmax_attention(Q, K, {.heads = H, .head_dim = P}, iattn::bidirectional);
    for (Index c : {Index(0), D - 1}) {
      check_close(iattn::materialize(A, c), dense_softmax(dd(Q), dd(K), H, P, c, true), tolerance<T>());
      check_close(iattn::materialize(Ab, c), dense_softmax(dd(Q), dd(K), H, P, c, false), tolerance<T>());
    }
    check_close(iattn::apply(A, x), dense_apply([&](Index c) { return dense_softmax(dd(Q), dd(K), H, P, c, true); }, dd(x)),
                tolerance<T>());
    check_close(iattn::apply(Ab, x), dense_apply([&](Index c) { return dense_softmax(dd(Q), dd(K), H, P, c, false); }, dd(x)),
                tolerance<T>());
  }
}

TEST_CASE("softmax_attention subtracts the row maximum: huge scores stay finite", "[softmax]") {
  const Index L = 10;
  const MatD Q = 1000.0 * MatD::Ones(L, 2), K = normal<double>(L, 2) * 10.0;
  const MatD A = iattn::materialize(iattn::softmax_attention(Q, K), 0);
  REQUIRE(A.allFinite());
  for (Index t = 0; t < L; ++t) REQUIRE(std::abs(A.row(t).sum() - 1.0) < 1e-12);
}
