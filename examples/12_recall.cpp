// A trained model's implicit attention, from its checkpoint, in C++ only: models/recall-mamba is a
// 2-layer MambaForCausalLM trained on associative recall (tools/train). The example runs one held-out
// sequence through the whole stack (embedding, norms, residuals, final norm, tied head), decomposes
// each layer on its mixer's input, checks the decomposition against the layer, and prints what the
// query token reads: each layer's map and the rollout over both, with the matching key marked.
//
//   12_recall [checkpoint directory] [output directory for PNG heatmaps]
//
// Exits non-zero when the decomposition is not exact or the model does not retrieve the value.
#include <iattn/checkpoint/mamba.hpp>
#include <iattn/explain/methods.hpp>
#if defined(IATTN_HAS_PNG)
#include <iattn/explain/png.hpp>
#endif

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#ifndef IATTN_SOURCE_DIR
#define IATTN_SOURCE_DIR "."
#endif

int main(int argc, char** argv) {
  using namespace iattn;
  using Mat = Matrix<double>;
  const std::string dir = argc > 1 ? argv[1] : std::string(IATTN_SOURCE_DIR) + "/models/recall-mamba";
  const std::string out = argc > 2 ? argv[2] : "";

  double eps = 1e-5;
  {
    std::ifstream cfg(dir + "/config.json");
    if (cfg) eps = nlohmann::json::parse(cfg).value("layer_norm_epsilon", 1e-5);
  }
  const auto f = safetensors::file::open(dir + "/model.safetensors");
  const auto lm = checkpoint::mamba_lm_from<double>(f, eps);

  // k v pairs (keys 0..15, values 16..31), then the query key 12: the answer is 29, the value after key 12
  const std::vector<Index> ids = {3, 20, 7, 17, 12, 29, 0, 22, 9, 16, 14, 31, 5, 25, 1, 18, 12};
  const Index L = Index(ids.size()), q = L - 1, key = 4, answer = 29;
  const auto tr = checkpoint::lm_run(lm, ids);
  Index predicted = 0;
  tr.logits.row(q).maxCoeff(&predicted);

  bool ok = predicted == answer;
  std::printf("tokens:    ");
  for (Index t = 0; t < L; ++t) std::printf("%4lld", static_cast<long long>(ids[std::size_t(t)]));
  std::printf("\nquery %lld at position %lld; the matching key is at position %lld, its value %lld follows it\n",
              static_cast<long long>(ids[std::size_t(q)]), static_cast<long long>(q), static_cast<long long>(key),
              static_cast<long long>(answer));
  std::printf("the model predicts %lld (%s)\n\n", static_cast<long long>(predicted), predicted == answer ? "right" : "WRONG");

  std::vector<Mat> maps;
  for (std::size_t i = 0; i < lm.layers.size(); ++i) {
    const Mat& u = tr.mixer_inputs[i];
    const auto d = models::mamba_decompose(lm.layers[i], u);
    const Mat block = models::mamba_forward(lm.layers[i], u);
    const double err = (d.output() - block).cwiseAbs().maxCoeff() / block.cwiseAbs().maxCoeff();
    ok = ok && err < 1e-10;
    maps.push_back(materialize_mean(d.H, {.abs = true}));
    std::printf("layer %zu (exact to %.1e): ", i, err);
    for (Index s = 0; s <= q; ++s) std::printf("%s%.3f", s == key ? " [" : s == key + 1 ? "] " : " ", maps.back()(q, s));
    std::printf("\n");
  }
  const Mat rho = explain::rollout(maps);
  Index top = 0;
  rho.row(q).head(q).maxCoeff(&top);
  std::printf("rollout:   ");
  for (Index s = 0; s <= q; ++s) std::printf("%s%.3f", s == key ? " [" : s == key + 1 ? "] " : " ", rho(q, s));
  std::printf("\nthe query reads most from position %lld (%s)\n", static_cast<long long>(top),
              top == key ? "the matching key" : top == key + 1 ? "the matching key's value" : "another token");

#if defined(IATTN_HAS_PNG)
  if (!out.empty()) {
    std::vector<std::string> labels;
    for (Index id : ids) labels.push_back(id < 16 ? "k" + std::to_string(id) : "v" + std::to_string(id - 16));
    for (std::size_t i = 0; i < maps.size(); ++i)
      explain::write_heatmap_png(out + "/recall_mamba_layer" + std::to_string(i) + ".png", maps[i],
                                 {.title = "recall-mamba layer " + std::to_string(i) + ": mean |H^c|", .labels = labels});
    explain::write_heatmap_png(out + "/recall_mamba_rollout.png", rho, {.title = "recall-mamba: rollout", .labels = labels});
    std::printf("heatmaps in %s\n", out.c_str());
  }
#endif
  return ok ? 0 : 1;
}
