// iattn/checkpoint/mamba.hpp: Mamba mixers' weights from a Hugging Face checkpoint.
//
//   mamba_layers(f)                 the layer indices i of "backbone.layers.<i>.mixer.*" in f
//   mamba_weights_from<T>(f, i)     layer i's MambaMixer parameters as mamba_weights<T>
//
// Hugging Face's MambaForCausalLM (transformers model types `mamba` and `falcon_mamba`) names a
// mixer's parameters as mamba_ssm's `Mamba` does, under "backbone.layers.<i>.mixer.": in_proj,
// conv1d, x_proj, dt_proj, A_log, D, out_proj. The config is read off the shapes (d_inner and
// d_state from A_log, d_model from in_proj, d_conv from conv1d, dt_rank from dt_proj), each
// tensor keeps its own index order (conv1d.weight (d_inner, 1, d_conv) becomes (d_inner, d_conv)),
// and a missing tensor or a shape that disagrees with the others throws, naming the tensor.
// Projection biases (`use_bias=True`) are refused: mamba_weights has none, and dropping them would
// change the output silently. Falcon-Mamba's extra RMS norms of B, C and Δ are not modelled
// either: its checkpoints load, but its mixer computes more than mamba_weights describes.
#pragma once

#include "../models/mamba.hpp"
#include "safetensors.hpp"

#include <set>
#include <string>
#include <vector>

namespace iattn::checkpoint {

/// The indices i for which f has "backbone.layers.<i>.mixer.A_log", ascending.
inline std::vector<Index> mamba_layers(const safetensors::file& f) {
  const std::string head = "backbone.layers.", tail = ".mixer.A_log";
  std::set<Index> found;
  for (const auto& t : f.tensors()) {
    const std::string& n = t.name;
    if (n.size() <= head.size() + tail.size() || n.compare(0, head.size(), head) != 0 ||
        n.compare(n.size() - tail.size(), tail.size(), tail) != 0)
      continue;
    const std::string num = n.substr(head.size(), n.size() - head.size() - tail.size());
    if (num.empty() || num.find_first_not_of("0123456789") != std::string::npos) continue;
    found.insert(Index(std::stoll(num)));
  }
  return {found.begin(), found.end()};
}

/// Layer `layer`'s mixer weights (prefix "backbone.layers.<layer>.mixer.").
template <Scalar T>
models::mamba_weights<T> mamba_weights_from(const safetensors::file& f, Index layer) {
  const std::string p = "backbone.layers." + std::to_string(layer) + ".mixer.";
  for (const char* bias : {"in_proj.bias", "out_proj.bias"})
    if (f.contains(p + bias))
      safetensors::detail::fail(f.label(), "tensor '" + p + bias + "': projection biases (use_bias=True) are not modelled by mamba_weights");
  const auto& A = f.info(p + "A_log");
  f.require_rank(p + "A_log", 2, "(d_inner, d_state)");
  const std::int64_t di = A.shape[0], N = A.shape[1];
  const auto& in = f.info(p + "in_proj.weight");
  f.require_rank(p + "in_proj.weight", 2, "(2*d_inner, d_model)");
  const std::int64_t dm = in.shape[1];
  const auto& conv = f.info(p + "conv1d.weight");
  f.require_rank(p + "conv1d.weight", 3, "(d_inner, 1, d_conv)");
  const std::int64_t K = conv.shape[2];
  const auto& dt = f.info(p + "dt_proj.weight");
  f.require_rank(p + "dt_proj.weight", 2, "(d_inner, dt_rank)");
  const std::int64_t R = dt.shape[1];
  if (dm <= 0 || di % dm != 0)
    safetensors::detail::fail(f.label(), "tensor '" + p + "in_proj.weight' has shape " + safetensors::detail::shape_string(in.shape) +
                                             ": d_inner = " + std::to_string(di) + " (from A_log) is not a multiple of d_model");
  f.require_shape(p + "in_proj.weight", {2 * di, dm});
  f.require_shape(p + "conv1d.weight", {di, 1, K});
  f.require_shape(p + "conv1d.bias", {di});
  f.require_shape(p + "x_proj.weight", {R + 2 * N, di});
  f.require_shape(p + "dt_proj.weight", {di, R});
  f.require_shape(p + "dt_proj.bias", {di});
  f.require_shape(p + "D", {di});
  f.require_shape(p + "out_proj.weight", {dm, di});
  models::mamba_weights<T> w;
  w.config = {.d_model = Index(dm), .d_state = Index(N), .d_conv = Index(K), .expand = Index(di / dm), .dt_rank = Index(R)};
  w.in_proj_weight = f.matrix<T>(p + "in_proj.weight");
  w.conv1d_weight = f.matrix<T>(p + "conv1d.weight", Index(di), Index(K));
  w.conv1d_bias = f.matrix<T>(p + "conv1d.bias");
  w.x_proj_weight = f.matrix<T>(p + "x_proj.weight");
  w.dt_proj_weight = f.matrix<T>(p + "dt_proj.weight");
  w.dt_proj_bias = f.matrix<T>(p + "dt_proj.bias");
  w.A_log = f.matrix<T>(p + "A_log");
  w.D = f.matrix<T>(p + "D");
  w.out_proj_weight = f.matrix<T>(p + "out_proj.weight");
  w.check();
  return w;
}

}  // namespace iattn::checkpoint
