// Transition (the delta-rule family) against an independent dense oracle: every A_t formed as an
// explicit N x N matrix in double from the model-level parameters (DeltaNet I - beta k k^T, Gated
// DeltaNet e^g (I - beta k k^T), KDA (I - beta k k^T) Diag(e^g), the generic Diag(e^lambda) + sum_r
// b_r a_r^T), the products multiplied out naively; float and double; every evaluation path, the
// compositions, the special cases, a long run and the errors.
#include "support/test_common.hpp"

#include <cstdlib>
#include <iostream>
#include <limits>
#include <map>
#include <string>

using namespace test;

namespace {

enum class kind { delta, gated, kimi, generic };

struct shape {
  Index H, P, N;
};

/// Model-level parameters in T, the oracle reads them cast to double.
template <class T>
struct params {
  kind kd = kind::delta;
  Index L = 0, H = 1, P = 1, N = 1, R = 1;
  Mat<T> q, k, beta, g, lam, a, b;

  iattn::transition_options opts(bool growth = false) const {
    return {.heads = H, .head_dim = P, .state = 0, .rank = -1, .allow_growth = growth};
  }
  iattn::Transition<T> node(bool growth = false) const {
    switch (kd) {
      case kind::delta: return iattn::delta_rule(q, k, beta, opts(growth));
      case kind::gated: return iattn::gated_delta_rule(q, k, beta, g, opts(growth));
      case kind::kimi: return iattn::kimi_delta_rule(q, k, beta, g, opts(growth));
      default: return iattn::transition(lam, a, b, q, k, opts(growth));
    }
  }
  Index D() const { return H * P; }
};

/// Keys with unit norm per (token, head) (the models' L2-normalised keys).
template <class T>
void normalise_keys(Mat<T>& k, Index H, Index N) {
  for (Index t = 0; t < k.rows(); ++t)
    for (Index h = 0; h < H; ++h) {
      double s = 0;
      for (Index m = 0; m < N; ++m) s += double(k(t, h * N + m)) * double(k(t, h * N + m));
      const double inv = s > 0 ? 1.0 / std::sqrt(s) : 0.0;
      for (Index m = 0; m < N; ++m) k(t, h * N + m) = T(double(k(t, h * N + m)) * inv);
    }
}

template <class T>
params<T> make_params(kind kd, Index L, shape sh, Index R = 1, bool per_key = true) {
  params<T> p;
  p.kd = kd, p.L = L, p.H = sh.H, p.P = sh.P, p.N = sh.N, p.R = kd == kind::generic ? R : 1;
  const Index HN = sh.H * sh.N;
  p.q = normal<T>(L, HN);
  p.k = normal<T>(L, HN);
  if (kd != kind::generic) {
    normalise_keys(p.k, sh.H, sh.N);
    p.beta = uniform<T>(L, sh.H, 0.05, 1.95);
  }
  if (kd == kind::gated) p.g = uniform<T>(L, sh.H, -0.6, 0.0);
  if (kd == kind::kimi) p.g = uniform<T>(L, HN, -0.6, 0.0);
  if (kd == kind::generic) {
    // |A| <= e^-0.1 + R 0.05^2 N / N... kept below 1: a stable recurrence at any L.
    p.lam = uniform<T>(L, per_key ? HN : sh.H, -0.5, -0.1);
    const double sd = 0.2 / std::sqrt(double(sh.N));
    p.a = normal<T>(L, sh.H * p.R * sh.N, sd);
    p.b = normal<T>(L, sh.H * p.R * sh.N, sd);
  }
  return p;
}

/// The oracle: A_t of head h as an explicit N x N matrix, in double, from the model parameters.
template <class T>
MatD dense_A(const params<T>& p, Index t, Index h) {
  const Index N = p.N;
  MatD A = MatD::Zero(N, N);
  if (p.kd == kind::generic) {
    for (Index m = 0; m < N; ++m) A(m, m) = std::exp(double(p.lam(t, p.lam.cols() == p.H ? h : h * N + m)));
    for (Index r = 0; r < p.R; ++r)
      for (Index i = 0; i < N; ++i)
        for (Index j = 0; j < N; ++j)
          A(i, j) += double(p.b(t, (h * p.R + r) * N + i)) * double(p.a(t, (h * p.R + r) * N + j));
    return A;
  }
  const double be = double(p.beta(t, h));
  MatD I_bkk = MatD::Identity(N, N);
  for (Index i = 0; i < N; ++i)
    for (Index j = 0; j < N; ++j) I_bkk(i, j) -= be * double(p.k(t, h * N + i)) * double(p.k(t, h * N + j));
  if (p.kd == kind::delta) return I_bkk;
  if (p.kd == kind::gated) return std::exp(double(p.g(t, h))) * I_bkk;
  MatD G = MatD::Zero(N, N);  // kimi: (I - beta k k^T) Diag(e^g)
  for (Index m = 0; m < N; ++m) G(m, m) = std::exp(double(p.g(t, h * N + m)));
  return I_bkk * G;
}

/// The written key k~_s of head h: beta k for the delta rules, k for the generic form.
template <class T>
Eigen::VectorXd dense_key(const params<T>& p, Index s, Index h) {
  Eigen::VectorXd v(p.N);
  const double be = p.kd == kind::generic ? 1.0 : double(p.beta(s, h));
  for (Index m = 0; m < p.N; ++m) v(m) = be * double(p.k(s, h * p.N + m));
  return v;
}

/// Head h's L x L matrix: H[t, s] = q_t^T A_t ... A_{s+1} k~_s, the products applied naively.
template <class T>
MatD dense_head(const params<T>& p, Index h) {
  const Index L = p.L;
  std::vector<MatD> A;
  for (Index t = 0; t < L; ++t) A.push_back(dense_A(p, t, h));
  MatD M = MatD::Zero(L, L);
  Eigen::VectorXd w(p.N);  // A_t v, formed without a temporary (an allocation per entry under ASan)
  for (Index s = 0; s < L; ++s) {
    Eigen::VectorXd v = dense_key(p, s, h);
    for (Index t = s; t < L; ++t) {
      if (t > s) {
        w.noalias() = A[std::size_t(t)] * v;
        v.swap(w);
      }
      double acc = 0;
      for (Index m = 0; m < p.N; ++m) acc += double(p.q(t, h * p.N + m)) * v(m);
      M(t, s) = acc;
    }
  }
  return M;
}

template <class T>
std::vector<MatD> dense_heads(const params<T>& p) {
  std::vector<MatD> M;
  for (Index h = 0; h < p.H; ++h) M.push_back(dense_head(p, h));
  return M;
}

// ---- the measured errors, printed at exit when IATTN_TEST_REPORT is set -------------------------
struct error_log {
  std::map<std::string, double> worst;  // max |a - b| / (1 + max |b|)
  ~error_log() {
    if (!std::getenv("IATTN_TEST_REPORT")) return;
    for (const auto& [what, e] : worst) std::cout << "max relative error  " << what << ": " << e << "\n";
  }
};
error_log& errors() {
  static error_log log;
  return log;
}

template <class A, class B>
void expect_close(const std::string& what, const A& a, const B& b, double tol) {
  const MatD ad = a.template cast<double>(), bd = b.template cast<double>();
  if (ad.size() && ad.rows() == bd.rows() && ad.cols() == bd.cols()) {
    const double e = (ad - bd).cwiseAbs().maxCoeff() / (1.0 + bd.cwiseAbs().maxCoeff());
    double& w = errors().worst[what];
    w = std::max(w, std::isfinite(e) ? e : 1e300);
  }
  check_close(ad, bd, tol);
}

template <class T>
std::string tag(const char* what) {
  return std::string(what) + (std::is_same_v<T, float> ? " (float)" : " (double)");
}

MatD flip_matrix(Index L) {
  MatD J = MatD::Zero(L, L);
  for (Index t = 0; t < L; ++t) J(t, L - 1 - t) = 1;
  return J;
}

const char* kind_name(kind k) {
  switch (k) {
    case kind::delta: return "delta_rule";
    case kind::gated: return "gated_delta_rule";
    case kind::kimi: return "kimi_delta_rule";
    default: return "transition";
  }
}

/// Every evaluation path of one node against the oracle.
template <class T>
void check_paths(const params<T>& p) {
  const Index L = p.L, D = p.D();
  INFO(kind_name(p.kd) << " R = " << p.R << ", L = " << L << ", H = " << p.H << ", P = " << p.P << ", N = " << p.N);
  const auto Tn = p.node();
  REQUIRE(Tn.length() == L);
  REQUIRE(Tn.channels() == D);
  REQUIRE(Tn.state() == p.N);
  REQUIRE(Tn.rank() == p.R);
  const std::vector<MatD> M = dense_heads(p);
  const double tol = tolerance<T>();
  const Mat<T> x = normal<T>(L, D);
  auto oracle = [&](Index c) -> const MatD& { return M[std::size_t(c / p.P)]; };
  // materialize: channels in the first, a middle and the last head
  const Mat<T> y = iattn::apply(Tn, x);
  for (Index c : {Index(0), (D / 2), D - 1}) {
    const Mat<T> Mc = iattn::materialize(Tn, c);
    expect_close(tag<T>("materialize"), Mc, oracle(c), tol);
    // apply against the materialized matrix times x, channel by channel
    expect_close(tag<T>("apply vs materialize * x"), y.col(c), (dd(Mc) * dd(x).col(c)).eval(), tol);
  }
  expect_close(tag<T>("apply"), y, dense_apply(oracle, dd(x)), tol);
  // row and col: the transposed scan and the forward scan on unit vectors
  for (Index t : {Index(0), L / 2, L - 1}) {
    const MatD r = dd(iattn::row(Tn, t)), q = dd(iattn::col(Tn, t));
    for (Index c : {Index(0), D - 1}) {
      expect_close(tag<T>("row"), r.row(c), oracle(c).row(t), tol);
      expect_close(tag<T>("col"), q.row(c), oracle(c).col(t).transpose().eval(), tol);
    }
  }
  // tiles: one below the diagonal, one crossing it
  const Index c = D - 1;
  const iattn::range low_rows{L / 2, L}, low_cols{0, std::max<Index>(1, L / 3)};
  if (low_cols.end <= L)
    expect_close(tag<T>("block"), iattn::block(Tn, c, low_rows, low_cols),
                 oracle(c).block(low_rows.begin, low_cols.begin, low_rows.size(), low_cols.size()).eval(), tol);
  const iattn::range mid_rows{L / 4, (3 * L + 3) / 4}, mid_cols{L / 3, L};
  expect_close(tag<T>("block"), iattn::block(Tn, c, mid_rows, mid_cols),
               oracle(c).block(mid_rows.begin, mid_cols.begin, mid_rows.size(), mid_cols.size()).eval(), tol);
  // the channel mean: each head's matrix weighted by its P channels
  MatD mean = MatD::Zero(L, L);
  for (const MatD& m : M) mean += m / double(p.H);
  expect_close(tag<T>("materialize_mean"), iattn::materialize_mean(Tn), mean, tol);
  MatD abs_mean = MatD::Zero(L, L);
  for (const MatD& m : M) abs_mean += m.cwiseAbs() / double(p.H);
  expect_close(tag<T>("materialize_mean abs"), iattn::materialize_mean(Tn, {.abs = true}), abs_mean, tol);
  if (p.P >= 2)  // one head's mean (the head path takes heads of two or more channels)
    expect_close(tag<T>("materialize_mean head"), iattn::materialize_mean(Tn, {.head = p.H - 1}), M.back(), tol);
}

const shape shapes[] = {{1, 1, 1}, {3, 5, 8}, {1, 5, 16}, {3, 1, 16}};
const Index short_lengths[] = {1, 7, 64, 257};

}  // namespace

