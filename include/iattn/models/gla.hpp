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
//
// From activations (docs/models.md): gla_activations holds q, k, v, gk, g, the norm weight (and
// optionally o_proj_weight); attention(acts) is the decomposition, decompose(w, u) ==
// attention(activations(w, u)), final_state(acts) fla's recurrent_state (H*dk, dv).
#pragma once

#include "../iattn.hpp"
#include "common.hpp"
#include "recurrent_state.hpp"

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

/// One forward pass's activations, named as fla's `GatedLinearAttention.forward` names them (gk after
/// `F.logsigmoid(gk) / gate_logit_normalizer`), plus the layer parameters the decomposition reads:
/// everything `attention(acts)` needs. q is as q_proj returns it: the kernels' scale head_k_dim^-1/2
/// is applied by attention, as by fla's fused_recurrent_gla. Built by `activations(w, u)` or by hand.
template <Scalar T>
struct gla_activations {
  Matrix<T> q;                         ///< (L, K)   q_proj(u), unscaled: the scores' C (times dk^-1/2)
  Matrix<T> k;                         ///< (L, K)   keys: the scores' B
  Matrix<T> v;                         ///< (L, V)   values: the inner input x
  Matrix<T> gk;                        ///< (L, K)   log-decay, <= 0
  Matrix<T> g;                         ///< (L, V)   output gate before SiLU
  Matrix<T> g_norm_swish_gate_weight;  ///< (1, dv) or empty (1): the per-head RMSNorm's weight, shared by the heads
  Matrix<T> o_proj_weight;             ///< (hidden, V) or empty (the decomposition stops before o_proj)
  Index num_heads = 4;                 ///< H: K and V split into H heads of dk = K/H, dv = V/H
  double norm_eps = 1e-5;              ///< g_norm_swish_gate's eps

  Index length() const { return v.rows(); }
  Index head_k_dim() const { return q.cols() / num_heads; }
  Index head_v_dim() const { return v.cols() / num_heads; }

  /// Throws std::invalid_argument naming the first field whose shape disagrees (L, K from q; V from v).
  void check() const {
    using std::to_string;
    const char* m = "gla_activations";
    if (num_heads < 1) detail::fail(m, "num_heads is " + to_string(num_heads) + " but must be >= 1");
    const Index L = length(), K = q.cols(), V = v.cols(), H = num_heads;
    const std::string div = " divisible by num_heads=" + to_string(H);
    detail::require_shape(K >= 1 && K % H == 0, m, "q", q.rows(), q.cols(), "(L, K) with K" + div);
    detail::require_shape(V >= 1 && V % H == 0 && v.rows() == q.rows(), m, "v", v.rows(), v.cols(), "(L=" + to_string(q.rows()) + ", V) with V" + div);
    const std::string LK = "(L=" + to_string(L) + ", K=" + to_string(K) + ")", LV = "(L=" + to_string(L) + ", V=" + to_string(V) + ")";
    check_field(m, "k", k, L, K, LK);
    check_field(m, "gk", gk, L, K, LK);
    check_field(m, "g", g, L, V, LV);
    if (g_norm_swish_gate_weight.size() != 0)
      check_field(m, "g_norm_swish_gate_weight", g_norm_swish_gate_weight, 1, V / H, "(1, head_v_dim=" + to_string(V / H) + ") or empty");
    if (o_proj_weight.size() != 0)
      detail::require_shape(o_proj_weight.cols() == V, m, "o_proj_weight", o_proj_weight.rows(), o_proj_weight.cols(), "(hidden, V=" + to_string(V) + ") or empty");
  }
};

