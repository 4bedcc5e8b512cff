// iattn/models/qwen3_next.hpp: the Gated DeltaNet layer of Qwen3-Next (and the Qwen3.5 family's
// linear-attention layers), as transformers' `Qwen3NextGatedDeltaNet` defines it, as implicit
// attention.
//
// Forward, nk key heads of dk, nv value heads of dv (r = nv / nk value heads per key head):
//   qkvz = in_proj_qkvz(u), ba = in_proj_ba(u), split per key head j (fix_query_key_value_ordering):
//     [q_j (dk), k_j (dk), v_j (r dv), z_j (r dv)] and [b_j (r), a_j (r)]; value head j*r + i.
//   mixed_qkv = [q | k | v] (L, 2 nk dk + nv dv);  [q, k, v] = SiLU(conv1d(mixed_qkv))  (no bias)
//   beta = sigmoid(b), g = -exp(A_log) softplus(a + dt_bias)                       (L, nv)
//   q = l2norm(q) / sqrt(dk), k = l2norm(k) per key head (eps 1e-6), repeated to the nv value heads
//   S_t = exp(g_t) (I - beta_t k_t k_t^T) S_{t-1} + beta_t k_t v_t^T,  o_t = S_t^T q_t   (per value head)
//   y = RMSNormGated(o, z) = o / sqrt(mean_head(o^2) + eps) * norm_weight * SiLU(z);  out = out_proj(y)
//
// Exact decomposition over the nv*dv value channels, inner input x = the value part of mixed_qkv
// (before the convolution), beta = 0 (the conv has no bias):
//   H = diag(SiLU z) N T diag(sigmoid p) M
// with M the value channels' depthwise convolution, p = M x (so SiLU(p) = sigmoid(p) p), T the gated
// delta rule (ops/transition.hpp) over the value heads with the normalised q, k, beta, g frozen, and
// N the per-head RMS norm bound to the statistics of its actual input.
//
// Qwen3.5 (`Qwen3_5GatedDeltaNet`) is the same layer with four plain projections instead of the two
// grouped ones: in_proj_qkv = [q | k | v] (2 nk dk + nv dv rows, already in mixed_qkv's order),
// in_proj_z, in_proj_b, in_proj_a (qwen3_5_weights below; its activations are qwen3_next_activations).
//
// The reference computes the recurrence and the norm in float32 even when the model is double
// (`.to(torch.float32)` in torch_chunk_gated_delta_rule and Qwen3NextRMSNormGated): its double output
// agrees with the exact value to float precision only (docs/models.md).
#pragma once

#include "../iattn.hpp"
#include "common.hpp"
#include "delta_rule.hpp"

#include <cstdint>
#include <string>

namespace iattn::models {

struct qwen3_next_config {
  Index hidden_size = 64;
  Index linear_num_value_heads = 4;  ///< nv
  Index linear_num_key_heads = 2;    ///< nk, divides nv
  Index linear_key_head_dim = 16;    ///< dk (N)
  Index linear_value_head_dim = 16;  ///< dv (P)
  Index linear_conv_kernel_dim = 4;  ///< K
  double rms_norm_eps = 1e-6;
  double initializer_range = 0.02;
  Index key_dim() const { return linear_num_key_heads * linear_key_head_dim; }
  Index value_dim() const { return linear_num_value_heads * linear_value_head_dim; }
  Index conv_dim() const { return 2 * key_dim() + value_dim(); }
  Index heads_per_key() const { return linear_num_value_heads / linear_num_key_heads; }
};

/// `Qwen3NextGatedDeltaNet` parameters, named as its state_dict ('.' written '_').
template <Scalar T>
struct qwen3_next_weights {
  qwen3_next_config config;
  Matrix<T> in_proj_qkvz_weight;  ///< (2*key_dim + 2*value_dim, hidden)   in_proj_qkvz.weight
  Matrix<T> in_proj_ba_weight;    ///< (2*nv, hidden)                      in_proj_ba.weight
  Matrix<T> conv1d_weight;        ///< (conv_dim, K)   conv1d.weight, PyTorch (conv_dim, 1, K)
  Matrix<T> dt_bias;              ///< (1, nv)         dt_bias
  Matrix<T> A_log;                ///< (1, nv)         A_log
  Matrix<T> norm_weight;          ///< (1, dv)         norm.weight, shared by the value heads
  Matrix<T> out_proj_weight;      ///< (hidden, value_dim)   out_proj.weight

