// iattn/models/transformer.hpp: causal multi-head softmax attention (PyTorch's nn.MultiheadAttention
// with a causal mask), so that a Transformer layer's map sits next to the linear RNNs' implicit ones.
//
// Forward, H heads of width hd = E/H:
//   [q, k, v] = u in_proj_weight^T + in_proj_bias;  A_h[t, s] = softmax_{s<=t}(q_t[h] . k_s[h] / sqrt(hd))
//   o_t[h] = sum_s A_h[t, s] v_s[h];  out = out_proj(o)
//
// Exact decomposition over the E value channels, inner input x = v:
//   H = softmax_attention(q, k; H heads, hd channels each),  beta = 0.
// The operator is explicit (it forms scores row by row), as attention has no recurrent form.
//
// From activations (docs/models.md): transformer_activations holds q, k, v (and optionally the out
// projection); attention(acts) is the decomposition, decompose(w, u) == attention(activations(w, u)).
// No final_state: the layer has no recurrent state, its KV cache is its own k and v.
#pragma once

#include "../iattn.hpp"
#include "common.hpp"

#include <cstdint>
#include <limits>
#include <string>
#include <vector>

namespace iattn::models {

struct transformer_config {
  Index embed_dim = 64;
  Index num_heads = 4;
  Index head_dim() const { return embed_dim / num_heads; }
};

/// nn.MultiheadAttention parameters (batch_first, packed in_proj), '.' written '_'.
template <Scalar T>
struct transformer_weights {
  transformer_config config;
  Matrix<T> in_proj_weight;   ///< (3E, E): rows q, k, v
  Matrix<T> in_proj_bias;     ///< (1, 3E)
  Matrix<T> out_proj_weight;  ///< (E, E)
  Matrix<T> out_proj_bias;    ///< (1, E)

  void check() const {
    const auto& c = config;
    using std::to_string;
    const char* m = "transformer";
    if (c.num_heads < 1 || c.embed_dim % c.num_heads != 0)
      detail::fail(m, "num_heads " + to_string(c.num_heads) + " must divide embed_dim = " + to_string(c.embed_dim));
    const Index E = c.embed_dim;
    const std::string sE = to_string(E);
    check_field(m, "in_proj_weight", in_proj_weight, 3 * E, E, "(3*embed_dim=" + to_string(3 * E) + ", embed_dim=" + sE + ")");
    check_field(m, "in_proj_bias", in_proj_bias, 1, 3 * E, "(1, 3*embed_dim=" + to_string(3 * E) + ")");
    check_field(m, "out_proj_weight", out_proj_weight, E, E, "(embed_dim=" + sE + ", embed_dim=" + sE + ")");
    check_field(m, "out_proj_bias", out_proj_bias, 1, E, "(1, embed_dim=" + sE + ")");
  }
};

/// nn.MultiheadAttention's initialisation: xavier_uniform in_proj, zero biases, default out_proj
/// weight; the biases are drawn N(0, 0.1) here so that they take part in the check.
template <Scalar T>
transformer_weights<T> transformer_init(const transformer_config& c, std::uint64_t seed = 0) {
  init::generator g(seed);
  transformer_weights<T> w;
  w.config = c;
  const Index E = c.embed_dim;
  w.in_proj_weight = init::xavier_uniform<T>(g, 3 * E, E, 1.0);
  w.in_proj_bias = init::normal<T>(g, 1, 3 * E, 0.1);
  w.out_proj_weight = init::torch_default<T>(g, E, E, E);
  w.out_proj_bias = init::normal<T>(g, 1, E, 0.1);
  return w;
}

/// The layer's forward (the oracle): per head and query, max-subtracted softmax over s <= t.
template <Scalar T>
Matrix<T> transformer_forward(const transformer_weights<T>& w, const Matrix<T>& u) {
  w.check();
  const auto& c = w.config;
  detail::require_shape(u.cols() == c.embed_dim, "transformer", "u", u.rows(), u.cols(), "(L, embed_dim=" + std::to_string(c.embed_dim) + ")");
  const Index L = u.rows(), E = c.embed_dim, hd = c.head_dim();
  const Matrix<T> qkv = nn::linear<T>(u, w.in_proj_weight, w.in_proj_bias);
  const T scale = T(1) / std::sqrt(T(hd));
  Matrix<T> o = Matrix<T>::Zero(L, E);
  std::vector<T> score(static_cast<std::size_t>(L));
  for (Index h = 0; h < c.num_heads; ++h)
    for (Index t = 0; t < L; ++t) {
      T mx = -std::numeric_limits<T>::infinity(), den = 0;
      for (Index s = 0; s <= t; ++s) {
        score[std::size_t(s)] = qkv.row(t).segment(h * hd, hd).dot(qkv.row(s).segment(E + h * hd, hd)) * scale;
        mx = std::max(mx, score[std::size_t(s)]);
      }
      for (Index s = 0; s <= t; ++s) den += std::exp(score[std::size_t(s)] - mx);
      for (Index s = 0; s <= t; ++s)
        o.row(t).segment(h * hd, hd) += std::exp(score[std::size_t(s)] - mx) / den * qkv.row(s).segment(2 * E + h * hd, hd);
    }
  return nn::linear<T>(o, w.out_proj_weight, w.out_proj_bias);
}

/// One forward pass's activations, named as PyTorch's `F.multi_head_attention_forward` names them (q,
/// k, v after the packed in-projection; q unscaled, the softmax scales by head_dim^-1/2), plus the out
/// projection: everything `attention(acts)` needs. Built by `activations(w, u)` or by hand. There is
/// no final_state: causal softmax attention has no recurrent state (its KV cache is k and v themselves).
template <Scalar T>
struct transformer_activations {
  Matrix<T> q;                ///< (L, E)   queries, unscaled
  Matrix<T> k;                ///< (L, E)   keys
  Matrix<T> v;                ///< (L, E)   values: the inner input x
  Matrix<T> out_proj_weight;  ///< (E_out, E) or empty (the decomposition stops before out_proj)
  Matrix<T> out_proj_bias;    ///< (1, E_out) or empty
  Index num_heads = 4;        ///< H: E splits into H heads of head_dim = E/H

