// The activation-level doors (issue 19, part 2) of RWKV-4, RWKV-6, RetNet, GLA, linear attention,
// mLSTM and softmax attention: decompose(w, u) == attention(activations(w, u)), attention(acts)
// against the model's own recurrent forward, the inner output without the out projection, hand-built
// activations against dense matrices written from the formulas, the paper variants from activations,
// final_state against the forward's state, and shape errors naming the field.
#include "support/model_checks.hpp"

#include <iattn/models/gla.hpp>
#include <iattn/models/linear_attention.hpp>
#include <iattn/models/mlstm.hpp>
#include <iattn/models/retnet.hpp>
#include <iattn/models/rwkv4.hpp>
#include <iattn/models/rwkv6.hpp>
#include <iattn/models/transformer.hpp>

#include <vector>

using namespace test;
using namespace iattn::models;
using Catch::Matchers::Contains;
using iattn::Matrix;

namespace {

const std::vector<Index> act_lengths = {1, 5, 64};

template <class T>
rwkv4_weights<T> small_rwkv4(std::uint64_t seed) {
  return rwkv4_init<T>({.hidden_size = 32, .attention_hidden_size = 24, .layer_id = 1, .num_hidden_layers = 3}, seed);
}
template <class T>
rwkv6_weights<T> small_rwkv6(std::uint64_t seed) {
  auto w = rwkv6_init<T>({.hidden_size = 32, .key_dim = 16, .value_dim = 32, .num_heads = 2, .proj_low_rank_dim = 4,
                          .gate_low_rank_dim = 8, .layer_idx = 1, .num_layers = 3}, seed);
  init::generator g(seed + 100);
  w.g_norm_weight = init::uniform<T>(g, 1, 32, 0.5, 1.5);
  w.g_norm_bias = init::normal<T>(g, 1, 32, 0.3);
  return w;
}
template <class T>
gla_weights<T> small_gla(std::uint64_t seed) {
  auto w = gla_init<T>({.hidden_size = 32, .key_dim = 16, .value_dim = 32, .num_heads = 2, .gate_low_rank_dim = 8}, seed);
  init::generator g(seed + 100);
  w.g_norm_swish_gate_weight = init::uniform<T>(g, 1, 16, 0.5, 1.5);
  return w;
}
template <class T>
retnet_weights<T> small_retnet(std::uint64_t seed, bool centered = false) {
  return retnet_init<T>({.embed_dim = 32, .value_dim = 64, .num_heads = 4, .centered = centered}, seed);
}
template <class T>
linear_attention_weights<T> small_linear_attention(std::uint64_t seed) {
  return linear_attention_init<T>({.d_model = 32, .n_heads = 2, .d_keys = 8, .d_values = 16}, seed);
}
template <class T>
mlstm_weights<T> small_mlstm(std::uint64_t seed) {
  auto w = mlstm_init<T>({.embedding_dim = 32}, seed);
  init::generator g(seed + 100);  // a norm weight and a skip that are not 0 and 1
  w.mlstm_cell_outnorm_weight = init::normal<T>(g, 1, 64, 0.2);
  w.learnable_skip = init::uniform<T>(g, 1, 64, 0.5, 1.5);
  return w;
}
template <class T>
transformer_weights<T> small_transformer(std::uint64_t seed) {
  return transformer_init<T>({.embed_dim = 32, .num_heads = 4}, seed);
}

/// Two decompositions are the same: x, beta, output, and per channel materialize and apply.
template <class T, class D1, class D2>
void check_same(const D1& a, const D2& b) {
  const double tol = model_tol<T>();
  check_close(dd(a.x), dd(b.x), tol);
  check_close(dd(a.beta), dd(b.beta), tol);
  check_close(dd(a.output()), dd(b.output()), tol);
  const Index D = a.x.cols(), L = a.x.rows();
  for (Index c : {Index(0), D / 2, D - 1})
    check_close(dd(Matrix<T>(iattn::materialize(a.H, c, L))), dd(Matrix<T>(iattn::materialize(b.H, c, L))), tol);
  check_close(dd(Matrix<T>(iattn::apply(a.H, a.x))), dd(Matrix<T>(iattn::apply(b.H, b.x))), tol);
}

/// Two expressions have the same matrices on a few channels.
template <class T, class E1, class E2>
void check_same_matrix(const E1& a, const E2& b, Index D, Index L) {
  for (Index c : {Index(0), D / 2, D - 1})
    check_close(dd(Matrix<T>(iattn::materialize(a, c, L))), dd(Matrix<T>(iattn::materialize(b, c, L))), model_tol<T>());
}

/// The inner width of a model's activations (the columns of x).
template <class T> Index acts_width(const rwkv4_activations<T>& a) { return a.value.cols(); }
template <class T> Index acts_width(const rwkv6_activations<T>& a) { return a.v.cols(); }
template <class T> Index acts_width(const gla_activations<T>& a) { return a.v.cols(); }
template <class T> Index acts_width(const retnet_activations<T>& a) { return a.v.cols(); }
template <class T> Index acts_width(const linear_attention_activations<T>& a) { return a.values.cols(); }
template <class T> Index acts_width(const mlstm_activations<T>& a) { return a.v.cols(); }
template <class T> Index acts_width(const transformer_activations<T>& a) { return a.v.cols(); }

/// The doors every model shares: decompose == attention(activations), the oracle, and the inner output
/// (out projection left empty) projected by the weights' own out projection.
template <class T, class W, class Fwd, class Drop, class Project>
void check_doors(const W& w, Index d_model, std::uint64_t seed, Fwd&& forward, Drop&& drop_out_proj, Project&& project) {
  for (Index L : act_lengths) {
    INFO("L = " << L);
    const auto u = sample_input<T>(L, d_model, seed + std::uint64_t(L));
    const auto acts = activations(w, u);
    const auto d = attention(acts);
    check_same<T>(decompose(w, u), d);
    const Matrix<T> block = forward(w, u);
    check_exact<T>(block, d);
    auto inner_acts = acts;
    drop_out_proj(inner_acts);
    const auto inner = attention(inner_acts);
    REQUIRE(inner.out_weight.size() == 0);
    const Matrix<T> y = inner.output();
    REQUIRE(y.rows() == L);
    REQUIRE(y.cols() == acts_width(acts));
    check_close(dd(Matrix<T>(project(y))), dd(block), model_tol<T>());
  }
}

double silu(double v) { return v / (1 + std::exp(-v)); }

}  // namespace

