// RetNet multi-scale retention and HGRN (the papers' appendix A): exact decompositions against their
// own forwards, the papers' matrices (eq. 24, eq. 29) written out by hand for L = 3, shape errors.
#include "support/model_checks.hpp"

#include <iattn/models/hgrn.hpp>
#include <iattn/models/retnet.hpp>

using namespace test;
using namespace iattn::models;
using Catch::Matchers::Contains;
using iattn::Matrix;

namespace {

template <class T>
retnet_weights<T> small_retnet(std::uint64_t seed, bool centered = false) {
  return retnet_init<T>({.embed_dim = 32, .value_dim = 64, .num_heads = 4, .centered = centered}, seed);
}
template <class T>
hgrn_weights<T> small_hgrn(std::uint64_t seed, Index layer_idx = 0) {
  auto w = hgrn_init<T>({.hidden_size = 32, .expand_ratio = 2, .layer_idx = layer_idx, .num_layers = 4}, seed);
  init::generator g(seed + 100);  // a norm weight that is not all ones
  w.g_norm_weight = init::uniform<T>(g, 1, 64, 0.5, 1.5);
  return w;
}

}  // namespace

TEMPLATE_TEST_CASE("RetNet multi-scale retention equals out_proj(H v + beta)", "[models][retnet]", float, double) {
  using T = TestType;
  for (bool centered : {false, true}) {
    const auto w = small_retnet<T>(21, centered);
    for (Index L : model_lengths) {
      INFO("L = " << L << ", centered norm " << centered);
      const auto u = sample_input<T>(L, 32, 31 + L);
      check_exact<T>(retnet_forward(w, u), retnet_decompose(w, u));
    }
  }
}

TEST_CASE("RetNet: the score normalisation max(|row sum|, 1) takes both branches", "[models][retnet]") {
  // Large keys push |row sum| above 1 on some rows; the default init keeps it below on others.
  auto w = small_retnet<double>(22);
  w.k_proj_weight *= 6.0;
  w.q_proj_weight *= 6.0;
  const auto u = sample_input<double>(64, 32, 5);
  const auto s = activations(w, u);
  int above = 0, below = 0;
  for (Index t = 0; t < 64; ++t) {
    double r = 0;
    for (Index j = 0; j <= t; ++j) r += s.qr.row(t).head(8).dot(s.kr.row(j).head(8)) * std::pow(1 - std::exp2(-5.0), double(t - j));
    r /= std::sqrt(-std::expm1(double(t + 1) * retnet_log_decay(0)) / -std::expm1(retnet_log_decay(0)));
    (std::abs(r) > 1 ? above : below)++;
  }
  REQUIRE(above > 0);
  REQUIRE(below > 0);
  check_exact<double>(retnet_forward(w, u), retnet_decompose(w, u));
}

TEMPLATE_TEST_CASE("HGRN equals o_proj(H i)", "[models][hgrn]", float, double) {
  using T = TestType;
  for (Index layer : {0, 2}) {  // without and with the forget-gate lower bound
    const auto w = small_hgrn<T>(23, layer);
    for (Index L : model_lengths) {
      INFO("L = " << L << ", layer " << layer);
      const auto u = sample_input<T>(L, 32, 33 + L);
      check_exact<T>(hgrn_forward(w, u), hgrn_decompose(w, u));
    }
  }
}

