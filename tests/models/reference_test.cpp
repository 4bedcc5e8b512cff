// The delta-rule models against the reference implementations themselves: fixtures written by
// tools/reference/make_fixtures.py from transformers' Qwen3NextGatedDeltaNet and
// KimiLinearDeltaAttention, from fla's RWKV7Attention and GatedDeltaProduct layers (their Triton
// calls swapped for fla's own torch references) and from fla's naive recurrences (gated delta rule,
// delta rule, KDA, DPLR), run in float64 with their float32 casts patched out
// (tests/data/reference/README.md).
// No torch is needed here: the fixtures are committed .npy files. A missing fixture fails the test.
//
// Layer cases: the weights are read under their state_dict names, then decompose(w, u).output()
// and final_state(activations(w, u)) are compared with the reference's output and final recurrent
// state (double: 1e-10 (1 + max|ref|); float: 1e-4 relative). Naive cases: the operator built by
// the factory from the saved q, k, v, beta, gates, applied to v and materialized per head, against
// the reference's o; the backward final state against the reference's.
#include "support/model_checks.hpp"

#include <iattn/explain/npy.hpp>
#include <iattn/models/delta_rule.hpp>
#include <iattn/models/deltaproduct.hpp>
#include <iattn/models/kimi_linear.hpp>
#include <iattn/models/qwen3_next.hpp>
#include <iattn/models/rwkv7.hpp>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>

using namespace test;
using namespace iattn::models;
using iattn::Matrix;