TEMPLATE_TEST_CASE("transition: every path matches the dense oracle, all factories", "[transition]", float, double) {
  using T = TestType;
  for (kind kd : {kind::delta, kind::gated, kind::kimi, kind::generic})
    for (const shape& sh : shapes)
      for (Index L : short_lengths) check_paths(make_params<T>(kd, L, sh, /*R=*/2));
  // a longer sequence, one per factory
  for (kind kd : {kind::delta, kind::gated, kind::kimi, kind::generic}) check_paths(make_params<T>(kd, 1000, {2, 3, 8}, 2));
}

TEMPLATE_TEST_CASE("transition: generic ranks 0, 1 and 3, one decay per head", "[transition]", float, double) {
  using T = TestType;
  for (Index R : {0, 1, 3})
    for (Index L : {Index(7), Index(130)}) {
      check_paths(make_params<T>(kind::generic, L, {2, 3, 5}, R, /*per_key=*/false));
      check_paths(make_params<T>(kind::generic, L, {2, 3, 5}, R, /*per_key=*/true));
    }
}

TEMPLATE_TEST_CASE("transition: rank 0 is the semiseparable matrix S(lambda, B = k, C = q)", "[transition]", float, double) {
  using T = TestType;
  const Index L = 200, H = 3, P = 2, N = 6;
  for (bool per_key : {false, true}) {
    const auto p = make_params<T>(kind::generic, L, {H, P, N}, 0, per_key);
    const auto Tn = iattn::transition(p.lam, Mat<T>(L, 0), Mat<T>(L, 0), p.q, p.k, {.heads = H, .head_dim = P});
    REQUIRE(Tn.rank() == 0);
    const auto S = iattn::semiseparable(p.lam, p.k, p.q, {.heads = H, .head_dim = P, .groups = H});
    for (Index c : {Index(0), Index(3), H * P - 1})
      expect_close(tag<T>("rank 0 vs semiseparable"), iattn::materialize(Tn, c), iattn::materialize(S, c), tolerance<T>());
    const Mat<T> x = normal<T>(L, H * P);
    expect_close(tag<T>("rank 0 vs semiseparable"), iattn::apply(Tn, x), iattn::apply(S, x), tolerance<T>());
  }
}

