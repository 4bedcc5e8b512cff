// iattn/models/kimi_linear.hpp: Kimi Delta Attention, the linear-attention layer of Kimi Linear,
// as transformers' `kimi_linear` (`KimiLinearDeltaAttention`) defines it, as implicit attention.
//
// Forward, H heads of d (dk = dv = d):
//   mixed_qkv = [q_proj(u) | k_proj(u) | v_proj(u)] (L, 3 H d);  [q, k, v] = SiLU(conv1d(mixed_qkv))  (no bias)
//   g = -exp(A_log[h]) softplus(f_b_proj(f_a_proj(u)) + dt_bias)        (L, H d), per key, <= 0
//   beta = sigmoid(b_proj(u))                                           (L, H)
//   q = l2norm(q) / sqrt(d), k = l2norm(k) per head (eps 1e-6 on the sum of squares)
//   S_t = (I - beta_t k_t k_t^T) Diag(exp g_t) S_{t-1} + beta_t k_t v_t^T,   o_t = S_t^T q_t
//   y = o / sqrt(mean_head(o^2) + eps) * o_norm_weight * sigmoid(g_b_proj(g_a_proj(u)));  out = o_proj(y)
// The gate decays the state before the delta rule reads it (A = (I - beta k k^T) Diag(alpha)), as
// the reference's recurrence, fla's naive_recurrent_kda and the Kimi Linear paper have it.
//
// Exact decomposition over the H*d value channels, inner input x = v_proj(u) (before the
// convolution), beta = 0: H = diag(sigmoid gate) N T diag(sigmoid p) M (models/delta_rule.hpp), T the
// KDA transition (ops/transition.hpp, kimi_delta_rule).
// The reference computes the recurrence and the norm in float32 whatever the model's dtype.
#pragma once

#include "../iattn.hpp"
#include "common.hpp"
#include "delta_rule.hpp"

#include <cstdint>
#include <string>

namespace iattn::models {

struct kimi_linear_config {
  Index hidden_size = 32;
  Index linear_num_heads = 2;         ///< H
  Index linear_head_dim = 8;          ///< d (= dk = dv)
  Index linear_conv_kernel_dim = 4;   ///< K
  double rms_norm_eps = 1e-5;
  double initializer_range = 0.02;
  Index qkv_dim() const { return linear_num_heads * linear_head_dim; }
};

/// `KimiLinearDeltaAttention` parameters, named as its state_dict ('.' written '_').
template <Scalar T>
struct kimi_linear_weights {
  kimi_linear_config config;
  Matrix<T> q_proj_weight;                ///< (qkv_dim, hidden)
  Matrix<T> k_proj_weight;                ///< (qkv_dim, hidden)
  Matrix<T> v_proj_weight;                ///< (qkv_dim, hidden)
  Matrix<T> conv1d_weight;                ///< (3*qkv_dim, K)   conv1d.weight, PyTorch (3*qkv_dim, 1, K)
  Matrix<T> forget_gate_f_a_proj_weight;  ///< (d, hidden)
  Matrix<T> forget_gate_f_b_proj_weight;  ///< (qkv_dim, d)
  Matrix<T> forget_gate_dt_bias;          ///< (1, qkv_dim)
  Matrix<T> forget_gate_A_log;            ///< (1, H)   the reference's (1, 1, H, 1) flattened
  Matrix<T> b_proj_weight;                ///< (H, hidden)
  Matrix<T> g_a_proj_weight;              ///< (d, hidden)
  Matrix<T> g_b_proj_weight;              ///< (qkv_dim, d)
  Matrix<T> o_norm_weight;                ///< (1, d)
  Matrix<T> o_proj_weight;                ///< (hidden, qkv_dim)

