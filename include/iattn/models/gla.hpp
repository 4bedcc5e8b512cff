// iattn/models/gla.hpp: gated linear attention (Yang et al. 2024) in the form of fla's
// `GatedLinearAttention` (defaults: no short convolution, no feature map, swish output gate fused
// with the per-head RMSNorm), as implicit attention.
//
// Forward, H heads, key width dk = K/H, value width dv = V/H:
//   q, k = q_proj(u), k_proj(u) (L, K);  v, g = v_proj(u), g_proj(u) (L, V)
//   gk = logsigmoid(gk_proj_1(gk_proj_0(u)) + gk_proj_1_bias) / gate_logit_normalizer   (L, K)
//   S_t = diag(exp gk_t) S_{t-1} + k_t v_t^T;  o_t = (q_t / sqrt(dk))^T S_t            (per head)
//   out = o_proj(RMSNorm_head(o) g_norm_swish_gate_weight SiLU(g))
//
// Exact decomposition over the V value channels, inner input x = v:
//   H = diag(SiLU g) N S(lambda = gk, B = k, C = q / sqrt(dk); H heads, dv channels each, H groups)
//   beta = 0
// with N the per-head RMSNorm (its (dv) weight repeated over the heads) bound to its actual input.
// The decay is per state (Nd = N = dk), like Mamba-1's but with P = dv channels sharing it.
#pragma once

#include "../iattn.hpp"
#include "common.hpp"

#include <cstdint>
#include <string>

namespace iattn::models {

struct gla_config {
  Index hidden_size = 64;
  Index key_dim = 32;         ///< K = expand_k * hidden_size (fla's default expand_k = 0.5)
  Index value_dim = 64;       ///< V = expand_v * hidden_size
  Index num_heads = 4;
  Index gate_low_rank_dim = 16;
  double gate_logit_normalizer = 16;
  double norm_eps = 1e-5;
  Index head_k_dim() const { return key_dim / num_heads; }
  Index head_v_dim() const { return value_dim / num_heads; }
};

/// fla `GatedLinearAttention` parameters, '.' written '_' (gk_proj is a Sequential of two Linears).
template <Scalar T>
struct gla_weights {
  gla_config config;
  Matrix<T> q_proj_weight;             ///< (K, hidden)
  Matrix<T> k_proj_weight;             ///< (K, hidden)
  Matrix<T> v_proj_weight;             ///< (V, hidden)
  Matrix<T> g_proj_weight;             ///< (V, hidden)
  Matrix<T> gk_proj_0_weight;          ///< (gate_low_rank_dim, hidden)
  Matrix<T> gk_proj_1_weight;          ///< (K, gate_low_rank_dim)
  Matrix<T> gk_proj_1_bias;            ///< (1, K)
  Matrix<T> g_norm_swish_gate_weight;  ///< (1, head_v_dim), shared by the heads
  Matrix<T> o_proj_weight;             ///< (hidden, V)