TEMPLATE_TEST_CASE("transition: compositions against products and sums of dense oracles", "[transition]", float, double) {
  using T = TestType;
  using namespace iattn;
  for (kind kd : {kind::delta, kind::gated, kind::kimi, kind::generic})
    for (Index L : {Index(64), Index(257)}) {
      const auto p = make_params<T>(kd, L, {3, 5, 8}, 2);
      INFO(kind_name(kd) << ", L = " << L);
      const Index D = p.D();
      const auto Tn = p.node();
      const std::vector<MatD> M = dense_heads(p);
      const Mat<T> g = normal<T>(L, D), d = normal<T>(L, D), w = normal<T>(4, D), x = normal<T>(L, D);
      const double tol = tolerance<T>();
      const MatD J = flip_matrix(L);
      auto head = [&](Index c) -> const MatD& { return M[std::size_t(c / p.P)]; };
      const auto e1 = diagonal(g) * Tn * diagonal(d);
      const auto e2 = Tn * causal_conv(w);
      const auto e3 = Tn + diagonal(d);
      const auto e4 = flip(Tn);
      const auto e5 = 0.5 * Tn;
      // O(L^2) forms of the dense products: diag(g) M diag(d), M times the Toeplitz band of w, J M J
      auto o1 = [&](Index c) { return MatD(dd(g).col(c).asDiagonal() * head(c) * dd(d).col(c).asDiagonal()); };
      auto o2 = [&](Index c) {
        const MatD& Mh = head(c);
        MatD out = MatD::Zero(L, L);
        for (Index t = 0; t < L; ++t)
          for (Index s = 0; s <= t; ++s)
            for (Index lag = 0; lag < w.rows() && s + lag <= t; ++lag) out(t, s) += Mh(t, s + lag) * double(w(w.rows() - 1 - lag, c));
        return out;
      };
      auto o3 = [&](Index c) { return MatD(head(c) + dense_diagonal(dd(d), c, L)); };
      auto o4 = [&](Index c) { return MatD(head(c).reverse()); };
      auto o5 = [&](Index c) { return MatD(0.5 * head(c)); };
      if (L == 64) {  // the band and flip shortcuts against the literal products, once
        expect_close("oracle shortcuts", o2(7), MatD(head(7) * dense_conv(dd(w), 7, L)), 1e-12);
        expect_close("oracle shortcuts", o4(7), MatD(J * head(7) * J), 1e-12);
      }
      for (Index c : {Index(1), Index(7), D - 1}) {
        expect_close(tag<T>("diag * T * diag"), materialize(e1, c), o1(c), tol);
        expect_close(tag<T>("T * conv"), materialize(e2, c), o2(c), tol);
        expect_close(tag<T>("T + diag"), materialize(e3, c), o3(c), tol);
        expect_close(tag<T>("flip(T)"), materialize(e4, c), o4(c), tol);
        expect_close(tag<T>("0.5 T"), materialize(e5, c), o5(c), tol);
      }
      expect_close(tag<T>("diag * T * diag"), apply(e1, x), dense_apply(o1, dd(x)), tol);
      expect_close(tag<T>("T * conv"), apply(e2, x), dense_apply(o2, dd(x)), tol);
      expect_close(tag<T>("T + diag"), apply(e3, x), dense_apply(o3, dd(x)), tol);
      expect_close(tag<T>("flip(T)"), apply(e4, x), dense_apply(o4, dd(x)), tol);
      expect_close(tag<T>("0.5 T"), apply(e5, x), dense_apply(o5, dd(x)), tol);
      // the channel mean of a composition (the tile path)
      MatD mean = MatD::Zero(L, L);
      for (Index c = 0; c < D; ++c) mean += o1(c) / double(D);
      expect_close(tag<T>("materialize_mean(diag * T * diag)"), materialize_mean(e1), mean, tol);
      // the transposed apply through a composition: row t of diag * T * diag
      const MatD r = dd(row(e1, L / 2));
      for (Index c : {Index(0), D - 1}) expect_close(tag<T>("row(diag * T * diag)"), r.row(c), o1(c).row(L / 2), tol);
    }
}

TEMPLATE_TEST_CASE("transition: a slab boundary inside a head, SIMD bodies and tails", "[transition]", float, double) {
  using T = TestType;
  // D = 150: the first 128-channel slab ends inside head 2; P = 50 is whole packs plus a tail.
  for (kind kd : {kind::gated, kind::generic}) {
    const auto p = make_params<T>(kd, 33, {3, 50, 4}, 2);
    const auto Tn = p.node();
    const std::vector<MatD> M = dense_heads(p);
    const Mat<T> x = normal<T>(p.L, p.D());
    auto oracle = [&](Index c) -> const MatD& { return M[std::size_t(c / p.P)]; };
    expect_close(tag<T>("apply, cut heads"), iattn::apply(Tn, x), dense_apply(oracle, dd(x)), tolerance<T>());
    const MatD r = dd(iattn::row(Tn, 20));
    for (Index c : {Index(100), Index(127), Index(128), Index(149)})
      expect_close(tag<T>("row, cut heads"), r.row(c), oracle(c).row(20), tolerance<T>());
  }
}

TEST_CASE("transition: a reset (decay 0) leaves exact zeros behind it", "[transition]") {
  const Index L = 150, H = 2, P = 2, N = 8, t0 = 70;
  auto gdn = make_params<double>(kind::gated, L, {H, P, N});
  gdn.g(t0, 1) = -std::numeric_limits<double>::infinity();  // head 1 forgets everything at t0
  auto kda = make_params<double>(kind::kimi, L, {H, P, N});
  for (Index m = 0; m < N; ++m) kda.g(t0, N + m) = -std::numeric_limits<double>::infinity();
  for (const auto* p : {&gdn, &kda}) {
    const auto Tn = p->node();
    const MatD M1 = iattn::materialize(Tn, 2), M0 = iattn::materialize(Tn, 0);
    REQUIRE(M1.allFinite());
    for (Index t = t0; t < L; ++t)
      for (Index s = 0; s < t0; ++s) REQUIRE(M1(t, s) == 0.0);
    REQUIRE(M1(t0, t0) != 0.0);
    REQUIRE(M0(t0 + 5, t0 - 5) != 0.0);  // head 0 keeps its memory
    expect_close("reset (double)", M1, dense_head(*p, 1), 1e-10);
    // apply and the transposed scan see the same cut
    MatD x = MatD::Zero(L, H * P);
    x.topRows(t0).setRandom();
    const MatD y = iattn::apply(Tn, x);
    for (Index t = t0; t < L; ++t) REQUIRE(y(t, 2) == 0.0);
    const MatD r = iattn::row(Tn, L - 1);
    for (Index s = 0; s < t0; ++s) REQUIRE(r(3, s) == 0.0);
  }
}

TEMPLATE_TEST_CASE("transition: decay 1, beta = 0 and beta = 1.999", "[transition]", float, double) {
  using T = TestType;
  const double tol = tolerance<T>();
  {  // lambda = 0: the gated rule with g = 0 is the plain delta rule
    auto p = make_params<T>(kind::gated, 100, {2, 3, 8});
    p.g.setZero();
    auto d = p;
    d.kd = kind::delta;
    expect_close(tag<T>("g = 0 vs delta_rule"), iattn::materialize(p.node(), 4), iattn::materialize(d.node(), 4), tol);
    expect_close(tag<T>("g = 0"), iattn::materialize(p.node(), 4), dense_head(p, 1), tol);
  }
  {  // beta = 0 on every third token: nothing written (a zero column) and nothing removed
    auto p = make_params<T>(kind::gated, 120, {1, 2, 8});
    for (Index t = 0; t < p.L; t += 3) p.beta(t, 0) = 0;
    const Mat<T> M = iattn::materialize(p.node(), 0);
    for (Index s = 0; s < p.L; s += 3) REQUIRE(M.col(s).cwiseAbs().maxCoeff() == T(0));
    expect_close(tag<T>("beta = 0"), M, dense_head(p, 0), tol);
  }
  {  // beta = 1.999 (a near-reflection) with normalised keys: still a non-expansion, long and accurate
    auto p = make_params<T>(kind::kimi, 1500, {1, 3, 8});
    p.beta.setConstant(T(1.999));
    p.g = uniform<T>(p.L, p.N, -0.01, 0.0);  // almost no decay
    const auto Tn = p.node();
    const MatD M = dense_head(p, 0);
    expect_close(tag<T>("beta = 1.999"), iattn::materialize(Tn, 1), M, tol);
    const Mat<T> x = normal<T>(p.L, 3);
    expect_close(tag<T>("beta = 1.999"), iattn::apply(Tn, x), (M * dd(x)).eval(), tol);
    REQUIRE(M.cwiseAbs().maxCoeff() < 50.0);  // |q| |k| bounds every entry of a non-expansion
  }
}

