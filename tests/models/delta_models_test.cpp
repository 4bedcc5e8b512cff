// The delta-rule models and complex decays (issue 20): each model's exact decomposition against its own recurrent
// forward, decompose(w, u) == attention(activations(w, u)), the inner output without the out
// projection, the final state against the forward's, the head's transition against a dense oracle
// built from explicit N x N transition matrices, and shape errors naming the field.
#include "support/model_checks.hpp"

#include <iattn/models/deltanet.hpp>
#include <iattn/models/deltaproduct.hpp>
#include <iattn/models/kimi_linear.hpp>
#include <iattn/models/lru.hpp>
#include <iattn/models/qwen3_next.hpp>
#include <iattn/models/rwkv7.hpp>
#include <iattn/models/s4d.hpp>

#include <vector>

using namespace test;
using namespace iattn::models;
using Catch::Matchers::Contains;
using iattn::Matrix;

namespace {

/// A small Qwen3-Next layer with weights large enough that every term matters: projections of
/// std 0.3, decays exp(g) spread over (0, 1) (A_log small), a norm weight that is not 1.
template <class T>
qwen3_next_weights<T> small_qwen3_next(std::uint64_t seed, Index nk = 2, Index nv = 4) {
  auto w = qwen3_next_init<T>({.hidden_size = 24, .linear_num_value_heads = nv, .linear_num_key_heads = nk, .linear_key_head_dim = 8,
                               .linear_value_head_dim = 6, .linear_conv_kernel_dim = 4, .initializer_range = 0.3},
                              seed);
  init::generator g(seed + 100);
  w.A_log = init::uniform<T>(g, 1, nv, -4.0, 0.5);
  w.dt_bias = init::normal<T>(g, 1, nv, 0.5);
  w.norm_weight = init::uniform<T>(g, 1, w.config.linear_value_head_dim, 0.5, 1.5);
  return w;
}

/// The L x L matrix of value head h from explicit (dk, dk) transitions formed in double:
/// T[t, s] = q_t^T A_t ... A_{s+1} beta_s k_s with A_t = exp(g_t) (I - beta_t k_t k_t^T).
template <class T>
MatD dense_gated_delta(const Matrix<T>& q, const Matrix<T>& k, const Matrix<T>& beta, const Matrix<T>& g, Index h, Index dk) {
  const Index L = q.rows();
  MatD out = MatD::Zero(L, L);
  for (Index s = 0; s < L; ++s) {
    Eigen::VectorXd x(dk);  // A_t ... A_{s+1} beta_s k_s, advanced one token at a time
    for (Index i = 0; i < dk; ++i) x(i) = double(beta(s, h)) * double(k(s, h * dk + i));
    for (Index t = s; t < L; ++t) {
      if (t > s) {
        MatD A = MatD::Identity(dk, dk);
        Eigen::VectorXd kt(dk);
        for (Index i = 0; i < dk; ++i) kt(i) = double(k(t, h * dk + i));
        A -= double(beta(t, h)) * kt * kt.transpose();
        A *= std::exp(double(g(t, h)));
        x = A * x;
      }
      double acc = 0;
      for (Index i = 0; i < dk; ++i) acc += double(q(t, h * dk + i)) * x(i);
      out(t, s) = acc;
    }
  }
  return out;
}

/// The doors every delta-rule layer shares on one input: the decomposition against the forward,
/// decompose == attention(activations), the inner output (out projection dropped by `drop`) times
/// the weights' out projection, and final_state against the forward's state.
template <class T, class W, class Forward, class Drop>
void check_layer(const W& w, const Matrix<T>& u, Forward&& forward, Drop&& drop, const Matrix<T>& out_proj) {
  Matrix<T> S_fwd;
  const Matrix<T> block = forward(w, u, &S_fwd);
  const auto acts = activations(w, u);
  const auto d = attention(acts);
  check_exact<T>(block, d);
  check_close(dd(decompose(w, u).output()), dd(d.output()), model_tol<T>());
  auto inner_acts = acts;
  drop(inner_acts);
  check_close(dd(Matrix<T>(nn::linear<T>(attention(inner_acts).output(), out_proj))), dd(block), model_tol<T>());
  check_close(dd(final_state(acts)), dd(S_fwd), model_tol<T>());
}

}  // namespace