// ---- decompose == attention(activations), the oracle, the inner output -------------------------------

TEMPLATE_TEST_CASE("RWKV-4 from activations", "[activations][rwkv4]", float, double) {
  using T = TestType;
  const auto w = small_rwkv4<T>(1);
  check_doors<T>(w, 32, 100, [](const auto& w, const auto& u) { return rwkv4_forward(w, u); },
                 [](auto& a) { a.output_weight.resize(0, 0); }, [&](const Matrix<T>& y) { return nn::linear<T>(y, w.output_weight); });
}

TEMPLATE_TEST_CASE("RWKV-6 from activations", "[activations][rwkv6]", float, double) {
  using T = TestType;
  const auto w = small_rwkv6<T>(2);
  check_doors<T>(w, 32, 200, [](const auto& w, const auto& u) { return rwkv6_forward(w, u); },
                 [](auto& a) { a.o_proj_weight.resize(0, 0); }, [&](const Matrix<T>& y) { return nn::linear<T>(y, w.o_proj_weight); });
}

TEMPLATE_TEST_CASE("GLA from activations", "[activations][gla]", float, double) {
  using T = TestType;
  const auto w = small_gla<T>(3);
  check_doors<T>(w, 32, 300, [](const auto& w, const auto& u) { return gla_forward(w, u); },
                 [](auto& a) { a.o_proj_weight.resize(0, 0); }, [&](const Matrix<T>& y) { return nn::linear<T>(y, w.o_proj_weight); });
}

TEMPLATE_TEST_CASE("RetNet from activations", "[activations][retnet]", float, double) {
  using T = TestType;
  for (bool centered : {false, true}) {
    INFO("centered " << centered);
    const auto w = small_retnet<T>(4, centered);
    check_doors<T>(w, 32, 400, [](const auto& w, const auto& u) { return retnet_forward(w, u); },
                   [](auto& a) { a.out_proj_weight.resize(0, 0); }, [&](const Matrix<T>& y) { return nn::linear<T>(y, w.out_proj_weight); });
  }
}

