// Wkv (RWKV's normalised WKV matrix) against a dense oracle with plain loops (per-row max-shifted
// log-sum-exp), against row_normalize(S_strict) where that is representable, with resets, and with
// keys of +-80 in float (where e^k over- and underflows).
#include "support/test_common.hpp"

using namespace test;

namespace {

/// The dense per-channel matrix: score[t, s] = sum_{r=s+1..t-1} w_r + k_s (s < t), u + k_t (s = t),
/// each row's scores shifted by its maximum, exponentiated and normalised.
MatD dense_wkv(const MatD& w, const MatD& k, const MatD& u, Index c) {
  const Index L = k.rows();
  MatD M = MatD::Zero(L, L);
  for (Index t = 0; t < L; ++t) {
    std::vector<double> sc(static_cast<std::size_t>(t + 1));
    double mx = -INFINITY;
    for (Index s = 0; s <= t; ++s) {
      double v = s == t ? u(0, c) + k(t, c) : k(s, c);
      for (Index r = s + 1; r <= t - 1; ++r) v += w(w.rows() == 1 ? 0 : r, c);
      sc[std::size_t(s)] = v;
      mx = std::max(mx, v);
    }
    double z = 0;
    for (Index s = 0; s <= t; ++s) z += std::exp(sc[std::size_t(s)] - mx);
    for (Index s = 0; s <= t; ++s) M(t, s) = std::exp(sc[std::size_t(s)] - mx) / z;
  }
  return M;
}

/// Row t of channel c's matrix in O(L): the scores of row t from a running decay sum, max-shifted,
/// exponentiated and normalised (the dense oracle's arithmetic for one row).
std::vector<double> oracle_row(const MatD& w, const MatD& k, const MatD& u, Index c, Index t) {
  std::vector<double> sc(static_cast<std::size_t>(t + 1)), out(static_cast<std::size_t>(k.rows()), 0.0);
  sc[std::size_t(t)] = u(0, c) + k(t, c);
  double run = 0;  // sum_{r=s+1..t-1} w_r
  for (Index s = t - 1; s >= 0; --s) {
    sc[std::size_t(s)] = run + k(s, c);
    run += w(w.rows() == 1 ? 0 : s, c);
  }
  const double mx = *std::max_element(sc.begin(), sc.end());
  double z = 0;
  for (double v : sc) z += std::exp(v - mx);
  for (Index s = 0; s <= t; ++s) out[std::size_t(s)] = std::exp(sc[std::size_t(s)] - mx) / z;
  return out;
}

}  // namespace

TEMPLATE_TEST_CASE("wkv row (the vectorised transposed apply) matches a per-row oracle at L = 1000", "[wkv][row]", float, double) {
  using T = TestType;
  const Index L = 1000, D = 11;  // 11 channels: full packs and a tail at every SIMD width
  Mat<T> w = uniform<T>(L, D, -0.3, 0.0);
  for (Index t = 5; t < L; t += 97) w(t, t % D) = -std::numeric_limits<T>::infinity();  // resets
  const Mat<T> wc = uniform<T>(1, D, -0.05, -0.001), k = uniform<T>(L, D, -6, 6), u = uniform<T>(1, D, -1, 1);
  for (bool constant : {false, true}) {
    const Mat<T>& wd = constant ? wc : w;
    const auto W = iattn::wkv(wd, k, u);
    for (Index t : {Index(0), Index(1), Index(498), L - 1}) {
      INFO("constant decay " << constant << ", row " << t);
      const Mat<T> r = iattn::row(W, t);
      REQUIRE(r.rows() == D);
      REQUIRE(r.cols() == L);
      MatD want(D, L);
      for (Index c = 0; c < D; ++c) {
        const std::vector<double> o = oracle_row(dd(wd), dd(k), dd(u), c, t);
        for (Index s = 0; s < L; ++s) want(c, s) = o[std::size_t(s)];
      }
      check_close(dd(r), want, tolerance<T>());
      for (Index c = 0; c < D; ++c) REQUIRE(std::abs(double(r.row(c).sum()) - 1.0) < 1e-5);  // a row of a normalised matrix
      // diag(d) W: the transposed scan then gets a different input value in every channel
      const Mat<T> d = uniform<T>(L, D, 0.5, 2.0);
      MatD want_d = want;
      for (Index c = 0; c < D; ++c) want_d.row(c) *= double(d(t, c));
      check_close(dd(Mat<T>(iattn::row(iattn::diagonal(d) * W, t))), want_d, tolerance<T>());
    }
  }
}