  void check() const {
    const auto& c = config;
    using std::to_string;
    const char* m = "gla";
    if (c.num_heads < 1 || c.key_dim % c.num_heads != 0 || c.value_dim % c.num_heads != 0)
      detail::fail(m, "num_heads " + to_string(c.num_heads) + " must divide key_dim = " + to_string(c.key_dim) +
                          " and value_dim = " + to_string(c.value_dim));
    const std::string d = to_string(c.hidden_size), K = to_string(c.key_dim), V = to_string(c.value_dim), R = to_string(c.gate_low_rank_dim);
    check_field(m, "q_proj_weight", q_proj_weight, c.key_dim, c.hidden_size, "(key_dim=" + K + ", hidden_size=" + d + ")");
    check_field(m, "k_proj_weight", k_proj_weight, c.key_dim, c.hidden_size, "(key_dim=" + K + ", hidden_size=" + d + ")");
    check_field(m, "v_proj_weight", v_proj_weight, c.value_dim, c.hidden_size, "(value_dim=" + V + ", hidden_size=" + d + ")");
    check_field(m, "g_proj_weight", g_proj_weight, c.value_dim, c.hidden_size, "(value_dim=" + V + ", hidden_size=" + d + ")");
    check_field(m, "gk_proj_0_weight", gk_proj_0_weight, c.gate_low_rank_dim, c.hidden_size, "(gate_low_rank_dim=" + R + ", hidden_size=" + d + ")");
    check_field(m, "gk_proj_1_weight", gk_proj_1_weight, c.key_dim, c.gate_low_rank_dim, "(key_dim=" + K + ", gate_low_rank_dim=" + R + ")");
    check_field(m, "gk_proj_1_bias", gk_proj_1_bias, 1, c.key_dim, "(1, key_dim=" + K + ")");
    check_field(m, "g_norm_swish_gate_weight", g_norm_swish_gate_weight, 1, c.head_v_dim(), "(1, head_v_dim=" + to_string(c.head_v_dim()) + ")");
    check_field(m, "o_proj_weight", o_proj_weight, c.hidden_size, c.value_dim, "(hidden_size=" + d + ", value_dim=" + V + ")");
  }
};

/// fla's layer initialisation: PyTorch's default Linear init (the layer sets no other), norm weight 1.
template <Scalar T>
gla_weights<T> gla_init(const gla_config& c, std::uint64_t seed = 0) {
  init::generator g(seed);
  gla_weights<T> w;
  w.config = c;
  const Index d = c.hidden_size, R = c.gate_low_rank_dim;
  w.q_proj_weight = init::torch_default<T>(g, c.key_dim, d, d);
  w.k_proj_weight = init::torch_default<T>(g, c.key_dim, d, d);
  w.v_proj_weight = init::torch_default<T>(g, c.value_dim, d, d);
  w.g_proj_weight = init::torch_default<T>(g, c.value_dim, d, d);
  w.gk_proj_0_weight = init::torch_default<T>(g, R, d, d);
  w.gk_proj_1_weight = init::torch_default<T>(g, c.key_dim, R, R);
  w.gk_proj_1_bias = init::torch_default<T>(g, 1, c.key_dim, R);
  w.g_norm_swish_gate_weight = Matrix<T>::Ones(1, c.head_v_dim());
  w.o_proj_weight = init::torch_default<T>(g, d, c.value_dim, c.value_dim);
  return w;
}

template <Scalar T>
struct gla_activations {
  Matrix<T> q, k, v, g, gk;  // q already scaled by 1/sqrt(dk); g before SiLU; gk the log-decay
};

template <Scalar T>
gla_activations<T> gla_project(const gla_weights<T>& w, const Matrix<T>& u) {
  w.check();
  const auto& c = w.config;
  detail::require_shape(u.cols() == c.hidden_size, "gla", "u", u.rows(), u.cols(), "(L, hidden_size=" + std::to_string(c.hidden_size) + ")");
  gla_activations<T> s;
  s.q = nn::linear<T>(u, w.q_proj_weight) / std::sqrt(T(c.head_k_dim()));
  s.k = nn::linear<T>(u, w.k_proj_weight);
  s.v = nn::linear<T>(u, w.v_proj_weight);
  s.g = nn::linear<T>(u, w.g_proj_weight);
  const T inv_norm = T(1 / c.gate_logit_normalizer);
  s.gk = nn::map<T>(nn::linear<T>(nn::linear<T>(u, w.gk_proj_0_weight), w.gk_proj_1_weight, w.gk_proj_1_bias),
                    [inv_norm](T v) { return nn::log_sigmoid(v) * inv_norm; });
  return s;
}

namespace gla_detail {
template <class T>
Matrix<T> norm_weight(const gla_weights<T>& w) { return w.g_norm_swish_gate_weight.replicate(1, w.config.num_heads); }
}  // namespace gla_detail

/// The layer's forward (the oracle).
template <Scalar T>
Matrix<T> gla_forward(const gla_weights<T>& w, const Matrix<T>& u) {
  const auto s = gla_project(w, u);
  Matrix<T> o = nn::gated_state_scan<T>(s.q, s.k, s.v, s.gk, w.config.num_heads);
  nn::group_norm_rows<T>(o, w.config.num_heads, w.config.norm_eps, false, gla_detail::norm_weight(w));
  o.array() *= nn::map<T>(s.g, [](T v) { return nn::silu(v); }).array();
  return nn::linear<T>(o, w.o_proj_weight);
}

/// The decay-weighted scores S(gk, k, q / sqrt(dk)) (no norm, no gate).
template <Scalar T>
auto gla_scores(const gla_activations<T>& s, const gla_config& c) {
  return semiseparable(Matrix<T>(s.gk), Matrix<T>(s.k), Matrix<T>(s.q),
                       {.heads = c.num_heads, .head_dim = c.head_v_dim(), .groups = c.num_heads});
}

/// The exact decomposition: gla_forward(w, u) == d.output(), x = v, beta = 0.
template <Scalar T>
auto gla_decompose(const gla_weights<T>& w, const Matrix<T>& u) {
  const auto s = gla_project(w, u);
  const auto& c = w.config;
  const Index L = u.rows();
  auto S = gla_scores(s, c);
  const Matrix<T> o = apply(S, s.v);
  const auto n = group_norm(c.num_heads, gla_detail::norm_weight(w), {.eps = c.norm_eps});
  auto H = diagonal(nn::map<T>(s.g, [](T v) { return nn::silu(v); })) * n.bound_to(n.compute(o.data(), L, c.value_dim)) * std::move(S);
  return make_decomposition<T>(s.v, std::move(H), Matrix<T>(Matrix<T>::Zero(L, c.value_dim)), w.o_proj_weight);
}

}  // namespace iattn::models
