// The models beyond the papers (GLA, HGRN2, RWKV-6, linear and softmax attention, S4D, Hyena,
// Vision Mamba, mLSTM): exact decompositions against their own forwards, structure, shape errors.
#include "support/model_checks.hpp"

#include <iattn/models/gla.hpp>
#include <iattn/models/hgrn2.hpp>
#include <iattn/models/rwkv6.hpp>

using namespace test;
using namespace iattn::models;
using Catch::Matchers::Contains;
using iattn::Matrix;

namespace {

template <class T>
gla_weights<T> small_gla(std::uint64_t seed) {
  auto w = gla_init<T>({.hidden_size = 32, .key_dim = 16, .value_dim = 32, .num_heads = 2, .gate_low_rank_dim = 8}, seed);
  init::generator g(seed + 100);
  w.g_norm_swish_gate_weight = init::uniform<T>(g, 1, 16, 0.5, 1.5);
  return w;
}
template <class T>
hgrn2_weights<T> small_hgrn2(std::uint64_t seed, Index layer = 0) {
  auto w = hgrn2_init<T>({.hidden_size = 32, .expand_ratio = 8, .layer_idx = layer, .num_layers = 4}, seed);
  init::generator g(seed + 100);
  w.g_norm_weight = init::uniform<T>(g, 1, 32, 0.5, 1.5);
  return w;
}
template <class T>
rwkv6_weights<T> small_rwkv6(std::uint64_t seed) {
  auto w = rwkv6_init<T>({.hidden_size = 32, .key_dim = 16, .value_dim = 32, .num_heads = 2, .proj_low_rank_dim = 4,
                          .gate_low_rank_dim = 8, .layer_idx = 1, .num_layers = 3}, seed);
  init::generator g(seed + 100);  // norm affine parameters that are not 1 and 0
  w.g_norm_weight = init::uniform<T>(g, 1, 32, 0.5, 1.5);
  w.g_norm_bias = init::normal<T>(g, 1, 32, 0.3);
  return w;
}

}  // namespace

TEMPLATE_TEST_CASE("GLA equals o_proj(H v)", "[models][gla]", float, double) {
  using T = TestType;
  const auto w = small_gla<T>(41);
  for (Index L : model_lengths) {
    INFO("L = " << L);
    const auto u = sample_input<T>(L, 32, 51 + L);
    check_exact<T>(gla_forward(w, u), gla_decompose(w, u));
  }
}

TEMPLATE_TEST_CASE("HGRN2 equals o_proj(H i)", "[models][hgrn2]", float, double) {
  using T = TestType;
  for (Index layer : {0, 3}) {
    const auto w = small_hgrn2<T>(42, layer);
    for (Index L : model_lengths) {
      INFO("L = " << L << ", layer " << layer);
      const auto u = sample_input<T>(L, 32, 52 + L);
      check_exact<T>(hgrn2_forward(w, u), hgrn2_decompose(w, u));
    }
  }
}

TEMPLATE_TEST_CASE("RWKV-6 time mixing equals o_proj(H v + beta)", "[models][rwkv6]", float, double) {
  using T = TestType;
  const auto w = small_rwkv6<T>(43);
  for (Index L : model_lengths) {
    INFO("L = " << L);
    const auto u = sample_input<T>(L, 32, 53 + L);
    check_exact<T>(rwkv6_forward(w, u), rwkv6_decompose(w, u));
  }
}

TEST_CASE("RWKV-6 WKV matrix by hand (L = 3): strict decay, bonus on the diagonal", "[models][rwkv6]") {
  const auto w = small_rwkv6<double>(44);
  const auto u = sample_input<double>(3, 32, 8);
  const auto s = rwkv6_project(w, u);
  const auto S = rwkv6_wkv(w, s);
  const Index dk = 8;
  for (Index c : {Index(0), Index(20)}) {
    const Index h = c / 16;
    MatD expect = MatD::Zero(3, 3);
    for (Index t = 0; t < 3; ++t)
      for (Index j = 0; j <= t; ++j)
        for (Index m = 0; m < dk; ++m) {
          const Index km = h * dk + m;
          double decay = 1;
          for (Index k = j + 1; k < t; ++k) decay *= std::exp(s.w(k, km));
          expect(t, j) += s.r(t, km) * s.k(j, km) * (j == t ? w.bonus(h, m) : decay);
        }
    check_close(MatD(iattn::materialize(S, c)), expect, 1e-13);
  }
}

TEST_CASE("GLA, HGRN2 and RWKV-6 weights with a wrong shape throw, naming the field", "[models][errors]") {
  const auto u = sample_input<double>(5, 32);
  {
    auto w = small_gla<double>(1);
    w.gk_proj_1_bias = MatD::Zero(1, 15);
    REQUIRE_THROWS_WITH(gla_decompose(w, u), Contains("gla: gk_proj_1_bias has shape (1, 15)") && Contains("(1, key_dim=16)"));
  }
  {
    auto w = small_hgrn2<double>(1);
    w.q_proj_weight = MatD::Zero(32, 31);
    REQUIRE_THROWS_WITH(hgrn2_forward(w, u), Contains("hgrn2: q_proj_weight has shape (32, 31)") && Contains("(forget_dim=32, hidden_size=32)"));
  }
  {
    auto w = small_rwkv6<double>(1);
    w.bonus = MatD::Zero(4, 4);
    REQUIRE_THROWS_WITH(rwkv6_decompose(w, u), Contains("rwkv6: bonus has shape (4, 4)") && Contains("(num_heads=2, head_k_dim=8)"));
    REQUIRE_THROWS_WITH(rwkv6_forward(small_rwkv6<double>(1), sample_input<double>(5, 8)), Contains("u has shape (5, 8)"));
  }
}