namespace {

const std::string data_dir = IATTN_TEST_DATA_DIR;

/// tests/data/reference/<case>/<name>.npy as a double matrix; a missing file fails the test and
/// says how to regenerate it.
MatD fixture(const std::string& c, const std::string& name) {
  const std::string path = data_dir + "/reference/" + c + "/" + name + ".npy";
  if (!std::filesystem::exists(path))
    FAIL("missing reference fixture " << path << " (regenerate: bash tools/reference/setup_venv.sh && "
                                      << ".venv/bin/python tools/reference/make_fixtures.py)");
  return iattn::npy::read_matrix<double>(path);
}

template <class T>
Matrix<T> fixture_as(const std::string& c, const std::string& name) {
  return fixture(c, name).template cast<T>();
}

/// max |got - ref| <= tol (1 + max |ref|); the figures are reported on failure, and printed when
/// the environment sets IATTN_REFERENCE_REPORT.
template <class A>
void compare(const char* what, const A& got, const MatD& ref, double tol) {
  INFO(what);
  REQUIRE(got.rows() == ref.rows());
  REQUIRE(got.cols() == ref.cols());
  const double scale = 1.0 + ref.cwiseAbs().maxCoeff();
  const double err = (dd(got) - ref).cwiseAbs().maxCoeff();
  const double bound = tol * scale;
  CAPTURE(scale);
  if (std::getenv("IATTN_REFERENCE_REPORT"))
    std::printf("%-58s %-62s max|err| %.3e  max|ref| %.3e  rel %.3e\n", Catch::getResultCapture().getCurrentTestName().c_str(), what,
                err, scale - 1.0, err / scale);
  REQUIRE(std::isfinite(err));
  CHECK(err <= bound);
}

/// dk from the saved scale dk^-1/2 (every naive case uses the default scale).
Index key_dim_of(const MatD& scale) { return Index(std::lround(1.0 / (scale(0, 0) * scale(0, 0)))); }

// ---- the layers --------------------------------------------------------------------------------

template <class T>
qwen3_next_weights<T> qwen3_next_reference_weights() {
  const std::string c = "qwen3_next_layer";
  qwen3_next_weights<T> w;
  // The config make_fixtures.py builds (shapes are checked by w.check(); eps is the config's).
  w.config = {.hidden_size = 24, .linear_num_value_heads = 4, .linear_num_key_heads = 2, .linear_key_head_dim = 8,
              .linear_value_head_dim = 6, .linear_conv_kernel_dim = 4, .rms_norm_eps = 1e-6};
  w.in_proj_qkvz_weight = fixture_as<T>(c, "in_proj_qkvz_weight");
  w.in_proj_ba_weight = fixture_as<T>(c, "in_proj_ba_weight");
  w.conv1d_weight = fixture_as<T>(c, "conv1d_weight");
  w.dt_bias = fixture_as<T>(c, "dt_bias");
  w.A_log = fixture_as<T>(c, "A_log");
  w.norm_weight = fixture_as<T>(c, "norm_weight");
  w.out_proj_weight = fixture_as<T>(c, "out_proj_weight");
  w.check();
  return w;
}

template <class T>
kimi_linear_weights<T> kimi_linear_reference_weights() {
  const std::string c = "kimi_linear_layer";
  kimi_linear_weights<T> w;
  w.config = {.hidden_size = 24, .linear_num_heads = 3, .linear_head_dim = 8, .linear_conv_kernel_dim = 4, .rms_norm_eps = 1e-5};
  w.q_proj_weight = fixture_as<T>(c, "q_proj_weight");
  w.k_proj_weight = fixture_as<T>(c, "k_proj_weight");
  w.v_proj_weight = fixture_as<T>(c, "v_proj_weight");
  w.conv1d_weight = fixture_as<T>(c, "conv1d_weight");
  w.forget_gate_f_a_proj_weight = fixture_as<T>(c, "forget_gate_f_a_proj_weight");
  w.forget_gate_f_b_proj_weight = fixture_as<T>(c, "forget_gate_f_b_proj_weight");
  w.forget_gate_dt_bias = fixture_as<T>(c, "forget_gate_dt_bias");
  w.forget_gate_A_log = fixture_as<T>(c, "forget_gate_A_log");
  w.b_proj_weight = fixture_as<T>(c, "b_proj_weight");
  w.g_a_proj_weight = fixture_as<T>(c, "g_a_proj_weight");
  w.g_b_proj_weight = fixture_as<T>(c, "g_b_proj_weight");
  w.o_norm_weight = fixture_as<T>(c, "o_norm_weight");
  w.o_proj_weight = fixture_as<T>(c, "o_proj_weight");
  w.check();
  return w;
}

/// fla's RWKV7Attention: every parameter under its state_dict name (the token-shift mixes x_r..x_g
/// saved flat, (1, 1, C) -> (C,)); the config make_fixtures.py builds.
template <class T>
rwkv7_weights<T> rwkv7_reference_weights(const std::string& c, Index layer_idx, bool fuse_norm, Index value_dim) {
  rwkv7_weights<T> w;
  w.config = {.hidden_size = 32, .head_dim = 16, .value_dim = value_dim, .decay_low_rank_dim = 8, .a_low_rank_dim = 8,
              .v_low_rank_dim = 6, .gate_low_rank_dim = 12, .layer_idx = layer_idx, .num_hidden_layers = 2, .norm_eps = 1e-5,
              .fuse_norm = fuse_norm};
  w.x_r = fixture_as<T>(c, "x_r");
  w.x_w = fixture_as<T>(c, "x_w");
  w.x_k = fixture_as<T>(c, "x_k");
  w.x_v = fixture_as<T>(c, "x_v");
  w.x_a = fixture_as<T>(c, "x_a");
  w.x_g = fixture_as<T>(c, "x_g");
  w.k_k = fixture_as<T>(c, "k_k");
  w.k_a = fixture_as<T>(c, "k_a");
  w.r_k = fixture_as<T>(c, "r_k");
  w.r_proj_weight = fixture_as<T>(c, "r_proj_weight");
  w.k_proj_weight = fixture_as<T>(c, "k_proj_weight");
  w.v_proj_weight = fixture_as<T>(c, "v_proj_weight");
  w.o_proj_weight = fixture_as<T>(c, "o_proj_weight");
  w.w_lora_lora_0_weight = fixture_as<T>(c, "w_lora_lora_0_weight");
  w.w_lora_lora_2_weight = fixture_as<T>(c, "w_lora_lora_2_weight");
  w.w_lora_lora_2_bias = fixture_as<T>(c, "w_lora_lora_2_bias");
  w.a_lora_lora_0_weight = fixture_as<T>(c, "a_lora_lora_0_weight");
  w.a_lora_lora_2_weight = fixture_as<T>(c, "a_lora_lora_2_weight");
  w.a_lora_lora_2_bias = fixture_as<T>(c, "a_lora_lora_2_bias");
  if (layer_idx > 0) {
    w.v_lora_lora_0_weight = fixture_as<T>(c, "v_lora_lora_0_weight");
    w.v_lora_lora_2_weight = fixture_as<T>(c, "v_lora_lora_2_weight");
    w.v_lora_lora_2_bias = fixture_as<T>(c, "v_lora_lora_2_bias");
  }
  w.g_lora_lora_0_weight = fixture_as<T>(c, "g_lora_lora_0_weight");
  w.g_lora_lora_2_weight = fixture_as<T>(c, "g_lora_lora_2_weight");
  w.g_norm_weight = fixture_as<T>(c, "g_norm_weight");
  w.g_norm_bias = fixture_as<T>(c, "g_norm_bias");
  w.check();
  return w;
}

template <class T>
deltaproduct_weights<T> deltaproduct_reference_weights() {
  const std::string c = "fla_gated_deltaproduct_layer";
  deltaproduct_weights<T> w;
  w.config = {.hidden_size = 24, .head_dim = 8, .expand_v = 0.75, .num_heads = 2, .num_v_heads = 4, .num_householder = 2,
              .conv_size = 4, .use_output_gate = true, .use_short_conv = true, .use_forget_gate = true, .allow_neg_eigval = true,
              .norm_eps = 1e-5};
  w.q_proj_weight = fixture_as<T>(c, "q_proj_weight");
  w.k_proj_weight = fixture_as<T>(c, "k_proj_weight");
  w.v_proj_weight = fixture_as<T>(c, "v_proj_weight");
  w.b_proj_weight = fixture_as<T>(c, "b_proj_weight");
  w.a_proj_weight = fixture_as<T>(c, "a_proj_weight");
  w.A_log = fixture_as<T>(c, "A_log");
  w.dt_bias = fixture_as<T>(c, "dt_bias");
  w.q_conv1d_weight = fixture_as<T>(c, "q_conv1d_weight");
  w.k_conv1d_weight = fixture_as<T>(c, "k_conv1d_weight");
  w.v_conv1d_weight = fixture_as<T>(c, "v_conv1d_weight");
  w.g_proj_weight = fixture_as<T>(c, "g_proj_weight");
  w.o_norm_weight = fixture_as<T>(c, "o_norm_weight");
  w.o_proj_weight = fixture_as<T>(c, "o_proj_weight");
  w.check();
  return w;
}

/// A layer case: decompose(...).output(), the final recurrent state and iattn's own forward (the
/// models' oracle) against the reference's output and state; then the decomposition is exact
/// (materialize per channel, causal) against the reference output.
template <class T, class Dec, class State, class Forward>
void check_layer(const std::string& c, const Dec& d, const State& state, const Forward& forward) {
  const MatD out = fixture(c, "out");
  compare("decompose(...).output() vs the layer's output", d.output(), out, model_tol<T>());
  compare("final_state(activations(...)) vs the reference's final state", state, fixture(c, "final_state"), model_tol<T>());
  compare("iattn's forward (the model's oracle) vs the layer's output", forward, out, model_tol<T>());
  check_exact<T>(Matrix<T>(out.cast<T>()), d);
}

}  // namespace