TEST_CASE("transition: non-normalised keys are taken as given and can grow", "[transition]") {
  // |k| = 2 and beta = 1: I - beta k k^T has the eigenvalue 1 - 4 = -3. The library does not check
  // or rescale keys: it denotes the exact product, which grows geometrically, as the model would.
  const Index L = 30, N = 4;
  auto p = make_params<double>(kind::delta, L, {1, 1, N});
  p.beta.setOnes();
  Eigen::RowVectorXd dir = Eigen::RowVectorXd::Constant(N, 0.5);  // unit direction
  for (Index t = 0; t < L; ++t) p.k.row(t) = 2.0 * dir;
  const auto Tn = p.node();
  const MatD M = iattn::materialize(Tn, 0), O = dense_head(p, 0);
  expect_close("unnormalised keys, relative (double)", M, O, 1e-10);
  // H[t, s] = beta q_t^T (-3)^{t-s} k: |H[L-1, 0]| / |H[0, 0]| grows like 3^(L-1) times the q ratio
  REQUIRE(std::abs(M(L - 1, 0)) > 1e10);
  const Eigen::VectorXd kk = 2.0 * dir.transpose();
  REQUIRE(M(L - 1, 0) == Catch::Detail::Approx(std::pow(-3.0, double(L - 1)) * p.q.row(L - 1).dot(kk.transpose())));
  // in float, a long sequence overflows to inf and NaN instead of throwing
  params<float> pf;
  pf.kd = kind::delta, pf.L = 120, pf.H = 1, pf.P = 1, pf.N = N;
  pf.q = Mat<float>::Ones(pf.L, N);
  pf.k = Mat<float>::Constant(pf.L, N, 1.0f);  // |k| = 2
  pf.beta = Mat<float>::Ones(pf.L, 1);
  const auto Tf = pf.node();
  Mat<float> Mf;
  REQUIRE_NOTHROW(Mf = iattn::materialize(Tf, 0));
  REQUIRE_FALSE(Mf.allFinite());
  REQUIRE_FALSE(std::isfinite(Mf(100, 0)));  // inf, then NaN once inf meets -inf
  REQUIRE(double(Mf(40, 0)) == Catch::Detail::Approx(4.0 * std::pow(-3.0, 40.0)).epsilon(1e-4));
  const Mat<float> yf = iattn::apply(Tf, Mat<float>::Ones(pf.L, 1));
  REQUIRE_FALSE(yf.allFinite());
}

TEST_CASE("transition: L = 0", "[transition]") {
  for (kind kd : {kind::delta, kind::gated, kind::kimi, kind::generic}) {
    const auto p = make_params<double>(kd, 0, {2, 3, 4}, 2);
    const auto Tn = p.node();
    REQUIRE(Tn.length() == 0);
    REQUIRE(iattn::materialize(Tn, 5).size() == 0);
    REQUIRE(iattn::materialize_mean(Tn).size() == 0);
    const MatD y = iattn::apply(Tn, MatD(0, 6));
    REQUIRE(y.rows() == 0);
    REQUIRE(y.cols() == 6);
  }
}

TEST_CASE("transition: L = 100000 in float against double", "[transition][long]") {
  const Index L = 100000;
  auto pd = make_params<double>(kind::gated, L, {2, 3, 4});
  pd.g = uniform<double>(L, 2, -0.05, 0.0);  // long memory
  params<float> pf;
  pf.kd = kind::gated, pf.L = L, pf.H = 2, pf.P = 3, pf.N = 4;
  pf.q = pd.q.cast<float>(), pf.k = pd.k.cast<float>(), pf.beta = pd.beta.cast<float>(), pf.g = pd.g.cast<float>();
  const MatD x = normal<double>(L, 6);
  const MatD yd = iattn::apply(pd.node(), x);
  const Mat<float> yf = iattn::apply(pf.node(), Mat<float>(x.cast<float>()));
  expect_close("L = 100000 float vs double, gated_delta_rule", yf, yd, 1e-4);
  const auto p2 = make_params<double>(kind::generic, L, {1, 2, 4}, 2);
  auto f2 = params<float>{};
  f2.kd = kind::generic, f2.L = L, f2.H = 1, f2.P = 2, f2.N = 4, f2.R = 2;
  f2.q = p2.q.cast<float>(), f2.k = p2.k.cast<float>(), f2.lam = p2.lam.cast<float>(), f2.a = p2.a.cast<float>(),
  f2.b = p2.b.cast<float>();
  const MatD x2 = normal<double>(L, 2);
  expect_close("L = 100000 float vs double, transition R = 2", iattn::apply(f2.node(), Mat<float>(x2.cast<float>())),
               iattn::apply(p2.node(), x2), 1e-4);
}

// ---- the chunked (UT / WY) form of apply and of the tiles (backend/cpu/transition_chunk.hpp) -----
namespace {

namespace td = iattn::cpu_detail::transition_detail;

/// Runs apply in the chunked form for every head wherever it applies (the evaluator's default
/// keeps the recurrence where td::chunk_pays finds it cheaper, e.g. heads of a few channels).
struct force_chunked {
  int saved = td::chunk_tuning::force;
  force_chunked() { td::chunk_tuning::force = 1; }
  ~force_chunked() { td::chunk_tuning::force = saved; }
};

/// Whether every chunk of head h takes the chunked form (compute() true), and how many do.
template <class T>
Index chunked_count(const iattn::Transition<T>& n, Index h) {
  const td::head_view<T> hv(n, h);
  td::chunk_factors<T> f;
  Index ok = 0;
  for (Index t0 = 0; t0 < n.length(); t0 += td::chunk_len) ok += f.compute(hv, t0, std::min(td::chunk_len, n.length() - t0));
  return ok;
}
Index chunks_of(Index L) { return (L + td::chunk_len - 1) / td::chunk_len; }

const Index chunk_lengths[] = {1, 7, 63, 64, 65, 257, 1000};

}  // namespace

TEMPLATE_TEST_CASE("transition: chunked form, every path and factory at chunk tails", "[transition][chunked]", float, double) {
  using T = TestType;
  force_chunked forced;
  for (Index L : chunk_lengths)
    for (kind kd : {kind::delta, kind::gated, kind::kimi, kind::generic}) {
      const auto p = make_params<T>(kd, L, {2, 3, 8}, 2);
      REQUIRE(chunked_count(p.node(), 1) == chunks_of(L));  // none falls back to the recurrence
      check_paths(p);
    }
  // a head's channels cut by a slab edge, and whole SIMD packs of channels
  check_paths(make_params<T>(kind::gated, 130, {3, 50, 4}));
  check_paths(make_params<T>(kind::kimi, 200, {2, 17, 16}));
}

TEMPLATE_TEST_CASE("transition: chunked form, ranks 0 to 5 and both decay shapes", "[transition][chunked]", float, double) {
  using T = TestType;
  force_chunked forced;
  for (Index R : {0, 1, 2, 3, 5})  // R = 5 > chunk_max_rank: the recurrence everywhere
    for (bool per_key : {false, true})
      for (Index L : {Index(65), Index(257)}) {
        const auto p = make_params<T>(kind::generic, L, {2, 3, 6}, R, per_key);
        REQUIRE(chunked_count(p.node(), 0) == (R <= td::chunk_max_rank ? chunks_of(L) : 0));
        check_paths(p);
      }
}

TEMPLATE_TEST_CASE("transition: the tiles' chunk summaries by the recurrence and by the chunked factors", "[transition][chunked]",
                   float, double) {
  // A generic rank-1 head with a decay per key at N = 64 (RWKV-7's shape: the default takes the
  // recurrence, td::summary_by_recurrence_pays) and at N = 5 and 13 (the recurrence's channels
  // grow by one a token and are stepped in whole packs: N + t + 1 rounded up); a reset inside a
  // chunk, and lengths ending in a partial chunk.
  using T = TestType;
  const double tol = tolerance<T>();
  REQUIRE(td::summary_by_recurrence_pays(64, 64, 1, true));     // RWKV-7's heads
  REQUIRE_FALSE(td::summary_by_recurrence_pays(128, 64, 1, false));  // Gated DeltaNet's
  struct restore {  // the switch as it was, also when an assertion ends the test case
    int saved = td::chunk_tuning::force;
    ~restore() { td::chunk_tuning::force = saved; }
  } restored;
  for (Index N : {Index(64), Index(5), Index(13)})
    for (Index L : {Index(70), Index(130)}) {
      auto p = make_params<T>(kind::generic, L, {2, 3, N}, 1, /*per_key=*/true);
      for (Index m = 0; m < N; ++m) {  // head 1 resets: no decay and no low-rank path across L - 20
        p.lam(L - 20, N + m) = -std::numeric_limits<T>::infinity();
        p.b(L - 20, N + m) = T(0);
      }
      const auto Tn = p.node();
      const std::vector<MatD> M = dense_heads(p);
      for (int force : {-1, 0, 1}) {
        td::chunk_tuning::force = force;
        INFO("N = " << N << ", L = " << L << ", force = " << force);
        for (Index h = 0; h < 2; ++h) {
          const Mat<T> Mh = iattn::materialize(Tn, h * 3 + 1);
          expect_close(tag<T>("summaries, materialize"), Mh, M[std::size_t(h)], tol);
          if (h == 1)  // exact zeros across the reset
            for (Index t = L - 20; t < L; ++t) REQUIRE(Mh.row(t).head(L - 20).cwiseAbs().maxCoeff() == T(0));
        }
        expect_close(tag<T>("summaries, block"), iattn::block(Tn, 4, {L - 10, L}, {0, L - 30}),
                     MatD(M[1].block(L - 10, 0, 10, L - 30)), tol);
      }
    }
}

