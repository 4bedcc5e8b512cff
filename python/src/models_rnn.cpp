// python/src/models_rnn.cpp: iattn.models.griffin, retnet, rwkv4, gla and hgrn.
#include "model_binding.hpp"

#include <iattn/models/gla.hpp>
#include <iattn/models/griffin.hpp>
#include <iattn/models/hgrn.hpp>
#include <iattn/models/retnet.hpp>
#include <iattn/models/rwkv4.hpp>

namespace iattn::py {
namespace {

struct griffin_spec {
  IATTN_PY_SPEC(griffin, "Griffin's recurrent block (recurrentgemma, transformers `RecurrentGemmaRecurrentBlock`): the RG-LRU.")
  IATTN_PY_CONFIG(width, lru_width, num_heads)
  IATTN_PY_WEIGHTS(linear_y_weight, linear_y_bias, linear_x_weight, linear_x_bias, linear_out_weight, linear_out_bias, conv_1d_w,
                   conv_1d_b, rg_lru_a_param, rg_lru_input_gate_w, rg_lru_input_gate_b, rg_lru_a_gate_w, rg_lru_a_gate_b)
  IATTN_PY_ACTS(x, y, gate_x, log_a, conv_1d_w, conv_1d_b, linear_out_weight, linear_out_bias)
  IATTN_PY_ACT_SCALARS(segment_pos)
};

struct retnet_spec {
  IATTN_PY_SPEC(retnet, "RetNet's multi-scale retention (torchscale `MultiScaleRetention`), its group norm bound at u.")
  IATTN_PY_CONFIG(embed_dim, value_dim, num_heads, layernorm_eps, centered)
  IATTN_PY_WEIGHTS(q_proj_weight, k_proj_weight, v_proj_weight, g_proj_weight, out_proj_weight)
  IATTN_PY_ACTS(qr, kr, v, g, decay, out_proj_weight)
  IATTN_PY_ACT_SCALARS(layernorm_eps, centered)
};

struct rwkv4_spec {
  IATTN_PY_SPEC(rwkv4, "RWKV-4 time mixing (transformers `RwkvSelfAttention`): the WKV operator.")
  IATTN_PY_CONFIG(hidden_size, attention_hidden_size, layer_id, num_hidden_layers)
  IATTN_PY_WEIGHTS(time_decay, time_first, time_mix_key, time_mix_value, time_mix_receptance, key_weight, value_weight,
                   receptance_weight, output_weight)
  IATTN_PY_ACTS(key, value, receptance, time_decay, time_first, output_weight, shift_state)
  IATTN_PY_ACT_SCALARS()
};

struct gla_spec {
  IATTN_PY_SPEC(gla, "Gated Linear Attention (flash-linear-attention `GatedLinearAttention`).")
  IATTN_PY_CONFIG(hidden_size, key_dim, value_dim, num_heads, gate_low_rank_dim, gate_logit_normalizer, norm_eps)
  IATTN_PY_WEIGHTS(q_proj_weight, k_proj_weight, v_proj_weight, g_proj_weight, gk_proj_0_weight, gk_proj_1_weight, gk_proj_1_bias,
                   g_norm_swish_gate_weight, o_proj_weight)
  IATTN_PY_ACTS(q, k, v, gk, g, g_norm_swish_gate_weight, o_proj_weight)
  IATTN_PY_ACT_SCALARS(num_heads, norm_eps)
};

struct hgrn_spec {
  IATTN_PY_SPEC(hgrn, "HGRN (flash-linear-attention `HGRNAttention`); lower_bound may be an empty (0, 0) array.")
  IATTN_PY_CONFIG(hidden_size, expand_ratio, norm_eps, layer_idx, num_layers)
  IATTN_PY_WEIGHTS(i_proj_weight, f_proj_weight, g_proj_weight, g_norm_weight, o_proj_weight, lower_bound)
  IATTN_PY_ACTS(i, f, g, g_norm_weight, o_proj_weight)
  IATTN_PY_ACT_SCALARS(norm_eps)
};

}  // namespace

void bind_models_rnn(nb::module_& models) {
  bind_model<griffin_spec>(models);
  bind_model<retnet_spec>(models);
  bind_model<rwkv4_spec>(models);
  bind_model<gla_spec>(models);
  bind_model<hgrn_spec>(models);
}

}  // namespace iattn::py
