// iattn/models/linear_attention.hpp: causal normalised linear attention (Katharopoulos et al. 2020,
// "Transformers are RNNs"), as fast-transformers' `AttentionLayer` with `CausalLinearAttention`.
//
// Forward, H heads of key width dk and value width dv, feature map phi(x) = elu(x) + 1 > 0:
//   q, k, v = query/key/value_projection(u) (with biases);  Q = phi(q), K = phi(k)   (per head)
//   o_t = Q_t^T (sum_{s<=t} K_s v_s^T) / (Q_t . sum_{s<=t} K_s + eps)
//   out = out_projection(o)
//
// Exact decomposition over the H*dv value channels, inner input x = v:
//   H = diag(r / (r + eps)) row_normalize(S(lambda = 0, B = K, C = Q; H heads, dv channels each))
//   beta = 0, with r = S 1 the row sums (taken from S itself); without eps the diagonal is 1.
// Linear attention is the semiseparable matrix with no decay: the same operator as Mamba-2's
// with lambda = 0, normalised by its row sums.
#pragma once

#include "../iattn.hpp"
#include "common.hpp"

#include <cstdint>
#include <string>

namespace iattn::models {

struct linear_attention_config {
  Index d_model = 64;
  Index n_heads = 4;
  Index d_keys = 16;    ///< dk per head
  Index d_values = 16;  ///< dv per head
  double eps = 1e-6;    ///< fast-transformers' CausalLinearAttention eps
};

/// fast-transformers `AttentionLayer` parameters, '.' written '_'.
template <Scalar T>
struct linear_attention_weights {
  linear_attention_config config;
  Matrix<T> query_projection_weight, query_projection_bias;  ///< (H*dk, d_model), (1, H*dk)
  Matrix<T> key_projection_weight, key_projection_bias;      ///< (H*dk, d_model), (1, H*dk)
  Matrix<T> value_projection_weight, value_projection_bias;  ///< (H*dv, d_model), (1, H*dv)
  Matrix<T> out_projection_weight, out_projection_bias;      ///< (d_model, H*dv), (1, d_model)

