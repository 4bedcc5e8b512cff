// iattn/checkpoint/nemotron_h.hpp: a hybrid from its checkpoint: transformers' NemotronHForCausalLM
// (Mamba-2 blocks, softmax attention blocks and MLP blocks, each pre-normed with a residual), read from
// a save_pretrained directory and run in C++, reproducing transformers' hidden states and logits.
//
//   nemotron_h_config_from_json(text)   the fields the runner needs, from config.json's text
//   nemotron_h_lm_from<T>(f, c)         every block (its kind from the tensors it has), the embedding,
//                                       norms and head
//   nemotron_h_run(lm, ids)             the forward pass: per block its input (the mixer's, normed),
//                                       output, and for attention blocks the probabilities (heads, L, L);
//                                       the final hidden states and the logits
//
// Blocks (prefix "backbone.layers.<i>."; norm.weight on each):
//   Mamba-2:   mixer.A_log ...                  models::mamba2 with dt_min = time_step_min (NemotronH
//                                               clamps dt from below at time_step_min)
//   attention: mixer.{q,k,v,o}_proj.weight       causal softmax, grouped key/value heads, scale
//                                               head_dim^-1/2, no positional encoding (NemotronH has none)
//   MLP:       mixer.{up,down}_proj.weight       down(relu(up x)^2)
// Biases (use_bias, attention_bias, mlp_bias) are refused with the tensor's name.
#pragma once

#include "mamba.hpp"

#include <nlohmann/json.hpp>

#include <cmath>
#include <string>
#include <vector>

namespace iattn::checkpoint {

struct nemotron_h_config {
  double eps = 1e-5;              ///< layer_norm_epsilon: the block norms, the final norm and the gated norm
  Index n_groups = 1;             ///< n_groups of the Mamba-2 mixers
  Index num_attention_heads = 0;  ///< of the attention blocks
  Index num_key_value_heads = 0;
  Index head_dim = 0;
  double time_step_min = 0.001;   ///< the Mamba-2 mixers' dt floor
};

/// The runner's fields from config.json's text; a missing field keeps the transformers default, a
/// field of the wrong type throws naming it.
inline nemotron_h_config nemotron_h_config_from_json(const std::string& text) {
  nemotron_h_config c;
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const std::exception& e) {
    iattn::detail::fail("nemotron_h_config_from_json", std::string("config.json is not JSON: ") + e.what());
  }
  auto get = [&](const char* key, auto& field) {
    if (!j.contains(key)) return;
    try {
      field = j.at(key).get<std::remove_reference_t<decltype(field)>>();
    } catch (const std::exception&) {
      iattn::detail::fail("nemotron_h_config_from_json", std::string("config.json's \"") + key + "\" has the wrong type");
    }
  };
  get("layer_norm_epsilon", c.eps);
  get("n_groups", c.n_groups);
  get("num_attention_heads", c.num_attention_heads);
  get("num_key_value_heads", c.num_key_value_heads);
  get("head_dim", c.head_dim);
  get("time_step_min", c.time_step_min);
  return c;
}

enum class block_kind { mamba2, attention, mlp };

template <Scalar T>
struct nemotron_h_block {
  block_kind kind = block_kind::mamba2;
  Matrix<T> norm;                       ///< (1, d_model)
  models::mamba2_weights<T> mamba;      ///< kind mamba2
  Matrix<T> q, k, v, o;                 ///< kind attention: (heads*hd, d), (kv*hd, d), (kv*hd, d), (d, heads*hd)
  Matrix<T> up, down;                   ///< kind mlp: (inter, d), (d, inter)
};

template <Scalar T>
struct nemotron_h_lm {
  nemotron_h_config config;
  Matrix<T> embeddings;  ///< (vocab, d_model)
  std::vector<nemotron_h_block<T>> blocks;
  Matrix<T> norm_f;      ///< (1, d_model)
  Matrix<T> lm_head;     ///< (vocab, d_model), or the embeddings (tied)
};