/// The activations of one forward pass of the layer on u (L, hidden), o_proj_weight included.
template <Scalar T>
gla_activations<T> activations(const gla_weights<T>& w, const Matrix<T>& u) {
  w.check();
  const auto& c = w.config;
  detail::require_shape(u.cols() == c.hidden_size, "gla", "u", u.rows(), u.cols(), "(L, hidden_size=" + std::to_string(c.hidden_size) + ")");
  gla_activations<T> s;
  s.q = nn::linear<T>(u, w.q_proj_weight);
  s.k = nn::linear<T>(u, w.k_proj_weight);
  s.v = nn::linear<T>(u, w.v_proj_weight);
  s.g = nn::linear<T>(u, w.g_proj_weight);
  const T inv_norm = T(1 / c.gate_logit_normalizer);
  s.gk = nn::map<T>(nn::linear<T>(nn::linear<T>(u, w.gk_proj_0_weight), w.gk_proj_1_weight, w.gk_proj_1_bias),
                    [inv_norm](T v) { return nn::log_sigmoid(v) * inv_norm; });
  s.g_norm_swish_gate_weight = w.g_norm_swish_gate_weight;
  s.o_proj_weight = w.o_proj_weight;
  s.num_heads = c.num_heads;
  s.norm_eps = c.norm_eps;
  return s;
}

/// The layer's forward (the oracle). final_state, when given, receives the matrix state after the
/// last token (H*dk, dv), fla's final_state (H, dk, dv) flattened.
template <Scalar T>
Matrix<T> gla_forward(const gla_weights<T>& w, const Matrix<T>& u, Matrix<T>* final_state = nullptr) {
  const auto s = activations(w, u);
  const Matrix<T> q = s.q / std::sqrt(T(w.config.head_k_dim()));
  Matrix<T> o = nn::gated_state_scan<T>(q, s.k, s.v, s.gk, w.config.num_heads, {}, final_state);
  nn::group_norm_rows<T>(o, w.config.num_heads, w.config.norm_eps, false, Matrix<T>(w.g_norm_swish_gate_weight.replicate(1, w.config.num_heads)));
  o.array() *= nn::map<T>(s.g, [](T v) { return nn::silu(v); }).array();
  return nn::linear<T>(o, w.o_proj_weight);
}

/// The decay-weighted scores S(gk, k, q / sqrt(dk)) (no norm, no gate).
template <Scalar T>
auto gla_scores(const gla_activations<T>& s) {
  s.check();
  const Index H = s.num_heads;
  return semiseparable(s.gk, s.k, Matrix<T>(s.q / std::sqrt(T(s.head_k_dim()))), {.heads = H, .head_dim = s.head_v_dim(), .groups = H});
}
/// The scores of the layer on u (L, hidden): gla_scores(activations(w, u)).
template <Scalar T>
auto gla_scores(const gla_weights<T>& w, const Matrix<T>& u) { return gla_scores(activations(w, u)); }

/// The exact decomposition from activations (see the header comment); with o_proj_weight empty,
/// output() is the inner output RMSNorm_head(o) * SiLU(g).
template <Scalar T>
auto attention(const gla_activations<T>& s) {
  s.check();
  const Index L = s.length(), H = s.num_heads;
  auto S = gla_scores(s);
  const Matrix<T> o = apply(S, s.v);
  const group_norm_options opts{.eps = s.norm_eps};
  const auto n = s.g_norm_swish_gate_weight.size() ? group_norm(H, Matrix<T>(s.g_norm_swish_gate_weight.replicate(1, H)), opts)
                                                   : group_norm<T>(H, opts);
  auto H_ = diagonal(nn::map<T>(s.g, [](T v) { return nn::silu(v); })) * n.bound_to(n.compute(o.data(), L, s.v.cols())) * std::move(S);
  return make_decomposition<T>(s.v, std::move(H_), Matrix<T>(Matrix<T>::Zero(L, s.v.cols())), s.o_proj_weight);
}

/// The exact decomposition: gla_forward(w, u) == d.output(), x = v, beta = 0.
template <Scalar T>
auto decompose(const gla_weights<T>& w, const Matrix<T>& u) { return attention(activations(w, u)); }

/// The exact decomposition (the named form of decompose).
template <Scalar T>
auto gla_decompose(const gla_weights<T>& w, const Matrix<T>& u) { return decompose(w, u); }

/// The matrix state after the last token, (H*dk, dv): fla's final_state / recurrent_state (H, dk, dv)
/// flattened, S[h*dk + i, j] = sum_s exp(sum_{r>s} gk_r[i]) k_s[i] v_s[j], in log space.
template <Scalar T>
Matrix<T> final_state(const gla_activations<T>& s) {
  s.check();
  return gated_final_state(s.k, s.v, s.gk, s.num_heads);
}

}  // namespace iattn::models