TEMPLATE_TEST_CASE("Qwen3-Next Gated DeltaNet: exact decomposition and doors", "[models][qwen3_next]", float, double) {
  using T = TestType;
  for (auto [nk, nv] : {std::pair<Index, Index>{2, 4}, {3, 3}}) {
    INFO("nk = " << nk << ", nv = " << nv);
    const auto w = small_qwen3_next<T>(1, nk, nv);
    for (Index L : model_lengths) {
      INFO("L = " << L);
      const auto u = sample_input<T>(L, 24, 50 + std::uint64_t(L));
      Matrix<T> S_fwd;
      const Matrix<T> block = qwen3_next_forward(w, u, &S_fwd);
      const auto acts = activations(w, u);
      const auto d = attention(acts);
      check_exact<T>(block, d);
      const auto d2 = decompose(w, u);
      check_close(dd(d2.output()), dd(d.output()), model_tol<T>());
      // the inner output (no out_proj), projected by the weights' out_proj
      auto inner_acts = acts;
      inner_acts.out_proj_weight.resize(0, 0);
      const auto inner = attention(inner_acts);
      REQUIRE(inner.out_weight.size() == 0);
      check_close(dd(Matrix<T>(nn::linear<T>(inner.output(), w.out_proj_weight))), dd(block), model_tol<T>());
      // the final state, by the backward running product, against the forward scan's
      const Matrix<T> S = final_state(acts);
      REQUIRE(S.rows() == nv * 8);
      REQUIRE(S.cols() == 6);
      check_close(dd(S), dd(S_fwd), model_tol<T>());
    }
  }
}

TEMPLATE_TEST_CASE("Qwen3-Next transition against explicit transition matrices", "[models][qwen3_next]", float, double) {
  using T = TestType;
  const auto w = small_qwen3_next<T>(2);
  for (Index L : {Index(1), Index(7), Index(70)}) {
    INFO("L = " << L);
    const auto acts = activations(w, sample_input<T>(L, 24, 9));
    Matrix<T> q, k, v;
    acts.qkv(q, k, v);
    const auto Tr = qwen3_next_transition(acts);
    for (Index h = 0; h < acts.num_v_heads; ++h) {
      const MatD ref = dense_gated_delta(q, k, acts.beta, acts.g, h, acts.head_k_dim);
      for (Index c : {h * acts.head_v_dim, h * acts.head_v_dim + acts.head_v_dim - 1})
        check_close(dd(Matrix<T>(iattn::materialize(Tr, c, L))), ref, model_tol<T>());
    }
  }
}

TEST_CASE("Qwen3-Next: shape errors name the field", "[models][qwen3_next][errors]") {
  using T = double;
  auto w = small_qwen3_next<T>(3);
  const auto u = sample_input<T>(5, 24, 1);
  {
    auto bad = w;
    bad.in_proj_ba_weight.resize(3, 24);
    REQUIRE_THROWS_WITH(decompose(bad, u), Contains("in_proj_ba_weight") && Contains("(3, 24)"));
  }
  {
    auto bad = w;
    bad.config.linear_num_key_heads = 3;
    REQUIRE_THROWS_WITH(decompose(bad, u), Contains("linear_num_key_heads"));
  }
  REQUIRE_THROWS_WITH(decompose(w, Matrix<T>(Matrix<T>::Zero(5, 7))), Contains("u") && Contains("(5, 7)"));
  auto acts = activations(w, u);
  {
    auto bad = acts;
    bad.g.resize(5, 3);
    REQUIRE_THROWS_WITH(attention(bad), Contains("g has shape (5, 3)"));
  }
  {
    auto bad = acts;
    bad.mixed_qkv.resize(5, 10);
    REQUIRE_THROWS_WITH(final_state(bad), Contains("mixed_qkv"));
  }
}