  void check() const {
    const auto& c = config;
    using std::to_string;
    const char* m = "linear_attention";
    const Index K = c.n_heads * c.d_keys, V = c.n_heads * c.d_values, d = c.d_model;
    const std::string sd = to_string(d), sK = to_string(K), sV = to_string(V);
    check_field(m, "query_projection_weight", query_projection_weight, K, d, "(n_heads*d_keys=" + sK + ", d_model=" + sd + ")");
    check_field(m, "query_projection_bias", query_projection_bias, 1, K, "(1, n_heads*d_keys=" + sK + ")");
    check_field(m, "key_projection_weight", key_projection_weight, K, d, "(n_heads*d_keys=" + sK + ", d_model=" + sd + ")");
    check_field(m, "key_projection_bias", key_projection_bias, 1, K, "(1, n_heads*d_keys=" + sK + ")");
    check_field(m, "value_projection_weight", value_projection_weight, V, d, "(n_heads*d_values=" + sV + ", d_model=" + sd + ")");
    check_field(m, "value_projection_bias", value_projection_bias, 1, V, "(1, n_heads*d_values=" + sV + ")");
    check_field(m, "out_projection_weight", out_projection_weight, d, V, "(d_model=" + sd + ", n_heads*d_values=" + sV + ")");
    check_field(m, "out_projection_bias", out_projection_bias, 1, d, "(1, d_model=" + sd + ")");
  }
};

/// PyTorch's default Linear init (weights and biases).
template <Scalar T>
linear_attention_weights<T> linear_attention_init(const linear_attention_config& c, std::uint64_t seed = 0) {
  init::generator g(seed);
  linear_attention_weights<T> w;
  w.config = c;
  const Index K = c.n_heads * c.d_keys, V = c.n_heads * c.d_values, d = c.d_model;
  w.query_projection_weight = init::torch_default<T>(g, K, d, d);
  w.query_projection_bias = init::torch_default<T>(g, 1, K, d);
  w.key_projection_weight = init::torch_default<T>(g, K, d, d);
  w.key_projection_bias = init::torch_default<T>(g, 1, K, d);
  w.value_projection_weight = init::torch_default<T>(g, V, d, d);
  w.value_projection_bias = init::torch_default<T>(g, 1, V, d);
  w.out_projection_weight = init::torch_default<T>(g, d, V, V);
  w.out_projection_bias = init::torch_default<T>(g, 1, d, V);
  return w;
}

template <Scalar T>
struct linear_attention_activations {
  Matrix<T> Q, K, v;  // phi(q), phi(k) (L, H*dk); v (L, H*dv)
};

template <Scalar T>
linear_attention_activations<T> linear_attention_project(const linear_attention_weights<T>& w, const Matrix<T>& u) {
  w.check();
  detail::require_shape(u.cols() == w.config.d_model, "linear_attention", "u", u.rows(), u.cols(),
                        "(L, d_model=" + std::to_string(w.config.d_model) + ")");
  auto phi = [](T x) { return x > 0 ? x + T(1) : std::exp(x); };  // elu(x) + 1
  linear_attention_activations<T> s;
  s.Q = nn::map<T>(nn::linear<T>(u, w.query_projection_weight, w.query_projection_bias), phi);
  s.K = nn::map<T>(nn::linear<T>(u, w.key_projection_weight, w.key_projection_bias), phi);
  s.v = nn::linear<T>(u, w.value_projection_weight, w.value_projection_bias);
  return s;
}

/// The layer's forward (the oracle): the causal recurrence with running sums of K v^T and K.
template <Scalar T>
Matrix<T> linear_attention_forward(const linear_attention_weights<T>& w, const Matrix<T>& u) {
  const auto s = linear_attention_project(w, u);
  const auto& c = w.config;
  const Index L = u.rows(), dk = c.d_keys, dv = c.d_values;
  Matrix<T> o(L, c.n_heads * dv);
  for (Index h = 0; h < c.n_heads; ++h) {
    Matrix<T> S = Matrix<T>::Zero(dk, dv);
    Eigen::Matrix<T, 1, Eigen::Dynamic> z = Eigen::Matrix<T, 1, Eigen::Dynamic>::Zero(dk);
    for (Index t = 0; t < L; ++t) {
      const auto Kt = s.K.row(t).segment(h * dk, dk), Qt = s.Q.row(t).segment(h * dk, dk);
      S += Kt.transpose() * s.v.row(t).segment(h * dv, dv);
      z += Kt;
      const T den = Qt.dot(z) + T(c.eps);
      o.row(t).segment(h * dv, dv) = (Qt * S) / den;
    }
  }
  return nn::linear<T>(o, w.out_projection_weight, w.out_projection_bias);
}

/// The unnormalised scores S(0, phi(k), phi(q)): Q_t . K_s for s <= t, per head.
template <Scalar T>
auto linear_attention_scores(const linear_attention_activations<T>& s, const linear_attention_config& c) {
  const Index L = s.Q.rows();
  return semiseparable(Matrix<T>(Matrix<T>::Zero(L, c.n_heads)), Matrix<T>(s.K), Matrix<T>(s.Q),
                       {.heads = c.n_heads, .head_dim = c.d_values, .groups = c.n_heads});
}

/// The exact decomposition: linear_attention_forward(w, u) == d.output(), x = v, beta = 0.
template <Scalar T>
auto linear_attention_decompose(const linear_attention_weights<T>& w, const Matrix<T>& u) {
  const auto s = linear_attention_project(w, u);
  const auto& c = w.config;
  const Index L = u.rows(), V = c.n_heads * c.d_values;
  auto S = linear_attention_scores(s, c);
  Matrix<T> r = apply(S, Matrix<T>(Matrix<T>::Ones(L, V)));  // row sums Q_t . sum K_s > 0
  r = (r.array() / (r.array() + T(c.eps))).matrix();
  return make_decomposition<T>(s.v, diagonal(std::move(r)) * row_normalize(std::move(S)), Matrix<T>(Matrix<T>::Zero(L, V)),
                               w.out_projection_weight, w.out_projection_bias);
}

}  // namespace iattn::models