TEMPLATE_TEST_CASE("linear attention from activations", "[activations][linear_attention]", float, double) {
  using T = TestType;
  const auto w = small_linear_attention<T>(5);
  check_doors<T>(w, 32, 500, [](const auto& w, const auto& u) { return linear_attention_forward(w, u); },
                 [](auto& a) { a.out_projection_weight.resize(0, 0), a.out_projection_bias.resize(0, 0); },
                 [&](const Matrix<T>& y) { return nn::linear<T>(y, w.out_projection_weight, w.out_projection_bias); });
}

TEMPLATE_TEST_CASE("mLSTM from activations", "[activations][mlstm]", float, double) {
  using T = TestType;
  const auto w = small_mlstm<T>(6);
  check_doors<T>(w, 32, 600, [](const auto& w, const auto& u) { return mlstm_forward(w, u); },
                 [](auto& a) { a.proj_down_weight.resize(0, 0); }, [&](const Matrix<T>& y) { return nn::linear<T>(y, w.proj_down_weight); });
}

TEMPLATE_TEST_CASE("softmax attention from activations", "[activations][transformer]", float, double) {
  using T = TestType;
  const auto w = small_transformer<T>(7);
  check_doors<T>(w, 32, 700, [](const auto& w, const auto& u) { return transformer_forward(w, u); },
                 [](auto& a) { a.out_proj_weight.resize(0, 0), a.out_proj_bias.resize(0, 0); },
                 [&](const Matrix<T>& y) { return nn::linear<T>(y, w.out_proj_weight, w.out_proj_bias); });
}

// ---- the paper variants and named sub-matrices take activations ---------------------------------------

TEMPLATE_TEST_CASE("paper variants from activations equal the weights versions", "[activations][paper]", float, double) {
  using T = TestType;
  const Index L = 33;
  {
    const auto w = small_rwkv4<T>(11);
    const auto u = sample_input<T>(L, 32, 11);
    check_same_matrix<T>(rwkv4_wkv(activations(w, u)), rwkv4_wkv(w, u), 24, L);
  }
  {
    const auto w = small_rwkv6<T>(12);
    const auto u = sample_input<T>(L, 32, 12);
    check_same_matrix<T>(rwkv6_wkv(activations(w, u)), rwkv6_wkv(w, u), 32, L);
  }
  {
    const auto w = small_gla<T>(13);
    const auto u = sample_input<T>(L, 32, 13);
    check_same_matrix<T>(gla_scores(activations(w, u)), gla_scores(w, u), 32, L);
  }
  for (bool centered : {false, true}) {
    const auto w = small_retnet<T>(14, centered);
    const auto u = sample_input<T>(L, 32, 14);
    check_same_matrix<T>(retnet_paper_attention(activations(w, u)), retnet_paper_attention(w, u), 64, L);
    if (!centered)  // for the RMS norm eq. 24 is the exact H
      check_same_matrix<T>(retnet_paper_attention(activations(w, u)), decompose(w, u).H, 64, L);
  }
  {
    const auto w = small_linear_attention<T>(15);
    const auto u = sample_input<T>(L, 32, 15);
    check_same_matrix<T>(linear_attention_scores(activations(w, u)), linear_attention_scores(w, u), 32, L);
  }
  {
    const auto w = small_mlstm<T>(16);
    const auto u = sample_input<T>(L, 32, 16);
    check_same_matrix<T>(mlstm_cell_attention(activations(w, u)), mlstm_cell_attention(w, u), 64, L);
  }
}

// ---- final_state against the forward's own state -----------------------------------------------------