  void check() const {
    const auto& c = config;
    using std::to_string;
    const char* m = "kimi_linear";
    if (c.linear_num_heads < 1 || c.linear_head_dim < 1 || c.linear_conv_kernel_dim < 1)
      detail::fail(m, "linear_num_heads, linear_head_dim and linear_conv_kernel_dim must be >= 1");
    const Index Q = c.qkv_dim(), d = c.linear_head_dim, hid = c.hidden_size, H = c.linear_num_heads;
    const std::string qs = "(qkv_dim=" + to_string(Q), hs = "hidden_size=" + to_string(hid) + ")", ds = "d=" + to_string(d);
    check_field(m, "q_proj_weight", q_proj_weight, Q, hid, qs + ", " + hs);
    check_field(m, "k_proj_weight", k_proj_weight, Q, hid, qs + ", " + hs);
    check_field(m, "v_proj_weight", v_proj_weight, Q, hid, qs + ", " + hs);
    check_field(m, "conv1d_weight", conv1d_weight, 3 * Q, c.linear_conv_kernel_dim,
                "(3*qkv_dim=" + to_string(3 * Q) + ", linear_conv_kernel_dim=" + to_string(c.linear_conv_kernel_dim) + ")");
    check_field(m, "forget_gate_f_a_proj_weight", forget_gate_f_a_proj_weight, d, hid, "(" + ds + ", " + hs);
    check_field(m, "forget_gate_f_b_proj_weight", forget_gate_f_b_proj_weight, Q, d, qs + ", " + ds + ")");
    check_field(m, "forget_gate_dt_bias", forget_gate_dt_bias, 1, Q, "(1, qkv_dim=" + to_string(Q) + ")");
    check_field(m, "forget_gate_A_log", forget_gate_A_log, 1, H, "(1, linear_num_heads=" + to_string(H) + ")");
    check_field(m, "b_proj_weight", b_proj_weight, H, hid, "(linear_num_heads=" + to_string(H) + ", " + hs);
    check_field(m, "g_a_proj_weight", g_a_proj_weight, d, hid, "(" + ds + ", " + hs);
    check_field(m, "g_b_proj_weight", g_b_proj_weight, Q, d, qs + ", " + ds + ")");
    check_field(m, "o_norm_weight", o_norm_weight, 1, d, "(1, " + ds + ")");
    check_field(m, "o_proj_weight", o_proj_weight, hid, Q, "(" + hs.substr(0, hs.size() - 1) + ", qkv_dim=" + to_string(Q) + ")");
  }
};

/// transformers' initialisation: Linear and Conv1d weights N(0, initializer_range), A_log = log U(1, 16),
/// dt_bias the inverse softplus of dt = exp(U(log 1e-3, log 1e-1)) (at least 1e-4), norm weight 1.
template <Scalar T>
kimi_linear_weights<T> kimi_linear_init(const kimi_linear_config& c, std::uint64_t seed = 0) {
  init::generator g(seed);
  kimi_linear_weights<T> w;
  w.config = c;
  const Index Q = c.qkv_dim(), d = c.linear_head_dim, hid = c.hidden_size, H = c.linear_num_heads;
  const double sd = c.initializer_range;
  w.q_proj_weight = init::normal<T>(g, Q, hid, sd);
  w.k_proj_weight = init::normal<T>(g, Q, hid, sd);
  w.v_proj_weight = init::normal<T>(g, Q, hid, sd);
  w.conv1d_weight = init::normal<T>(g, 3 * Q, c.linear_conv_kernel_dim, sd);
  w.forget_gate_f_a_proj_weight = init::normal<T>(g, d, hid, sd);
  w.forget_gate_f_b_proj_weight = init::normal<T>(g, Q, d, sd);
  w.forget_gate_dt_bias.resize(1, Q);
  const Matrix<T> u01 = init::uniform<T>(g, 1, Q, 0.0, 1.0);
  for (Index j = 0; j < Q; ++j) {
    const double dt = std::max(1e-4, std::exp(double(u01(0, j)) * (std::log(0.1) - std::log(0.001)) + std::log(0.001)));
    w.forget_gate_dt_bias(0, j) = T(nn::inverse_softplus(dt));
  }
  w.forget_gate_A_log = init::uniform<T>(g, 1, H, 1.0, 16.0).array().log().matrix();
  w.b_proj_weight = init::normal<T>(g, H, hid, sd);
  w.g_a_proj_weight = init::normal<T>(g, d, hid, sd);
  w.g_b_proj_weight = init::normal<T>(g, Q, d, sd);
  w.o_norm_weight = Matrix<T>::Ones(1, d);
  w.o_proj_weight = init::normal<T>(g, hid, Q, sd);
  return w;
}

/// One forward pass's activations, named as `KimiLinearDeltaAttention.forward` names them, plus the
/// parameters the decomposition reads. mixed_qkv is taken before the convolution; g is the forget
/// gate's output (the per-key log-decay), beta after sigmoid, gate g_b_proj(g_a_proj(u)) before sigmoid.
template <Scalar T>
struct kimi_linear_activations {
  Matrix<T> mixed_qkv;        ///< (L, 3*H*d)  [q_proj(u) | k_proj(u) | v_proj(u)], before conv1d
  Matrix<T> g;                ///< (L, H*d)    per-key log-decay, <= 0
  Matrix<T> beta;             ///< (L, H)
  Matrix<T> gate;             ///< (L, H*d)    the output gate before sigmoid
  Matrix<T> conv1d_weight;    ///< (3*H*d, K)
  Matrix<T> o_norm_weight;    ///< (1, d)
  Matrix<T> o_proj_weight;    ///< (hidden, H*d) or empty
  Index num_heads = 2, head_dim = 8;
  double eps = 1e-5;

