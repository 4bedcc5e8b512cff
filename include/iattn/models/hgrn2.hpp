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
#pragma once

#include "../iattn.hpp"
#include "common.hpp"

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

template <Scalar T>
struct hgrn2_activations {
  Matrix<T> q, k, i, g;  // q = SiLU(q_proj u) / sqrt(df); k = 1 - exp(g); g the log forget gate
};

template <Scalar T>
hgrn2_activations<T> hgrn2_project(const hgrn2_weights<T>& w, const Matrix<T>& u) {
  w.check();
  const auto& c = w.config;
  detail::require_shape(u.cols() == c.hidden_size, "hgrn2", "u", u.rows(), u.cols(), "(L, hidden_size=" + std::to_string(c.hidden_size) + ")");
  hgrn2_activations<T> s;
  const T scale = T(1) / std::sqrt(T(c.expand_ratio));
  s.q = nn::map<T>(nn::linear<T>(u, w.q_proj_weight), [scale](T v) { return nn::silu(v) * scale; });
  s.i = nn::linear<T>(u, w.i_proj_weight);
  s.g = nn::linear<T>(u, w.f_proj_weight);
  s.k.resize(s.g.rows(), s.g.cols());
  for (Index t = 0; t < s.g.rows(); ++t)
    for (Index j = 0; j < s.g.cols(); ++j) {
      s.g(t, j) = nn::log_bounded_sigmoid(s.g(t, j), w.lower_bound.size() ? w.lower_bound(0, j) : T(0));
      s.k(t, j) = -std::expm1(s.g(t, j));
    }
  return s;
}

/// The layer's forward (the oracle).
template <Scalar T>
Matrix<T> hgrn2_forward(const hgrn2_weights<T>& w, const Matrix<T>& u) {
  const auto s = hgrn2_project(w, u);
  Matrix<T> o = nn::gated_state_scan<T>(s.q, s.k, s.i, s.g, w.config.num_heads());
  nn::group_norm_rows<T>(o, 1, w.config.norm_eps, false, w.g_norm_weight);
  return nn::linear<T>(o, w.o_proj_weight);
}

/// The exact decomposition: hgrn2_forward(w, u) == d.output(), x = i_proj(u), beta = 0.
template <Scalar T>
auto hgrn2_decompose(const hgrn2_weights<T>& w, const Matrix<T>& u) {
  const auto s = hgrn2_project(w, u);
  const auto& c = w.config;
  const Index L = u.rows(), H = c.num_heads();
  auto S = semiseparable(Matrix<T>(s.g), Matrix<T>(s.k), Matrix<T>(s.q), {.heads = H, .head_dim = c.head_i_dim(), .groups = H});
  const Matrix<T> o = apply(S, s.i);
  const auto n = group_norm(1, Matrix<T>(w.g_norm_weight), {.eps = c.norm_eps});
  auto Hop = n.bound_to(n.compute(o.data(), L, c.hidden_size)) * std::move(S);
  return make_decomposition<T>(s.i, std::move(Hop), Matrix<T>(Matrix<T>::Zero(L, c.hidden_size)), w.o_proj_weight);
}

}  // namespace iattn::models
