// iattn/models/hgrn2.hpp: HGRN2, gated linear RNN with state expansion (Qin et al. 2024), in the
// form of fla's `HGRN2Attention` (no short convolution), as implicit attention.
//
// Forward, H = hidden_size / expand_ratio heads, forget width df = expand_ratio, input width di = hidden/H:
//   q = SiLU(q_proj(u)), f = f_proj(u) (L, H*df);  i = i_proj(u) (L, hidden)
//   g_t = log(lb + (1 - lb) sigmoid(f_t))   (logsigmoid(f) without a lower bound);  k = 1 - exp(g)
//   S_t = diag(exp g_t) S_{t-1} + k_t i_t^T;  o_t = (q_t / sqrt(df))^T S_t          (per head)
//   out = o_proj(RMSNorm(o) g_norm_weight)                                          (over all channels)
//
// Exact decomposition over the hidden channels, inner input x = i:
//   H = N S(lambda = g, B = 1 - exp(g), C = SiLU(q) / sqrt(df); H heads, di channels each, H groups)
//   beta = 0, N the RMSNorm (one group, weight) bound to its actual input.
// HGRN2 is HGRN with its forget gate expanded to a df-wide state; the input gate 1 - f is the key.
//
// From activations (docs/models.md): hgrn2_activations holds q, k, g, i (as fla passes them to
// chunk_gla), the norm and (optionally) o_proj; attention(acts) is the decomposition, final_state(acts)
// chunk_gla's recurrent_state (num_heads, df, di) flattened to (num_heads*df, di).
#pragma once

#include "../iattn.hpp"
#include "common.hpp"
#include "recurrent_state.hpp"

#include <cstdint>
#include <string>

namespace iattn::models {

struct hgrn2_config {
  Index hidden_size = 64;
  Index expand_ratio = 16;  ///< df, the state width per head (fla's default 128)
  double norm_eps = 1e-5;
  Index layer_idx = 0;      ///< the initialiser's lower bound: layer_idx / num_layers
  Index num_layers = 1;
  Index num_heads() const { return expand_ratio > 0 ? hidden_size / expand_ratio : 0; }
  Index forget_dim() const { return num_heads() * expand_ratio; }
  Index head_i_dim() const { return num_heads() > 0 ? hidden_size / num_heads() : 0; }
};

/// fla `HGRN2Attention` parameters (bias-free projections), '.' written '_'.
template <Scalar T>
struct hgrn2_weights {
  hgrn2_config config;
  Matrix<T> q_proj_weight;  ///< (forget_dim, hidden)
  Matrix<T> f_proj_weight;  ///< (forget_dim, hidden)
  Matrix<T> i_proj_weight;  ///< (hidden, hidden)
  Matrix<T> g_norm_weight;  ///< (1, hidden)
  Matrix<T> o_proj_weight;  ///< (hidden, hidden)
  Matrix<T> lower_bound;    ///< (1, forget_dim) in [0, 1), from HGRN2Model; empty: 0