TEMPLATE_TEST_CASE("final_state equals the recurrent forward's state", "[activations][state]", float, double) {
  using T = TestType;
  const double tol = model_tol<T>();
  for (Index L : act_lengths) {
    INFO("L = " << L);
    {
      const auto w = small_rwkv4<T>(21);
      const auto u = sample_input<T>(L, 32, 21 + std::uint64_t(L));
      rwkv4_state<T> ref;
      rwkv4_forward(w, u, &ref);
      const auto st = final_state(activations(w, u));
      check_close(dd(st.shift_state), dd(ref.shift_state), 0.0);
      check_close(dd(st.shift_state), dd(Matrix<T>(u.row(L - 1))), 0.0);
      check_close(dd(st.max_state), dd(ref.max_state), tol);
      check_close(dd(st.num_state), dd(ref.num_state), tol);
      check_close(dd(st.den_state), dd(ref.den_state), tol);
      REQUIRE((st.den_state.array() >= T(1) - T(tol)).all());  // the maximising token contributes exp(0)
    }
    {
      const auto w = small_rwkv6<T>(22);
      const auto u = sample_input<T>(L, 32, 22 + std::uint64_t(L));
      rwkv6_state<T> ref;
      rwkv6_forward(w, u, &ref);
      const auto st = final_state(activations(w, u));
      REQUIRE(st.recurrent_state.rows() == 16);
      REQUIRE(st.recurrent_state.cols() == 16);
      check_close(dd(st.recurrent_state), dd(ref.recurrent_state), tol);
      check_close(dd(st.conv_state), dd(ref.conv_state), 0.0);
    }
    {
      const auto w = small_gla<T>(23);
      const auto u = sample_input<T>(L, 32, 23 + std::uint64_t(L));
      Matrix<T> ref;
      gla_forward(w, u, &ref);
      const Matrix<T> st = final_state(activations(w, u));
      REQUIRE(st.rows() == 16);
      REQUIRE(st.cols() == 16);
      check_close(dd(st), dd(ref), tol);
    }
    for (bool centered : {false, true}) {
      const auto w = small_retnet<T>(24, centered);
      const auto u = sample_input<T>(L, 32, 24 + std::uint64_t(L));
      retnet_state<T> ref;
      retnet_forward(w, u, &ref);
      const auto st = final_state(activations(w, u));
      REQUIRE(st.prev_key_value.rows() == 64);
      REQUIRE(st.prev_key_value.cols() == 8);
      check_close(dd(st.prev_key_value), dd(ref.prev_key_value), tol);
      check_close(dd(st.scale), dd(ref.scale), tol);
    }
    {
      const auto w = small_linear_attention<T>(25);
      const auto u = sample_input<T>(L, 32, 25 + std::uint64_t(L));
      linear_attention_state<T> ref;
      linear_attention_forward(w, u, &ref);
      const auto st = final_state(activations(w, u));
      check_close(dd(st.Si), dd(ref.Si), tol);
      check_close(dd(st.Zi), dd(ref.Zi), tol);
    }
    {
      auto w = small_mlstm<T>(26);
      init::generator g(26);  // input gates spread out, so the stabiliser is not the last token's gate
      w.mlstm_cell_igate_weight = init::normal<T>(g, 4, 192, 0.3);
      const auto u = sample_input<T>(L, 32, 26 + std::uint64_t(L));
      mlstm_state<T> ref;
      mlstm_forward(w, u, &ref);
      const auto st = final_state(activations(w, u));
      REQUIRE(st.c_state.rows() == 64);
      REQUIRE(st.c_state.cols() == 16);
      check_close(dd(st.m_state), dd(ref.m_state), tol);
      check_close(dd(st.c_state), dd(ref.c_state), tol);
      check_close(dd(st.n_state), dd(ref.n_state), tol);
    }
  }
}

TEST_CASE("RWKV-4 final_state with keys of +-80 in float matches the double forward", "[activations][state][extremes]") {
  auto w = small_rwkv4<double>(31);
  w.key_weight *= 40.0;
  const MatD u = sample_input<double>(200, 32, 31);
  rwkv4_state<double> ref;
  rwkv4_forward(w, u, &ref);
  REQUIRE(activations(w, u).key.cwiseAbs().maxCoeff() > 60);
  auto a = activations(w, u);
  rwkv4_activations<float> af;  // the double activations rounded to float: what a float hook would hold
  af.key = a.key.cast<float>(), af.value = a.value.cast<float>(), af.receptance = a.receptance.cast<float>();
  af.time_decay = a.time_decay.cast<float>(), af.time_first = a.time_first.cast<float>(), af.shift_state = a.shift_state.cast<float>();
  const auto st = final_state(af);
  REQUIRE(st.num_state.allFinite());
  REQUIRE(st.den_state.allFinite());
  check_close(dd(st.max_state), ref.max_state, 1e-5);
  // the unshifted sums num * e^max: compare the ratio num / den (a weighted mean of the values)
  const MatD ratio = (dd(st.num_state).array() / dd(st.den_state).array()).matrix();
  const MatD ref_ratio = (ref.num_state.array() / ref.den_state.array()).matrix();
  check_close(ratio, ref_ratio, 1e-3);
}

// ---- hand-built activations against dense matrices written from the formulas --------------------------