TEMPLATE_TEST_CASE("transition: chunked form, decays 1 and 0, beta 0 and near 2", "[transition][chunked]", float, double) {
  using T = TestType;
  force_chunked forced;
  const double tol = tolerance<T>();
  for (kind kd : {kind::gated, kind::kimi}) {
    {  // decay 1 (g = 0) with beta = 1.999 (a near-reflection), normalised keys: still chunked
      auto p = make_params<T>(kd, 300, {1, 4, 8});
      p.g.setZero();
      p.beta.setConstant(T(1.999));
      REQUIRE(chunked_count(p.node(), 0) == chunks_of(300));
      check_paths(p);
    }
    {  // beta = 0 on every third token, and exactly 2 elsewhere (reflections)
      auto p = make_params<T>(kd, 200, {2, 3, 8});
      p.beta.setConstant(T(2));
      for (Index t = 0; t < p.L; t += 3) p.beta.row(t).setZero();
      check_paths(p);
      const Mat<T> M = iattn::materialize(p.node(), 0);
      for (Index s = 0; s < p.L; s += 3) REQUIRE(M.col(s).cwiseAbs().maxCoeff() == T(0));
    }
    {  // decays that underflow to 0 without being -inf (g = -200): finite, chunked, tiny entries
      auto p = make_params<T>(kd, 150, {1, 2, 8});
      for (Index t = 40; t < 150; t += 37) p.g.row(t).setConstant(T(-200));
      REQUIRE(chunked_count(p.node(), 0) == chunks_of(150));
      check_paths(p);
    }
  }
  {  // DeltaNet at long range with beta = 1: 1000 tokens of pure memory (no decay)
    auto p = make_params<T>(kind::delta, 1000, {1, 3, 8});
    p.beta.setOnes();
    const auto Tn = p.node();
    const MatD M = dense_head(p, 0);
    expect_close(tag<T>("chunked, delta rule beta = 1"), iattn::materialize(Tn, 2), M, tol);
    const Mat<T> x = normal<T>(p.L, 3);
    expect_close(tag<T>("chunked, delta rule beta = 1"), iattn::apply(Tn, x), (M * dd(x)).eval(), tol);
  }
}

TEST_CASE("transition: chunked form, resets inside chunks and at their borders give exact zeros", "[transition][chunked]") {
  force_chunked forced;
  const Index L = 300, H = 2, P = 3, N = 8;
  for (Index t0 : {Index(1), Index(30), Index(63), Index(64), Index(65), Index(128), Index(299)}) {
    auto gdn = make_params<double>(kind::gated, L, {H, P, N});
    gdn.g(t0, 1) = -std::numeric_limits<double>::infinity();  // head 1 forgets everything at t0
    auto kda = make_params<double>(kind::kimi, L, {H, P, N});
    for (Index m = 0; m < N; ++m) kda.g(t0, N + m) = -std::numeric_limits<double>::infinity();
    auto gen = make_params<double>(kind::generic, L, {H, P, N}, 1, /*per_key=*/false);
    gen.lam(t0, 1) = -std::numeric_limits<double>::infinity();
    for (Index m = 0; m < N; ++m) gen.b(t0, N + m) = 0;  // no low-rank path across the reset
    for (const auto* p : {&gdn, &kda, &gen}) {
      INFO(kind_name(p->kd) << ", reset at " << t0);
      const auto Tn = p->node();
      REQUIRE(chunked_count(Tn, 1) == chunks_of(L) - 1);  // only the reset's chunk falls back
      REQUIRE(chunked_count(Tn, 0) == chunks_of(L));
      const MatD M1 = iattn::materialize(Tn, P);  // head 1
      REQUIRE(M1.allFinite());
      for (Index t = t0; t < L; ++t)
        for (Index s = 0; s < t0; ++s) REQUIRE(M1(t, s) == 0.0);
      const std::vector<MatD> M = dense_heads(*p);
      expect_close("chunked reset (double)", M1, M[1], 1e-10);
      const MatD blk = iattn::block(Tn, P + 1, {t0, L}, {0, t0});
      REQUIRE(blk.cwiseAbs().maxCoeff() == 0.0);
      MatD x = MatD::Zero(L, H * P);
      x.topRows(t0).setRandom();
      const MatD y = iattn::apply(Tn, x);
      for (Index t = t0; t < L; ++t)
        for (Index c = P; c < 2 * P; ++c) REQUIRE(y(t, c) == 0.0);
      const MatD r = iattn::row(Tn, L - 1);
      for (Index s = 0; s < t0; ++s) REQUIRE(r(P, s) == 0.0);
      expect_close("chunked reset (double)", iattn::apply(Tn, x),
                   dense_apply([&](Index c) -> const MatD& { return M[std::size_t(c / P)]; }, x), 1e-10);
    }
  }
}

TEST_CASE("transition: chunked form falls back where its conditions fail", "[transition][chunked]") {
  force_chunked forced;
  {  // growing products (|k| = 2, beta = 1: eigenvalue -3): every chunk runs the recurrence
    auto p = make_params<double>(kind::delta, 128, {1, 2, 4});
    p.beta.setOnes();
    p.k *= 2.0;
    const auto Tn = p.node();
    REQUIRE(chunked_count(Tn, 0) == 0);
    const MatD M = iattn::materialize(Tn, 0), O = dense_head(p, 0);
    expect_close("chunked fallback, growth (double)", M, O, 1e-10);
  }
  {  // a positive log-decay (allow_growth) in one chunk only
    auto p = make_params<double>(kind::gated, 200, {1, 2, 8});
    p.g(100, 0) = 0.3;
    const auto Tn = p.node(true);
    REQUIRE(chunked_count(Tn, 0) == chunks_of(200) - 1);
    expect_close("chunked fallback, growth allowed (double)", iattn::materialize(Tn, 1), dense_head(p, 0), 1e-10);
    const MatD x = normal<double>(200, 2);
    expect_close("chunked fallback, growth allowed (double)", iattn::apply(Tn, x), (dense_head(p, 0) * x).eval(), 1e-10);
  }
  {  // NaN in one coefficient: it reaches exactly the entries that depend on it, as in the recurrence
    auto p = make_params<double>(kind::gated, 200, {1, 2, 8});
    p.q(150, 3) = std::numeric_limits<double>::quiet_NaN();
    const auto Tn = p.node();
    const MatD M = iattn::materialize(Tn, 0);
    for (Index t = 0; t < 200; ++t)
      for (Index s = 0; s <= t; ++s) REQUIRE(std::isnan(M(t, s)) == (t == 150));
    MatD x = normal<double>(200, 2);
    x(20, 1) = std::numeric_limits<double>::quiet_NaN();  // a NaN value: outputs from token 20 on
    const MatD y = iattn::apply(Tn, x);
    for (Index t = 0; t < 200; ++t) REQUIRE(std::isnan(y(t, 1)) == (t >= 20));
    for (Index t = 0; t < 200; ++t) REQUIRE(std::isnan(y(t, 0)) == (t == 150));
  }
}