namespace {

/// fla DeltaNet / GatedDeltaNet layers in the configurations the tests cover, with weights large
/// enough that every term matters.
template <class T>
deltanet_weights<T> small_deltanet(std::uint64_t seed, deltanet_config c) {
  c.hidden_size = 24;
  c.head_dim = 8;
  c.expand_v = 0.75;  // dv = 6
  c.initializer_range = 0.3;
  auto w = deltanet_init<T>(c, seed);
  init::generator g(seed + 100);
  if (c.gated) w.A_log = init::uniform<T>(g, 1, c.value_heads(), -4.0, 0.5);
  w.o_norm_weight = init::uniform<T>(g, 1, c.head_v_dim(), 0.5, 1.5);
  return w;
}

}  // namespace

TEMPLATE_TEST_CASE("fla DeltaNet and GatedDeltaNet: exact decomposition and doors", "[models][deltanet]", float, double) {
  using T = TestType;
  const std::vector<std::pair<const char*, deltanet_config>> configs = {
      {"GatedDeltaNet, GVA 2 -> 4, gate", {.num_heads = 2, .num_v_heads = 4}},
      {"GatedDeltaNet, no output gate, no short conv, allow_neg_eigval",
       {.num_heads = 2, .use_gate = false, .use_short_conv = false, .allow_neg_eigval = true}},
      {"DeltaNet (defaults: no gate)", {.num_heads = 2, .gated = false, .use_gate = false}},
      {"DeltaNet, output gate, no beta", {.num_heads = 3, .gated = false, .use_gate = true, .use_beta = false}},
  };
  for (const auto& [name, c] : configs) {
    INFO(name);
    const auto w = small_deltanet<T>(4, c);
    for (Index L : model_lengths) {
      INFO("L = " << L);
      check_layer<T>(
          w, sample_input<T>(L, 24, 70 + std::uint64_t(L)),
          [](const auto& w, const Matrix<T>& u, Matrix<T>* S) { return deltanet_forward(w, u, S); },
          [](auto& a) { a.o_proj_weight.resize(0, 0); }, w.o_proj_weight);
    }
  }
}

TEST_CASE("fla DeltaNet: weights a configuration does not use are rejected by name", "[models][deltanet][errors]") {
  using T = double;
  auto w = small_deltanet<T>(5, {.num_heads = 2, .gated = false, .use_gate = false});
  const auto u = sample_input<T>(4, 24, 1);
  {
    auto bad = w;
    bad.A_log = Matrix<T>::Zero(1, 2);
    REQUIRE_THROWS_WITH(decompose(bad, u), Contains("A_log is given"));
  }
  {
    auto bad = w;
    bad.v_conv1d_weight.resize(12, 3);
    REQUIRE_THROWS_WITH(decompose(bad, u), Contains("v_conv1d_weight has shape (12, 3)"));
  }
  auto acts = activations(w, u);
  acts.beta.resize(4, 5);
  REQUIRE_THROWS_WITH(attention(acts), Contains("beta has shape (4, 5)"));
}

TEMPLATE_TEST_CASE("Kimi Delta Attention: exact decomposition and doors", "[models][kimi_linear]", float, double) {
  using T = TestType;
  auto w = kimi_linear_init<T>({.hidden_size = 24, .linear_num_heads = 3, .linear_head_dim = 6, .initializer_range = 0.3}, 6);
  init::generator g(106);
  w.forget_gate_A_log = init::uniform<T>(g, 1, 3, -4.0, 0.5);  // decays spread over (0, 1)
  w.o_norm_weight = init::uniform<T>(g, 1, 6, 0.5, 1.5);
  for (Index L : model_lengths) {
    INFO("L = " << L);
    check_layer<T>(
        w, sample_input<T>(L, 24, 90 + std::uint64_t(L)),
        [](const auto& w, const Matrix<T>& u, Matrix<T>* S) { return kimi_linear_forward(w, u, S); },
        [](auto& a) { a.o_proj_weight.resize(0, 0); }, w.o_proj_weight);
  }
  auto acts = activations(w, sample_input<T>(5, 24, 1));
  acts.g.resize(5, 3);
  REQUIRE_THROWS_WITH(attention(acts), Contains("g has shape (5, 3)"));
}

