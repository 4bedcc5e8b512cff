// Trained models' implicit attention, from their checkpoints, in C++ only: models/recall-mamba (a
// 2-layer MambaForCausalLM) and models/recall-hybrid (a NemotronHForCausalLM: a Mamba-2 block, then
// softmax attention), trained on associative recall (tools/train). The example runs one held-out
// sequence through each whole stack (embedding, norms, residuals, final norm, head), decomposes each
// SSM layer on its mixer's input, checks the decomposition against the layer, and prints what the
// query token reads: each layer's map (attention: the mean over heads of its probabilities) and the
// rollout over the stack, with the matching key marked.
//
//   12_recall [models directory] [output directory for PNG heatmaps]
//
// Exits non-zero when the decomposition is not exact or the model does not retrieve the value.
#include <iattn/checkpoint/mamba.hpp>
#include <iattn/checkpoint/nemotron_h.hpp>
#include <iattn/explain/methods.hpp>
#if defined(IATTN_HAS_PNG)
#include <iattn/explain/png.hpp>
#endif

#include <nlohmann/json.hpp>

#include <sstream>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#ifndef IATTN_SOURCE_DIR
#define IATTN_SOURCE_DIR "."
#endif

namespace {
using namespace iattn;
using Mat = Matrix<double>;

// k v pairs (keys 0..15, values 16..31), then the query key 12: the answer is 29, the value after key 12
const std::vector<Index> ids = {3, 20, 7, 17, 12, 29, 0, 22, 9, 16, 14, 31, 5, 25, 1, 18, 12};
constexpr Index key = 4, answer = 29;

std::string slurp(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

void print_row(const char* what, const Mat& M) {
  const Index q = M.rows() - 1;
  std::printf("%-28s", what);
  for (Index s = 0; s <= q; ++s) std::printf("%s%.3f", s == key ? " [" : s == key + 1 ? "] " : " ", M(q, s));
  std::printf("\n");
}

/// Prints the rollout's verdict, writes the heatmaps; true when the model answers right.
bool report(const std::string& name, const Mat& logits, const std::vector<Mat>& maps, const std::string& out) {
  const Index q = Index(ids.size()) - 1;
  Index predicted = 0;
  logits.row(q).maxCoeff(&predicted);
  const Mat rho = explain::rollout(maps);
  print_row("rollout:", rho);
  Index top = 0;
  rho.row(q).head(q).maxCoeff(&top);
  std::printf("%s predicts %lld (%s); the query reads most from position %lld (%s)\n\n", name.c_str(),
              static_cast<long long>(predicted), predicted == answer ? "right" : "WRONG", static_cast<long long>(top),
              top == key ? "the matching key" : top == key + 1 ? "the matching key's value" : "another token");
#if defined(IATTN_HAS_PNG)
  if (!out.empty()) {
    std::vector<std::string> labels;
    for (Index id : ids) labels.push_back(id < 16 ? "k" + std::to_string(id) : "v" + std::to_string(id - 16));
    for (std::size_t i = 0; i < maps.size(); ++i)
      explain::write_heatmap_png(out + "/" + name + "_layer" + std::to_string(i) + ".png", maps[i],
                                 {.title = name + " layer " + std::to_string(i), .labels = labels});
    explain::write_heatmap_png(out + "/" + name + "_rollout.png", rho, {.title = name + ": rollout", .labels = labels});
  }
#else
  (void)out;
#endif
  return predicted == answer;
}
}  // namespace

int main(int argc, char** argv) {
  const std::string dir = argc > 1 ? argv[1] : std::string(IATTN_SOURCE_DIR) + "/models";
  const std::string out = argc > 2 ? argv[2] : "";
  if (!out.empty()) std::filesystem::create_directories(out);
  bool ok = true;
  std::printf("tokens:                     ");
  for (Index id : ids) std::printf("%6lld", static_cast<long long>(id));
  std::printf("\nthe query %lld's key is at position %lld ([ ] below), its value %lld follows it\n\n", static_cast<long long>(ids.back()),
              static_cast<long long>(key), static_cast<long long>(answer));

  {  // Mamba: two Mamba-1 layers
    const auto f = safetensors::file::open(dir + "/recall-mamba/model.safetensors");
    const double eps = nlohmann::json::parse(slurp(dir + "/recall-mamba/config.json")).value("layer_norm_epsilon", 1e-5);
    const auto lm = checkpoint::mamba_lm_from<double>(f, eps);
    const auto tr = checkpoint::lm_run(lm, ids);
    std::vector<Mat> maps;
    for (std::size_t i = 0; i < lm.layers.size(); ++i) {
      const auto d = models::mamba_decompose(lm.layers[i], tr.mixer_inputs[i]);
      const Mat block = models::mamba_forward(lm.layers[i], tr.mixer_inputs[i]);
      const double err = (d.output() - block).cwiseAbs().maxCoeff() / block.cwiseAbs().maxCoeff();
      ok = ok && err < 1e-10;
      maps.push_back(materialize_mean(d.H, {.abs = true}));
      char what[64];
      std::snprintf(what, sizeof what, "mamba layer %zu (err %.0e):", i, err);
      print_row(what, maps.back());
    }
    ok = report("recall-mamba", tr.logits, maps, out) && ok;
  }
  {  // the hybrid: a Mamba-2 block, then softmax attention
    const auto c = checkpoint::nemotron_h_config_from_json(slurp(dir + "/recall-hybrid/config.json"));
    const auto f = safetensors::file::open(dir + "/recall-hybrid/model.safetensors");
    const auto lm = checkpoint::nemotron_h_lm_from<double>(f, c);
    const auto tr = checkpoint::nemotron_h_run(lm, ids);
    std::vector<Mat> maps;
    for (std::size_t i = 0; i < lm.blocks.size(); ++i) {
      const auto& b = lm.blocks[i];
      char what[64];
      if (b.kind == checkpoint::block_kind::mamba2) {
        const auto d = models::mamba2_decompose(b.mamba, tr.mixer_inputs[i]);
        const double err = (d.output() - tr.mixer_outputs[i]).cwiseAbs().maxCoeff() / tr.mixer_outputs[i].cwiseAbs().maxCoeff();
        ok = ok && err < 1e-10;
        maps.push_back(materialize_mean(d.H, {.abs = true}));
        std::snprintf(what, sizeof what, "mamba2 block %zu (err %.0e):", i, err);
      } else if (b.kind == checkpoint::block_kind::attention) {
        const auto& P = tr.attention[i];
        Mat m = Mat::Zero(P.dims[1], P.dims[2]);
        for (Index h = 0; h < P.dims[0]; ++h) m += P.slice(h) / double(P.dims[0]);
        maps.push_back(m);
        std::snprintf(what, sizeof what, "attention block %zu:", i);
      } else {
        continue;  // an MLP block mixes no tokens
      }
      print_row(what, maps.back());
    }
    ok = report("recall-hybrid", tr.logits, maps, out) && ok;
  }
  return ok ? 0 : 1;
}