TEST_CASE("transition: apply's choice between the chunked form and the recurrence", "[transition][chunked]") {
  REQUIRE(td::chunk_pays(128, 128, 1, false, true));   // Gated DeltaNet at Qwen3-Next's head shape
  REQUIRE_FALSE(td::chunk_pays(64, 64, 1, true, false));  // RWKV-7: rank-2 writes, N = P = 64
  REQUIRE_FALSE(td::chunk_pays(8, 3, 1, false, true));    // a few channels per head
  // the default (no switch) at a shape it takes chunked, against the oracle
  auto p = make_params<double>(kind::gated, 150, {1, 128, 128});
  const auto Tn = p.node();
  REQUIRE(chunked_count(Tn, 0) == chunks_of(150));
  const MatD x = normal<double>(150, 128), M = dense_head(p, 0);
  expect_close("default apply, chunked (double)", iattn::apply(Tn, x), (M * x).eval(), 1e-10);
}

TEST_CASE("transition: chunked form, L = 100000 in float against double", "[transition][chunked][long]") {
  force_chunked forced;
  const Index L = 100000;
  auto pd = make_params<double>(kind::kimi, L, {1, 3, 8});
  pd.g = uniform<double>(L, 8, -0.05, 0.0);  // long memory, per key
  params<float> pf;
  pf.kd = kind::kimi, pf.L = L, pf.H = 1, pf.P = 3, pf.N = 8;
  pf.q = pd.q.cast<float>(), pf.k = pd.k.cast<float>(), pf.beta = pd.beta.cast<float>(), pf.g = pd.g.cast<float>();
  REQUIRE(chunked_count(pf.node(), 0) == chunks_of(L));
  const MatD x = normal<double>(L, 3);
  const MatD yd = iattn::apply(pd.node(), x);
  td::chunk_tuning::force = -1;  // the double reference by the recurrence
  const MatD yr = iattn::apply(pd.node(), x);
  td::chunk_tuning::force = 1;
  expect_close("L = 100000 chunked vs recurrence (double)", yd, yr, 1e-10);
  expect_close("L = 100000 float chunked vs double, kimi_delta_rule", iattn::apply(pf.node(), Mat<float>(x.cast<float>())), yr, 1e-4);
  // the last rows of the matrix, far from the diagonal: a block at the end against the double one
  const iattn::range rows{L - 64, L}, cols{L - 1024, L - 64};
  expect_close("L = 100000 float chunked block vs double", iattn::block(pf.node(), 1, rows, cols),
               iattn::block(pd.node(), 1, rows, cols), 1e-4);
}

TEST_CASE("transition: shape errors name the argument and its shape", "[transition][errors]") {
  using Catch::Matchers::Contains;
  const Index L = 6, H = 2, N = 3, R = 1;
  const MatD q = normal<double>(L, H * N), k = normal<double>(L, H * N), lam = uniform<double>(L, H, -1, 0);
  const MatD a = normal<double>(L, H * R * N), b = normal<double>(L, H * R * N), beta = uniform<double>(L, H, 0, 1);
  const MatD g = uniform<double>(L, H, -1, 0), gk = uniform<double>(L, H * N, -1, 0);
  const iattn::transition_options o{.heads = H, .head_dim = 2};
  REQUIRE_NOTHROW(iattn::transition(lam, a, b, q, k, o));
  REQUIRE_NOTHROW(iattn::transition(gk, a, b, q, k, o));
  REQUIRE(iattn::transition(lam, a, b, q, k, o).rank() == 1);
  const MatD bad_rows = normal<double>(L + 1, H * N), bad_cols = normal<double>(L, H * N + 1);
  REQUIRE_THROWS_WITH(iattn::transition(lam, a, b, bad_rows, k, o),
                      Contains("transition: q has shape (7, 6)") && Contains("(L=6, H*N=6)"));
  REQUIRE_THROWS_WITH(iattn::transition(lam, a, b, q, bad_cols, o),
                      Contains("transition: k has shape (6, 7)") && Contains("(L=6, H*N=6)"));
  REQUIRE_THROWS_WITH(iattn::transition(normal<double>(L, 5), a, b, q, k, o),
                      Contains("transition: lambda has shape (6, 5)") && Contains("(L=6, H=2)") && Contains("H*N=6"));
  REQUIRE_THROWS_WITH(iattn::transition(normal<double>(L - 1, H), a, b, q, k, o), Contains("lambda has shape (5, 2)"));
  REQUIRE_THROWS_WITH(iattn::transition(lam, normal<double>(L, 7), b, q, k, o), Contains("transition: a has shape (6, 7)") &&
                                                                                    Contains("H*R*N=6"));
  REQUIRE_THROWS_WITH(iattn::transition(lam, a, normal<double>(L + 2, H * N), q, k, o),
                      Contains("transition: b has shape (8, 6)") && Contains("(L=6, H*R*N=6)"));
  REQUIRE_THROWS_WITH(iattn::transition(lam, a, normal<double>(L, 2 * H * N), q, k, o),
                      Contains("a (6, 6) and b (6, 12) disagree"));
  REQUIRE_THROWS_WITH(iattn::transition(lam, a, normal<double>(L, 2 * H * N), q, k, {.heads = H, .rank = 2}),
                      Contains("transition: a has shape (6, 6)") && Contains("H*R*N=12"));
  REQUIRE_THROWS_WITH(iattn::transition(lam, a, b, q, k, {.heads = 0}), Contains("options.heads is 0"));
  REQUIRE_THROWS_WITH(iattn::transition(lam, a, b, q, k, {.heads = H, .head_dim = 0}), Contains("options.head_dim is 0"));
  REQUIRE_THROWS_WITH(iattn::transition(lam, a, b, normal<double>(L, 8), normal<double>(L, 4), o),
                      Contains("q (6, 8) and k (6, 4) disagree"));
  REQUIRE_THROWS_AS(iattn::transition(lam, a, b, q, k, {.heads = 4}), std::invalid_argument);
  // rank 0: a and b empty, or (L, 0)
  REQUIRE_NOTHROW(iattn::transition(lam, MatD(), MatD(), q, k, o));
  REQUIRE_NOTHROW(iattn::transition(lam, MatD(L, 0), MatD(L, 0), q, k, o));
  // the model factories name their own arguments
  REQUIRE_NOTHROW(iattn::delta_rule(q, k, beta, o));
  REQUIRE_NOTHROW(iattn::gated_delta_rule(q, k, beta, g, o));
  REQUIRE_NOTHROW(iattn::kimi_delta_rule(q, k, beta, gk, o));
  REQUIRE_THROWS_WITH(iattn::delta_rule(q, k, normal<double>(L, H + 1), o),
                      Contains("delta_rule: beta has shape (6, 3)") && Contains("(L=6, H=2)"));
  REQUIRE_THROWS_WITH(iattn::delta_rule(bad_rows, k, beta, o), Contains("delta_rule: q has shape (7, 6)"));
  REQUIRE_THROWS_WITH(iattn::gated_delta_rule(q, bad_cols, beta, g, o),
                      Contains("gated_delta_rule: k has shape (6, 7)") && Contains("(L=6, H*N=6)"));
  REQUIRE_THROWS_WITH(iattn::gated_delta_rule(q, k, beta, gk, o),
                      Contains("gated_delta_rule: g has shape (6, 6)") && Contains("(L=6, H=2)"));
  REQUIRE_THROWS_WITH(iattn::kimi_delta_rule(q, k, beta, g, o),
                      Contains("kimi_delta_rule: g has shape (6, 2)") && Contains("(L=6, H*N=6)"));
  REQUIRE_THROWS_WITH(iattn::kimi_delta_rule(q, k, beta.topRows(5), gk, o),
                      Contains("kimi_delta_rule: beta has shape (5, 2)"));
  REQUIRE_THROWS_WITH(iattn::delta_rule(q, k, beta, {.heads = H, .rank = 2}), Contains("options.rank is 2"));
}

