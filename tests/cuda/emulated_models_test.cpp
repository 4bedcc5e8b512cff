// Every model decomposition the CUDA backend covers, evaluated through its kernels on the host
// emulator (issue 23: "every model's decomposition gets a twin"): the block output
// out_proj(H x + beta) with H x applied on the device against the model's own forward; the
// statistics of bind(iattn::cuda, H, x) against the CPU's bind; and, for the bound H, channels
// 0 and D-1: the matrix (materialize), the last row and the first column against the CPU backend.
// fp32 1e-4, fp64 1e-10 relative to 1 + the largest entry. All fifteen models of the papers and
// the zoo, the complex-decay models (LRU, Mamba-3, S4D as a recurrence) and the delta-rule
// family (Qwen3-Next, DeltaNet, Gated DeltaNet, KDA, RWKV-7, DeltaProduct). The ThreadSanitizer
// stage runs the kernel tests, not these.
#include "support/model_checks.hpp"

#include <iattn/cuda.hpp>
#include <iattn/models/all.hpp>

#include <string>

using namespace test;
using namespace iattn::models;
using iattn::Matrix;

namespace {

template <class A>
MatD dd_of(const A& a) {
  return a.template cast<double>();
}

void close_to(const MatD& got, const MatD& want, double tol, const std::string& what) {
  REQUIRE(got.rows() == want.rows());
  REQUIRE(got.cols() == want.cols());
  const double scale = 1.0 + (want.size() ? want.cwiseAbs().maxCoeff() : 0.0);
  const double err = got.size() ? (got - want).cwiseAbs().maxCoeff() : 0.0;
  INFO(what << ": max abs error " << err << ", allowed " << tol * scale);
  CHECK(err <= tol * scale);
}

/// The device twin of one decomposition d of a block whose forward gave `block`.
template <class T, class Dec>
void device_twin(const Matrix<T>& block, const Dec& d, const std::string& name) {
  const iattn::cuda on{};
  const double tol = model_tol<T>();
  const Index L = d.x.rows(), D = d.x.cols();
  const std::string what = name + " L=" + std::to_string(L);
  const Matrix<T> y = iattn::apply(on, d.H, d.x);
  close_to(dd_of(d.project(Matrix<T>(y + d.beta))), dd_of(block), tol, what + ": out_proj(H x + beta) on the device vs forward");
  const auto Hd = iattn::bind(on, d.H, d.x);
  const auto Hc = iattn::bind(d.H, d.x);
  for (Index c : {Index(0), D - 1}) {
    const std::string at = what + " c=" + std::to_string(c);
    close_to(dd_of(iattn::to_host(iattn::materialize(on, Hd, c, L))), dd_of(Matrix<T>(iattn::materialize(Hc, c, L))), tol,
             at + ": materialize vs cpu");
    if (L == 0) continue;
    close_to(dd_of(iattn::to_host(iattn::row(on, Hd, L - 1, c, L))), dd_of(Matrix<T>(iattn::row(Hc, L - 1, L).row(c))), tol,
             at + ": last row vs cpu");
    close_to(dd_of(iattn::to_host(iattn::col(on, Hd, 0, c, L))), dd_of(Matrix<T>(iattn::col(Hc, 0, L).row(c))), tol,
             at + ": first column vs cpu");
  }
}

const std::vector<Index> twin_lengths = {1, 5, 70};

template <class T, class W, class Forward, class Decompose>
void twins(const W& w, Index d_model, Forward&& forward, Decompose&& decompose, const std::string& name, std::uint64_t seed) {
  for (Index L : twin_lengths) {
    const auto u = sample_input<T>(L, d_model, seed + L);
    device_twin<T>(forward(w, u), decompose(w, u), name);
  }
}

#define IATTN_TWIN(model, w, d_model, seed) \
  twins<T>(w, d_model, [](const auto& w_, const auto& u_) { return model##_forward(w_, u_); }, \
           [](const auto& w_, const auto& u_) { return model##_decompose(w_, u_); }, #model, seed)

}  // namespace

TEMPLATE_TEST_CASE("models on the CUDA backend (emulated): Mamba, Mamba-2, Griffin, Vision Mamba, S4D, Hyena",
                   "[cuda][models]", float, double) {
  using T = TestType;
  IATTN_TWIN(mamba, mamba_init<T>({.d_model = 16, .d_state = 8}, 1), 16, 10);
  auto m2 = mamba2_init<T>({.d_model = 16, .d_state = 8, .headdim = 8, .ngroups = 2}, 2);
  init::generator g(200);
  m2.norm_weight = init::uniform<T>(g, 1, m2.config.d_inner(), 0.5, 1.5);
  IATTN_TWIN(mamba2, m2, 16, 20);
  IATTN_TWIN(griffin, griffin_init<T>({.width = 16, .lru_width = 24, .num_heads = 3}, 3), 16, 30);
  IATTN_TWIN(vision_mamba, vision_mamba_init<T>({.mamba = {.d_model = 16, .d_state = 8}}, 4), 16, 40);
  IATTN_TWIN(s4d, s4d_init<T>({.d_model = 16, .d_state = 16}, 5), 16, 50);
  IATTN_TWIN(hyena, hyena_init<T>({.d_model = 16, .l_max = 80}, 6), 16, 60);
}

TEMPLATE_TEST_CASE("models on the CUDA backend (emulated): RetNet, HGRN, HGRN2, GLA, RWKV-4, RWKV-6, linear attention, mLSTM, "
                   "the softmax transformer",
                   "[cuda][models]", float, double) {
  using T = TestType;
  init::generator g(300);
  IATTN_TWIN(retnet, retnet_init<T>({.embed_dim = 32, .value_dim = 64, .num_heads = 4, .centered = true}, 7), 32, 70);
  IATTN_TWIN(hgrn, hgrn_init<T>({.hidden_size = 16, .expand_ratio = 1, .layer_idx = 1, .num_layers = 4}, 8), 16, 80);
  auto h2 = hgrn2_init<T>({.hidden_size = 32, .expand_ratio = 8, .layer_idx = 1, .num_layers = 4}, 9);
  h2.g_norm_weight = init::uniform<T>(g, 1, 32, 0.5, 1.5);
  IATTN_TWIN(hgrn2, h2, 32, 90);
  auto gl = gla_init<T>({.hidden_size = 32, .key_dim = 16, .value_dim = 32, .num_heads = 2, .gate_low_rank_dim = 8}, 10);
  gl.g_norm_swish_gate_weight = init::uniform<T>(g, 1, 16, 0.5, 1.5);
  IATTN_TWIN(gla, gl, 32, 100);
  auto r6 = rwkv6_init<T>({.hidden_size = 32, .key_dim = 16, .value_dim = 32, .num_heads = 2, .proj_low_rank_dim = 4,
                           .gate_low_rank_dim = 8, .layer_idx = 1, .num_layers = 3}, 11);
  r6.g_norm_weight = init::uniform<T>(g, 1, 32, 0.5, 1.5);
  r6.g_norm_bias = init::normal<T>(g, 1, 32, 0.3);
  IATTN_TWIN(rwkv6, r6, 32, 110);
  IATTN_TWIN(rwkv4, rwkv4_init<T>({.hidden_size = 32, .attention_hidden_size = 24, .layer_id = 1, .num_hidden_layers = 3}, 14),
             32, 140);
  IATTN_TWIN(linear_attention, linear_attention_init<T>({.d_model = 32, .n_heads = 2, .d_keys = 8, .d_values = 16}, 12), 32, 120);
  IATTN_TWIN(mlstm, mlstm_init<T>({.embedding_dim = 32}, 13), 32, 130);
  IATTN_TWIN(transformer, transformer_init<T>({.embed_dim = 32, .num_heads = 4}, 15), 32, 150);
}

TEMPLATE_TEST_CASE("models on the CUDA backend (emulated): complex decays (LRU, Mamba-3, S4D as a complex recurrence)",
                   "[cuda][models][complex]", float, double) {
  using T = TestType;
  IATTN_TWIN(lru, lru_init<T>({.d_model = 12, .d_hidden = 10}, 31), 12, 160);
  IATTN_TWIN(mamba3, mamba3_init<T>({.d_model = 16, .d_state = 8, .expand = 2, .headdim = 8, .ngroups = 1}, 32), 16, 170);
  twins<T>(s4d_init<T>({.d_model = 16, .d_state = 16}, 33), 16,
           [](const auto& w_, const auto& u_) { return s4d_forward(w_, u_); },
           [](const auto& w_, const auto& u_) { return s4d_recurrent_decompose(w_, u_); }, "s4d_recurrent", 180);
}

TEMPLATE_TEST_CASE("models on the CUDA backend (emulated): the delta-rule family (Qwen3-Next, DeltaNet, Gated DeltaNet, "
                   "KDA, RWKV-7, DeltaProduct)",
                   "[cuda][models][delta]", float, double) {
  using T = TestType;
  init::generator g(400);
  auto qn = qwen3_next_init<T>({.hidden_size = 24, .linear_num_value_heads = 4, .linear_num_key_heads = 2,
                                .linear_key_head_dim = 8, .linear_value_head_dim = 6, .linear_conv_kernel_dim = 4,
                                .initializer_range = 0.3},
                               41);
  qn.A_log = init::uniform<T>(g, 1, 4, -4.0, 0.5);
  IATTN_TWIN(qwen3_next, qn, 24, 410);
  for (bool gated : {false, true}) {
    auto dn = deltanet_init<T>({.hidden_size = 24, .head_dim = 8, .expand_v = 0.75, .num_heads = 2, .num_v_heads = gated ? 4 : 2,
                                .gated = gated, .initializer_range = 0.3},
                               42);
    dn.o_norm_weight = init::uniform<T>(g, 1, dn.config.head_v_dim(), 0.5, 1.5);
    IATTN_TWIN(deltanet, dn, 24, 420);
  }
  IATTN_TWIN(kimi_linear, kimi_linear_init<T>({.hidden_size = 24, .linear_num_heads = 3, .linear_head_dim = 6,
                                               .initializer_range = 0.3},
                                              43),
             24, 430);
  auto r7 = rwkv7_init<T>({.hidden_size = 24, .head_dim = 8, .value_dim = 0, .decay_low_rank_dim = 4, .a_low_rank_dim = 4,
                           .v_low_rank_dim = 4, .gate_low_rank_dim = 6, .layer_idx = 0, .num_hidden_layers = 3},
                          44);
  // Every weight drawn: the reference init zeroes o_proj and the first LoRA layers.
  for (Matrix<T>* m : {&r7.w_lora_lora_0_weight, &r7.a_lora_lora_0_weight, &r7.g_lora_lora_0_weight, &r7.o_proj_weight})
    *m = init::normal<T>(g, m->rows(), m->cols(), 0.3);
  IATTN_TWIN(rwkv7, r7, 24, 440);
  IATTN_TWIN(deltaproduct, deltaproduct_init<T>({.hidden_size = 24, .head_dim = 6, .num_heads = 2}, 45), 24, 450);
}