TEMPLATE_TEST_CASE("reference: transformers Qwen3NextGatedDeltaNet", "[models][reference][qwen3_next]", float, double) {
  using T = TestType;
  const std::string c = "qwen3_next_layer";
  const auto w = qwen3_next_reference_weights<T>();
  const Matrix<T> u = fixture_as<T>(c, "u");
  REQUIRE(u.rows() == 37);
  check_layer<T>(c, decompose(w, u), final_state(activations(w, u)), qwen3_next_forward(w, u));
}

TEMPLATE_TEST_CASE("reference: transformers KimiLinearDeltaAttention", "[models][reference][kimi_linear]", float, double) {
  using T = TestType;
  const std::string c = "kimi_linear_layer";
  const auto w = kimi_linear_reference_weights<T>();
  const Matrix<T> u = fixture_as<T>(c, "u");
  REQUIRE(u.rows() == 37);
  check_layer<T>(c, decompose(w, u), final_state(activations(w, u)), kimi_linear_forward(w, u));
}

TEMPLATE_TEST_CASE("reference: fla RWKV7Attention, layer 0, fuse_norm", "[models][reference][rwkv7]", float, double) {
  using T = TestType;
  const std::string c = "fla_rwkv7_layer";
  const auto w = rwkv7_reference_weights<T>(c, 0, true, 0);
  const Matrix<T> u = fixture_as<T>(c, "u");
  REQUIRE(u.rows() == 37);
  const auto s = activations(w, u);
  compare("activations(w, u).v vs the layer's returned v_first", s.v, fixture(c, "v_first"), model_tol<T>());
  check_layer<T>(c, decompose(w, u), final_state(s), rwkv7_forward(w, u));
}