TEST_CASE("transition: a positive log-decay throws std::domain_error naming index and value", "[transition][errors]") {
  using Catch::Matchers::Contains;
  const Index L = 6, H = 2, N = 3;
  const MatD q = normal<double>(L, H * N), k = normal<double>(L, H * N), a = normal<double>(L, H * N),
             b = normal<double>(L, H * N), beta = uniform<double>(L, H, 0, 1);
  MatD lam = uniform<double>(L, H * N, -1, 0);
  lam(2, 4) = 0.5;
  lam(3, 1) = std::numeric_limits<double>::quiet_NaN();  // NaN passes
  lam(1, 1) = -std::numeric_limits<double>::infinity();  // a reset is fine
  const iattn::transition_options o{.heads = H};
  REQUIRE_THROWS_AS(iattn::transition(lam, a, b, q, k, o), std::domain_error);
  REQUIRE_THROWS_WITH(iattn::transition(lam, a, b, q, k, o),
                      Contains("transition: lambda[2, 4] = 0.5") && Contains("allow_growth"));
  REQUIRE_NOTHROW(iattn::transition(lam, a, b, q, k, {.heads = H, .allow_growth = true}));
  MatD g = uniform<double>(L, H, -1, 0);
  g(5, 1) = 0.25;
  REQUIRE_THROWS_AS(iattn::gated_delta_rule(q, k, beta, g, o), std::domain_error);
  REQUIRE_THROWS_WITH(iattn::gated_delta_rule(q, k, beta, g, o), Contains("gated_delta_rule: g[5, 1] = 0.25"));
  REQUIRE_NOTHROW(iattn::gated_delta_rule(q, k, beta, g, {.heads = H, .allow_growth = true}));
  MatD gk = uniform<double>(L, H * N, -1, 0);
  gk(0, 5) = 2.0;
  REQUIRE_THROWS_WITH(iattn::kimi_delta_rule(q, k, beta, gk, o), Contains("kimi_delta_rule: g[0, 5] = 2"));
  // with allow_growth a growing state is evaluated as given
  MatD g1 = MatD::Constant(L, H, 0.1);
  auto p = make_params<double>(kind::gated, L, {H, 1, N});
  p.g = g1;
  expect_close("allow_growth (double)", iattn::materialize(p.node(true), 1), dense_head(p, 1), 1e-10);
}

TEST_CASE("transition: operands are owned, ref() is zero-copy", "[transition]") {
  auto make = [] {
    const auto p = make_params<double>(kind::kimi, 40, {2, 2, 4});
    return std::make_pair(p.node(), dense_head(p, 1));
  };
  const auto [Tn, M] = make();  // built from a function's locals
  expect_close("owned operands (double)", iattn::materialize(Tn, 3), M, 1e-10);
  const auto p = make_params<double>(kind::generic, 40, {2, 2, 4}, 2);
  const auto Tr = iattn::transition(iattn::ref(p.lam), iattn::ref(p.a), iattn::ref(p.b), iattn::ref(p.q), iattn::ref(p.k),
                                    {.heads = 2, .head_dim = 2});
  REQUIRE(Tr.q().data() == p.q.data());
  REQUIRE_FALSE(Tr.q().owning());
  expect_close("ref operands (double)", iattn::materialize(Tr, 2), dense_head(p, 1), 1e-10);
}

// ---- the recurrence at RWKV-7's head shape (backend/cpu/transition_scan.hpp) ----------------------
namespace {

/// RWKV-7's transition at N = P = 64: A_t = Diag(e^w) + (kk (.) lr) (-kk)^T per head, kk unit
/// per (token, head), lr in (0, 1), w one log-decay per key in (-0.6, 0). apply keeps the
/// recurrence for it (chunk_pays), gathered block by block (workspace::B tokens), the heads of a
/// slab in one scan.
template <class T>
params<T> rwkv7_params(Index L, Index H) {
  const Index N = 64;
  params<T> p;
  p.kd = kind::generic, p.L = L, p.H = H, p.P = N, p.N = N, p.R = 1;
  p.q = normal<T>(L, H * N, 0.3);
  p.k = normal<T>(L, H * N, 0.3);
  p.lam = uniform<T>(L, H * N, -0.6, -0.01);
  Mat<T> kk = normal<T>(L, H * N);
  normalise_keys(kk, H, N);
  const Mat<T> lr = uniform<T>(L, H * N, 0.0, 1.0);
  p.a = -kk;
  p.b = kk.cwiseProduct(lr);
  return p;
}

}  // namespace

TEMPLATE_TEST_CASE("transition: the recurrence at RWKV-7's head shape, at every block tail", "[transition]", float,
                   double) {
  using T = TestType;
  const Index B = td::workspace<T>(64, 1, 64).B;
  REQUIRE(B >= 2);
  REQUIRE(td::recurrence_only(rwkv7_params<T>(4, 2).node(), 64));
  for (Index H : {Index(2), Index(3)})  // one slab of two heads; a second slab with one
    for (Index L : {Index(1), Index(2), B - 1, B, B + 1, 2 * B + 1, 3 * B, Index(41)}) {
      if (L < 1) continue;
      INFO("H = " << H << ", L = " << L << ", B = " << B);
      const auto p = rwkv7_params<T>(L, H);
      const auto Tn = p.node();
      const std::vector<MatD> M = dense_heads(p);
      auto oracle = [&](Index c) -> const MatD& { return M[std::size_t(c / p.P)]; };
      const Mat<T> x = normal<T>(L, p.D());
      expect_close(tag<T>("rwkv7 apply"), iattn::apply(Tn, x), dense_apply(oracle, dd(x)), tolerance<T>());
      // the transposed scan (row) and a composition (apply_scaled: pre and post factors per token)
      const Index t = L / 2;
      const MatD r = dd(iattn::row(Tn, t));
      for (Index c : {Index(0), p.D() - 1}) expect_close(tag<T>("rwkv7 row"), r.row(c), oracle(c).row(t), tolerance<T>());
      const Mat<T> d = uniform<T>(L, p.D(), 0.5, 1.5), e = uniform<T>(L, p.D(), 0.5, 1.5);
      auto o1 = [&](Index c) { return MatD(dd(d).col(c).asDiagonal() * oracle(c) * dd(e).col(c).asDiagonal()); };
      expect_close(tag<T>("rwkv7 diag * T * diag"), iattn::apply(iattn::diagonal(d) * Tn * iattn::diagonal(e), x),
                   dense_apply(o1, dd(x)), tolerance<T>());
    }
}

TEST_CASE("transition: the recurrence at RWKV-7's head shape, resets and NaN", "[transition]") {
  const Index L = 40, H = 2, P = 64;
  for (Index t0 : {Index(1), Index(5), Index(6), Index(7), Index(23)}) {  // inside and at block edges
    INFO("reset at " << t0);
    auto p = rwkv7_params<double>(L, H);
    for (Index m = 0; m < 64; ++m) {  // head 1 forgets everything at t0, no low-rank path across it
      p.lam(t0, 64 + m) = -std::numeric_limits<double>::infinity();
      p.b(t0, 64 + m) = 0;
    }
    const auto Tn = p.node();
    MatD x = MatD::Zero(L, H * P);
    x.topRows(t0).setRandom();
    const MatD y = iattn::apply(Tn, x);
    for (Index t = t0; t < L; ++t)
      for (Index c = P; c < 2 * P; ++c) REQUIRE(y(t, c) == 0.0);
    expect_close("rwkv7 reset (double)", y, dense_apply([&](Index c) { return dense_head(p, c / P); }, x), 1e-10);
    const MatD r = iattn::row(Tn, L - 1);
    for (Index s = 0; s < t0; ++s) REQUIRE(r(P, s) == 0.0);
  }
  {  // NaN in one value reaches its channel from its token on; NaN in q_t, the head's row t only
    auto p = rwkv7_params<double>(L, H);
    p.q(30, 3) = std::numeric_limits<double>::quiet_NaN();
    const auto Tn = p.node();
    MatD x = normal<double>(L, H * P);
    x(20, 70) = std::numeric_limits<double>::quiet_NaN();
    const MatD y = iattn::apply(Tn, x);
    for (Index t = 0; t < L; ++t)
      for (Index c = 0; c < H * P; ++c) {
        INFO("t = " << t << ", c = " << c);
        const bool nan = (c == 70 && t >= 20) || (c < P && t == 30);
        REQUIRE(std::isnan(y(t, c)) == nan);
      }
  }
}

