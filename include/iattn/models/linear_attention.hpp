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
//
// From activations (docs/models.md): linear_attention_activations holds Q, K, values (and optionally
// the out projection); attention(acts) is the decomposition, decompose(w, u) ==
// attention(activations(w, u)), final_state(acts) RecurrentLinearAttention's [Si, Zi].
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

/// One forward pass's activations, named as fast-transformers' `CausalLinearAttention.forward` names
/// them (Q, K after the feature map; values), plus what the decomposition reads: everything
/// `attention(acts)` needs. Any positive feature map works: Q and K are taken as given. Built by
/// `activations(w, u)` or by hand.
template <Scalar T>
struct linear_attention_activations {
  Matrix<T> Q;                      ///< (L, H*dk)   feature-mapped queries: the scores' C
  Matrix<T> K;                      ///< (L, H*dk)   feature-mapped keys: the scores' B
  Matrix<T> values;                 ///< (L, H*dv)   value_projection(u): the inner input x
  Matrix<T> out_projection_weight;  ///< (d_model, H*dv) or empty (the decomposition stops before out_projection)
  Matrix<T> out_projection_bias;    ///< (1, d_model) or empty
  Index n_heads = 4;                ///< H
  double eps = 1e-6;                ///< the normaliser's eps

  Index length() const { return values.rows(); }

  /// Throws std::invalid_argument naming the first field whose shape disagrees (L, H*dv from values; H*dk from Q).
  void check() const {
    using std::to_string;
    const char* m = "linear_attention_activations";
    if (n_heads < 1) detail::fail(m, "n_heads is " + to_string(n_heads) + " but must be >= 1");
    const Index L = length(), V = values.cols(), Kd = Q.cols();
    const std::string div = " divisible by n_heads=" + to_string(n_heads);
    detail::require_shape(V >= 1 && V % n_heads == 0, m, "values", values.rows(), values.cols(), "(L, H*dv) with H*dv" + div);
    detail::require_shape(Q.rows() == L && Kd >= 1 && Kd % n_heads == 0, m, "Q", Q.rows(), Q.cols(), "(L=" + to_string(L) + ", H*dk) with H*dk" + div);
    check_field(m, "K", K, L, Kd, "(L=" + to_string(L) + ", H*dk=" + to_string(Kd) + ")");
    if (out_projection_weight.size() != 0)
      detail::require_shape(out_projection_weight.cols() == V, m, "out_projection_weight", out_projection_weight.rows(),
                            out_projection_weight.cols(), "(d_model, H*dv=" + to_string(V) + ") or empty");
    if (out_projection_bias.size() != 0)
      detail::require_shape(out_projection_weight.size() != 0 && out_projection_bias.rows() == 1 && out_projection_bias.cols() == out_projection_weight.rows(),
                            m, "out_projection_bias", out_projection_bias.rows(), out_projection_bias.cols(),
                            "(1, d_model=" + to_string(out_projection_weight.rows()) + ") with out_projection_weight, or empty");
  }
};

/// The state after the last token, as fast-transformers' `RecurrentLinearAttention` returns it ([Si, Zi]).
template <Scalar T>
struct linear_attention_state {
  Matrix<T> Si;  ///< (H*dk, dv): (H, dk, dv) flattened, sum_s K_s values_s^T per head
  Matrix<T> Zi;  ///< (H, dk): sum_s K_s per head
};

/// The activations of one forward pass of the layer on u (L, d_model), the out projection included.
template <Scalar T>
linear_attention_activations<T> activations(const linear_attention_weights<T>& w, const Matrix<T>& u) {
  w.check();
  detail::require_shape(u.cols() == w.config.d_model, "linear_attention", "u", u.rows(), u.cols(),
                        "(L, d_model=" + std::to_string(w.config.d_model) + ")");
  auto phi = [](T x) { return x > 0 ? x + T(1) : std::exp(x); };  // elu(x) + 1
  linear_attention_activations<T> s;
  s.Q = nn::map<T>(nn::linear<T>(u, w.query_projection_weight, w.query_projection_bias), phi);
  s.K = nn::map<T>(nn::linear<T>(u, w.key_projection_weight, w.key_projection_bias), phi);
  s.values = nn::linear<T>(u, w.value_projection_weight, w.value_projection_bias);
  s.out_projection_weight = w.out_projection_weight;
  s.out_projection_bias = w.out_projection_bias;
  s.n_heads = w.config.n_heads;
  s.eps = w.config.eps;
  return s;
}