  void check() const {
    const auto& c = config;
    using std::to_string;
    const char* m = "hgrn2";
    if (c.num_heads() < 1 || c.hidden_size % c.expand_ratio != 0)
      detail::fail(m, "expand_ratio " + to_string(c.expand_ratio) + " must divide hidden_size = " + to_string(c.hidden_size));
    const Index F = c.forget_dim(), d = c.hidden_size;
    const std::string fd = "(forget_dim=" + to_string(F) + ", hidden_size=" + to_string(d) + ")";
    const std::string dd = "(hidden_size=" + to_string(d) + ", hidden_size=" + to_string(d) + ")";
    check_field(m, "q_proj_weight", q_proj_weight, F, d, fd);
    check_field(m, "f_proj_weight", f_proj_weight, F, d, fd);
    check_field(m, "i_proj_weight", i_proj_weight, d, d, dd);
    check_field(m, "g_norm_weight", g_norm_weight, 1, d, "(1, hidden_size=" + to_string(d) + ")");
    check_field(m, "o_proj_weight", o_proj_weight, d, d, dd);
    check_lower_bound(m, lower_bound, F, "(1, forget_dim=" + to_string(F) + ")");
  }
};

/// PyTorch's default Linear init, norm weight 1, lower bound layer_idx / num_layers (none in layer 0).
template <Scalar T>
hgrn2_weights<T> hgrn2_init(const hgrn2_config& c, std::uint64_t seed = 0) {
  init::generator g(seed);
  hgrn2_weights<T> w;
  w.config = c;
  const Index F = c.forget_dim(), d = c.hidden_size;
  w.q_proj_weight = init::torch_default<T>(g, F, d, d);
  w.f_proj_weight = init::torch_default<T>(g, F, d, d);
  w.i_proj_weight = init::torch_default<T>(g, d, d, d);
  w.g_norm_weight = Matrix<T>::Ones(1, d);
  w.o_proj_weight = init::torch_default<T>(g, d, d, d);
  if (c.layer_idx > 0) w.lower_bound = Matrix<T>::Constant(1, F, T(double(c.layer_idx) / double(c.num_layers)));
  return w;
}

/// One forward pass's activations, named as fla's `HGRN2Attention.forward` passes them to chunk_gla
/// (heads flattened: column h*df + m). Built by `activations(w, u)` or by hand.
template <Scalar T>
struct hgrn2_activations {
  Matrix<T> q;              ///< (L, H*df)  swish(q_proj u), before chunk_gla's scale
  Matrix<T> k;              ///< (L, H*df)  1 - forget gate
  Matrix<T> g;              ///< (L, H*df)  the log forget gate, <= 0
  Matrix<T> i;              ///< (L, hidden) i_proj(u): the values and the inner input
  Index num_heads = 1;      ///< H
  double scale = 0;         ///< chunk_gla's scale on q; 0 means its default df^-1/2
  Matrix<T> g_norm_weight;  ///< (1, hidden)
  Matrix<T> o_proj_weight;  ///< (hidden, hidden) or empty (the decomposition stops before o_proj)
  double norm_eps = 1e-5;   ///< g_norm's eps

  Index length() const { return i.rows(); }
  Index forget_dim() const { return num_heads > 0 ? q.cols() / num_heads : 0; }  ///< df per head
  Index head_i_dim() const { return num_heads > 0 ? i.cols() / num_heads : 0; }
  T q_scale() const { return scale > 0 ? T(scale) : T(1) / std::sqrt(T(forget_dim())); }