TEST_CASE("RetNet paper matrix by hand (L = 3, eq. 24)", "[models][retnet][paper]") {
  const auto w = small_retnet<double>(24);
  const Index L = 3, dk = 8, P = 16, H = 4;
  const auto u = sample_input<double>(L, 32, 9);
  const auto s = activations(w, u);
  // The parallel form with plain loops: per head the masked, normalised score matrix, then the norm.
  std::vector<MatD> A(H, MatD::Zero(L, L));
  MatD o = MatD::Zero(L, 64);
  for (Index h = 0; h < H; ++h) {
    const double gamma = 1 - std::pow(2.0, -5.0 - double(h));
    for (Index t = 0; t < L; ++t) {
      double m = 0;
      for (Index j = 0; j <= t; ++j) m += std::pow(gamma, double(t - j));
      for (Index j = 0; j <= t; ++j)
        A[h](t, j) = s.qr.row(t).segment(h * dk, dk).dot(s.kr.row(j).segment(h * dk, dk)) * std::pow(gamma, double(t - j)) / std::sqrt(m);
      A[h].row(t) /= std::max(std::abs(A[h].row(t).sum()), 1.0);
    }
    o.middleCols(h * P, P) = A[h] * s.v.middleCols(h * P, P);
  }
  const auto paper = retnet_paper_attention(w, u);
  const auto d = retnet_decompose(w, u);
  for (Index c : {Index(0), Index(17), Index(63)}) {
    const Index h = c / P;
    MatD expect(L, L);
    for (Index t = 0; t < L; ++t) {
      const double sigma = std::sqrt(o.row(t).segment(h * P, P).squaredNorm() / double(P) + 1e-6);
      expect.row(t) = A[h].row(t) * nn::silu(s.g(t, c)) / sigma;
    }
    check_close(MatD(iattn::materialize(paper, c)), expect, 1e-12);
    check_close(MatD(iattn::materialize(d.H, c)), expect, 1e-12);  // RMS norm: the exact H is G R too
  }
}

TEST_CASE("HGRN paper matrix by hand (L = 3, eq. 29)", "[models][hgrn][paper]") {
  const auto w = small_hgrn<double>(25);
  const Index L = 3;
  const auto u = sample_input<double>(L, 32, 10);
  const MatD i = u * w.i_proj_weight.transpose(), f = u * w.f_proj_weight.transpose(), g = u * w.g_proj_weight.transpose();
  const auto paper = hgrn_paper_attention(w, u);
  for (Index c : {Index(0), Index(40)}) {
    auto fg = [&](Index t) { return 1 / (1 + std::exp(-f(t, c))); };
    MatD expect = MatD::Zero(L, L);
    for (Index t = 0; t < L; ++t)
      for (Index j = 0; j <= t; ++j) {
        double prod = 1;
        for (Index k = j + 1; k <= t; ++k) prod *= fg(k);
        expect(t, j) = nn::silu(g(t, c)) * prod * (1 - fg(j)) / (1 + std::exp(-i(j, c)));
      }
    check_close(MatD(iattn::materialize(paper, c)), expect, 1e-13);
  }
}

TEST_CASE("RetNet and HGRN weights with a wrong shape throw, naming the field", "[models][errors]") {
  const auto u = sample_input<double>(5, 32);
  {
    auto w = small_retnet<double>(1);
    w.v_proj_weight = MatD::Zero(63, 32);
    REQUIRE_THROWS_WITH(retnet_decompose(w, u), Contains("retnet: v_proj_weight has shape (63, 32)") && Contains("(value_dim=64, embed_dim=32)"));
    REQUIRE_THROWS_AS(retnet_forward(w, u), std::invalid_argument);
  }
  {
    auto w = small_retnet<double>(1);
    w.config.num_heads = 3;
    REQUIRE_THROWS_WITH(retnet_decompose(w, u), Contains("num_heads 3 must divide embed_dim = 32"));
  }
  {
    auto w = small_hgrn<double>(1);
    w.g_norm_weight = MatD::Zero(64, 1);
    REQUIRE_THROWS_WITH(hgrn_decompose(w, u), Contains("hgrn: g_norm_weight has shape (64, 1)") && Contains("(1, input_dim=64)"));
    w = small_hgrn<double>(1, 1);
    w.lower_bound(0, 3) = 1.0;
    REQUIRE_THROWS_WITH(hgrn_forward(w, u), Contains("lower_bound[3] is 1") && Contains("[0, 1)"));
    REQUIRE_THROWS_WITH(hgrn_decompose(small_hgrn<double>(1), sample_input<double>(5, 30)), Contains("u has shape (5, 30)"));
  }
}
