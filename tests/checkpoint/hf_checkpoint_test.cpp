// Mixers loaded from checkpoints that transformers' save_pretrained wrote (Mamba, Mamba-2, RWKV,
// RecurrentGemma;
// tools/reference/make_checkpoint_fixtures.py): each layer's forward and decomposition on the mixer
// input transformers saw equal the mixer output transformers computed (in double), and a malformed
// checkpoint is refused naming the tensor.
#include <iattn/checkpoint/mamba.hpp>
#include <iattn/checkpoint/recurrent_gemma.hpp>
#include <iattn/checkpoint/rwkv.hpp>
#include <iattn/explain/npy.hpp>

#include <iattn/models/mamba2.hpp>
#include <iattn/models/griffin.hpp>
#include <iattn/models/rwkv4.hpp>

#include "support/model_checks.hpp"

#include <fstream>
#include <iterator>

using Catch::Matchers::Contains;
using namespace test;
using namespace iattn::models;

namespace {
const std::string dir = std::string(IATTN_TEST_DATA_DIR) + "/checkpoint/mamba/";
}

TEMPLATE_TEST_CASE("checkpoint: MambaForCausalLM mixers from save_pretrained equal transformers' mixer outputs", "[checkpoint]", float, double) {
  using T = TestType;
  const auto f = iattn::safetensors::file::open(dir + "model.safetensors");
  REQUIRE(iattn::checkpoint::mamba_layers(f) == std::vector<Index>{0, 1});
  for (Index i : {0, 1}) {
    INFO("layer " << i);
    const auto w = iattn::checkpoint::mamba_weights_from<T>(f, i);
    REQUIRE(w.config.d_model == 16);
    REQUIRE(w.config.d_state == 4);
    REQUIRE(w.config.d_inner() == 32);
    REQUIRE(w.config.rank() == 3);
    const iattn::Matrix<T> u = iattn::npy::read_matrix<double>(dir + "mixer_in_" + std::to_string(i) + ".npy").template cast<T>();
    const MatD ref = iattn::npy::read_matrix<double>(dir + "mixer_out_" + std::to_string(i) + ".npy");
    const double tol = std::is_same_v<T, float> ? 1e-5 : 1e-10;
    check_close(mamba_forward(w, u), ref, tol);
    check_exact<T>(iattn::Matrix<T>(ref.cast<T>()), mamba_decompose(w, u));
  }
}

// transformers' Mamba-2 torch path computes its scan and gated norm in float32 whatever the model's
// dtype, so its outputs are float32-accurate: compared at 2e-5 relative to 1 + max (a wrong field
// or layout is off by O(1)).
TEMPLATE_TEST_CASE("checkpoint: Mamba2ForCausalLM mixers from save_pretrained equal transformers' mixer outputs", "[checkpoint]", float, double) {
  using T = TestType;
  const std::string d2 = std::string(IATTN_TEST_DATA_DIR) + "/checkpoint/mamba2/";
  const auto f = iattn::safetensors::file::open(d2 + "model.safetensors");
  REQUIRE(iattn::checkpoint::mamba_layers(f) == std::vector<Index>{0, 1});
  for (Index i : {0, 1}) {
    INFO("layer " << i);
    const auto w = iattn::checkpoint::mamba2_weights_from<T>(f, i, 2, 1e-5);
    REQUIRE(w.config.d_state == 8);
    REQUIRE(w.config.headdim == 4);
    REQUIRE(w.config.nheads() == 8);
    const iattn::Matrix<T> u = iattn::npy::read_matrix<double>(d2 + "mixer_in_" + std::to_string(i) + ".npy").template cast<T>();
    const MatD ref = iattn::npy::read_matrix<double>(d2 + "mixer_out_" + std::to_string(i) + ".npy");
    check_close(mamba2_forward(w, u), ref, 2e-5);
    const auto d = mamba2_decompose(w, u);
    check_close(d.output(), ref, 2e-5);
  }
  // n_groups is not in the shapes: a value the shapes cannot take is refused.
  REQUIRE_THROWS_WITH(iattn::checkpoint::mamba2_weights_from<float>(f, 0, 3),
                      Contains("tensor 'backbone.layers.0.mixer.conv1d.weight': conv_dim = 64 is not d_inner + 2*n_groups*d_state"));
}

