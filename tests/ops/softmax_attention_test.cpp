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
  const Index H = 2, P = 3, D = H * P;
  // key widths below one pack and with a partial last pack (the scores' SIMD tails)
  for (const auto& size : {std::pair<Index, Index>{1, 4}, {2, 4}, {7, 19}, {64, 4}, {70, 19}, {257, 4}}) {
    const Index L = size.first, dk = size.second;  // not a structured binding: lambdas capture them
    INFO("L = " << L << ", dk = " << dk);
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

TEMPLATE_TEST_CASE("softmax_attention: channel means (head path), |H| means, per-head means, tiles", "[softmax][means]", float,
                   double) {
  // diag(a) A diag(b) with the causal A a head-shared core: materialize_mean, its abs form and one
  // head's mean against the dense per-channel mean; the bidirectional form's mean (tile path) too;
  // an off-diagonal tile and one crossing the diagonal against the dense matrix.
  using T = TestType;
  const Index H = 3, P = 4, D = H * P;
  for (const auto& size : {std::pair<Index, Index>{1, 5}, {7, 19}, {65, 8}, {130, 19}}) {
    const Index L = size.first, dk = size.second;
    INFO("L = " << L << ", dk = " << dk);
    const Mat<T> Q = normal<T>(L, H * dk, 1.5), K = normal<T>(L, H * dk, 1.5), a = normal<T>(L, D), b = normal<T>(L, D);
    for (bool causal : {true, false}) {
      INFO("causal " << causal);
      auto oracle = [&](Index c) {
        MatD m = dense_softmax(dd(Q), dd(K), H, P, c, causal);
        for (Index t = 0; t < L; ++t)
          for (Index s = 0; s < L; ++s) m(t, s) *= double(a(t, c)) * double(b(s, c));
        return m;
      };
      MatD mean = MatD::Zero(L, L), abs_mean = MatD::Zero(L, L), last_head = MatD::Zero(L, L);
      for (Index c = 0; c < D; ++c) {
        const MatD m = oracle(c);
        mean += m / double(D);
        abs_mean += m.cwiseAbs() / double(D);
        if (c / P == H - 1) last_head += m / double(P);
      }
      auto check = [&](const auto& A) {
        const auto expr = iattn::diagonal(a) * A * iattn::diagonal(b);
        check_close(iattn::materialize_mean(expr), mean, tolerance<T>());
        check_close(iattn::materialize_mean(expr, {.abs = true}), abs_mean, tolerance<T>());
        check_close(iattn::materialize_mean(expr, {.head = H - 1}), last_head, tolerance<T>());
        const Index c = D - 1;
        const MatD full = oracle(c);
        const iattn::range low_rows{L / 2, L}, low_cols{0, std::max<Index>(1, L / 3)}, mid_rows{L / 4, (3 * L + 3) / 4},
            mid_cols{L / 3, L};
        check_close(iattn::block(expr, c, low_rows, low_cols),
                    full.block(low_rows.begin, low_cols.begin, low_rows.size(), low_cols.size()), tolerance<T>());
        check_close(iattn::block(expr, c, mid_rows, mid_cols),
                    full.block(mid_rows.begin, mid_cols.begin, mid_rows.size(), mid_cols.size()), tolerance<T>());
      };
      if (causal) check(iattn::softmax_attention(Q, K, {.heads = H, .head_dim = P}));
      else check(iattn::softmax_attention(Q, K, {.heads = H, .head_dim = P}, iattn::bidirectional));
    }
  }
}