  void check() const {
    const auto& c = config;
    using std::to_string;
    const char* m = "qwen3_next";
    if (c.linear_num_key_heads < 1 || c.linear_num_value_heads < 1 || c.linear_num_value_heads % c.linear_num_key_heads != 0)
      detail::fail(m, "linear_num_key_heads " + to_string(c.linear_num_key_heads) + " must be >= 1 and divide linear_num_value_heads = " +
                          to_string(c.linear_num_value_heads));
    if (c.linear_key_head_dim < 1 || c.linear_value_head_dim < 1 || c.linear_conv_kernel_dim < 1)
      detail::fail(m, "linear_key_head_dim, linear_value_head_dim and linear_conv_kernel_dim must be >= 1");
    const std::string d = to_string(c.hidden_size), nv = to_string(c.linear_num_value_heads);
    check_field(m, "in_proj_qkvz_weight", in_proj_qkvz_weight, 2 * c.key_dim() + 2 * c.value_dim(), c.hidden_size,
                "(2*key_dim + 2*value_dim=" + to_string(2 * c.key_dim() + 2 * c.value_dim()) + ", hidden_size=" + d + ")");
    check_field(m, "in_proj_ba_weight", in_proj_ba_weight, 2 * c.linear_num_value_heads, c.hidden_size,
                "(2*linear_num_value_heads=" + to_string(2 * c.linear_num_value_heads) + ", hidden_size=" + d + ")");
    check_field(m, "conv1d_weight", conv1d_weight, c.conv_dim(), c.linear_conv_kernel_dim,
                "(conv_dim=" + to_string(c.conv_dim()) + ", linear_conv_kernel_dim=" + to_string(c.linear_conv_kernel_dim) + ")");
    check_field(m, "dt_bias", dt_bias, 1, c.linear_num_value_heads, "(1, linear_num_value_heads=" + nv + ")");
    check_field(m, "A_log", A_log, 1, c.linear_num_value_heads, "(1, linear_num_value_heads=" + nv + ")");
    check_field(m, "norm_weight", norm_weight, 1, c.linear_value_head_dim, "(1, linear_value_head_dim=" + to_string(c.linear_value_head_dim) + ")");
    check_field(m, "out_proj_weight", out_proj_weight, c.hidden_size, c.value_dim(),
                "(hidden_size=" + d + ", value_dim=" + to_string(c.value_dim()) + ")");
  }
};

/// transformers' initialisation: Linear and Conv1d weights N(0, initializer_range), dt_bias 1,
/// A_log = log U(0, 16), norm weight 1.
template <Scalar T>
qwen3_next_weights<T> qwen3_next_init(const qwen3_next_config& c, std::uint64_t seed = 0) {
  init::generator g(seed);
  qwen3_next_weights<T> w;
  w.config = c;
  const Index d = c.hidden_size, nv = c.linear_num_value_heads;
  const double sd = c.initializer_range;
  w.in_proj_qkvz_weight = init::normal<T>(g, 2 * c.key_dim() + 2 * c.value_dim(), d, sd);
  w.in_proj_ba_weight = init::normal<T>(g, 2 * nv, d, sd);
  w.conv1d_weight = init::normal<T>(g, c.conv_dim(), c.linear_conv_kernel_dim, sd);
  w.dt_bias = Matrix<T>::Ones(1, nv);
  w.A_log = init::uniform<T>(g, 1, nv, 1e-6, 16.0).array().log().matrix();
  w.norm_weight = Matrix<T>::Ones(1, c.linear_value_head_dim);
  w.out_proj_weight = init::normal<T>(g, d, c.value_dim(), sd);
  return w;
}

/// One forward pass's activations, named as `Qwen3NextGatedDeltaNet.forward` names them, plus the
/// parameters the decomposition reads. mixed_qkv is taken before the convolution (the
/// decomposition's inner input is its value part); beta and g after their formulas.
template <Scalar T>
struct qwen3_next_activations {
  Matrix<T> mixed_qkv;        ///< (L, 2*nk*dk + nv*dv)  [query | key | value] before conv1d
  Matrix<T> z;                ///< (L, nv*dv)   the output gate, before SiLU
  Matrix<T> beta;             ///< (L, nv)      sigmoid(b)
  Matrix<T> g;                ///< (L, nv)      -exp(A_log) softplus(a + dt_bias), <= 0
  Matrix<T> conv1d_weight;    ///< (conv_dim, K)
  Matrix<T> norm_weight;      ///< (1, dv)
  Matrix<T> out_proj_weight;  ///< (hidden, nv*dv) or empty (the decomposition stops before out_proj)
  Index num_k_heads = 2, num_v_heads = 4, head_k_dim = 16, head_v_dim = 16;
  double eps = 1e-6;          ///< the gated RMS norm's eps (config.rms_norm_eps)