/// The layer's forward (the oracle): the causal recurrence with running sums of K v^T and K.
/// final_state, when given, receives [Si, Zi] after the last token.
template <Scalar T>
Matrix<T> linear_attention_forward(const linear_attention_weights<T>& w, const Matrix<T>& u, linear_attention_state<T>* final_state = nullptr) {
  const auto s = activations(w, u);
  const auto& c = w.config;
  const Index L = u.rows(), dk = c.d_keys, dv = c.d_values;
  Matrix<T> o(L, c.n_heads * dv);
  if (final_state) {
    final_state->Si.resize(c.n_heads * dk, dv);
    final_state->Zi.resize(c.n_heads, dk);
  }
  for (Index h = 0; h < c.n_heads; ++h) {
    Matrix<T> S = Matrix<T>::Zero(dk, dv);
    Eigen::Matrix<T, 1, Eigen::Dynamic> z = Eigen::Matrix<T, 1, Eigen::Dynamic>::Zero(dk);
    for (Index t = 0; t < L; ++t) {
      const auto Kt = s.K.row(t).segment(h * dk, dk), Qt = s.Q.row(t).segment(h * dk, dk);
      S += Kt.transpose() * s.values.row(t).segment(h * dv, dv);
      z += Kt;
      const T den = Qt.dot(z) + T(c.eps);
      o.row(t).segment(h * dv, dv) = (Qt * S) / den;
    }
    if (final_state) {
      final_state->Si.middleRows(h * dk, dk) = S;
      final_state->Zi.row(h) = z;
    }
  }
  return nn::linear<T>(o, w.out_projection_weight, w.out_projection_bias);
}

/// The unnormalised scores S(0, K, Q): Q_t . K_s for s <= t, per head.
template <Scalar T>
auto linear_attention_scores(const linear_attention_activations<T>& s) {
  s.check();
  const Index L = s.length(), H = s.n_heads;
  return semiseparable(Matrix<T>(Matrix<T>::Zero(L, H)), s.K, s.Q, {.heads = H, .head_dim = s.values.cols() / H, .groups = H});
}
/// The scores of the layer on u (L, d_model): linear_attention_scores(activations(w, u)).
template <Scalar T>
auto linear_attention_scores(const linear_attention_weights<T>& w, const Matrix<T>& u) { return linear_attention_scores(activations(w, u)); }

/// The exact decomposition from activations: H = diag(r / (r + eps)) row_normalize(S), x = values,
/// beta = 0; with out_projection_weight empty, output() is the inner output.
template <Scalar T>
auto attention(const linear_attention_activations<T>& s) {
  s.check();
  const Index L = s.length(), V = s.values.cols();
  auto S = linear_attention_scores(s);
  Matrix<T> r = apply(S, Matrix<T>(Matrix<T>::Ones(L, V)));  // row sums Q_t . sum K_s > 0
  r = (r.array() / (r.array() + T(s.eps))).matrix();
  return make_decomposition<T>(s.values, diagonal(std::move(r)) * row_normalize(std::move(S)), Matrix<T>(Matrix<T>::Zero(L, V)),
                               s.out_projection_weight, s.out_projection_bias);
}

/// The exact decomposition: linear_attention_forward(w, u) == d.output(), x = values, beta = 0.
template <Scalar T>
auto decompose(const linear_attention_weights<T>& w, const Matrix<T>& u) { return attention(activations(w, u)); }

/// The exact decomposition (the named form of decompose).
template <Scalar T>
auto linear_attention_decompose(const linear_attention_weights<T>& w, const Matrix<T>& u) { return decompose(w, u); }

/// The state after the last token ([Si, Zi], linear_attention_state): plain sums (no decay).
template <Scalar T>
linear_attention_state<T> final_state(const linear_attention_activations<T>& s) {
  s.check();
  const Index L = s.length(), H = s.n_heads, dk = s.Q.cols() / H, dv = s.values.cols() / H;
  linear_attention_state<T> st{Matrix<T>::Zero(H * dk, dv), Matrix<T>::Zero(H, dk)};
  for (Index h = 0; h < H; ++h)
    for (Index t = 0; t < L; ++t) {
      st.Si.middleRows(h * dk, dk) += s.K.row(t).segment(h * dk, dk).transpose() * s.values.row(t).segment(h * dv, dv);
      st.Zi.row(h) += s.K.row(t).segment(h * dk, dk);
    }
  return st;
}

}  // namespace iattn::models
