// The shipped associative-recall checkpoints (models/recall-*, tools/train) run by the C++ full-stack
// runners: logits and mixer outputs against transformers' (tests/data/checkpoint/recall, written by
// tools/reference/make_recall_fixtures.py in float64), every layer's decomposition against the layer,
// and the models' answers. The hybrid is NemotronHForCausalLM: a Mamba-2 block, then attention.
#include "support/test_common.hpp"

#include <iattn/checkpoint/mamba.hpp>
#include <iattn/checkpoint/nemotron_h.hpp>
#include <iattn/explain/npy.hpp>

#include <fstream>
#include <sstream>

using namespace test;
using Catch::Contains;

namespace {
const std::string models_dir = std::string(IATTN_SOURCE_DIR) + "/models/";
const std::string data = std::string(IATTN_TEST_DATA_DIR) + "/checkpoint/recall/";

std::vector<Index> fixture_ids() {
  const MatD v = iattn::npy::read_matrix<double>(data + "ids.npy");
  std::vector<Index> ids;
  for (Index i = 0; i < v.size(); ++i) ids.push_back(Index(v.data()[i]));
  return ids;
}
std::string slurp(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}
}  // namespace

TEST_CASE("recall-mamba: the C++ runner and decompositions against transformers", "[checkpoint][recall]") {
  const auto f = iattn::safetensors::file::open(models_dir + "recall-mamba/model.safetensors");
  const auto lm = iattn::checkpoint::mamba_lm_from<double>(f, 1e-5);
  const auto ids = fixture_ids();
  const auto tr = iattn::checkpoint::lm_run(lm, ids);
  // transformers computes parts of the mixer in float32 even in float64 (docs/python.md)
  check_close(tr.logits, iattn::npy::read_matrix<double>(data + "mamba_logits.npy"), 1e-5);
  Index predicted = 0;
  tr.logits.row(Index(ids.size()) - 1).maxCoeff(&predicted);
  CHECK(predicted == 29);
  for (std::size_t i = 0; i < lm.layers.size(); ++i) {
    const auto d = iattn::models::mamba_decompose(lm.layers[i], tr.mixer_inputs[i]);
    const MatD y = iattn::models::mamba_forward(lm.layers[i], tr.mixer_inputs[i]);
    check_close(d.output(), y, 1e-10);
    check_close(y, iattn::npy::read_matrix<double>(data + "mamba_mixer_out_" + std::to_string(i) + ".npy"), 1e-5);
  }
}

TEST_CASE("recall-hybrid (NemotronH): the C++ runner and decompositions against transformers", "[checkpoint][recall]") {
  const auto c = iattn::checkpoint::nemotron_h_config_from_json(slurp(models_dir + "recall-hybrid/config.json"));
  CHECK(c.num_attention_heads == 4);
  CHECK(c.time_step_min > 0);
  const auto f = iattn::safetensors::file::open(models_dir + "recall-hybrid/model.safetensors");
  const auto lm = iattn::checkpoint::nemotron_h_lm_from<double>(f, c);
  REQUIRE(lm.blocks.size() == 2);
  CHECK(lm.blocks[0].kind == iattn::checkpoint::block_kind::mamba2);
  CHECK(lm.blocks[1].kind == iattn::checkpoint::block_kind::attention);
  const auto ids = fixture_ids();
  const auto tr = iattn::checkpoint::nemotron_h_run(lm, ids);
  check_close(tr.logits, iattn::npy::read_matrix<double>(data + "hybrid_logits.npy"), 1e-5);
  Index predicted = 0;
  tr.logits.row(Index(ids.size()) - 1).maxCoeff(&predicted);
  CHECK(predicted == 29);
  for (std::size_t i = 0; i < lm.blocks.size(); ++i)
    check_close(tr.mixer_outputs[i], iattn::npy::read_matrix<double>(data + "hybrid_mixer_out_" + std::to_string(i) + ".npy"), 1e-5);
  const auto d = iattn::models::mamba2_decompose(lm.blocks[0].mamba, tr.mixer_inputs[0]);
  check_close(d.output(), tr.mixer_outputs[0], 1e-10);
  const auto& P = tr.attention[1];
  REQUIRE(P.dims[0] == 4);
  for (Index h = 0; h < 4; ++h)
    for (Index t = 0; t < P.dims[1]; ++t) {
      CHECK(std::abs(P.slice(h).row(t).sum() - 1.0) < 1e-12);
      if (t + 1 < P.dims[2]) CHECK(P.slice(h).row(t).tail(P.dims[2] - t - 1).cwiseAbs().maxCoeff() == 0.0);
    }
}

TEST_CASE("nemotron_h loading refuses what it does not model, naming it", "[checkpoint][recall][errors]") {
  REQUIRE_THROWS_WITH(iattn::checkpoint::nemotron_h_config_from_json("{\"n_groups\": \"two\"}"), Contains("\"n_groups\" has the wrong type"));
  REQUIRE_THROWS_WITH(iattn::checkpoint::nemotron_h_config_from_json("{"), Contains("config.json is not JSON"));
  const auto f = iattn::safetensors::file::open(models_dir + "recall-hybrid/model.safetensors");
  {
    const auto good = iattn::checkpoint::nemotron_h_lm_from<double>(
        f, iattn::checkpoint::nemotron_h_config_from_json(slurp(models_dir + "recall-hybrid/config.json")));
    REQUIRE_THROWS_WITH(iattn::checkpoint::nemotron_h_run(good, {1, 2, 40}),
                        Contains("nemotron_h_run: token id 40 at position 2 is outside the vocabulary [0, 32)"));
  }
  iattn::checkpoint::nemotron_h_config c;  // no attention geometry
  REQUIRE_THROWS_WITH(iattn::checkpoint::nemotron_h_lm_from<double>(f, c), Contains("mixer.q_proj.weight': an attention block needs"));
  // a projection bias (use_bias=True) is refused with the tensor's name, by the Mamba loaders too
  std::string header = R"({"backbone.layers.0.mixer.in_proj.bias":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})";
  while ((header.size() + 8) % 8) header += ' ';
  std::string bytes(8, '\0');
  for (int i = 0; i < 8; ++i) bytes[std::size_t(i)] = char((header.size() >> (8 * i)) & 0xff);
  bytes += header + std::string(4, '\0');
  const auto g = iattn::safetensors::file::from_bytes(bytes, "t");
  REQUIRE_THROWS_WITH(iattn::checkpoint::mamba_weights_from<double>(g, 0), Contains("in_proj.bias': projection biases (use_bias=True)"));
  REQUIRE_THROWS_WITH(iattn::checkpoint::mamba2_weights_from<double>(g, 0, 1), Contains("in_proj.bias': projection biases"));
}
