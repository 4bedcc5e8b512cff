// python/src/models_delta.cpp: the delta-rule family: iattn.models.qwen3_next, deltanet and rwkv7.
#include "model_binding.hpp"

#include <iattn/models/deltanet.hpp>
#include <iattn/models/qwen3_next.hpp>
#include <iattn/models/rwkv7.hpp>

namespace iattn::py {
namespace {

struct qwen3_next_spec {
  IATTN_PY_SPEC(qwen3_next, "Qwen3-Next's Gated DeltaNet (transformers `Qwen3NextGatedDeltaNet`): the gated delta rule.")
  IATTN_PY_CONFIG(hidden_size, linear_num_value_heads, linear_num_key_heads, linear_key_head_dim, linear_value_head_dim,
                  linear_conv_kernel_dim, rms_norm_eps, initializer_range)
  IATTN_PY_WEIGHTS(in_proj_qkvz_weight, in_proj_ba_weight, conv1d_weight, dt_bias, A_log, norm_weight, out_proj_weight)
  IATTN_PY_ACTS(mixed_qkv, z, beta, g, conv1d_weight, norm_weight, out_proj_weight)
  IATTN_PY_ACT_SCALARS(num_k_heads, num_v_heads, head_k_dim, head_v_dim, eps)
};

struct deltanet_spec {
  IATTN_PY_SPEC(deltanet, "flash-linear-attention's DeltaNet and Gated DeltaNet (gated=True); unused fields are (0, 0) arrays.")
  IATTN_PY_CONFIG(hidden_size, head_dim, expand_v, num_heads, num_v_heads, conv_size, gated, use_gate, use_beta, use_short_conv,
                  allow_neg_eigval, norm_eps, initializer_range)
  IATTN_PY_WEIGHTS(q_proj_weight, k_proj_weight, v_proj_weight, a_proj_weight, b_proj_weight, A_log, dt_bias, q_conv1d_weight,
                   k_conv1d_weight, v_conv1d_weight, g_proj_weight, o_norm_weight, o_proj_weight)
  IATTN_PY_ACTS(q, k, v, beta, g, gate, q_conv1d_weight, k_conv1d_weight, v_conv1d_weight, o_norm_weight, o_proj_weight)
  IATTN_PY_ACT_SCALARS(num_heads, num_v_heads, norm_eps)
};

struct rwkv7_spec {
  IATTN_PY_SPEC(rwkv7, "RWKV-7 time mixing (flash-linear-attention `RWKV7Attention`), first layer (v_first = v).")
  IATTN_PY_CONFIG(hidden_size, head_dim, value_dim, decay_low_rank_dim, a_low_rank_dim, v_low_rank_dim, gate_low_rank_dim,
                  layer_idx, num_hidden_layers, norm_eps, fuse_norm)
  IATTN_PY_WEIGHTS(x_r, x_w, x_k, x_v, x_a, x_g, k_k, k_a, r_k, r_proj_weight, k_proj_weight, v_proj_weight, o_proj_weight,
                   w_lora_lora_0_weight, w_lora_lora_2_weight, w_lora_lora_2_bias, a_lora_lora_0_weight, a_lora_lora_2_weight,
                   a_lora_lora_2_bias, v_lora_lora_0_weight, v_lora_lora_2_weight, v_lora_lora_2_bias, g_lora_lora_0_weight,
                   g_lora_lora_2_weight, g_norm_weight, g_norm_bias)
  IATTN_PY_ACTS(r, w, k, v, a, kk, g, r_k, g_norm_weight, g_norm_bias, o_proj_weight)
  IATTN_PY_ACT_SCALARS(num_heads, norm_eps)
};

}  // namespace

void bind_models_delta(nb::module_& models) {
  bind_model<qwen3_next_spec>(models);
  bind_model<deltanet_spec>(models);
  bind_model<rwkv7_spec>(models);
}

}  // namespace iattn::py