namespace {

/// An RWKV-7 layer with every weight drawn (the reference init zeroes o_proj and the first LoRA
/// layers, which would hide most terms), layer layer_idx of 3.
template <class T>
rwkv7_weights<T> small_rwkv7(std::uint64_t seed, Index layer_idx, bool fuse_norm = true) {
  const rwkv7_config c{.hidden_size = 24, .head_dim = 8, .value_dim = 0, .decay_low_rank_dim = 4, .a_low_rank_dim = 4,
                       .v_low_rank_dim = 4, .gate_low_rank_dim = 6, .layer_idx = layer_idx, .num_hidden_layers = 3,
                       .fuse_norm = fuse_norm};
  auto w = rwkv7_init<T>(c, seed);
  init::generator g(seed + 100);
  auto redraw = [&](Matrix<T>& m, double sd) { m = init::normal<T>(g, m.rows(), m.cols(), sd); };
  for (Matrix<T>* m : {&w.w_lora_lora_0_weight, &w.a_lora_lora_0_weight, &w.g_lora_lora_0_weight, &w.o_proj_weight}) redraw(*m, 0.3);
  if (layer_idx > 0) redraw(w.v_lora_lora_0_weight, 0.3);
  redraw(w.r_k, 0.5);
  redraw(w.k_proj_weight, 0.3);
  redraw(w.g_norm_bias, 0.2);
  return w;
}

}  // namespace

TEMPLATE_TEST_CASE("RWKV-7 init: orthogonal projections as the reference draws them", "[models][rwkv7][init]", float, double) {
  // r, k, v (C x C, gains 1, 0.1, 1): orthonormal rows times the gain; the second LoRA layers
  // (C x rank, gain 0.1): orthonormal columns (square and tall draws).
  using T = TestType;
  const double tol = std::is_same_v<T, float> ? 1e-6 : 1e-13;
  const auto w = rwkv7_init<T>({.hidden_size = 48, .head_dim = 8, .value_dim = 0, .decay_low_rank_dim = 5, .a_low_rank_dim = 6,
                                .v_low_rank_dim = 7, .gate_low_rank_dim = 9},
                               3);
  auto gram_error = [](const Matrix<T>& m, double gain, bool rows) {
    const Matrix<double> x = m.template cast<double>() / gain;
    const Matrix<double> G = rows ? Matrix<double>(x * x.transpose()) : Matrix<double>(x.transpose() * x);
    return (G - Matrix<double>::Identity(G.rows(), G.cols())).cwiseAbs().maxCoeff();
  };
  CHECK(gram_error(w.r_proj_weight, 1.0, true) < tol);
  CHECK(gram_error(w.k_proj_weight, 0.1, true) < tol);
  CHECK(gram_error(w.v_proj_weight, 1.0, true) < tol);
  CHECK(gram_error(w.w_lora_lora_2_weight, 0.1, false) < tol);
  CHECK(gram_error(w.a_lora_lora_2_weight, 0.1, false) < tol);
  // distinct draws, not one matrix repeated
  CHECK((w.r_proj_weight - w.v_proj_weight).cwiseAbs().maxCoeff() > T(0.1));
}

TEMPLATE_TEST_CASE("RWKV-7 time mixing: exact decomposition and doors", "[models][rwkv7]", float, double) {
  using T = TestType;
  for (bool fuse : {true, false}) {
    INFO("fuse_norm " << fuse);
    const auto w0 = small_rwkv7<T>(8, 0, fuse), w1 = small_rwkv7<T>(9, 1, fuse);
    for (Index L : model_lengths) {
      INFO("L = " << L);
      const auto x = sample_input<T>(L, 24, 110 + std::uint64_t(L));
      for (const auto* w : {&w0, &w1}) {
        INFO("layer " << w->config.layer_idx);
        const Matrix<T> v_first = w->config.layer_idx ? activations(w0, x).v : Matrix<T>();
        Matrix<T> S_fwd;
        const Matrix<T> block = rwkv7_forward(*w, x, v_first, &S_fwd);
        const auto acts = activations(*w, x, v_first);
        const auto d = attention(acts);
        check_exact<T>(block, d);
        check_close(dd(decompose(*w, x, v_first).output()), dd(d.output()), model_tol<T>());
        check_close(dd(final_state(acts)), dd(S_fwd), model_tol<T>());
      }
    }
  }
  const auto w1 = small_rwkv7<T>(9, 1);
  REQUIRE_THROWS_WITH(decompose(w1, sample_input<T>(5, 24, 1)), Contains("v_first") && Contains("layer 0's values"));
}

