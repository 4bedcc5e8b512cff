// iattn/models/hgrn.hpp: HGRN, the hierarchically gated linear RNN (Qin et al. 2023), in the form of
// fla's `HGRNAttention` (no short convolution), as implicit attention.
//
// Forward, with the layer's forget-gate lower bound lb (0 in the first layer):
//   i = i_proj(u), f = f_proj(u), g = g_proj(u)                    (L, I) each, I = expand_ratio d
//   f_t = lb + (1 - lb) sigmoid(f)       (as a logarithm: logaddexp(log lb, log1p(-lb) + logsigmoid f))
//   c_t = SiLU(i_t) (1 - f_t)            (the input gate tied to the forget gate)
//   h_t = f_t h_{t-1} + c_t;  o = RMSNorm(h) g_norm_weight SiLU(g);  out = o_proj(o)
//
// Exact decomposition over the I channels, inner input x = i (pre-activation):
//   H = diag(SiLU g) N LinearRecurrence(f, (1 - f) sigmoid(i)),   beta = 0
// since SiLU(i) = sigmoid(i) i; N is the RMSNorm (one group, weight) bound to its actual input.
// paper_attention is Zimerman et al.'s eq. 29, G alpha_r G_act = diag(SiLU g) LinearRecurrence(f, 1 - f)
// diag(sigmoid i): the output norm dropped.
#pragma once

#include "../iattn.hpp"
#include "common.hpp"

#include <cstdint>
#include <string>

namespace iattn::models {

struct hgrn_config {
  Index hidden_size = 64;
  Index expand_ratio = 1;  ///< I = expand_ratio * hidden_size
  double norm_eps = 1e-5;
  Index layer_idx = 0;     ///< the initialiser's lower bound: layer_idx / num_layers
  Index num_layers = 1;
  Index input_dim() const { return expand_ratio * hidden_size; }
};

/// fla `HGRNAttention` parameters (bias-free projections), '.' written '_'.
template <Scalar T>
struct hgrn_weights {
  hgrn_config config;
  Matrix<T> i_proj_weight;  ///< (I, hidden)
  Matrix<T> f_proj_weight;  ///< (I, hidden)
  Matrix<T> g_proj_weight;  ///< (I, hidden)
  Matrix<T> g_norm_weight;  ///< (1, I)
  Matrix<T> o_proj_weight;  ///< (hidden, I)
  Matrix<T> lower_bound;    ///< (1, I) in [0, 1), this layer's slice of HGRNModel's bounds; empty: 0