  Index length() const { return mixed_qkv.rows(); }
  Index key_dim() const { return num_k_heads * head_k_dim; }
  Index value_dim() const { return num_v_heads * head_v_dim; }

  void check() const {
    using std::to_string;
    const char* m = "qwen3_next_activations";
    if (num_k_heads < 1 || num_v_heads < 1 || num_v_heads % num_k_heads != 0 || head_k_dim < 1 || head_v_dim < 1)
      detail::fail(m, "num_k_heads " + to_string(num_k_heads) + ", num_v_heads " + to_string(num_v_heads) + ", head_k_dim " +
                          to_string(head_k_dim) + ", head_v_dim " + to_string(head_v_dim) +
                          ": all must be >= 1 and num_k_heads must divide num_v_heads");
    const Index L = length(), cd = 2 * key_dim() + value_dim(), nv = num_v_heads;
    const std::string Ls = "(L=" + to_string(L);
    detail::require_shape(mixed_qkv.cols() == cd, m, "mixed_qkv", mixed_qkv.rows(), mixed_qkv.cols(),
                          "(L, 2*num_k_heads*head_k_dim + num_v_heads*head_v_dim=" + to_string(cd) + ")");
    check_field(m, "z", z, L, value_dim(), Ls + ", num_v_heads*head_v_dim=" + to_string(value_dim()) + ")");
    check_field(m, "beta", beta, L, nv, Ls + ", num_v_heads=" + to_string(nv) + ")");
    check_field(m, "g", g, L, nv, Ls + ", num_v_heads=" + to_string(nv) + ")");
    detail::require_shape(conv1d_weight.rows() == cd && conv1d_weight.cols() >= 1, m, "conv1d_weight", conv1d_weight.rows(),
                          conv1d_weight.cols(), "(conv_dim=" + to_string(cd) + ", K)");
    check_field(m, "norm_weight", norm_weight, 1, head_v_dim, "(1, head_v_dim=" + to_string(head_v_dim) + ")");
    if (out_proj_weight.size() != 0)
      detail::require_shape(out_proj_weight.cols() == value_dim(), m, "out_proj_weight", out_proj_weight.rows(), out_proj_weight.cols(),
                            "(hidden, num_v_heads*head_v_dim=" + to_string(value_dim()) + ") or empty");
  }
  /// The convolution's output before SiLU, (L, conv_dim).
  Matrix<T> conv_out() const { return nn::causal_conv1d<T>(mixed_qkv, conv1d_weight); }
  /// The normalised, scaled queries and the normalised keys per value head, (L, nv*dk) each, and the
  /// values SiLU(conv) (L, nv*dv): the recurrence's q, k and v.
  void qkv(Matrix<T>& q, Matrix<T>& k, Matrix<T>& v) const {
    const Matrix<T> act = nn::map<T>(conv_out(), [](T x) { return nn::silu(x); });
    const Index K = key_dim(), r = num_v_heads / num_k_heads;
    q = nn::repeat_heads<T>(Matrix<T>(nn::l2norm_groups<T>(act.leftCols(K), num_k_heads) / std::sqrt(T(head_k_dim))), num_k_heads, r);
    k = nn::repeat_heads<T>(nn::l2norm_groups<T>(act.middleCols(K, K), num_k_heads), num_k_heads, r);
    v = act.rightCols(value_dim());
  }
};

/// The activations of one forward pass on u (L, hidden), out_proj included.
template <Scalar T>
qwen3_next_activations<T> activations(const qwen3_next_weights<T>& w, const Matrix<T>& u) {
  w.check();
  const auto& c = w.config;
  detail::require_shape(u.cols() == c.hidden_size, "qwen3_next", "u", u.rows(), u.cols(),
                        "(L, hidden_size=" + std::to_string(c.hidden_size) + ")");
  const Index L = u.rows(), nk = c.linear_num_key_heads, dk = c.linear_key_head_dim, dv = c.linear_value_head_dim;
  const Index r = c.heads_per_key(), K = c.key_dim(), V = c.value_dim(), nv = c.linear_num_value_heads;
  const Matrix<T> qkvz = nn::linear<T>(u, w.in_proj_qkvz_weight), ba = nn::linear<T>(u, w.in_proj_ba_weight);
  qwen3_next_activations<T> s;
  s.mixed_qkv.resize(L, c.conv_dim());
  s.z.resize(L, V);
  s.beta.resize(L, nv);
  s.g.resize(L, nv);
  const Index span = 2 * dk + 2 * r * dv;  // one key head's slice of qkvz
  for (Index j = 0; j < nk; ++j) {
    s.mixed_qkv.middleCols(j * dk, dk) = qkvz.middleCols(j * span, dk);
    s.mixed_qkv.middleCols(K + j * dk, dk) = qkvz.middleCols(j * span + dk, dk);
    s.mixed_qkv.middleCols(2 * K + j * r * dv, r * dv) = qkvz.middleCols(j * span + 2 * dk, r * dv);
    s.z.middleCols(j * r * dv, r * dv) = qkvz.middleCols(j * span + 2 * dk + r * dv, r * dv);
  }
  for (Index t = 0; t < L; ++t)
    for (Index j = 0; j < nk; ++j)
      for (Index i = 0; i < r; ++i) {
        const Index h = j * r + i;
        s.beta(t, h) = nn::sigmoid(ba(t, j * 2 * r + i));
        s.g(t, h) = -std::exp(w.A_log(0, h)) * nn::softplus(ba(t, j * 2 * r + r + i) + w.dt_bias(0, h));
      }
  s.conv1d_weight = w.conv1d_weight;
  s.norm_weight = w.norm_weight;
  s.out_proj_weight = w.out_proj_weight;
  s.num_k_heads = nk;
  s.num_v_heads = nv;
  s.head_k_dim = dk;
  s.head_v_dim = dv;
  s.eps = c.rms_norm_eps;
  return s;
}

/// The gated RMS norm of Qwen3NextRMSNormGated per value head: o / sqrt(mean(o^2) + eps) * weight * SiLU(z).
template <Scalar T>
Matrix<T> qwen3_next_gated_norm(const qwen3_next_activations<T>& s, const Matrix<T>& o) {
  Matrix<T> y = o;
  nn::group_norm_rows<T>(y, s.num_v_heads, s.eps, false, Matrix<T>(s.norm_weight.replicate(1, s.num_v_heads)));
  y.array() *= nn::map<T>(s.z, [](T v) { return nn::silu(v); }).array();
  return y;
}

/// `Qwen3_5GatedDeltaNet` parameters (Qwen3.5's linear-attention layers): the Qwen3-Next layer with
/// plain projections, named as its state_dict ('.' written '_').
template <Scalar T>
struct qwen3_5_weights {
  qwen3_next_config config;  ///< the same linear_* fields as Qwen3-Next
  Matrix<T> in_proj_qkv_weight;  ///< (2*key_dim + value_dim, hidden)   rows [q | k | v], head-major
  Matrix<T> in_proj_z_weight;    ///< (value_dim, hidden)
  Matrix<T> in_proj_b_weight;    ///< (nv, hidden)
  Matrix<T> in_proj_a_weight;    ///< (nv, hidden)
  Matrix<T> conv1d_weight;       ///< (conv_dim, K)
  Matrix<T> dt_bias, A_log;      ///< (1, nv) each
  Matrix<T> norm_weight;         ///< (1, dv)
  Matrix<T> out_proj_weight;     ///< (hidden, value_dim)