  Index length() const { return v.rows(); }

  /// Throws std::invalid_argument naming the first field whose shape disagrees (L, E from v).
  void check() const {
    using std::to_string;
    const char* m = "transformer_activations";
    if (num_heads < 1) detail::fail(m, "num_heads is " + to_string(num_heads) + " but must be >= 1");
    const Index L = length(), E = v.cols();
    detail::require_shape(E >= 1 && E % num_heads == 0, m, "v", v.rows(), v.cols(), "(L, E) with E divisible by num_heads=" + to_string(num_heads));
    const std::string LE = "(L=" + to_string(L) + ", E=" + to_string(E) + ")";
    check_field(m, "q", q, L, E, LE);
    check_field(m, "k", k, L, E, LE);
    if (out_proj_weight.size() != 0)
      detail::require_shape(out_proj_weight.cols() == E, m, "out_proj_weight", out_proj_weight.rows(), out_proj_weight.cols(), "(E_out, E=" + to_string(E) + ") or empty");
    if (out_proj_bias.size() != 0)
      detail::require_shape(out_proj_weight.size() != 0 && out_proj_bias.rows() == 1 && out_proj_bias.cols() == out_proj_weight.rows(), m,
                            "out_proj_bias", out_proj_bias.rows(), out_proj_bias.cols(),
                            "(1, E_out=" + to_string(out_proj_weight.rows()) + ") with out_proj_weight, or empty");
  }
};

/// The activations of one forward pass of the layer on u (L, E), the out projection included.
template <Scalar T>
transformer_activations<T> activations(const transformer_weights<T>& w, const Matrix<T>& u) {
  w.check();
  const auto& c = w.config;
  detail::require_shape(u.cols() == c.embed_dim, "transformer", "u", u.rows(), u.cols(), "(L, embed_dim=" + std::to_string(c.embed_dim) + ")");
  const Index E = c.embed_dim;
  const Matrix<T> qkv = nn::linear<T>(u, w.in_proj_weight, w.in_proj_bias);
  transformer_activations<T> a;
  a.q = qkv.leftCols(E);
  a.k = qkv.middleCols(E, E);
  a.v = qkv.rightCols(E);
  a.out_proj_weight = w.out_proj_weight;
  a.out_proj_bias = w.out_proj_bias;
  a.num_heads = c.num_heads;
  return a;
}

/// The exact decomposition from activations: H = softmax_attention(q, k), x = v, beta = 0; with
/// out_proj_weight empty, output() is the heads' concatenated output.
template <Scalar T>
auto attention(const transformer_activations<T>& a) {
  a.check();
  const Index E = a.v.cols();
  auto H = softmax_attention(a.q, a.k, {.heads = a.num_heads, .head_dim = E / a.num_heads});
  return make_decomposition<T>(a.v, std::move(H), Matrix<T>(Matrix<T>::Zero(a.length(), E)), a.out_proj_weight, a.out_proj_bias);
}

/// The exact decomposition: transformer_forward(w, u) == d.output(), x = v, beta = 0.
template <Scalar T>
auto decompose(const transformer_weights<T>& w, const Matrix<T>& u) { return attention(activations(w, u)); }

/// The exact decomposition (the named form of decompose).
template <Scalar T>
auto transformer_decompose(const transformer_weights<T>& w, const Matrix<T>& u) { return decompose(w, u); }

}  // namespace iattn::models
