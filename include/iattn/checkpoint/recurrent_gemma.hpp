// iattn/checkpoint/recurrent_gemma.hpp: Griffin's recurrent block weights from a Hugging Face
// RecurrentGemma checkpoint.
//
//   recurrent_gemma_layers(f)            the indices i of "model.layers.<i>.temporal_block.rg_lru.*"
//                                        (the recurrent blocks; attention blocks are skipped)
//   griffin_weights_from<T>(f, i)        block i's RecurrentGemmaRecurrentBlock as griffin_weights<T>
//
// transformers' RecurrentGemmaForCausalLM (model type `recurrent_gemma`) names a recurrent block's
// parameters "model.layers.<i>.temporal_block.": linear_y, linear_x, linear_out (weights and
// biases), conv_1d (lru_width, 1, 4) and bias, and rg_lru's recurrent_param (lru_width,),
// input_gate_weight / recurrent_gate_weight (heads, bw, bw) with their biases (heads, bw).
// griffin_weights follows recurrentgemma's own checkpoint layout, so two fields change layout here
// (the only places a loader does): conv_1d.weight's (lru_width, 1, 4) becomes the (4, lru_width)
// taps (models::depthwise_taps), and the gates' (heads, bw, bw) are flattened to (lru_width, bw)
// (the same numbers in the same order). recurrent_gate ↔ rg_lru_a_gate, recurrent_param ↔ rg_lru_a_param.
#pragma once

#include "../models/griffin.hpp"
#include "safetensors.hpp"

#include <string>
#include <vector>

namespace iattn::checkpoint {

/// The indices i for which f has "model.layers.<i>.temporal_block.rg_lru.recurrent_param", ascending.
inline std::vector<Index> recurrent_gemma_layers(const safetensors::file& f) {
  const auto found = f.indices("model.layers.", ".temporal_block.rg_lru.recurrent_param");
  return {found.begin(), found.end()};
}

/// Recurrent block `layer`'s weights (prefix "model.layers.<layer>.temporal_block.").
template <Scalar T>
models::griffin_weights<T> griffin_weights_from(const safetensors::file& f, Index layer) {
  const std::string p = "model.layers." + std::to_string(layer) + ".temporal_block.";
  f.require_rank(p + "rg_lru.recurrent_param", 1, "(lru_width,)");
  f.require_rank(p + "linear_x.weight", 2, "(lru_width, hidden_size)");
  f.require_rank(p + "rg_lru.input_gate_weight", 3, "(num_heads, block_width, block_width)");
  const std::int64_t D = f.info(p + "rg_lru.recurrent_param").shape[0], W = f.info(p + "linear_x.weight").shape[1];
  const std::int64_t H = f.info(p + "rg_lru.input_gate_weight").shape[0];
  if (H < 1 || D % H != 0)
    safetensors::detail::fail(f.label(), "tensor '" + p + "rg_lru.input_gate_weight': " + std::to_string(H) +
                                             " heads do not divide lru_width = " + std::to_string(D));
  const std::int64_t bw = D / H, K = models::griffin_config::conv1d_temporal_width;
  for (const char* m : {"linear_y.weight", "linear_x.weight"}) f.require_shape(p + m, {D, W});
  for (const char* m : {"linear_y.bias", "linear_x.bias", "conv_1d.bias"}) f.require_shape(p + m, {D});
  f.require_shape(p + "linear_out.weight", {W, D});
  f.require_shape(p + "linear_out.bias", {W});
  f.require_shape(p + "conv_1d.weight", {D, 1, K});
  for (const char* m : {"rg_lru.input_gate_weight", "rg_lru.recurrent_gate_weight"}) f.require_shape(p + m, {H, bw, bw});
  for (const char* m : {"rg_lru.input_gate_bias", "rg_lru.recurrent_gate_bias"}) f.require_shape(p + m, {H, bw});
  models::griffin_weights<T> w;
  w.config = {.width = Index(W), .lru_width = Index(D), .num_heads = Index(H)};
  w.linear_y_weight = f.matrix<T>(p + "linear_y.weight");
  w.linear_y_bias = f.matrix<T>(p + "linear_y.bias");
  w.linear_x_weight = f.matrix<T>(p + "linear_x.weight");
  w.linear_x_bias = f.matrix<T>(p + "linear_x.bias");
  w.linear_out_weight = f.matrix<T>(p + "linear_out.weight");
  w.linear_out_bias = f.matrix<T>(p + "linear_out.bias");
  w.conv_1d_w = models::depthwise_taps(f.matrix<T>(p + "conv_1d.weight", Index(D), Index(K)));
  w.conv_1d_b = f.matrix<T>(p + "conv_1d.bias");
  w.rg_lru_a_param = f.matrix<T>(p + "rg_lru.recurrent_param");
  w.rg_lru_input_gate_w = f.matrix<T>(p + "rg_lru.input_gate_weight", Index(D), Index(bw));
  w.rg_lru_input_gate_b = f.matrix<T>(p + "rg_lru.input_gate_bias", 1, Index(D));
  w.rg_lru_a_gate_w = f.matrix<T>(p + "rg_lru.recurrent_gate_weight", Index(D), Index(bw));
  w.rg_lru_a_gate_b = f.matrix<T>(p + "rg_lru.recurrent_gate_bias", 1, Index(D));
  w.check();
  return w;
}

}  // namespace iattn::checkpoint