TEMPLATE_TEST_CASE("reference: fla RWKV7Attention, layer 1 with v_first, value_dim != hidden", "[models][reference][rwkv7]", float,
                   double) {
  using T = TestType;
  const std::string c = "fla_rwkv7_layer_v_first";
  const auto w = rwkv7_reference_weights<T>(c, 1, false, 24);
  const Matrix<T> u = fixture_as<T>(c, "u"), v_first = fixture_as<T>(c, "v_first");
  REQUIRE(u.rows() == 37);
  REQUIRE(v_first.cols() == 24);
  check_layer<T>(c, decompose(w, u, v_first), final_state(activations(w, u, v_first)), rwkv7_forward(w, u, v_first));
}

TEMPLATE_TEST_CASE("reference: fla GatedDeltaProduct (n = 2, grouped value heads)", "[models][reference][deltaproduct]", float, double) {
  using T = TestType;
  const std::string c = "fla_gated_deltaproduct_layer";
  const auto w = deltaproduct_reference_weights<T>();
  const Matrix<T> u = fixture_as<T>(c, "u");
  REQUIRE(u.rows() == 37);
  check_layer<T>(c, decompose(w, u), final_state(activations(w, u)), deltaproduct_forward(w, u));
}

// ---- fla's naive recurrences -------------------------------------------------------------------

namespace {

/// apply(op, v) and, per head, materialize(op, h*dv) v_head against the reference's o.
template <class Op>
void check_operator(const Op& op, const MatD& v, const MatD& o, Index heads) {
  const Index L = v.rows(), dv = v.cols() / heads;
  compare("apply(op, v) vs o", Matrix<double>(iattn::apply(op, v)), o, 1e-10);
  for (Index h = 0; h < heads; ++h) {
    INFO("head " << h);
    const MatD M = iattn::materialize(op, h * dv, L);
    compare("materialize(op, h*dv) * v_head vs o_head", MatD(M * v.middleCols(h * dv, dv)), MatD(o.middleCols(h * dv, dv)), 1e-10);
  }
}

}  // namespace