  Index length() const { return mixed_qkv.rows(); }
  Index qkv_dim() const { return num_heads * head_dim; }

  void check() const {
    using std::to_string;
    const char* m = "kimi_linear_activations";
    if (num_heads < 1 || head_dim < 1) detail::fail(m, "num_heads and head_dim must be >= 1");
    const Index L = length(), Q = qkv_dim();
    const std::string Ls = "(L=" + to_string(L), Qs = ", H*d=" + to_string(Q) + ")";
    detail::require_shape(mixed_qkv.cols() == 3 * Q, m, "mixed_qkv", mixed_qkv.rows(), mixed_qkv.cols(),
                          "(L, 3*H*d=" + to_string(3 * Q) + ")");
    check_field(m, "g", g, L, Q, Ls + Qs);
    check_field(m, "beta", beta, L, num_heads, Ls + ", H=" + to_string(num_heads) + ")");
    check_field(m, "gate", gate, L, Q, Ls + Qs);
    detail::require_shape(conv1d_weight.rows() == 3 * Q && conv1d_weight.cols() >= 1, m, "conv1d_weight", conv1d_weight.rows(),
                          conv1d_weight.cols(), "(3*H*d=" + to_string(3 * Q) + ", K)");
    check_field(m, "o_norm_weight", o_norm_weight, 1, head_dim, "(1, d=" + to_string(head_dim) + ")");
    if (o_proj_weight.size() != 0)
      detail::require_shape(o_proj_weight.cols() == Q, m, "o_proj_weight", o_proj_weight.rows(), o_proj_weight.cols(),
                            "(hidden, H*d=" + to_string(Q) + ") or empty");
  }
  /// The recurrence's normalised, scaled q, normalised k and values SiLU(conv), (L, H*d) each.
  void qkv(Matrix<T>& q, Matrix<T>& k, Matrix<T>& v) const {
    const Matrix<T> act = nn::map<T>(nn::causal_conv1d<T>(mixed_qkv, conv1d_weight), [](T x) { return nn::silu(x); });
    const Index Q = qkv_dim();
    q = nn::l2norm_groups<T>(act.leftCols(Q), num_heads) / std::sqrt(T(head_dim));
    k = nn::l2norm_groups<T>(act.middleCols(Q, Q), num_heads);
    v = act.rightCols(Q);
  }
};

/// The activations of one forward pass on u (L, hidden), o_proj included.
template <Scalar T>
kimi_linear_activations<T> activations(const kimi_linear_weights<T>& w, const Matrix<T>& u) {
  w.check();
  const auto& c = w.config;
  detail::require_shape(u.cols() == c.hidden_size, "kimi_linear", "u", u.rows(), u.cols(),
                        "(L, hidden_size=" + std::to_string(c.hidden_size) + ")");
  const Index L = u.rows(), Q = c.qkv_dim(), d = c.linear_head_dim;
  kimi_linear_activations<T> s;
  s.mixed_qkv.resize(L, 3 * Q);
  s.mixed_qkv << nn::linear<T>(u, w.q_proj_weight), nn::linear<T>(u, w.k_proj_weight), nn::linear<T>(u, w.v_proj_weight);
  const Matrix<T> f = nn::linear<T>(nn::linear<T>(u, w.forget_gate_f_a_proj_weight), w.forget_gate_f_b_proj_weight);
  s.g.resize(L, Q);
  for (Index t = 0; t < L; ++t)
    for (Index j = 0; j < Q; ++j) s.g(t, j) = -std::exp(w.forget_gate_A_log(0, j / d)) * nn::softplus(f(t, j) + w.forget_gate_dt_bias(0, j));
  s.beta = nn::map<T>(nn::linear<T>(u, w.b_proj_weight), [](T b) { return nn::sigmoid(b); });
  s.gate = nn::linear<T>(nn::linear<T>(u, w.g_a_proj_weight), w.g_b_proj_weight);
  s.conv1d_weight = w.conv1d_weight;
  s.o_norm_weight = w.o_norm_weight;
  s.o_proj_weight = w.o_proj_weight;
  s.num_heads = c.linear_num_heads;
  s.head_dim = d;
  s.eps = c.rms_norm_eps;
  return s;
}

/// The layer's plain recurrent forward (the oracle). final_state, when given, receives the
/// recurrent state after the last token, (H*d, d): last_recurrent_state (1, H, dk, dv) flattened.
template <Scalar T>
Matrix<T> kimi_linear_forward(const kimi_linear_weights<T>& w, const Matrix<T>& u, Matrix<T>* final_state = nullptr) {
  const auto s = activations(w, u);
  Matrix<T> q, k, v;
  s.qkv(q, k, v);
  Matrix<T> o = nn::delta_rule_scan<T>(q, k, v, s.beta, s.g, s.num_heads, final_state);
  nn::group_norm_rows<T>(o, s.num_heads, s.eps, false, Matrix<T>(s.o_norm_weight.replicate(1, s.num_heads)));
  o.array() *= nn::map<T>(s.gate, [](T x) { return nn::sigmoid(x); }).array();
  return nn::linear<T>(o, w.o_proj_weight);
}

/// The KDA transition T of the layer (no convolution, norm or gate), per head.
template <Scalar T>
Transition<T> kimi_linear_transition(const kimi_linear_activations<T>& s) {
  s.check();
  Matrix<T> q, k, v;
  s.qkv(q, k, v);
  return kimi_delta_rule(std::move(q), std::move(k), s.beta, s.g,
                         transition_options{.heads = s.num_heads, .head_dim = s.head_dim, .state = s.head_dim});
}

/// The exact decomposition from activations; with o_proj_weight empty, output() is the gated, normed
/// inner output.
template <Scalar T>
auto attention(const kimi_linear_activations<T>& s) {
  s.check();
  const Index Q = s.qkv_dim();
  return delta_detail::decomposition_of<T>(kimi_linear_transition(s), Matrix<T>(s.mixed_qkv.rightCols(Q)),
                                           depthwise_taps(s.conv1d_weight.bottomRows(Q)),
                                           nn::map<T>(s.gate, [](T x) { return nn::sigmoid(x); }), s.o_norm_weight, s.num_heads,
                                           s.eps, s.o_proj_weight);
}

/// The exact decomposition: kimi_linear_forward(w, u) == d.output(), x = v_proj(u).
template <Scalar T>
auto decompose(const kimi_linear_weights<T>& w, const Matrix<T>& u) { return attention(activations(w, u)); }

/// The exact decomposition (the named form of decompose).
template <Scalar T>
auto kimi_linear_decompose(const kimi_linear_weights<T>& w, const Matrix<T>& u) { return decompose(w, u); }

/// The recurrent state after the last token, (H*d, d), from the backward running product.
template <Scalar T>
Matrix<T> final_state(const kimi_linear_activations<T>& s) {
  s.check();
  Matrix<T> q, k, v;
  s.qkv(q, k, v);
  return delta_final_state<T>(k, v, s.beta, s.g, s.num_heads);
}

}  // namespace iattn::models