// ---- channel means of the delta-rule decompositions: one head matrix per head --------------------

/// Every mean the library offers of d.H (signed, |H^c|, one head, per-head tensor, all channels)
/// against means of the per-channel matrices materialized one at a time, in double.
template <class T, class Dec>
void check_means(const Dec& d, Index P) {
  const Index L = d.x.rows(), D = d.x.cols(), H = D / P;
  std::vector<MatD> M;
  for (Index c = 0; c < D; ++c) M.push_back(dd(Matrix<T>(iattn::materialize(d.H, c, L))));
  MatD mean = MatD::Zero(L, L), amean = MatD::Zero(L, L);
  for (const auto& m : M) mean += m / double(D), amean += m.cwiseAbs() / double(D);
  const double tol = model_tol<T>();
  check_close(dd(Matrix<T>(iattn::materialize_mean(d.H))), mean, tol);
  check_close(dd(Matrix<T>(iattn::materialize_mean(d.H, {.abs = true}))), amean, tol);
  const auto heads = iattn::materialize_head_means(d.H);
  REQUIRE(heads.dims[0] == H);
  for (Index h = 0; h < H; ++h) {
    MatD hm = MatD::Zero(L, L);
    for (Index c = h * P; c < (h + 1) * P; ++c) hm += M[std::size_t(c)] / double(P);
    check_close(dd(Matrix<T>(heads.slice(h))), hm, tol);
    if (h == H - 1) check_close(dd(Matrix<T>(iattn::materialize_mean(d.H, {.head = h}))), hm, tol);
  }
  const auto all = iattn::materialize_all(d.H);
  for (Index c : {Index(0), D / 2, D - 1}) check_close(dd(Matrix<T>(all.slice(c))), M[std::size_t(c)], tol);
}

TEMPLATE_TEST_CASE("delta-rule decompositions: head, channel and |H| means", "[models][means]", float, double) {
  using T = TestType;
  for (Index L : {Index(1), Index(9), Index(70)}) {
    INFO("L = " << L);
    {
      INFO("Qwen3-Next");
      const auto w = small_qwen3_next<T>(11);
      check_means<T>(decompose(w, sample_input<T>(L, 24, 3)), w.config.linear_value_head_dim);
    }
    {
      INFO("RWKV-7");
      const auto w = small_rwkv7<T>(12, 0);
      check_means<T>(decompose(w, sample_input<T>(L, 24, 4)), 8);
    }
  }
}

TEST_CASE("delta-rule models: an empty sequence gives an empty output", "[models][empty]") {
  using T = double;
  const Matrix<T> u0(0, 24);
  auto check = [](const auto& d, const Matrix<T>& block, Index D) {
    REQUIRE(block.rows() == 0);
    REQUIRE(d.output().rows() == 0);
    REQUIRE(d.x.cols() == D);
    REQUIRE(iattn::apply(d.H, d.x).rows() == 0);
  };
  const auto q = small_qwen3_next<T>(1);
  check(decompose(q, u0), qwen3_next_forward(q, u0), 24);
  const auto dn = small_deltanet<T>(2, {.num_heads = 2, .num_v_heads = 4});
  check(decompose(dn, u0), deltanet_forward(dn, u0), 24);
  const auto kd = kimi_linear_init<T>({.hidden_size = 24, .linear_num_heads = 3, .linear_head_dim = 6}, 3);
  check(decompose(kd, u0), kimi_linear_forward(kd, u0), 18);
  const auto r7 = small_rwkv7<T>(4, 0);
  check(decompose(r7, u0), rwkv7_forward(r7, u0), 24);
  const auto dp = deltaproduct_init<T>({.hidden_size = 24, .head_dim = 6, .num_heads = 2}, 5);
  check(decompose(dp, u0), deltaproduct_forward(dp, u0), 2 * 12);
  const auto lr = lru_init<T>({.d_model = 24, .d_hidden = 5}, 6);
  check(decompose(lr, u0), lru_forward(lr, u0), 4 * 5 + 24);
  REQUIRE(final_state(activations(q, u0)).cwiseAbs().maxCoeff() == 0.0);
}

