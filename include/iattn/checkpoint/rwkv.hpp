// iattn/checkpoint/rwkv.hpp: RWKV-4 time mixing weights from a Hugging Face checkpoint.
//
//   rwkv_layers(f)                the block indices i of "rwkv.blocks.<i>.attention.time_decay" in f
//   rwkv4_weights_from<T>(f, i)   block i's RwkvSelfAttention parameters as rwkv4_weights<T>
//
// transformers' RwkvForCausalLM (model type `rwkv`) names them "rwkv.blocks.<i>.attention.":
// time_decay, time_first (A,), time_mix_key/value/receptance (1, 1, hidden), key, value, receptance
// (A, hidden) and output (hidden, A) weights. The config is read off the shapes. These are the
// checkpoint's weights: transformers rescales `attention.output.weight` by 2^-(i / rescale_every)
// in place when a model is put in eval mode (and the residual stream with it); the mixer here is
// the unrescaled one, as in training mode or with rescale_every = 0.
#pragma once

#include "../models/rwkv4.hpp"
#include "safetensors.hpp"

#include <string>
#include <vector>

namespace iattn::checkpoint {

/// The indices i for which f has "rwkv.blocks.<i>.attention.time_decay", ascending.
inline std::vector<Index> rwkv_layers(const safetensors::file& f) {
  const auto found = f.indices("rwkv.blocks.", ".attention.time_decay");
  return {found.begin(), found.end()};
}

/// Block `layer`'s time mixing weights (prefix "rwkv.blocks.<layer>.attention.").
template <Scalar T>
models::rwkv4_weights<T> rwkv4_weights_from(const safetensors::file& f, Index layer) {
  const std::string p = "rwkv.blocks." + std::to_string(layer) + ".attention.";
  f.require_rank(p + "time_decay", 1, "(attention_hidden_size,)");
  f.require_rank(p + "key.weight", 2, "(attention_hidden_size, hidden_size)");
  const std::int64_t A = f.info(p + "time_decay").shape[0], Hd = f.info(p + "key.weight").shape[1];
  f.require_shape(p + "time_first", {A});
  for (const char* m : {"time_mix_key", "time_mix_value", "time_mix_receptance"}) f.require_shape(p + m, {1, 1, Hd});
  for (const char* m : {"key.weight", "value.weight", "receptance.weight"}) f.require_shape(p + m, {A, Hd});
  f.require_shape(p + "output.weight", {Hd, A});
  models::rwkv4_weights<T> w;
  w.config = {.hidden_size = Index(Hd), .attention_hidden_size = Index(A), .layer_id = layer, .num_hidden_layers = layer + 1};
  w.time_decay = f.matrix<T>(p + "time_decay");
  w.time_first = f.matrix<T>(p + "time_first");
  w.time_mix_key = f.matrix<T>(p + "time_mix_key", 1, Index(Hd));
  w.time_mix_value = f.matrix<T>(p + "time_mix_value", 1, Index(Hd));
  w.time_mix_receptance = f.matrix<T>(p + "time_mix_receptance", 1, Index(Hd));
  w.key_weight = f.matrix<T>(p + "key.weight");
  w.value_weight = f.matrix<T>(p + "value.weight");
  w.receptance_weight = f.matrix<T>(p + "receptance.weight");
  w.output_weight = f.matrix<T>(p + "output.weight");
  w.check();
  return w;
}

}  // namespace iattn::checkpoint
