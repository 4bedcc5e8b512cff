// Semiseparable against the dense oracle (plain loops over docs/design.md section 2's formula), float and double,
// per-state and per-head decay, heads/groups, strict with and without bonus, lambda = -inf resets.
#include "support/test_common.hpp"

using namespace test;

namespace {

struct ss_case {
  const char* name;
  Index H, P, G, N;
  bool per_state, strict, bonus, resets;
  bool factored = false;  // lambda = dt (x) A through factored_decay
};

const ss_case cases[] = {
    {"mamba1-like per-state N=16", 5, 1, 1, 16, true, false, false, false},
    {"per-state N=3 (SIMD tail)", 3, 1, 1, 3, true, false, false, false},
    {"mamba2-like scalar decay, heads and groups", 4, 3, 2, 5, false, false, false, false},
    {"per-state with head_dim 2 (GLA-like)", 2, 2, 1, 4, true, false, false, false},
    {"strict with bonus (RWKV)", 3, 2, 3, 4, true, true, true, false},
    {"strict without bonus", 2, 1, 1, 3, false, true, false, false},
    {"resets lambda = -inf", 3, 1, 1, 8, true, false, false, true},
    {"strict with bonus and resets", 2, 1, 1, 17, true, true, true, true},
    {"factored decay, one channel per head, 19 channels (SIMD body and tail)", 19, 1, 1, 16, true, false, false, false, true},
    {"factored decay, groups across the channel packs", 20, 1, 4, 3, true, false, false, true, true},
    {"factored decay, strict with bonus", 11, 1, 1, 5, true, true, true, false, true},
    {"factored decay, strict without bonus", 9, 1, 1, 2, true, true, false, false, true},
    {"factored decay with head_dim 3", 3, 3, 1, 6, true, false, false, true, true},
};

template <class T>
void run_case(const ss_case& k, Index L) {
  INFO(k.name << ", L = " << L);
  const Index D = k.H * k.P;
  Mat<T> lam = uniform<T>(L, k.per_state ? k.H * k.N : k.H, -1.0, -0.01);
  if (k.resets)
    for (Index t = 0; t < L; t += 5) lam(t, (t / 5) % lam.cols()) = -std::numeric_limits<T>::infinity();
  Mat<T> dt = uniform<T>(L, k.H, 0.001, 0.5), A = -uniform<T>(k.H, k.N, 0.1, 2.0);
  if (k.factored) {  // the dense lambda the factored decay denotes, for the oracle
    if (k.resets)
      for (Index t = 0; t < L; t += 5) dt(t, (t / 5) % k.H) = std::numeric_limits<T>::infinity();
    for (Index t = 0; t < L; ++t)
      for (Index h = 0; h < k.H; ++h)
        for (Index m = 0; m < k.N; ++m) lam(t, h * k.N + m) = dt(t, h) * A(h, m);
  }
  const Mat<T> B = normal<T>(L, k.G * k.N), C = normal<T>(L, k.G * k.N), u = normal<T>(k.H, k.N);
  const Mat<T> x = normal<T>(L, D);
  const iattn::semiseparable_options o{.heads = k.H, .head_dim = k.P, .groups = k.G, .strict = k.strict};
  auto S = k.factored ? (k.bonus ? iattn::semiseparable(iattn::factored_decay(dt, A), B, C, u, o)
                                 : iattn::semiseparable(iattn::factored_decay(dt, A), B, C, o))
                      : (k.bonus ? iattn::semiseparable(lam, B, C, u, o) : iattn::semiseparable(lam, B, C, o));
  REQUIRE(S.factored() == k.factored);
  REQUIRE_FALSE(iattn::cpu_detail::takes_chunked_apply(S));  // the scans; the chunked apply is tested below
  const MatD ud = dd(u);
  // each channel's dense matrix is built once (plain loops, O(L^2 N)) and reused by every check
  const MatD lam_d = dd(lam), B_d = dd(B), C_d = dd(C);
  std::vector<MatD> dense(static_cast<std::size_t>(D));
  auto oracle = [&](Index c) -> const MatD& {
    MatD& m = dense[static_cast<std::size_t>(c)];
    if (m.size() == 0 && L > 0) m = dense_semiseparable(lam_d, B_d, C_d, k.H, k.P, k.G, c, k.strict, k.bonus ? &ud : nullptr);
    return m;
  };
  const double tol = tolerance<T>();
  // materialize: first, a middle and the last channel
  for (Index c : {Index(0), D / 2, D - 1}) check_close(iattn::materialize(S, c), oracle(c), tol);
  // apply
  check_close(iattn::apply(S, x), dense_apply(oracle, dd(x)), tol);
  // row and col: the transposed scan
  for (Index t : {Index(0), L / 2, L - 1}) {
    const MatD r = iattn::row(S, t).template cast<double>(), q = iattn::col(S, t).template cast<double>();
    for (Index c : {Index(0), D - 1}) {
      check_close(r.row(c), oracle(c).row(t), tol);
      check_close(q.row(c), oracle(c).col(t).transpose(), tol);
    }
  }
}

}  // namespace