TEST_CASE("GLA: hand-built activations give the dense matrix of the formula", "[activations][gla][oracle]") {
  const Index L = 9, H = 2, dk = 4, dv = 3, K = H * dk, V = H * dv;
  gla_activations<double> a;
  a.q = normal<double>(L, K), a.k = normal<double>(L, K), a.v = normal<double>(L, V), a.g = normal<double>(L, V);
  a.gk = -uniform<double>(L, K, 0.01, 1.0);
  a.g_norm_swish_gate_weight = uniform<double>(1, dv, 0.5, 1.5);
  a.num_heads = H;
  a.norm_eps = 1e-5;
  // S^h[t, s] = sum_i q_t[i] / sqrt(dk) k_s[i] exp(sum_{r=s+1..t} gk_r[i]); o = S v; y = silu(g) w o / sigma
  std::vector<MatD> S(H, MatD::Zero(L, L));
  MatD o = MatD::Zero(L, V);
  for (Index h = 0; h < H; ++h) {
    for (Index t = 0; t < L; ++t)
      for (Index s = 0; s <= t; ++s)
        for (Index i = 0; i < dk; ++i) {
          double lg = 0;
          for (Index r = s + 1; r <= t; ++r) lg += a.gk(r, h * dk + i);
          S[h](t, s) += a.q(t, h * dk + i) / std::sqrt(double(dk)) * a.k(s, h * dk + i) * std::exp(lg);
        }
    o.middleCols(h * dv, dv) = S[h] * a.v.middleCols(h * dv, dv);
  }
  const auto d = attention(a);
  MatD y(L, V);
  for (Index c = 0; c < V; ++c) {
    const Index h = c / dv;
    MatD expect(L, L);
    for (Index t = 0; t < L; ++t) {
      const double sigma = std::sqrt(o.row(t).segment(h * dv, dv).squaredNorm() / double(dv) + 1e-5);
      const double gain = silu(a.g(t, c)) * a.g_norm_swish_gate_weight(0, c % dv) / sigma;
      expect.row(t) = S[h].row(t) * gain;
      y(t, c) = o(t, c) * gain;
    }
    check_close(MatD(iattn::materialize(d.H, c, L)), expect, 1e-12);
  }
  check_close(d.output(), y, 1e-12);
  // the state: S_final[h*dk + i, j] = sum_s exp(sum_{r>s} gk_r[i]) k_s[i] v_s[j]
  MatD st = MatD::Zero(K, dv);
  for (Index h = 0; h < H; ++h)
    for (Index i = 0; i < dk; ++i)
      for (Index s = 0; s < L; ++s) {
        double lg = 0;
        for (Index r = s + 1; r < L; ++r) lg += a.gk(r, h * dk + i);
        for (Index j = 0; j < dv; ++j) st(h * dk + i, j) += std::exp(lg) * a.k(s, h * dk + i) * a.v(s, h * dv + j);
      }
  check_close(final_state(a), st, 1e-12);
}