TEMPLATE_TEST_CASE("checkpoint: RwkvForCausalLM time mixing from save_pretrained equals transformers' attention outputs", "[checkpoint]", float, double) {
  using T = TestType;
  const std::string d3 = std::string(IATTN_TEST_DATA_DIR) + "/checkpoint/rwkv/";
  const auto f = iattn::safetensors::file::open(d3 + "model.safetensors");
  REQUIRE(iattn::checkpoint::rwkv_layers(f) == std::vector<Index>{0, 1});
  REQUIRE(iattn::checkpoint::mamba_layers(f).empty());
  for (Index i : {0, 1}) {
    INFO("block " << i);
    const auto w = iattn::checkpoint::rwkv4_weights_from<T>(f, i);
    REQUIRE(w.config.hidden_size == 16);
    REQUIRE(w.config.attention_hidden_size == 16);
    const iattn::Matrix<T> u = iattn::npy::read_matrix<double>(d3 + "mixer_in_" + std::to_string(i) + ".npy").template cast<T>();
    const MatD ref = iattn::npy::read_matrix<double>(d3 + "mixer_out_" + std::to_string(i) + ".npy");
    // transformers' CPU WKV rounds the keys to float32 (`current_key.float()`) even in a double
    // model: its double outputs carry float32-rounded keys, hence 2e-7 there.
    const iattn::Matrix<T> y = rwkv4_forward(w, u);
    check_close(y, ref, std::is_same_v<T, float> ? 1e-5 : 2e-7);
    check_exact<T>(y, rwkv4_decompose(w, u));
  }
  REQUIRE_THROWS_WITH(iattn::checkpoint::rwkv4_weights_from<float>(f, 5), Contains("no tensor 'rwkv.blocks.5.attention.time_decay'"));
}

// transformers runs RecurrentGemma's RG-LRU scan in float32 (acc_dtype) whatever the model's
// dtype: compared at 1e-5.
TEMPLATE_TEST_CASE("checkpoint: RecurrentGemmaForCausalLM recurrent blocks from save_pretrained equal transformers' block outputs", "[checkpoint]", float, double) {
  using T = TestType;
  const std::string d4 = std::string(IATTN_TEST_DATA_DIR) + "/checkpoint/recurrent_gemma/";
  const auto f = iattn::safetensors::file::open(d4 + "model.safetensors");
  REQUIRE(iattn::checkpoint::recurrent_gemma_layers(f) == std::vector<Index>{0, 1});
  for (Index i : {0, 1}) {
    INFO("block " << i);
    const auto w = iattn::checkpoint::griffin_weights_from<T>(f, i);
    REQUIRE(w.config.lru_width == 24);
    REQUIRE(w.config.num_heads == 4);
    const iattn::Matrix<T> u = iattn::npy::read_matrix<double>(d4 + "mixer_in_" + std::to_string(i) + ".npy").template cast<T>();
    const MatD ref = iattn::npy::read_matrix<double>(d4 + "mixer_out_" + std::to_string(i) + ".npy");
    const iattn::Matrix<T> y = griffin_forward(w, u);
    check_close(y, ref, 1e-5);
    check_exact<T>(y, griffin_decompose(w, u));
  }
}