TEST_CASE("reference: fla naive_recurrent_gated_delta_rule", "[models][reference][fla]") {
  const std::string c = "fla_naive_gdn";
  const MatD q = fixture(c, "q"), k = fixture(c, "k"), v = fixture(c, "v"), beta = fixture(c, "beta"), g = fixture(c, "g");
  const MatD scale = fixture(c, "scale"), o = fixture(c, "o"), S = fixture(c, "final_state");
  const Index H = beta.cols(), dk = key_dim_of(scale), dv = v.cols() / H;
  REQUIRE(q.cols() == H * dk);
  const auto op = iattn::gated_delta_rule(MatD(q * scale(0, 0)), k, beta, g, {.heads = H, .head_dim = dv, .state = dk});
  check_operator(op, v, o, H);
  compare("delta_final_state vs the final state", delta_final_state<double>(k, v, beta, g, H), S, 1e-10);
}

TEST_CASE("reference: fla delta_rule_recurrence", "[models][reference][fla]") {
  const std::string c = "fla_naive_deltanet";
  const MatD q = fixture(c, "q"), k = fixture(c, "k"), v = fixture(c, "v"), beta = fixture(c, "beta");
  const MatD scale = fixture(c, "scale"), o = fixture(c, "o"), S = fixture(c, "final_state");
  const Index H = beta.cols(), dk = key_dim_of(scale), dv = v.cols() / H;
  REQUIRE(q.cols() == H * dk);
  const auto op = iattn::delta_rule(MatD(q * scale(0, 0)), k, beta, {.heads = H, .head_dim = dv, .state = dk});
  check_operator(op, v, o, H);
  compare("delta_final_state vs the final state", delta_final_state<double>(k, v, beta, MatD(), H), S, 1e-10);
}

TEST_CASE("reference: fla naive_recurrent_kda (grouped value heads)", "[models][reference][fla]") {
  const std::string c = "fla_naive_kda";
  const MatD q = fixture(c, "q"), k = fixture(c, "k"), v = fixture(c, "v"), beta = fixture(c, "beta"), gk = fixture(c, "gk");
  const MatD scale = fixture(c, "scale"), o = fixture(c, "o"), S = fixture(c, "final_state");
  const Index HV = beta.cols(), dk = key_dim_of(scale), H = q.cols() / dk, dv = v.cols() / HV;
  REQUIRE(HV % H == 0);
  REQUIRE(gk.cols() == HV * dk);
  // value head hv reads key head hv / (HV / H), as the reference's repeat_interleave
  const MatD qr = nn::repeat_heads<double>(q, H, HV / H), kr = nn::repeat_heads<double>(k, H, HV / H);
  const auto op = iattn::kimi_delta_rule(MatD(qr * scale(0, 0)), kr, beta, gk, {.heads = HV, .head_dim = dv, .state = dk});
  check_operator(op, v, o, HV);
  compare("delta_final_state vs the final state", delta_final_state<double>(kr, v, beta, gk, HV), S, 1e-10);
}

TEST_CASE("reference: fla dplr_recurrence", "[models][reference][fla]") {
  const std::string c = "fla_naive_dplr";
  const MatD q = fixture(c, "q"), k = fixture(c, "k"), v = fixture(c, "v"), a = fixture(c, "a"), b = fixture(c, "b");
  const MatD gk = fixture(c, "gk"), scale = fixture(c, "scale"), o = fixture(c, "o"), S = fixture(c, "final_state");
  const Index dk = key_dim_of(scale), H = q.cols() / dk, dv = v.cols() / H;
  // S_t = Diag(exp gk_t) S_{t-1} + b_t (a_t^T S_{t-1}) + k_t v_t^T: A_t = Diag(exp gk_t) + b_t a_t^T
  const auto op = iattn::transition(gk, a, b, MatD(q * scale(0, 0)), k, {.heads = H, .head_dim = dv, .state = dk});
  check_operator(op, v, o, H);
  compare("dplr_final_state vs the final state", dplr_final_state<double>(k, v, gk, a, b, H), S, 1e-10);
}