TEST_CASE("RWKV-6: hand-built activations give the dense matrix of the formula", "[activations][rwkv6][oracle]") {
  const Index L = 9, H = 2, dk = 4, dv = 3, K = H * dk, V = H * dv;
  rwkv6_activations<double> a;
  a.r = normal<double>(L, K), a.k = normal<double>(L, K), a.v = normal<double>(L, V), a.g = normal<double>(L, V);
  a.w = -(normal<double>(L, K, 0.5).array().exp()).matrix();
  a.bonus = normal<double>(H, dk);
  a.g_norm_weight = uniform<double>(1, V, 0.5, 1.5);
  a.g_norm_bias = normal<double>(1, V, 0.3);
  a.norm_eps = 1e-5;
  // S^h[t, s] = sum_i r_t[i] k_s[i] (exp(sum_{k=s+1..t-1} w_k[i]) for s < t, bonus[h, i] for s = t)
  std::vector<MatD> S(H, MatD::Zero(L, L));
  MatD o = MatD::Zero(L, V);
  for (Index h = 0; h < H; ++h) {
    for (Index t = 0; t < L; ++t)
      for (Index s = 0; s <= t; ++s)
        for (Index i = 0; i < dk; ++i) {
          double lg = 0;
          for (Index r = s + 1; r < t; ++r) lg += a.w(r, h * dk + i);
          S[h](t, s) += a.r(t, h * dk + i) * a.k(s, h * dk + i) * (s == t ? a.bonus(h, i) : std::exp(lg));
        }
    o.middleCols(h * dv, dv) = S[h] * a.v.middleCols(h * dv, dv);
  }
  const auto d = attention(a);
  MatD y(L, V);
  for (Index c = 0; c < V; ++c) {
    const Index h = c / dv;
    MatD expect(L, L);
    for (Index t = 0; t < L; ++t) {
      const auto seg = o.row(t).segment(h * dv, dv);
      const double mu = seg.mean(), sigma = std::sqrt((seg.array() - mu).square().mean() + 1e-5);
      const double gain = silu(a.g(t, c)) * a.g_norm_weight(0, c) / sigma;
      expect.row(t) = S[h].row(t) * gain;
      y(t, c) = silu(a.g(t, c)) * ((o(t, c) - mu) / sigma * a.g_norm_weight(0, c) + a.g_norm_bias(0, c));
    }
    check_close(MatD(iattn::materialize(d.H, c, L)), expect, 1e-12);
  }
  check_close(d.output(), y, 1e-12);
  // the state excludes the bonus: sum_s exp(sum_{r>s} w_r[i]) k_s[i] v_s[j]
  MatD st = MatD::Zero(K, dv);
  for (Index h = 0; h < H; ++h)
    for (Index i = 0; i < dk; ++i)
      for (Index s = 0; s < L; ++s) {
        double lg = 0;
        for (Index r = s + 1; r < L; ++r) lg += a.w(r, h * dk + i);
        for (Index j = 0; j < dv; ++j) st(h * dk + i, j) += std::exp(lg) * a.k(s, h * dk + i) * a.v(s, h * dv + j);
      }
  check_close(final_state(a).recurrent_state, st, 1e-12);
}

TEST_CASE("RetNet: hand-built activations with any decays give the dense matrix of the formula", "[activations][retnet][oracle]") {
  const Index L = 9, H = 3, dk = 4, P = 2, E = H * dk, V = H * P;
  retnet_activations<double> a;
  a.qr = normal<double>(L, E, 1.5), a.kr = normal<double>(L, E, 1.5), a.v = normal<double>(L, V), a.g = normal<double>(L, V);
  a.decay = uniform<double>(1, H, 0.3, 0.99).array().log().matrix();
  a.decay(0, 1) = 0.0;  // gamma = 1: no decay at all
  a.layernorm_eps = 1e-6;
  // R[t, s] = qr_t . kr_s gamma^(t-s) / sqrt(sum_{j<=t} gamma^j), rows / max(|row sum|, 1); y = silu(g) RMSNorm(R v)
  std::vector<MatD> R(H, MatD::Zero(L, L));
  MatD o = MatD::Zero(L, V);
  for (Index h = 0; h < H; ++h) {
    const double gamma = std::exp(a.decay(0, h));
    for (Index t = 0; t < L; ++t) {
      double m = 0;
      for (Index j = 0; j <= t; ++j) m += std::pow(gamma, double(j));
      for (Index s = 0; s <= t; ++s)
        R[h](t, s) = a.qr.row(t).segment(h * dk, dk).dot(a.kr.row(s).segment(h * dk, dk)) * std::pow(gamma, double(t - s)) / std::sqrt(m);
      R[h].row(t) /= std::max(std::abs(R[h].row(t).sum()), 1.0);
    }
    o.middleCols(h * P, P) = R[h] * a.v.middleCols(h * P, P);
  }
  const auto d = attention(a);
  const auto paper = retnet_paper_attention(a);
  MatD y(L, V);
  for (Index c = 0; c < V; ++c) {
    const Index h = c / P;
    MatD expect(L, L);
    for (Index t = 0; t < L; ++t) {
      const double sigma = std::sqrt(o.row(t).segment(h * P, P).squaredNorm() / double(P) + 1e-6);
      expect.row(t) = R[h].row(t) * silu(a.g(t, c)) / sigma;
      y(t, c) = o(t, c) * silu(a.g(t, c)) / sigma;
    }
    check_close(MatD(iattn::materialize(d.H, c, L)), expect, 1e-12);
    check_close(MatD(iattn::materialize(paper, c, L)), expect, 1e-12);  // RMS norm: eq. 24 is H
  }
  check_close(d.output(), y, 1e-12);
  // torchscale's state: prev_key_value[h*P + p, i] = sum_s gamma^(L-1-s) v_s[p] kr_s[i] / sqrt(scale)
  const auto st = final_state(a);
  for (Index h = 0; h < H; ++h) {
    const double gamma = std::exp(a.decay(0, h));
    double scale = 0;
    for (Index j = 0; j < L; ++j) scale += std::pow(gamma, double(j));
    REQUIRE(std::abs(st.scale(0, h) - scale) <= 1e-12 * scale);
    MatD kv = MatD::Zero(P, dk);
    for (Index s = 0; s < L; ++s)
      kv += std::pow(gamma, double(L - 1 - s)) * a.v.row(s).segment(h * P, P).transpose() * a.kr.row(s).segment(h * dk, dk) / std::sqrt(scale);
    check_close(MatD(st.prev_key_value.middleRows(h * P, P)), kv, 1e-12);
  }
}