  void check() const {
    const auto& c = config;
    using std::to_string;
    const char* m = "qwen3_5";
    if (c.linear_num_key_heads < 1 || c.linear_num_value_heads < 1 || c.linear_num_value_heads % c.linear_num_key_heads != 0 ||
        c.linear_key_head_dim < 1 || c.linear_value_head_dim < 1 || c.linear_conv_kernel_dim < 1)
      detail::fail(m, "linear_num_key_heads must divide linear_num_value_heads, and every linear_* size must be >= 1");
    const std::string d = to_string(c.hidden_size), nv = to_string(c.linear_num_value_heads), V = to_string(c.value_dim());
    check_field(m, "in_proj_qkv_weight", in_proj_qkv_weight, c.conv_dim(), c.hidden_size, "(conv_dim=" + to_string(c.conv_dim()) + ", hidden_size=" + d + ")");
    check_field(m, "in_proj_z_weight", in_proj_z_weight, c.value_dim(), c.hidden_size, "(value_dim=" + V + ", hidden_size=" + d + ")");
    check_field(m, "in_proj_b_weight", in_proj_b_weight, c.linear_num_value_heads, c.hidden_size, "(nv=" + nv + ", hidden_size=" + d + ")");
    check_field(m, "in_proj_a_weight", in_proj_a_weight, c.linear_num_value_heads, c.hidden_size, "(nv=" + nv + ", hidden_size=" + d + ")");
    check_field(m, "conv1d_weight", conv1d_weight, c.conv_dim(), c.linear_conv_kernel_dim,
                "(conv_dim=" + to_string(c.conv_dim()) + ", linear_conv_kernel_dim=" + to_string(c.linear_conv_kernel_dim) + ")");
    check_field(m, "dt_bias", dt_bias, 1, c.linear_num_value_heads, "(1, nv=" + nv + ")");
    check_field(m, "A_log", A_log, 1, c.linear_num_value_heads, "(1, nv=" + nv + ")");
    check_field(m, "norm_weight", norm_weight, 1, c.linear_value_head_dim, "(1, dv=" + to_string(c.linear_value_head_dim) + ")");
    check_field(m, "out_proj_weight", out_proj_weight, c.hidden_size, c.value_dim(), "(hidden_size=" + d + ", value_dim=" + V + ")");
  }
};

/// The Qwen3.5 layer with the weights of a Qwen3-Next layer, its grouped projections reordered
/// (the two layers then compute the same function): for tests and for converting checkpoints.
template <Scalar T>
qwen3_5_weights<T> qwen3_5_from_qwen3_next(const qwen3_next_weights<T>& w) {
  w.check();
  const auto& c = w.config;
  const Index nk = c.linear_num_key_heads, dk = c.linear_key_head_dim, dv = c.linear_value_head_dim, r = c.heads_per_key();
  const Index K = c.key_dim(), span = 2 * dk + 2 * r * dv, d = c.hidden_size;
  qwen3_5_weights<T> o;
  o.config = c;
  o.in_proj_qkv_weight.resize(c.conv_dim(), d);
  o.in_proj_z_weight.resize(c.value_dim(), d);
  o.in_proj_b_weight.resize(c.linear_num_value_heads, d);
  o.in_proj_a_weight.resize(c.linear_num_value_heads, d);
  for (Index j = 0; j < nk; ++j) {
    o.in_proj_qkv_weight.middleRows(j * dk, dk) = w.in_proj_qkvz_weight.middleRows(j * span, dk);
    o.in_proj_qkv_weight.middleRows(K + j * dk, dk) = w.in_proj_qkvz_weight.middleRows(j * span + dk, dk);
    o.in_proj_qkv_weight.middleRows(2 * K + j * r * dv, r * dv) = w.in_proj_qkvz_weight.middleRows(j * span + 2 * dk, r * dv);
    o.in_proj_z_weight.middleRows(j * r * dv, r * dv) = w.in_proj_qkvz_weight.middleRows(j * span + 2 * dk + r * dv, r * dv);
    o.in_proj_b_weight.middleRows(j * r, r) = w.in_proj_ba_weight.middleRows(j * 2 * r, r);
    o.in_proj_a_weight.middleRows(j * r, r) = w.in_proj_ba_weight.middleRows(j * 2 * r + r, r);
  }
  o.conv1d_weight = w.conv1d_weight;
  o.dt_bias = w.dt_bias;
  o.A_log = w.A_log;
  o.norm_weight = w.norm_weight;
  o.out_proj_weight = w.out_proj_weight;
  return o;
}

/// The activations of one Qwen3.5 forward pass on u (L, hidden): the same fields as Qwen3-Next's.
template <Scalar T>
qwen3_next_activations<T> activations(const qwen3_5_weights<T>& w, const Matrix<T>& u) {
  w.check();
  const auto& c = w.config;
  detail::require_shape(u.cols() == c.hidden_size, "qwen3_5", "u", u.rows(), u.cols(), "(L, hidden_size=" + std::to_string(c.hidden_size) + ")");
  const Index L = u.rows(), nv = c.linear_num_value_heads;
  qwen3_next_activations<T> s;
  s.mixed_qkv = nn::linear<T>(u, w.in_proj_qkv_weight);
  s.z = nn::linear<T>(u, w.in_proj_z_weight);
  const Matrix<T> b = nn::linear<T>(u, w.in_proj_b_weight), a = nn::linear<T>(u, w.in_proj_a_weight);
  s.beta.resize(L, nv);
  s.g.resize(L, nv);
  for (Index t = 0; t < L; ++t)
    for (Index h = 0; h < nv; ++h) {
      s.beta(t, h) = nn::sigmoid(b(t, h));
      s.g(t, h) = -std::exp(w.A_log(0, h)) * nn::softplus(a(t, h) + w.dt_bias(0, h));
    }
  s.conv1d_weight = w.conv1d_weight;
  s.norm_weight = w.norm_weight;
  s.out_proj_weight = w.out_proj_weight;
  s.num_k_heads = c.linear_num_key_heads;
  s.num_v_heads = nv;
  s.head_k_dim = c.linear_key_head_dim;
  s.head_v_dim = c.linear_value_head_dim;
  s.eps = c.rms_norm_eps;
  return s;
}

/// The layer's plain recurrent forward (the oracle). final_state, when given, receives the
/// recurrent state after the last token, (nv*dk, dv): transformers' last_recurrent_state
/// (1, nv, dk, dv) flattened.
template <Scalar T>
Matrix<T> qwen3_next_forward(const qwen3_next_weights<T>& w, const Matrix<T>& u, Matrix<T>* final_state = nullptr) {
  const auto s = activations(w, u);
  Matrix<T> q, k, v;
  s.qkv(q, k, v);
  const Matrix<T> o = nn::delta_rule_scan<T>(q, k, v, s.beta, s.g, s.num_v_heads, final_state);
  return nn::linear<T>(qwen3_next_gated_norm(s, o), w.out_proj_weight);
}

/// The Qwen3.5 layer's plain recurrent forward (the oracle), as qwen3_next_forward.
template <Scalar T>
Matrix<T> qwen3_5_forward(const qwen3_5_weights<T>& w, const Matrix<T>& u, Matrix<T>* final_state = nullptr) {
  const auto s = activations(w, u);
  Matrix<T> q, k, v;
  s.qkv(q, k, v);
  const Matrix<T> o = nn::delta_rule_scan<T>(q, k, v, s.beta, s.g, s.num_v_heads, final_state);
  return nn::linear<T>(qwen3_next_gated_norm(s, o), w.out_proj_weight);
}

/// The gated delta rule T of the layer (no convolution, norm or gate): per value head,
/// T[t, s] = q_t^T A_t ... A_{s+1} beta_s k_s with the normalised, scaled q and k.
template <Scalar T>
auto qwen3_next_transition(const qwen3_next_activations<T>& s) {
  s.check();
  Matrix<T> q, k, v;
  s.qkv(q, k, v);
  return gated_delta_rule(std::move(q), std::move(k), s.beta, s.g,
                          transition_options{.heads = s.num_v_heads, .head_dim = s.head_v_dim, .state = s.head_k_dim});
}

/// The exact decomposition from activations (see the header comment); with out_proj_weight empty,
/// output() is the normed, gated inner output.
template <Scalar T>
auto attention(const qwen3_next_activations<T>& s) {
  s.check();
  const Index V = s.value_dim();
  return delta_detail::decomposition_of<T>(qwen3_next_transition(s), Matrix<T>(s.mixed_qkv.rightCols(V)),
                                           depthwise_taps(s.conv1d_weight.bottomRows(V)), delta_detail::silu_of(s.z), s.norm_weight, s.num_v_heads,
                                           s.eps, s.out_proj_weight);
}

/// The exact decomposition: qwen3_next_forward(w, u) == d.output(), x = the values before conv1d.
template <Scalar T>
auto decompose(const qwen3_next_weights<T>& w, const Matrix<T>& u) { return attention(activations(w, u)); }

/// The exact decomposition of the Qwen3.5 layer: qwen3_5_forward(w, u) == d.output().
template <Scalar T>
auto decompose(const qwen3_5_weights<T>& w, const Matrix<T>& u) { return attention(activations(w, u)); }

/// The exact decomposition (the named form of decompose).
template <Scalar T>
auto qwen3_next_decompose(const qwen3_next_weights<T>& w, const Matrix<T>& u) { return decompose(w, u); }

/// The recurrent state after the last token, (nv*dk, dv): last_recurrent_state (1, nv, dk, dv)
/// flattened, from the backward running product of delta_final_state (not the forward scan).
template <Scalar T>
Matrix<T> final_state(const qwen3_next_activations<T>& s) {
  s.check();
  Matrix<T> q, k, v;
  s.qkv(q, k, v);
  return delta_final_state<T>(k, v, s.beta, s.g, s.num_v_heads);
}

}  // namespace iattn::models