// ---- complex decays: S4D as a complex recurrence against the long-convolution S4D ---------------

TEMPLATE_TEST_CASE("S4D as a complex recurrence equals the long convolution", "[models][s4d][complex]", float, double) {
  using T = TestType;
  const auto w = s4d_init<T>({.d_model = 12, .d_state = 16}, 21);
  for (Index L : model_lengths) {
    INFO("L = " << L);
    const auto u = sample_input<T>(L, 12, 130 + std::uint64_t(L));
    const auto d = s4d_recurrent_decompose(w, u);
    check_exact<T>(s4d_forward(w, u), d);
    const auto conv = iattn::causal_conv(s4d_kernel_taps(w, L));
    const auto rec = s4d_recurrence(w, L);
    for (Index c : {Index(0), Index(11)})
      check_close(dd(Matrix<T>(iattn::materialize(rec, c, L))), dd(Matrix<T>(iattn::materialize(conv, c, L))), model_tol<T>());
    check_close(dd(d.output()), dd(s4d_decompose(w, u).output()), model_tol<T>());
  }
}

TEMPLATE_TEST_CASE("complex decays: head means of a head-shared complex core", "[means][complex]", float, double) {
  using T = TestType;
  // Mamba-3-shaped: H = 3 heads of P = 4 channels sharing one complex core (N = 5 states, one group),
  // gates around it and a short convolution on the right.
  const Index H = 3, P = 4, N = 5, D = H * P;
  for (Index L : {Index(1), Index(9), Index(70)}) {
    INFO("L = " << L);
    init::generator g(77 + std::uint64_t(L));
    const Matrix<T> rho = init::uniform<T>(g, L, H * N, -0.3, 0.0), theta = init::uniform<T>(g, L, H * N, -3.0, 3.0);
    auto S = iattn::complex_semiseparable(rho, theta, init::normal<T>(g, L, N, 1.0), init::normal<T>(g, L, N, 1.0),
                                          init::normal<T>(g, L, N, 1.0), init::normal<T>(g, L, N, 1.0),
                                          {.heads = H, .head_dim = P, .groups = 1, .state = N});
    const auto Hop = iattn::diagonal(init::normal<T>(g, L, D, 1.0)) * std::move(S) * iattn::diagonal(init::uniform<T>(g, L, D, 0.5, 1.5)) *
                     iattn::causal_conv(init::normal<T>(g, 3, D, 0.5));
    struct { Matrix<T> x; decltype(Hop) H; } d{Matrix<T>(L, D), Hop};
    check_means<T>(d, P);
  }
}