TEST_CASE("RWKV-4, linear and softmax attention: hand-built activations give the dense matrix", "[activations][oracle]") {
  const Index L = 8;
  {
    const Index A = 5;
    rwkv4_activations<double> a;
    a.key = normal<double>(L, A, 3.0), a.value = normal<double>(L, A), a.receptance = uniform<double>(L, A, 0, 1);
    a.time_decay = normal<double>(1, A), a.time_first = normal<double>(1, A);
    const auto d = attention(a);
    for (Index c = 0; c < A; ++c) {
      const double wd = -std::exp(a.time_decay(0, c)), first = a.time_first(0, c);
      MatD alpha = MatD::Zero(L, L);
      for (Index t = 0; t < L; ++t) {
        double den = std::exp(first + a.key(t, c));
        for (Index s = 0; s < t; ++s) den += std::exp(double(t - 1 - s) * wd + a.key(s, c));
        alpha(t, t) = std::exp(first + a.key(t, c)) / den * a.receptance(t, c);
        for (Index s = 0; s < t; ++s) alpha(t, s) = std::exp(double(t - 1 - s) * wd + a.key(s, c)) / den * a.receptance(t, c);
      }
      check_close(MatD(iattn::materialize(d.H, c, L)), alpha, 1e-12);
      double num = 0, den = 0, mx = -1e300;  // HF's state: sums scaled by exp(-max)
      for (Index s = 0; s < L; ++s) mx = std::max(mx, a.key(s, c) + double(L - 1 - s) * wd);
      for (Index s = 0; s < L; ++s) {
        num += std::exp(a.key(s, c) + double(L - 1 - s) * wd - mx) * a.value(s, c);
        den += std::exp(a.key(s, c) + double(L - 1 - s) * wd - mx);
      }
      const auto st = final_state(a);
      REQUIRE(std::abs(st.max_state(0, c) - mx) <= 1e-12 * (1 + std::abs(mx)));
      REQUIRE(std::abs(st.num_state(0, c) - num) <= 1e-12 * (1 + std::abs(num)));
      REQUIRE(std::abs(st.den_state(0, c) - den) <= 1e-12 * (1 + den));
    }
  }
  {
    const Index H = 2, dk = 3, dv = 2;
    linear_attention_activations<double> a;
    a.Q = uniform<double>(L, H * dk, 0.1, 2), a.K = uniform<double>(L, H * dk, 0.1, 2), a.values = normal<double>(L, H * dv);
    a.n_heads = H;
    a.eps = 1e-3;
    const auto d = attention(a);
    for (Index c = 0; c < H * dv; ++c) {
      const Index h = c / dv;
      MatD M = MatD::Zero(L, L);
      for (Index t = 0; t < L; ++t) {
        double den = a.eps;
        for (Index s = 0; s <= t; ++s) den += a.Q.row(t).segment(h * dk, dk).dot(a.K.row(s).segment(h * dk, dk));
        for (Index s = 0; s <= t; ++s) M(t, s) = a.Q.row(t).segment(h * dk, dk).dot(a.K.row(s).segment(h * dk, dk)) / den;
      }
      check_close(MatD(iattn::materialize(d.H, c, L)), M, 1e-12);
    }
  }
  {
    const Index H = 2, hd = 3;
    transformer_activations<double> a;
    a.q = normal<double>(L, H * hd), a.k = normal<double>(L, H * hd), a.v = normal<double>(L, H * hd);
    a.num_heads = H;
    const auto d = attention(a);
    for (Index c = 0; c < H * hd; ++c) {
      const Index h = c / hd;
      MatD M = MatD::Zero(L, L);
      for (Index t = 0; t < L; ++t) {
        double den = 0;
        for (Index s = 0; s <= t; ++s) den += std::exp(a.q.row(t).segment(h * hd, hd).dot(a.k.row(s).segment(h * hd, hd)) / std::sqrt(double(hd)));
        for (Index s = 0; s <= t; ++s) M(t, s) = std::exp(a.q.row(t).segment(h * hd, hd).dot(a.k.row(s).segment(h * hd, hd)) / std::sqrt(double(hd))) / den;
      }
      check_close(MatD(iattn::materialize(d.H, c, L)), M, 1e-12);
    }
  }
}