TEMPLATE_TEST_CASE("semiseparable matches the dense oracle", "[semiseparable]", float, double) {
  for (const auto& k : cases)
    for (Index L : lengths) run_case<TestType>(k, L);
}

// The SSD-style chunked apply (one decay per head, P >= 64, N >= 64) in 64-token chunks, inside
// diag(g) S diag(dt) so the folded input and output scalings run through it. L crosses chunk
// boundaries; P = 72 puts the 128-channel slab boundary inside head 1; groups and resets.
TEMPLATE_TEST_CASE("semiseparable: the chunked apply matches the dense oracle", "[semiseparable][chunked]", float, double) {
  using T = TestType;
  struct chunk_case { Index H, P, G, N; bool resets; };
  for (const chunk_case k : {chunk_case{3, 72, 1, 64, false}, chunk_case{4, 64, 2, 65, true}})
    for (Index L : {Index(1), Index(7), Index(63), Index(64), Index(65), Index(257), Index(1000)}) {
      INFO("H = " << k.H << ", P = " << k.P << ", G = " << k.G << ", N = " << k.N << ", L = " << L);
      const Index D = k.H * k.P;
      Mat<T> lam = uniform<T>(L, k.H, -0.3, -0.001);
      if (k.resets)
        for (Index t = 3; t < L; t += 50) lam(t, (t / 50) % k.H) = -std::numeric_limits<T>::infinity();
      const Mat<T> B = normal<T>(L, k.G * k.N, 0.2), C = normal<T>(L, k.G * k.N, 0.2), x = normal<T>(L, D);
      const Mat<T> g = normal<T>(L, D), dt = uniform<T>(L, D, 0.01, 0.2);
      const auto S = iattn::semiseparable(lam, B, C, {.heads = k.H, .head_dim = k.P, .groups = k.G});
      REQUIRE(iattn::cpu_detail::takes_chunked_apply(S));
      std::vector<MatD> M;  // one dense matrix per head
      for (Index h = 0; h < k.H; ++h) M.push_back(dense_semiseparable(dd(lam), dd(B), dd(C), k.H, k.P, k.G, h * k.P));
      MatD want(L, D);
      for (Index c = 0; c < D; ++c)
        want.col(c) = dd(g).col(c).cwiseProduct(M[std::size_t(c / k.P)] * dd(dt).col(c).cwiseProduct(dd(x).col(c)));
      check_close(iattn::apply(iattn::diagonal(g) * S * iattn::diagonal(dt), x), want, tolerance<T>());
    }
}