  void check() const {
    const auto& c = config;
    using std::to_string;
    const char* m = "hgrn";
    const Index I = c.input_dim(), d = c.hidden_size;
    const std::string ih = "(input_dim=" + to_string(I) + ", hidden_size=" + to_string(d) + ")", i1 = "(1, input_dim=" + to_string(I) + ")";
    check_field(m, "i_proj_weight", i_proj_weight, I, d, ih);
    check_field(m, "f_proj_weight", f_proj_weight, I, d, ih);
    check_field(m, "g_proj_weight", g_proj_weight, I, d, ih);
    check_field(m, "g_norm_weight", g_norm_weight, 1, I, i1);
    check_field(m, "o_proj_weight", o_proj_weight, d, I, "(hidden_size=" + to_string(d) + ", input_dim=" + to_string(I) + ")");
    check_lower_bound(m, lower_bound, I, i1);
  }
};

/// PyTorch's default Linear init for the projections, g_norm_weight = 1, and the lower bound HGRNModel
/// starts from (its softmax-cumsum of zeros): layer_idx / num_layers, none in the first layer.
template <Scalar T>
hgrn_weights<T> hgrn_init(const hgrn_config& c, std::uint64_t seed = 0) {
  init::generator g(seed);
  hgrn_weights<T> w;
  w.config = c;
  const Index I = c.input_dim(), d = c.hidden_size;
  w.i_proj_weight = init::torch_default<T>(g, I, d, d);
  w.f_proj_weight = init::torch_default<T>(g, I, d, d);
  w.g_proj_weight = init::torch_default<T>(g, I, d, d);
  w.g_norm_weight = Matrix<T>::Ones(1, I);
  w.o_proj_weight = init::torch_default<T>(g, d, I, I);
  if (c.layer_idx > 0) w.lower_bound = Matrix<T>::Constant(1, I, T(double(c.layer_idx) / double(c.num_layers)));
  return w;
}

template <Scalar T>
struct hgrn_activations {
  Matrix<T> i, g, log_f;  // (L, I): i and g before their activations, log of the forget gate
};

template <Scalar T>
hgrn_activations<T> hgrn_project(const hgrn_weights<T>& w, const Matrix<T>& u) {
  w.check();
  const auto& c = w.config;
  detail::require_shape(u.cols() == c.hidden_size, "hgrn", "u", u.rows(), u.cols(), "(L, hidden_size=" + std::to_string(c.hidden_size) + ")");
  hgrn_activations<T> s;
  s.i = nn::linear<T>(u, w.i_proj_weight);
  s.g = nn::linear<T>(u, w.g_proj_weight);
  s.log_f = nn::linear<T>(u, w.f_proj_weight);
  for (Index t = 0; t < s.log_f.rows(); ++t)
    for (Index j = 0; j < s.log_f.cols(); ++j)
      s.log_f(t, j) = nn::log_bounded_sigmoid(s.log_f(t, j), w.lower_bound.size() ? w.lower_bound(0, j) : T(0));
  return s;
}

/// The block's forward (the oracle).
template <Scalar T>
Matrix<T> hgrn_forward(const hgrn_weights<T>& w, const Matrix<T>& u) {
  const auto s = hgrn_project(w, u);
  const Index L = u.rows(), I = w.config.input_dim();
  Matrix<T> h(L, I);
  for (Index j = 0; j < I; ++j) {
    T state = 0;
    for (Index t = 0; t < L; ++t) {
      const T f = std::exp(s.log_f(t, j));
      state = f * state + nn::silu(s.i(t, j)) * -std::expm1(s.log_f(t, j));
      h(t, j) = state;
    }
  }
  for (Index t = 0; t < L; ++t) {
    const T inv = T(1) / std::sqrt(h.row(t).squaredNorm() / T(I) + T(w.config.norm_eps));
    for (Index j = 0; j < I; ++j) h(t, j) *= inv * w.g_norm_weight(0, j) * nn::silu(s.g(t, j));
  }
  return nn::linear<T>(h, w.o_proj_weight);
}

namespace hgrn_detail {
/// LinearRecurrence(f, (1 - f) sigmoid(i)) or, without the activation, LinearRecurrence(f, 1 - f).
template <class T>
auto recurrence(const hgrn_activations<T>& s, bool with_activation) {
  Matrix<T> a = s.log_f.array().exp().matrix(), b(s.i.rows(), s.i.cols());
  for (Index k = 0; k < b.size(); ++k)
    b.data()[k] = -std::expm1(s.log_f.data()[k]) * (with_activation ? nn::sigmoid(s.i.data()[k]) : T(1));
  return linear_recurrence(std::move(a), std::move(b));
}
}  // namespace hgrn_detail

/// The exact decomposition: hgrn_forward(w, u) == d.output(), x = i_proj(u).
template <Scalar T>
auto hgrn_decompose(const hgrn_weights<T>& w, const Matrix<T>& u) {
  const auto s = hgrn_project(w, u);
  const Index L = u.rows(), I = w.config.input_dim();
  auto R = hgrn_detail::recurrence(s, true);
  const Matrix<T> h = apply(R, s.i);
  const auto n = group_norm(1, Matrix<T>(w.g_norm_weight), {.eps = w.config.norm_eps});
  auto H = diagonal(nn::map<T>(s.g, [](T v) { return nn::silu(v); })) * n.bound_to(n.compute(h.data(), L, I)) * std::move(R);
  return make_decomposition<T>(s.i, std::move(H), Matrix<T>(Matrix<T>::Zero(L, I)), w.o_proj_weight);
}

/// Zimerman et al.'s eq. 29: diag(SiLU g) LinearRecurrence(f, 1 - f) diag(sigmoid i), the norm dropped.
template <Scalar T>
auto hgrn_paper_attention(const hgrn_weights<T>& w, const Matrix<T>& u) {
  const auto s = hgrn_project(w, u);
  return diagonal(nn::map<T>(s.g, [](T v) { return nn::silu(v); })) * hgrn_detail::recurrence(s, false) *
         diagonal(nn::map<T>(s.i, [](T v) { return nn::sigmoid(v); }));
}

}  // namespace iattn::models