// ---- bad activations ----------------------------------------------------------------------------------

TEST_CASE("activations with a wrong shape throw, naming the field", "[activations][errors]") {
  const auto u = sample_input<double>(5, 32, 41);
  {
    auto a = activations(small_rwkv4<double>(1), u);
    a.receptance = MatD::Zero(5, 23);
    REQUIRE_THROWS_AS(attention(a), std::invalid_argument);
    REQUIRE_THROWS_WITH(attention(a), Contains("rwkv4_activations: receptance has shape (5, 23)") && Contains("(L=5, A=24)"));
    REQUIRE_THROWS_WITH(final_state(a), Contains("receptance"));
    a = activations(small_rwkv4<double>(1), u);
    a.time_first = MatD::Zero(24, 1);
    REQUIRE_THROWS_WITH(rwkv4_wkv(a), Contains("time_first has shape (24, 1)") && Contains("(1, A=24)"));
  }
  {
    auto a = activations(small_rwkv6<double>(1), u);
    a.w = MatD::Zero(5, 15);
    REQUIRE_THROWS_WITH(attention(a), Contains("rwkv6_activations: w has shape (5, 15)") && Contains("K=num_heads*head_k_dim=16"));
    a = activations(small_rwkv6<double>(1), u);
    a.g_norm_bias = MatD::Zero(1, 31);
    REQUIRE_THROWS_WITH(attention(a), Contains("g_norm_bias has shape (1, 31)"));
  }
  {
    auto a = activations(small_gla<double>(1), u);
    a.gk = MatD::Zero(4, 16);
    REQUIRE_THROWS_WITH(attention(a), Contains("gla_activations: gk has shape (4, 16)") && Contains("(L=5, K=16)"));
    REQUIRE_THROWS_AS(final_state(a), std::invalid_argument);
  }
  {
    auto a = activations(small_retnet<double>(1), u);
    a.kr = MatD::Zero(5, 31);
    REQUIRE_THROWS_WITH(attention(a), Contains("retnet_activations: kr has shape (5, 31)") && Contains("(L=5, E=32)"));
    REQUIRE_THROWS_WITH(retnet_paper_attention(a), Contains("kr"));
    a = activations(small_retnet<double>(1), u);
    a.decay(0, 2) = 0.1;
    REQUIRE_THROWS_WITH(attention(a), Contains("decay[2]") && Contains("<= 0"));
  }
  {
    auto a = activations(small_linear_attention<double>(1), u);
    a.K = MatD::Zero(5, 15);
    REQUIRE_THROWS_WITH(attention(a), Contains("linear_attention_activations: K has shape (5, 15)") && Contains("(L=5, H*dk=16)"));
  }
  {
    auto a = activations(small_mlstm<double>(1), u);
    a.fgate_preact = MatD::Zero(5, 3);
    REQUIRE_THROWS_WITH(attention(a), Contains("mlstm_activations: fgate_preact has shape (5, 3)") && Contains("(L=5, NH=4)"));
    a = activations(small_mlstm<double>(1), u);
    a.learnable_skip = MatD::Zero(1, 63);
    REQUIRE_THROWS_WITH(attention(a), Contains("learnable_skip has shape (1, 63)"));
  }
  {
    auto a = activations(small_transformer<double>(1), u);
    a.k = MatD::Zero(6, 32);
    REQUIRE_THROWS_WITH(attention(a), Contains("transformer_activations: k has shape (6, 32)") && Contains("(L=5, E=32)"));
    a = activations(small_transformer<double>(1), u);
    a.out_proj_bias = MatD::Zero(1, 31);
    REQUIRE_THROWS_WITH(attention(a), Contains("out_proj_bias has shape (1, 31)"));
  }
}