// A sum's diagonal inside the scan's own pass (row_ops::skip): Mamba's diag(g) (S diag(dt) + diag(D))
// diag(p) conv and its variants stream through each form of the scan (across channels: factored,
// one channel per head; per head: a per-state decay, head_dim 2; chunked: P = 72, N = 64), the
// skip reading the row without the diagonals between the sum and the core (skip_inputs). apply
// and apply_into (the caller's matrices in place, over stale values) against dense oracles made
// of the heads' dense matrices by row and column scalings.
TEMPLATE_TEST_CASE("semiseparable: a sum's diagonal inside the scan's pass", "[semiseparable][skip]", float, double) {
  using T = TestType;
  using namespace iattn;
  struct skip_case {
    const char* name;
    Index H, P, N;
    bool factored, per_state, strict;
  };
  for (const skip_case k : {skip_case{"across channels (factored, 19 channels)", 19, 1, 16, true, true, false},
                            skip_case{"across channels, strict with bonus", 11, 1, 5, true, true, true},
                            skip_case{"per head (per-state decay, head_dim 2)", 3, 2, 4, false, true, false},
                            skip_case{"chunked (P = 72, N = 64)", 2, 72, 64, false, false, false}})
    for (Index L : {Index(1), Index(7), Index(65), Index(130)}) {
      INFO(k.name << ", L = " << L);
      const Index D = k.H * k.P, N = k.N;
      Mat<T> lam = uniform<T>(L, k.per_state ? k.H * N : k.H, -0.5, -0.001);
      const Mat<T> dth = uniform<T>(L, k.H, 0.001, 0.5), A = -uniform<T>(k.H, N, 0.1, 2.0);
      if (k.factored)
        for (Index t = 0; t < L; ++t)
          for (Index h = 0; h < k.H; ++h)
            for (Index m = 0; m < N; ++m) lam(t, h * N + m) = dth(t, h) * A(h, m);
      const Mat<T> B = normal<T>(L, N, 0.3), C = normal<T>(L, N, 0.3), u = normal<T>(k.H, N);
      const semiseparable_options o{.heads = k.H, .head_dim = k.P, .strict = k.strict};
      const auto S = k.factored ? (k.strict ? semiseparable(factored_decay(dth, A), B, C, u, o) : semiseparable(factored_decay(dth, A), B, C, o))
                                : semiseparable(lam, B, C, o);
      REQUIRE(cpu_detail::takes_chunked_apply(S) == (k.P >= cpu_detail::ssd_min_head_dim));
      const Mat<T> x = normal<T>(L, D), g = normal<T>(L, D), g2 = normal<T>(L, D), p = normal<T>(L, D),
                   dt = uniform<T>(L, D, 0.1, 1.5), dt2 = normal<T>(L, D), sk = normal<T>(1, D), skt = normal<T>(L, D),
                   w = normal<T>(4, D);
      const MatD ud = dd(u);
      std::vector<MatD> heads;  // one dense matrix per head
      for (Index h = 0; h < k.H; ++h)
        heads.push_back(dense_semiseparable(dd(lam), dd(B), dd(C), k.H, k.P, 1, h * k.P, k.strict, k.strict ? &ud : nullptr));
      auto col_of = [&](const Mat<T>& m, Index c) {
        Eigen::VectorXd v(L);
        for (Index t = 0; t < L; ++t) v(t) = double(m(m.rows() == 1 ? 0 : t, c));
        return v;
      };
      auto ones = [&] { return Eigen::VectorXd::Ones(L); };
      // diag(post) (diag(in_post) S diag(in_pre) + diag(skip)) diag(pre) [conv]
      auto oracle = [&](Index c, const Eigen::VectorXd& post, const Eigen::VectorXd& in_post, const Eigen::VectorXd& in_pre,
                        const Eigen::VectorXd& skip, const Eigen::VectorXd& pre, bool conv) {
        MatD m = in_post.asDiagonal() * heads[std::size_t(c / k.P)] * in_pre.asDiagonal();
        m.diagonal() += skip;
        m = post.asDiagonal() * m * pre.asDiagonal();
        if (!conv) return m;
        MatD out = MatD::Zero(L, L);  // m times the Toeplitz band of w (PyTorch tap order)
        for (Index t = 0; t < L; ++t)
          for (Index s = 0; s <= t; ++s)
            for (Index lag = 0; lag < w.rows() && s + lag <= t; ++lag) out(t, s) += m(t, s + lag) * double(w(w.rows() - 1 - lag, c));
        return out;
      };
      const double tol = 10 * tolerance<T>();
      auto verify = [&](const auto& e, auto&& oracle_of) {
        std::vector<MatD> O;
        for (Index c = 0; c < D; ++c) O.push_back(oracle_of(c));
        const MatD want = dense_apply([&](Index c) -> const MatD& { return O[std::size_t(c)]; }, dd(x));
        check_close(apply(e, x), want, tol);
        Mat<T> y = Mat<T>::Constant(L, D, T(7));  // apply_into over stale values: the caller's rows in place
        apply_into(y, e, x);
        check_close(y, want, tol);
        const Index t = L / 2;  // row: the slab path's transposed scans, untouched by the skip
        const MatD r = dd(row(e, t));
        for (Index c : {Index(0), D - 1}) check_close(r.row(c), O[std::size_t(c)].row(t), tol);
      };
      auto check = [&](const char* what, const auto& e, auto&& oracle_of) {
        INFO(what);
        STATIC_REQUIRE(cpu_detail::streams_rows_v<T, std::remove_cvref_t<decltype(e)>>);
        verify(e, oracle_of);
      };
      check("diag * (S * diag + diag (1, D)) * diag * conv (Mamba)",
            diagonal(g) * (S * diagonal(dt) + diagonal(sk)) * diagonal(p) * causal_conv(w),
            [&](Index c) { return oracle(c, col_of(g, c), ones(), col_of(dt, c), col_of(sk, c), col_of(p, c), true); });
      check("diag * (diag * S * diag * diag + diag (L, D)) * diag",
            diagonal(g) * (diagonal(g2) * S * diagonal(dt) * diagonal(dt2) + diagonal(skt)) * diagonal(p),
            [&](Index c) {
              return oracle(c, col_of(g, c), col_of(g2, c), col_of(dt, c).cwiseProduct(col_of(dt2, c)), col_of(skt, c), col_of(p, c), false);
            });
      check("S * diag + diag", S * diagonal(dt) + diagonal(skt),
            [&](Index c) { return oracle(c, ones(), ones(), col_of(dt, c), col_of(skt, c), ones(), false); });
      check("diag * (S + diag) * diag * conv (the skip reads the core's row)",
            diagonal(g) * (S + diagonal(sk)) * diagonal(p) * causal_conv(w),
            [&](Index c) { return oracle(c, col_of(g, c), ones(), ones(), col_of(sk, c), col_of(p, c), true); });
      // A chain and the flip of another, summed and scaled (Vision Mamba's s (H_f + J H_b J)), each
      // with its skip inside its scan, on the slab path (streaming the first term into the caller's
      // rows was measured no faster: docs/performance.md, session 50).
      const auto fwd = diagonal(g) * (S * diagonal(dt) + diagonal(sk)) * diagonal(p) * causal_conv(w);
      const auto bwd = diagonal(g2) * (S * diagonal(dt2) + diagonal(skt)) * causal_conv(w);
      auto fwd_of = [&](Index c) { return oracle(c, col_of(g, c), ones(), col_of(dt, c), col_of(sk, c), col_of(p, c), true); };
      auto bwd_of = [&](Index c) {
        return dense_flip(oracle(c, col_of(g2, c), ones(), col_of(dt2, c), col_of(skt, c), ones(), true));
      };
      auto check_flip = [&](const char* what, const auto& e, auto&& oracle_of) {
        INFO(what);
        STATIC_REQUIRE(!cpu_detail::streams_rows_v<T, std::remove_cvref_t<decltype(e)>>);
        verify(e, oracle_of);
      };
      check_flip("0.5 * (chain + flip(chain)) (Vision Mamba)", 0.5 * (fwd + flip(bwd)),
                 [&](Index c) { return MatD(0.5 * (fwd_of(c) + bwd_of(c))); });
      check_flip("chain + flip(chain)", fwd + flip(bwd), [&](Index c) { return MatD(fwd_of(c) + bwd_of(c)); });
      check_flip("2 * (-3 * flip(chain))", 2.0 * (-3.0 * flip(bwd)), [&](Index c) { return MatD(-6.0 * bwd_of(c)); });
    }
}

