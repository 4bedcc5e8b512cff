// python/src/models_more.cpp: iattn.models for the models beyond the papers and the delta-rule and
// complex-decay families: hgrn2, rwkv6, linear_attention, mlstm, s4d, hyena, transformer,
// deltaproduct, kimi_linear, lru, mamba3.
#include "model_binding.hpp"

#include <iattn/models/deltaproduct.hpp>
#include <iattn/models/hgrn2.hpp>
#include <iattn/models/hyena.hpp>
#include <iattn/models/kimi_linear.hpp>
#include <iattn/models/linear_attention.hpp>
#include <iattn/models/lru.hpp>
#include <iattn/models/mamba3.hpp>
#include <iattn/models/mlstm.hpp>
#include <iattn/models/rwkv6.hpp>
#include <iattn/models/s4d.hpp>
#include <iattn/models/transformer.hpp>

namespace iattn::py {
namespace {

struct hgrn2_spec {
  IATTN_PY_SPEC(hgrn2, "HGRN2 (flash-linear-attention `HGRN2Attention`): HGRN with state expansion.")
  IATTN_PY_CONFIG(hidden_size, expand_ratio, norm_eps, layer_idx, num_layers)
  IATTN_PY_WEIGHTS(q_proj_weight, f_proj_weight, i_proj_weight, g_norm_weight, o_proj_weight, lower_bound)
  IATTN_PY_ACTS(q, k, g, i, g_norm_weight, o_proj_weight)
  IATTN_PY_ACT_SCALARS(num_heads, scale, norm_eps)
};

struct rwkv6_spec {
  IATTN_PY_SPEC(rwkv6, "RWKV-6 time mixing (flash-linear-attention `RWKV6Attention`): data-dependent shift and decay.")
  IATTN_PY_CONFIG(hidden_size, key_dim, value_dim, num_heads, proj_low_rank_dim, gate_low_rank_dim, norm_eps, layer_idx, num_layers)
  IATTN_PY_WEIGHTS(x_proj_0_mu, x_proj_0_linear_weight, x_proj_2_weight, x_bias, r_proj_linear_weight, w_proj_linear_lora_0_weight,
                   w_proj_linear_lora_2_weight, w_proj_linear_lora_2_bias, k_proj_linear_weight, v_proj_linear_weight,
                   g_proj_linear_weight, bonus, g_norm_weight, g_norm_bias, o_proj_weight)
  IATTN_PY_ACTS(r, w, k, v, g, bonus, g_norm_weight, g_norm_bias, o_proj_weight, conv_state)
  IATTN_PY_ACT_SCALARS(norm_eps)
};

struct linear_attention_spec {
  IATTN_PY_SPEC(linear_attention, "Normalised linear attention, phi = elu + 1 (Katharopoulos et al.).")
  IATTN_PY_CONFIG(d_model, n_heads, d_keys, d_values, eps)
  IATTN_PY_WEIGHTS(query_projection_weight, query_projection_bias, key_projection_weight, key_projection_bias, value_projection_weight,
                   value_projection_bias, out_projection_weight, out_projection_bias)
  IATTN_PY_ACTS(Q, K, values, out_projection_weight, out_projection_bias)
  IATTN_PY_ACT_SCALARS(n_heads, eps)
};

struct mlstm_spec {
  IATTN_PY_SPEC(mlstm, "xLSTM's mLSTM layer (NX-AI xlstm `mLSTMLayer`): the stabilised matrix memory.")
  IATTN_PY_CONFIG(embedding_dim, proj_factor, round_proj_up_to_multiple_of, num_heads, qkv_proj_blocksize, conv1d_kernel_size, norm_eps,
                  cell_eps)
  IATTN_PY_WEIGHTS(proj_up_weight, conv1d_conv_weight, conv1d_conv_bias, q_proj_weight, k_proj_weight, v_proj_weight,
                   mlstm_cell_igate_weight, mlstm_cell_igate_bias, mlstm_cell_fgate_weight, mlstm_cell_fgate_bias,
                   mlstm_cell_outnorm_weight, learnable_skip, proj_down_weight)
  IATTN_PY_ACTS(z, x_mlstm_conv_act, q, k, v, igate_preact, fgate_preact, mlstm_cell_outnorm_weight, learnable_skip, proj_down_weight)
  IATTN_PY_ACT_SCALARS(norm_eps, cell_eps)
};

struct s4d_spec {
  IATTN_PY_SPEC(s4d, "S4D: a linear time-invariant kernel as one long convolution, GELU as a diagonal.")
  IATTN_PY_CONFIG(d_model, d_state, dt_min, dt_max)
  IATTN_PY_WEIGHTS(kernel_log_dt, kernel_C_re, kernel_C_im, kernel_log_A_real, kernel_A_imag, D)
  IATTN_PY_ACTS(u, k, D)
  IATTN_PY_ACT_SCALARS()
};

struct hyena_spec {
  IATTN_PY_SPEC(hyena, "Hyena of order 2: data-controlled gates around a long implicit filter.")
  IATTN_PY_CONFIG(d_model, l_max, short_filter_order)
  IATTN_PY_WEIGHTS(in_proj_weight, in_proj_bias, short_filter_weight, short_filter_bias, filter, filter_bias, out_proj_weight, out_proj_bias)
  IATTN_PY_ACTS(in_proj_v, x0, x1, short_filter_weight, short_filter_bias, k, bias, out_proj_weight, out_proj_bias)
  IATTN_PY_ACT_SCALARS()
};

struct transformer_spec {
  IATTN_PY_SPEC(transformer, "Causal softmax attention (torch.nn.MultiheadAttention), for comparison.")
  IATTN_PY_CONFIG(embed_dim, num_heads)
  IATTN_PY_WEIGHTS(in_proj_weight, in_proj_bias, out_proj_weight, out_proj_bias)
  IATTN_PY_ACTS(q, k, v, out_proj_weight, out_proj_bias)
  IATTN_PY_ACT_SCALARS(num_heads)
};

struct deltaproduct_spec {
  IATTN_PY_SPEC(deltaproduct, "Gated DeltaProduct (flash-linear-attention): several Householder steps per token.")
  IATTN_PY_CONFIG(hidden_size, head_dim, expand_v, num_heads, num_v_heads, num_householder, conv_size, use_output_gate, use_short_conv,
                  use_forget_gate, allow_neg_eigval, norm_eps, initializer_range)
  IATTN_PY_WEIGHTS(q_proj_weight, k_proj_weight, v_proj_weight, b_proj_weight, a_proj_weight, A_log, dt_bias, q_conv1d_weight,
                   k_conv1d_weight, v_conv1d_weight, g_proj_weight, o_norm_weight, o_proj_weight)
  IATTN_PY_ACTS(q, k, v, beta, g, gate, q_conv1d_weight, k_conv1d_weight, v_conv1d_weight, o_norm_weight, o_proj_weight)
  IATTN_PY_ACT_SCALARS(num_heads, num_v_heads, num_householder, norm_eps)
};

struct kimi_linear_spec {
  IATTN_PY_SPEC(kimi_linear, "Kimi Delta Attention (transformers `KimiDeltaAttention`): per-channel gates, then key removal.")
  IATTN_PY_CONFIG(hidden_size, linear_num_heads, linear_head_dim, linear_conv_kernel_dim, rms_norm_eps, initializer_range)
  IATTN_PY_WEIGHTS(q_proj_weight, k_proj_weight, v_proj_weight, conv1d_weight, forget_gate_f_a_proj_weight, forget_gate_f_b_proj_weight,
                   forget_gate_dt_bias, forget_gate_A_log, b_proj_weight, g_a_proj_weight, g_b_proj_weight, o_norm_weight, o_proj_weight)
  IATTN_PY_ACTS(mixed_qkv, g, beta, gate, conv1d_weight, o_norm_weight, o_proj_weight)
  IATTN_PY_ACT_SCALARS(num_heads, head_dim, eps)
};

struct lru_spec {
  IATTN_PY_SPEC(lru, "The Linear Recurrent Unit (Orvieto et al.): complex diagonal states mixed by B and C.")
  IATTN_PY_CONFIG(d_model, d_hidden, r_min, r_max, max_phase)
  IATTN_PY_WEIGHTS(nu_log, theta_log, gamma_log, B_re, B_im, C_re, C_im, D)
  IATTN_PY_ACTS(u, z_re, z_im, nu_log, theta_log, C_re, C_im, D)
  IATTN_PY_ACT_SCALARS()
};

struct mamba3_spec {
  IATTN_PY_SPEC(mamba3, "Mamba-3 SISO: trapezoidal discretisation and data-dependent rotations (complex decay).")
  IATTN_PY_CONFIG(d_model, d_state, expand, headdim, ngroups, rope_fraction, dt_min, dt_max, dt_init_floor, A_floor, eps)
  IATTN_PY_WEIGHTS(in_proj_weight, dt_bias, B_bias, C_bias, B_norm_weight, C_norm_weight, D, out_proj_weight)
  IATTN_PY_ACTS(x, z, B, C, DT, ADT, trap, angles, B_bias, C_bias, D, out_proj_weight)
  IATTN_PY_ACT_SCALARS(ngroups)
};

}  // namespace

void bind_models_more(nb::module_& models) {
  bind_model<hgrn2_spec>(models);
  bind_model<rwkv6_spec>(models);
  bind_model<linear_attention_spec>(models);
  bind_model<mlstm_spec>(models);
  bind_model<s4d_spec>(models);
  bind_model<hyena_spec>(models);
  bind_model<transformer_spec>(models);
  bind_model<deltaproduct_spec>(models);
  bind_model<kimi_linear_spec>(models);
  bind_model<lru_spec>(models);
  bind_model<mamba3_spec>(models);
}

}  // namespace iattn::py