// ---- a bound norm and a sum's diagonal inside the scan's own pass (row_ops::skip) --------------
namespace {

/// The RWKV-7 chain diag(g) (N T + diag(u)) and the Gated DeltaNet chain diag(g) N T diag(d) conv,
/// N a bound centred group norm (one group per head), against O(L^2) forms of the dense products:
/// N's diagonal from its statistics (weight / sigma), T from dense_heads. apply and apply_into (the
/// caller's matrices streamed), row and col (slab passes), materialize (tiles) and the unbound
/// expression (statistics on the way) all agree with them.
template <class T>
void check_fused_chains(const params<T>& p) {
  using namespace iattn;
  const Index L = p.L, D = p.D(), H = p.H;
  INFO(kind_name(p.kd) << ", L = " << L << ", H = " << H << ", P = " << p.P << ", N = " << p.N);
  const auto Tn = p.node();
  const std::vector<MatD> M = dense_heads(p);
  const Mat<T> x = normal<T>(L, D), g = normal<T>(L, D), u = normal<T>(L, D), u1 = normal<T>(1, D),
               d = normal<T>(L, D), w = normal<T>(4, D), nw = uniform<T>(1, D, 0.5, 1.5);
  const double tol = 10 * tolerance<T>();
  const auto norm = group_norm(H, nw, {.eps = 1e-5, .centered = true});
  const auto nb = bind(norm, apply(Tn, x));  // the norm of T x, as RWKV-7 binds it
  const auto nc = bind(norm, apply(Tn * diagonal(d) * causal_conv(w), x));
  REQUIRE(nb.scale().rows() == L);
  REQUIRE(nb.scale().cols() == D);
  // the oracles as scalings of the heads' dense matrices (row and column scalings, no dense
  // diagonal products): the norm's diagonal from its statistics, in double
  auto col_of = [&](const Mat<T>& m, Index c) {
    Eigen::VectorXd v(L);
    for (Index t = 0; t < L; ++t) v(t) = double(m(m.rows() == 1 ? 0 : t, c));
    return v;
  };
  auto norm_diag = [&](const GroupNorm<T>& n, Index c) {
    Eigen::VectorXd v(L);
    for (Index t = 0; t < L; ++t) v(t) = double(nw(0, c)) * double(n.stats().inv_sigma(t, c / p.P));
    return v;
  };
  auto head = [&](Index c) -> const MatD& { return M[std::size_t(c / p.P)]; };
  auto conv_right = [&](const MatD& A, Index c) {  // A times the Toeplitz band of w (PyTorch tap order)
    MatD out = MatD::Zero(L, L);
    for (Index t = 0; t < L; ++t)
      for (Index s = 0; s <= t; ++s)
        for (Index lag = 0; lag < w.rows() && s + lag <= t; ++lag) out(t, s) += A(t, s + lag) * double(w(w.rows() - 1 - lag, c));
    return out;
  };
  const auto e_rwkv = diagonal(g) * (nb * Tn + diagonal(u));
  const auto e_rwkv1 = diagonal(g) * (nb * Tn + diagonal(u1));  // a (1, D) skip
  const auto e_nested = (nb * Tn + diagonal(u)) + diagonal(d);  // the inner sum's skip, the outer's slab pass
  const auto e_gdn = diagonal(g) * nc * Tn * diagonal(d) * causal_conv(w);
  const auto e_gdn_model = diagonal(g) * nc * (Tn * diagonal(d) * causal_conv(w));  // as delta_rule.hpp groups it
  auto o_rwkv_skip = [&](Index c, const Mat<T>& skip) {  // diag(g) (diag(norm) head + diag(skip))
    MatD s = norm_diag(nb, c).asDiagonal() * head(c);
    s.diagonal() += col_of(skip, c);
    return MatD(col_of(g, c).asDiagonal() * s);
  };
  auto o_rwkv = [&](Index c) { return o_rwkv_skip(c, u); };
  auto o_rwkv1 = [&](Index c) { return o_rwkv_skip(c, u1); };
  auto o_nested = [&](Index c) {
    MatD s = norm_diag(nb, c).asDiagonal() * head(c);
    s.diagonal() += col_of(u, c) + col_of(d, c);
    return s;
  };
  auto o_gdn = [&](Index c) {
    const MatD hd = head(c) * col_of(d, c).asDiagonal();
    return MatD(col_of(g, c).cwiseProduct(norm_diag(nc, c)).asDiagonal() * conv_right(hd, c));
  };
  auto check = [&](const char* what, const auto& e, auto&& oracle_of) {
    INFO(what);
    std::vector<MatD> O;  // every channel's dense matrix, once
    for (Index c = 0; c < D; ++c) O.push_back(oracle_of(c));
    auto oracle = [&](Index c) -> const MatD& { return O[std::size_t(c)]; };
    const MatD want = dense_apply(oracle, dd(x));
    expect_close(tag<T>(what), apply(e, x), want, tol);
    Mat<T> y = Mat<T>::Constant(L, D, T(7));  // apply_into over stale values
    apply_into(y, e, x);
    expect_close(tag<T>(what), y, want, tol);
    for (Index t : {Index(0), L / 2, L - 1}) {
      const MatD r = dd(row(e, t)), q = dd(col(e, t));
      for (Index c : {Index(0), D / 2, D - 1}) {
        const MatD& o = oracle(c);
        expect_close(tag<T>(what), r.row(c), o.row(t), tol);
        expect_close(tag<T>(what), q.row(c), o.col(t).transpose().eval(), tol);
      }
    }
    for (Index c : {Index(0), D - 1}) expect_close(tag<T>(what), materialize(e, c), oracle(c), tol);
  };
  check("diag * (norm * T + diag)", e_rwkv, o_rwkv);
  check("diag * (norm * T + diag (1, D))", e_rwkv1, o_rwkv1);
  check("(norm * T + diag) + diag", e_nested, o_nested);
  check("diag * norm * T * diag * conv", e_gdn, o_gdn);
  check("(diag * norm) * (T * diag * conv)", e_gdn_model, o_gdn);
  // unbound: the statistics of T x computed on the way are nb's
  expect_close(tag<T>("diag * (unbound norm * T + diag)"), apply(diagonal(g) * (norm * Tn + diagonal(u)), x),
               dense_apply(o_rwkv, dd(x)), tol);
}

}  // namespace

TEMPLATE_TEST_CASE("transition: a bound norm and a sum's diagonal fused into the scan's pass", "[transition]", float, double) {
  using T = TestType;
  for (kind kd : {kind::gated, kind::generic})
    for (Index L : {Index(1), Index(7), Index(64), Index(257)}) check_fused_chains(make_params<T>(kd, L, {3, 5, 8}, 2));
  // heads cut by a slab edge (D = 150), whole packs and tails; and the chunked form (each chunk's
  // input shaped and its outputs finished head by head)
  check_fused_chains(make_params<T>(kind::generic, 70, {3, 50, 4}, 1));
  force_chunked forced;
  for (Index L : {Index(65), Index(200)}) check_fused_chains(make_params<T>(kind::gated, L, {2, 17, 16}));
  // a reset in the middle: that chunk runs the recurrence inside the chunk-by-chunk pass that shapes
  // each chunk's input and finishes its outputs
  auto reset = make_params<T>(kind::generic, 200, {2, 17, 16}, 1);
  reset.lam.row(70).setConstant(-std::numeric_limits<T>::infinity());
  {
    const auto rn = reset.node();
    const td::head_view<T> hv(rn, 0);
    td::chunk_factors<T> f;
    REQUIRE(f.compute(hv, 0, td::apply_chunk_len));                        // chunked
    REQUIRE_FALSE(f.compute(hv, 2 * td::apply_chunk_len, td::apply_chunk_len));  // the reset's chunk: recurrence
  }
  check_fused_chains(reset);
}