TEMPLATE_TEST_CASE("wkv matches the dense oracle (per-token and constant decays, resets)", "[wkv]", float, double) {
  using T = TestType;
  const Index D = 11;
  for (Index L : lengths) {
    INFO("L = " << L);
    Mat<T> w = uniform<T>(L, D, -2.0, 0.0);
    for (Index t = 4; t < L; t += 13) w(t, t % D) = -std::numeric_limits<T>::infinity();  // resets
    const Mat<T> wc = uniform<T>(1, D, -1.0, -0.01), k = uniform<T>(L, D, -5, 5), u = uniform<T>(1, D, -1, 1), x = normal<T>(L, D);
    for (bool constant : {false, true}) {
      INFO("constant decay " << constant);
      const Mat<T>& wd = constant ? wc : w;
      const auto W = iattn::wkv(wd, k, u);
      for (Index c : {Index(0), Index(4), D - 1}) {
        if (L <= 257) check_close(iattn::materialize(W, c), dense_wkv(dd(wd), dd(k), dd(u), c), tolerance<T>());
      }
      if (L <= 257) {
        check_close(iattn::apply(W, x), dense_apply([&](Index c) { return dense_wkv(dd(wd), dd(k), dd(u), c); }, dd(x)), tolerance<T>());
        const Index t = L / 2;  // row() runs the transposed (anti-causal) apply
        const MatD r = dd(Mat<T>(iattn::row(W, t)));
        for (Index c : {Index(1), D - 2}) check_close(MatD(r.row(c)), MatD(dense_wkv(dd(wd), dd(k), dd(u), c).row(t)), tolerance<T>());
        const MatD cl = dd(Mat<T>(iattn::col(W, t)));
        for (Index c : {Index(1), D - 2}) check_close(MatD(cl.row(c)), MatD(dense_wkv(dd(wd), dd(k), dd(u), c).col(t).transpose()), tolerance<T>());
      }
      // rows sum to 1
      const Mat<T> ones = Mat<T>::Ones(L, D);
      check_close(iattn::apply(W, ones), MatD::Ones(L, D), tolerance<T>());
    }
  }
}

TEST_CASE("wkv is row_normalize(S_strict(w, e^k, 1, e^u)) where e^k is representable", "[wkv]") {
  const Index L = 120, D = 6;
  const MatD w = uniform<double>(L, D, -1, 0), k = uniform<double>(L, D, -3, 3), u = uniform<double>(1, D, -1, 1), x = normal<double>(L, D);
  const auto W = iattn::wkv(w, k, u);
  const auto R = iattn::row_normalize(iattn::semiseparable(w, MatD(k.array().exp().matrix()), MatD(MatD::Ones(L, D)),
                                                           MatD(u.transpose().array().exp().matrix()), {.heads = D, .groups = D}));
  check_close(iattn::apply(W, x), iattn::apply(R, x), 1e-12);
  for (Index c : {Index(0), D - 1}) check_close(iattn::materialize(W, c), iattn::materialize(R, c), 1e-12);
}

TEST_CASE("wkv with keys of +-80 in float stays finite and matches double", "[wkv][numerics]") {
  const Index L = 400, D = 8;
  Mat<float> k = uniform<float>(L, D, -80, 80);
  for (Index t = 0; t < 40; ++t) k.row(t).setConstant(-80.0f);  // early rows: every key far below the channel maximum
  const Mat<float> w = uniform<float>(1, D, -0.5f, -0.01f), u = uniform<float>(1, D, -1, 1), x = normal<float>(L, D);
  // e^(k - kmax), the per-channel shift, underflows to 0 for the early rows: row_normalize then divides 0 by 0
  REQUIRE(std::exp(k.minCoeff() - k.maxCoeff()) == 0.0f);
  Mat<float> B(L, D);
  for (Index c = 0; c < D; ++c) B.col(c) = (k.col(c).array() - k.col(c).maxCoeff()).exp().matrix();
  const auto shifted = iattn::row_normalize(iattn::semiseparable(Mat<float>(w.replicate(L, 1)), B, Mat<float>(Mat<float>::Ones(L, D)),
                                                                 Mat<float>(u.transpose().array().exp().matrix()), {.heads = D, .groups = D}));
  REQUIRE_FALSE(Mat<float>(iattn::apply(shifted, x)).allFinite());
  const auto W = iattn::wkv(w, k, u);
  const Mat<float> y = iattn::apply(W, x);
  REQUIRE(y.allFinite());
  const MatD yd = iattn::apply(iattn::wkv(dd(w), dd(k), dd(u)), dd(x));
  check_close(dd(y), yd, 1e-4);
  const Mat<float> M = iattn::materialize(W, 3);
  REQUIRE(M.allFinite());
  check_close(dd(M), dense_wkv(dd(w), dd(k), dd(u), 3), 1e-4);
  const Mat<float> r = iattn::row(W, L - 1);
  REQUIRE(r.allFinite());
  check_close(dd(Mat<float>(r.row(5))), MatD(dense_wkv(dd(w), dd(k), dd(u), 5).row(L - 1)), 1e-4);
}

TEST_CASE("wkv checks its shapes", "[wkv][errors]") {
  using Catch::Matchers::Contains;
  const MatD k = MatD::Zero(5, 3);
  REQUIRE_THROWS_WITH(iattn::wkv(MatD(MatD::Zero(5, 2)), k, MatD(MatD::Zero(1, 3))), Contains("wkv: w has shape (5, 2)") && Contains("(1, D=3)"));
  REQUIRE_THROWS_WITH(iattn::wkv(MatD(MatD::Zero(1, 3)), k, MatD(MatD::Zero(3, 1))), Contains("wkv: u has shape (3, 1)"));
}