TEMPLATE_TEST_CASE("fla GatedDeltaProduct: exact decomposition over the n steps' value blocks", "[models][deltaproduct]", float, double) {
  using T = TestType;
  const std::vector<std::pair<const char*, deltaproduct_config>> configs = {
      {"n = 2, forget gate, output gate, allow_neg_eigval (the layer's defaults)", {.num_heads = 2}},
      {"n = 3, GVA 1 -> 2, no short conv, no forget gate, beta in (0, 1)",
       {.num_heads = 1, .num_v_heads = 2, .num_householder = 3, .use_output_gate = false, .use_short_conv = false,
        .use_forget_gate = false, .allow_neg_eigval = false}},
  };
  for (const auto& [name, c0] : configs) {
    INFO(name);
    auto c = c0;
    c.hidden_size = 24;
    c.head_dim = 6;
    c.initializer_range = 0.3;
    auto w = deltaproduct_init<T>(c, 14);
    init::generator g(114);
    if (c.use_forget_gate) w.A_log = init::uniform<T>(g, 1, c.value_heads(), -4.0, 0.5);
    w.o_norm_weight = init::uniform<T>(g, 1, c.head_v_dim(), 0.5, 1.5);
    for (Index L : model_lengths) {
      INFO("L = " << L);
      const auto u = sample_input<T>(L, 24, 150 + std::uint64_t(L));
      Matrix<T> S_fwd;
      const Matrix<T> block = deltaproduct_forward(w, u, &S_fwd);
      const auto acts = activations(w, u);
      const auto d = attention(acts);
      REQUIRE(d.x.cols() == c.num_householder * c.value_dim());
      check_exact<T>(block, d);
      check_close(dd(decompose(w, u).output()), dd(d.output()), model_tol<T>());
      auto inner_acts = acts;
      inner_acts.o_proj_weight.resize(0, 0);
      const Matrix<T> blocks = attention(inner_acts).output();
      Matrix<T> inner = Matrix<T>::Zero(L, c.value_dim());
      for (Index j = 0; j < c.num_householder; ++j) inner += blocks.middleCols(j * c.value_dim(), c.value_dim());
      check_close(dd(Matrix<T>(nn::linear<T>(inner, w.o_proj_weight))), dd(block), model_tol<T>());
      check_close(dd(final_state(acts)), dd(S_fwd), model_tol<T>());
    }
  }
}

TEMPLATE_TEST_CASE("LRU: exact decomposition over the real and imaginary parts of its states", "[models][lru][complex]", float, double) {
  using T = TestType;
  for (auto [rmin, rmax, phase] : {std::tuple{0.0, 1.0, 6.28}, std::tuple{0.9, 0.999, 0.314}}) {
    INFO("ring [" << rmin << ", " << rmax << "], max phase " << phase);
    const auto w = lru_init<T>({.d_model = 12, .d_hidden = 10, .r_min = rmin, .r_max = rmax, .max_phase = phase}, 31);
    for (Index L : model_lengths) {
      INFO("L = " << L);
      const auto u = sample_input<T>(L, 12, 170 + std::uint64_t(L));
      Matrix<T> x_fwd;
      const Matrix<T> block = lru_forward(w, u, &x_fwd);
      const auto acts = activations(w, u);
      const auto d = attention(acts);
      REQUIRE(d.x.cols() == 4 * 10 + 12);
      check_exact<T>(block, d);
      check_close(dd(decompose(w, u).output()), dd(d.output()), model_tol<T>());
      check_close(dd(final_state(acts)), dd(x_fwd), model_tol<T>());
    }
  }
  auto w = lru_init<T>({.d_model = 12, .d_hidden = 10}, 1);
  w.B_im.resize(10, 11);
  REQUIRE_THROWS_WITH(decompose(w, sample_input<T>(4, 12, 1)), Contains("B_im has shape (10, 11)"));
}

TEMPLATE_TEST_CASE("Qwen3.5 Gated DeltaNet: plain projections, the same function as Qwen3-Next", "[models][qwen3_5]", float, double) {
  using T = TestType;
  const auto w = small_qwen3_next<T>(23);
  const auto w5 = qwen3_5_from_qwen3_next(w);
  for (Index L : model_lengths) {
    INFO("L = " << L);
    const auto u = sample_input<T>(L, 24, 190 + std::uint64_t(L));
    Matrix<T> S5, S;
    const Matrix<T> block5 = qwen3_5_forward(w5, u, &S5);
    check_exact<T>(block5, decompose(w5, u));
    check_close(dd(block5), dd(Matrix<T>(qwen3_next_forward(w, u, &S))), model_tol<T>());  // the reordering is right
    check_close(dd(final_state(activations(w5, u))), dd(S5), model_tol<T>());
  }
  auto bad = w5;
  bad.in_proj_z_weight.resize(3, 24);
  REQUIRE_THROWS_WITH(decompose(bad, sample_input<T>(4, 24, 1)), Contains("in_proj_z_weight has shape (3, 24)"));
}