  /// Throws std::invalid_argument naming the first field whose shape disagrees (L, hidden from i).
  void check() const {
    using std::to_string;
    const char* m = "hgrn2_activations";
    const Index L = i.rows(), d = i.cols();
    if (num_heads < 1 || d % num_heads != 0) detail::fail(m, "num_heads " + to_string(num_heads) + " must divide hidden = " + to_string(d));
    detail::require_shape(q.rows() == L && q.cols() >= num_heads && q.cols() % num_heads == 0, m, "q", q.rows(), q.cols(),
                          "(L=" + to_string(L) + ", num_heads*df) with num_heads=" + to_string(num_heads));
    const std::string LF = "(L=" + to_string(L) + ", num_heads*df=" + to_string(q.cols()) + ")";
    check_field(m, "k", k, L, q.cols(), LF);
    check_field(m, "g", g, L, q.cols(), LF);
    check_field(m, "g_norm_weight", g_norm_weight, 1, d, "(1, hidden=" + to_string(d) + ")");
    if (o_proj_weight.size() != 0)
      detail::require_shape(o_proj_weight.cols() == d, m, "o_proj_weight", o_proj_weight.rows(), o_proj_weight.cols(),
                            "(hidden_size, hidden=" + to_string(d) + ") or empty");
    if ((g.array() > T(0)).any()) detail::fail(m, "g (the log forget gate) must be <= 0");
  }
};

/// The activations of one forward pass on u (L, hidden_size), o_proj included.
template <Scalar T>
hgrn2_activations<T> activations(const hgrn2_weights<T>& w, const Matrix<T>& u) {
  w.check();
  const auto& c = w.config;
  detail::require_shape(u.cols() == c.hidden_size, "hgrn2", "u", u.rows(), u.cols(), "(L, hidden_size=" + std::to_string(c.hidden_size) + ")");
  hgrn2_activations<T> s;
  s.q = nn::map<T>(nn::linear<T>(u, w.q_proj_weight), [](T v) { return nn::silu(v); });
  s.i = nn::linear<T>(u, w.i_proj_weight);
  s.g = nn::linear<T>(u, w.f_proj_weight);
  s.k.resize(s.g.rows(), s.g.cols());
  for (Index t = 0; t < s.g.rows(); ++t)
    for (Index j = 0; j < s.g.cols(); ++j) {
      s.g(t, j) = nn::log_bounded_sigmoid(s.g(t, j), w.lower_bound.size() ? w.lower_bound(0, j) : T(0));
      s.k(t, j) = -std::expm1(s.g(t, j));
    }
  s.num_heads = c.num_heads();
  s.scale = 1.0 / std::sqrt(double(c.expand_ratio));
  s.g_norm_weight = w.g_norm_weight;
  s.o_proj_weight = w.o_proj_weight;
  s.norm_eps = c.norm_eps;
  return s;
}

/// The layer's forward (the oracle), the matrix state by plain loops. final_state, when given,
/// receives the state after the last token (num_heads*df, di), row h*df + m, column j.
template <Scalar T>
Matrix<T> hgrn2_forward(const hgrn2_weights<T>& w, const Matrix<T>& u, Matrix<T>* final_state = nullptr) {
  w.check();
  const auto& c = w.config;
  detail::require_shape(u.cols() == c.hidden_size, "hgrn2", "u", u.rows(), u.cols(), "(L, hidden_size=" + std::to_string(c.hidden_size) + ")");
  const Index L = u.rows(), H = c.num_heads(), df = c.expand_ratio, di = c.head_i_dim();
  const Matrix<T> qp = nn::linear<T>(u, w.q_proj_weight), fp = nn::linear<T>(u, w.f_proj_weight), i = nn::linear<T>(u, w.i_proj_weight);
  const T scale = T(1) / std::sqrt(T(df));
  Matrix<T> o(L, c.hidden_size), S = Matrix<T>::Zero(H * df, di);
  for (Index t = 0; t < L; ++t)
    for (Index h = 0; h < H; ++h) {
      for (Index m = 0; m < df; ++m) {
        const Index col = h * df + m;
        const T f = nn::log_bounded_sigmoid(fp(t, col), w.lower_bound.size() ? w.lower_bound(0, col) : T(0));
        for (Index j = 0; j < di; ++j) S(col, j) = std::exp(f) * S(col, j) - std::expm1(f) * i(t, h * di + j);
      }
      for (Index j = 0; j < di; ++j) {
        T acc = 0;
        for (Index m = 0; m < df; ++m) acc += nn::silu(qp(t, h * df + m)) * scale * S(h * df + m, j);
        o(t, h * di + j) = acc;
      }
    }
  if (final_state) *final_state = S;
  nn::group_norm_rows<T>(o, 1, c.norm_eps, false, w.g_norm_weight);
  return nn::linear<T>(o, w.o_proj_weight);
}

/// The exact decomposition from activations; o_proj_weight empty gives the normed inner output.
template <Scalar T>
auto attention(const hgrn2_activations<T>& s) {
  s.check();
  const Index L = s.length(), H = s.num_heads, d = s.i.cols();
  Matrix<T> C = s.q * s.q_scale();
  auto S = semiseparable(s.g, s.k, std::move(C), {.heads = H, .head_dim = s.head_i_dim(), .groups = H});
  const Matrix<T> o = apply(S, s.i);
  const auto n = group_norm(1, s.g_norm_weight, {.eps = s.norm_eps});
  auto Hop = n.bound_to(n.compute(o.data(), L, d)) * std::move(S);
  return make_decomposition<T>(s.i, std::move(Hop), Matrix<T>(Matrix<T>::Zero(L, d)), s.o_proj_weight);
}

/// The exact decomposition: hgrn2_forward(w, u) == d.output(), x = i_proj(u), beta = 0.
template <Scalar T>
auto decompose(const hgrn2_weights<T>& w, const Matrix<T>& u) { return attention(activations(w, u)); }

/// The exact decomposition (the named form of decompose).
template <Scalar T>
auto hgrn2_decompose(const hgrn2_weights<T>& w, const Matrix<T>& u) { return decompose(w, u); }

/// The state after the last token, chunk_gla's recurrent_state (num_heads, df, di) flattened to
/// (num_heads*df, di), row h*df + m: S[h, m, j] = sum_s exp(sum_{k>s} g_k[h, m]) k_s[h, m] i_s[h, j],
/// in log space (recurrent_state.hpp).
template <Scalar T>
Matrix<T> final_state(const hgrn2_activations<T>& s) {
  s.check();
  const Index L = s.length(), H = s.num_heads, df = s.forget_dim(), di = s.head_i_dim();
  Matrix<T> S(H * df, di);
  for (Index h = 0; h < H; ++h)
    for (Index m = 0; m < df; ++m)
      for (Index j = 0; j < di; ++j)
        S(h * df + m, j) = decayed_sum<T>(
            L, [&](Index k) { return s.g(k, h * df + m); }, [&](Index q) { return s.k(q, h * df + m) * s.i(q, h * di + j); });
  return S;
}

}  // namespace iattn::models