// The whole MambaForCausalLM in C++: embedding, norms, residuals, norm_f, tied lm_head. transformers
// keeps the residual stream in float32 (residual_in_fp32) and its RMSNorm computes in float32
// whatever the model's dtype, so its double logits are float32-accurate: compared at 1e-5.
TEMPLATE_TEST_CASE("checkpoint: MambaForCausalLM's logits and mixer inputs from the C++ runner", "[checkpoint]", float, double) {
  using T = TestType;
  const auto f = iattn::safetensors::file::open(dir + "model.safetensors");
  const auto lm = iattn::checkpoint::mamba_lm_from<T>(f, 1e-5);
  REQUIRE(lm.layers.size() == 2);
  const auto idd = iattn::npy::read(dir + "input_ids.npy");
  std::vector<Index> ids;
  for (double v : idd.data) ids.push_back(Index(v));
  const auto tr = iattn::checkpoint::lm_run(lm, ids);
  check_close(tr.logits, iattn::npy::read_matrix<double>(dir + "logits.npy"), 1e-5);
  for (Index i : {0, 1})
    check_close(tr.mixer_inputs[std::size_t(i)], iattn::npy::read_matrix<double>(dir + "mixer_in_" + std::to_string(i) + ".npy"), 1e-5);
  // The maps come from the runner's own mixer inputs: out_proj(Hx + beta) is the mixer's output.
  const auto d = mamba_decompose(lm.layers[1], tr.mixer_inputs[1]);
  check_exact<T>(mamba_forward(lm.layers[1], tr.mixer_inputs[1]), d);
  std::vector<Index> bad = ids;
  bad[3] = 40;
  REQUIRE_THROWS_WITH(iattn::checkpoint::lm_run(lm, bad), Contains("token id 40 at position 3 is outside the vocabulary [0, 40)"));
}

TEMPLATE_TEST_CASE("checkpoint: Mamba2ForCausalLM's logits and mixer inputs from the C++ runner", "[checkpoint]", float, double) {
  using T = TestType;
  const std::string d2 = std::string(IATTN_TEST_DATA_DIR) + "/checkpoint/mamba2/";
  const auto f = iattn::safetensors::file::open(d2 + "model.safetensors");
  const auto lm = iattn::checkpoint::mamba2_lm_from<T>(f, 2, 1e-5);
  REQUIRE(lm.layers.size() == 2);
  std::vector<Index> ids;
  for (double v : iattn::npy::read(d2 + "input_ids.npy").data) ids.push_back(Index(v));
  const auto tr = iattn::checkpoint::lm_run(lm, ids);
  check_close(tr.logits, iattn::npy::read_matrix<double>(d2 + "logits.npy"), 2e-5);
  for (Index i : {0, 1})
    check_close(tr.mixer_inputs[std::size_t(i)], iattn::npy::read_matrix<double>(d2 + "mixer_in_" + std::to_string(i) + ".npy"), 2e-5);
}

TEST_CASE("checkpoint: malformed Mamba checkpoints name the tensor", "[checkpoint]") {
  const auto f = iattn::safetensors::file::open(dir + "model.safetensors");
  REQUIRE_THROWS_WITH(iattn::checkpoint::mamba_weights_from<float>(f, 2), Contains("no tensor 'backbone.layers.2.mixer.A_log'"));
  // A checkpoint without one tensor: rebuild the file without x_proj of layer 0.
  std::ifstream in(dir + "model.safetensors", std::ios::binary);
  const std::string bytes{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
  const std::string name = "backbone.layers.0.mixer.x_proj.weight";
  std::string renamed = bytes;
  const auto at = renamed.find(name);
  REQUIRE(at != std::string::npos);
  renamed.replace(at, name.size(), "backbone.layers.0.mixer.x_proj.weighX");  // same length: offsets stay valid
  const auto g = iattn::safetensors::file::from_bytes(renamed, "edited");
  REQUIRE_THROWS_WITH(iattn::checkpoint::mamba_weights_from<float>(g, 0),
                      Contains("safetensors: edited: no tensor 'backbone.layers.0.mixer.x_proj.weight'"));
  REQUIRE_NOTHROW(iattn::checkpoint::mamba_weights_from<float>(g, 1));
}