TEST_CASE("semiseparable with lambda = 0 is masked linear attention", "[semiseparable]") {
  const Index L = 70, N = 6;
  const MatD lam = MatD::Zero(L, 1), B = normal<double>(L, N), C = normal<double>(L, N);
  auto S = iattn::semiseparable(lam, B, C, {.heads = 1});
  const MatD M = iattn::materialize(S, 0);
  MatD expected = (C * B.transpose()).triangularView<Eigen::Lower>();
  check_close(M, expected, 1e-12);
}

TEST_CASE("semiseparable: a reset (lambda = -inf) cuts all earlier tokens off exactly", "[semiseparable]") {
  const Index L = 200, N = 4;
  MatD lam = uniform<double>(L, N, -0.5, 0.0);
  lam(100, 2) = -std::numeric_limits<double>::infinity();
  const MatD B = normal<double>(L, N), C = MatD::Zero(L, N);
  MatD Cm = C;
  Cm.col(2).setOnes();  // read only state 2
  auto S = iattn::semiseparable(lam, B, Cm, {.heads = 1});
  const MatD M = iattn::materialize(S, 0);
  REQUIRE(M.allFinite());
  for (Index t = 100; t < L; ++t)
    for (Index s = 0; s < 100; ++s) REQUIRE(M(t, s) == 0.0);
  REQUIRE(M(150, 120) != 0.0);
}