template <Scalar T>
nemotron_h_lm<T> nemotron_h_lm_from(const safetensors::file& f, const nemotron_h_config& c) {
  nemotron_h_lm<T> lm;
  lm.config = c;
  lm.embeddings = f.matrix<T>("backbone.embeddings.weight");
  const Index dm = lm.embeddings.cols();
  const std::vector<Index> ids = f.indices("backbone.layers.", ".norm.weight");
  for (std::size_t i = 0; i < ids.size(); ++i) {
    if (ids[i] != Index(i)) f.info("backbone.layers." + std::to_string(i) + ".norm.weight");  // throws: a gap
    const std::string p = "backbone.layers." + std::to_string(i) + ".";
    nemotron_h_block<T> b;
    b.norm = f.matrix<T>(p + "norm.weight");
    for (const char* bias : {"mixer.in_proj.bias", "mixer.out_proj.bias", "mixer.q_proj.bias", "mixer.k_proj.bias", "mixer.v_proj.bias",
                             "mixer.o_proj.bias", "mixer.up_proj.bias", "mixer.down_proj.bias"})
      if (f.contains(p + bias)) safetensors::detail::fail(f.label(), "tensor '" + p + bias + "': biases are not modelled by nemotron_h_lm_from");
    if (f.contains(p + "mixer.A_log")) {
      b.kind = block_kind::mamba2;
      b.mamba = mamba2_weights_from<T>(f, Index(i), c.n_groups, c.eps);
      b.mamba.config.dt_min = c.time_step_min;
      b.mamba.check();
    } else if (f.contains(p + "mixer.q_proj.weight")) {
      b.kind = block_kind::attention;
      const Index H = c.num_attention_heads, KV = c.num_key_value_heads, hd = c.head_dim;
      if (H < 1 || KV < 1 || hd < 1 || H % KV != 0)
        safetensors::detail::fail(f.label(), "tensor '" + p + "mixer.q_proj.weight': an attention block needs num_attention_heads (" +
                                                 std::to_string(H) + ") a multiple of num_key_value_heads (" + std::to_string(KV) +
                                                 ") and head_dim (" + std::to_string(hd) + ") >= 1 from config.json");
      f.require_shape(p + "mixer.q_proj.weight", {H * hd, dm});
      f.require_shape(p + "mixer.k_proj.weight", {KV * hd, dm});
      f.require_shape(p + "mixer.v_proj.weight", {KV * hd, dm});
      f.require_shape(p + "mixer.o_proj.weight", {dm, H * hd});
      b.q = f.matrix<T>(p + "mixer.q_proj.weight");
      b.k = f.matrix<T>(p + "mixer.k_proj.weight");
      b.v = f.matrix<T>(p + "mixer.v_proj.weight");
      b.o = f.matrix<T>(p + "mixer.o_proj.weight");
    } else if (f.contains(p + "mixer.up_proj.weight")) {
      b.kind = block_kind::mlp;
      b.up = f.matrix<T>(p + "mixer.up_proj.weight");
      f.require_shape(p + "mixer.down_proj.weight", {dm, b.up.rows()});
      b.down = f.matrix<T>(p + "mixer.down_proj.weight");
    } else {
      safetensors::detail::fail(f.label(), "block " + std::to_string(i) + " has none of mixer.A_log, mixer.q_proj.weight, mixer.up_proj.weight "
                                           "(a MoE block is not supported)");
    }
    lm.blocks.push_back(std::move(b));
  }
  lm.norm_f = f.matrix<T>("backbone.norm_f.weight");
  lm.lm_head = f.contains("lm_head.weight") ? f.matrix<T>("lm_head.weight") : lm.embeddings;
  return lm;
}