TEST_CASE("semiseparable: N is inferred from B and the groups", "[semiseparable]") {
  const MatD lam = uniform<double>(9, 4, -1, 0), B = normal<double>(9, 6), C = normal<double>(9, 6);
  auto S = iattn::semiseparable(lam, B, C, {.heads = 4, .head_dim = 2, .groups = 2});
  REQUIRE(S.state() == 3);
  REQUIRE(S.channels() == 8);
  REQUIRE_FALSE(S.per_state());
}

TEST_CASE("semiseparable: factored decay shapes are checked", "[semiseparable][errors]") {
  const MatD dt = uniform<double>(6, 3, 0, 1), A = -uniform<double>(3, 4, 0, 1), B = normal<double>(6, 4), C = normal<double>(6, 4);
  REQUIRE_NOTHROW(iattn::semiseparable(iattn::factored_decay(dt, A), B, C, {.heads = 3}));
  REQUIRE_THROWS_WITH(iattn::semiseparable(iattn::factored_decay(dt, A), B, C, {.heads = 2}),
                      Catch::Matchers::Contains("dt") && Catch::Matchers::Contains("(6, 3)"));
  const MatD A5 = -uniform<double>(3, 5, 0, 1);
  REQUIRE_THROWS_WITH(iattn::semiseparable(iattn::factored_decay(dt, A5), B, C, {.heads = 3}),
                      Catch::Matchers::Contains("factored_decay A") && Catch::Matchers::Contains("(3, 5)") &&
                          Catch::Matchers::Contains("N=4"));
}

TEST_CASE("fast exp: accuracy, exact 0 and 1, inf and NaN", "[semiseparable][simd]") {
  using P = iattn::simd::pack<float, iattn::simd::width<float>>;
  constexpr int W = iattn::simd::width<float>;
  float in[W], out[W];
  // Relative error within 2e-7 whatever |x| (two-step argument reduction); exp2 of the factored scan
  // is tested through the Mamba-1 expressions.
  double worst = 0;
  for (double x = -87.0; x <= 80.0; x += 0.001237) {
    for (int i = 0; i < W; ++i) in[i] = float(x + i * 1e-4);
    exp(P::load(in)).store(out);
    for (int i = 0; i < W; ++i)
      worst = std::max(worst, std::abs(double(out[i]) / std::exp(double(in[i])) - 1.0) / 2e-7);
  }
  INFO("worst error relative to the bound " << worst);
  REQUIRE(worst <= 1.0);
  double worst_small = 0;
  for (double x = -2.0; x <= 0.0; x += 1e-4) {
    for (int i = 0; i < W; ++i) in[i] = float(x);
    exp(P::load(in)).store(out);
    worst_small = std::max(worst_small, std::abs(double(out[0]) / std::exp(double(in[0])) - 1.0));
  }
  REQUIRE(worst_small < 3e-7);
  const float special[] = {0.f, -std::numeric_limits<float>::infinity(), -200.f, std::numeric_limits<float>::quiet_NaN(),
                           std::numeric_limits<float>::infinity(), 100.f, -1e-30f, -88.5f};
  for (int i = 0; i < W; ++i) in[i] = special[i % 8];
  exp(P::load(in)).store(out);
  for (int i = 0; i < W; ++i) {
    INFO("x = " << in[i]);
    if (i % 8 == 0 || i % 8 == 6) REQUIRE(out[i] == 1.0f);
    if (i % 8 == 1 || i % 8 == 2 || i % 8 == 7) REQUIRE(out[i] == 0.0f);
    if (i % 8 == 3) REQUIRE(std::isnan(out[i]));
    if (i % 8 == 4 || i % 8 == 5) REQUIRE(std::isinf(out[i]));
  }
}