/// What one forward pass of a nemotron_h_lm computed.
template <Scalar T>
struct nemotron_h_trace {
  std::vector<Matrix<T>> mixer_inputs;   ///< per block (L, d_model): the normed input of its mixer
  std::vector<Matrix<T>> mixer_outputs;  ///< per block (L, d_model): what the mixer adds to the residual
  std::vector<Tensor3<T>> attention;     ///< per block: (heads, L, L) probabilities for attention, empty else
  Matrix<T> hidden;                      ///< (L, d_model) after norm_f
  Matrix<T> logits;                      ///< (L, vocab)
};

namespace detail {
/// Causal softmax attention with grouped key/value heads and scale hd^-1/2: the output (L, d_model)
/// and the probabilities (heads, L, L).
template <class T>
Matrix<T> causal_attention(const nemotron_h_block<T>& b, const nemotron_h_config& c, const Matrix<T>& u, Tensor3<T>& probs) {
  const Index L = u.rows(), H = c.num_attention_heads, KV = c.num_key_value_heads, hd = c.head_dim;
  const Matrix<T> Q = models::nn::linear<T>(u, b.q), K = models::nn::linear<T>(u, b.k), V = models::nn::linear<T>(u, b.v);
  Matrix<T> Y = Matrix<T>::Zero(L, H * hd);
  probs = Tensor3<T>(H, L, L, T(0));
  const double scale = 1.0 / std::sqrt(double(hd));
  for (Index h = 0; h < H; ++h) {
    const Index g = h / (H / KV);
    auto P = probs.slice(h);
    for (Index t = 0; t < L; ++t) {
      double mx = -std::numeric_limits<double>::infinity();
      std::vector<double> s(std::size_t(t + 1));
      for (Index j = 0; j <= t; ++j) {
        double dot = 0;
        for (Index e = 0; e < hd; ++e) dot += double(Q(t, h * hd + e)) * double(K(j, g * hd + e));
        s[std::size_t(j)] = dot * scale;
        mx = std::max(mx, s[std::size_t(j)]);
      }
      double z = 0;
      for (double& v : s) z += (v = std::exp(v - mx));
      for (Index j = 0; j <= t; ++j) {
        const T p = T(s[std::size_t(j)] / z);
        P(t, j) = p;
        for (Index e = 0; e < hd; ++e) Y(t, h * hd + e) += p * V(j, g * hd + e);
      }
    }
  }
  return models::nn::linear<T>(Y, b.o);
}
}  // namespace detail

/// The forward pass on token ids (every id in [0, vocab)).
template <Scalar T>
nemotron_h_trace<T> nemotron_h_run(const nemotron_h_lm<T>& lm, const std::vector<Index>& ids) {
  Matrix<T> x = detail::embed(lm.embeddings, ids, "nemotron_h_run");
  nemotron_h_trace<T> tr;
  for (const auto& b : lm.blocks) {
    tr.mixer_inputs.push_back(detail::rms_norm_rows(x, b.norm, lm.config.eps));
    const Matrix<T>& u = tr.mixer_inputs.back();
    Tensor3<T> probs;
    Matrix<T> y;
    if (b.kind == block_kind::mamba2) {
      y = models::mamba2_forward(b.mamba, u);
    } else if (b.kind == block_kind::attention) {
      y = detail::causal_attention(b, lm.config, u, probs);
    } else {
      Matrix<T> h = models::nn::linear<T>(u, b.up);
      for (Index i = 0; i < h.size(); ++i) {
        const T r = std::max(h.data()[i], T(0));
        h.data()[i] = r * r;
      }
      y = models::nn::linear<T>(h, b.down);
    }
    x += y;
    tr.mixer_outputs.push_back(std::move(y));
    tr.attention.push_back(std::move(probs));
  }
  tr.hidden = detail::rms_norm_rows(x, lm.norm_f, lm.config.eps);
  tr.logits = models::nn::linear<T>(tr.hidden, lm.lm_head);
  return tr;
}

}  // namespace iattn::checkpoint
