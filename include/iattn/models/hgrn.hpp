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
//
// From activations (docs/models.md): hgrn_activations holds i, f (the log forget gate), g, the norm
// and (optionally) o_proj; attention(acts) is the decomposition, hgrn_paper_attention(acts) eq. 29,
// final_state(acts) fla's recurrent_state h (1, I).
#pragma once

#include "../iattn.hpp"
#include "common.hpp"
#include "recurrent_state.hpp"

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

/// One forward pass's activations, named as fla's `HGRNAttention.forward` names them. Built by
/// `activations(w, u)` or by hand; `attention(acts)` needs nothing else.
template <Scalar T>
struct hgrn_activations {
  Matrix<T> i;              ///< (L, I)  i_proj(u), before swiglu: the inner input
  Matrix<T> f;              ///< (L, I)  the log forget gate log(lb + (1 - lb) sigmoid(f_proj u)) <= 0 (fla's f at the scan)
  Matrix<T> g;              ///< (L, I)  g_proj(u): the norm's swish gate, before SiLU
  Matrix<T> g_norm_weight;  ///< (1, I)
  Matrix<T> o_proj_weight;  ///< (hidden, I) or empty (the decomposition stops before o_proj)
  double norm_eps = 1e-5;   ///< g_norm's eps

  Index length() const { return i.rows(); }
  Index input_dim() const { return i.cols(); }

  /// Throws std::invalid_argument naming the first field whose shape disagrees (L, I from i).
  void check() const {
    using std::to_string;
    const char* m = "hgrn_activations";
    const Index L = i.rows(), I = i.cols();
    const std::string LI = "(L=" + to_string(L) + ", input_dim=" + to_string(I) + ")";
    check_field(m, "f", f, L, I, LI);
    check_field(m, "g", g, L, I, LI);
    check_field(m, "g_norm_weight", g_norm_weight, 1, I, "(1, input_dim=" + to_string(I) + ")");
    if (o_proj_weight.size() != 0)
      detail::require_shape(o_proj_weight.cols() == I, m, "o_proj_weight", o_proj_weight.rows(), o_proj_weight.cols(),
                            "(hidden_size, input_dim=" + to_string(I) + ") or empty");
    if ((f.array() > T(0)).any()) detail::fail(m, "f (the log forget gate) must be <= 0");
  }
};

/// The activations of one forward pass on u (L, hidden_size), o_proj included.
template <Scalar T>
hgrn_activations<T> activations(const hgrn_weights<T>& w, const Matrix<T>& u) {
  w.check();
  const auto& c = w.config;
  detail::require_shape(u.cols() == c.hidden_size, "hgrn", "u", u.rows(), u.cols(), "(L, hidden_size=" + std::to_string(c.hidden_size) + ")");
  hgrn_activations<T> s;
  s.i = nn::linear<T>(u, w.i_proj_weight);
  s.g = nn::linear<T>(u, w.g_proj_weight);
  s.f = nn::linear<T>(u, w.f_proj_weight);
  for (Index t = 0; t < s.f.rows(); ++t)
    for (Index j = 0; j < s.f.cols(); ++j)
      s.f(t, j) = nn::log_bounded_sigmoid(s.f(t, j), w.lower_bound.size() ? w.lower_bound(0, j) : T(0));
  s.g_norm_weight = w.g_norm_weight;
  s.o_proj_weight = w.o_proj_weight;
  s.norm_eps = c.norm_eps;
  return s;
}

/// The block's forward (the oracle). final_state, when given, receives h after the last token (1, I).
template <Scalar T>
Matrix<T> hgrn_forward(const hgrn_weights<T>& w, const Matrix<T>& u, Matrix<T>* final_state = nullptr) {
  w.check();
  const auto& c = w.config;
  detail::require_shape(u.cols() == c.hidden_size, "hgrn", "u", u.rows(), u.cols(), "(L, hidden_size=" + std::to_string(c.hidden_size) + ")");
  const Index L = u.rows(), I = c.input_dim();
  const Matrix<T> i = nn::linear<T>(u, w.i_proj_weight), fp = nn::linear<T>(u, w.f_proj_weight), g = nn::linear<T>(u, w.g_proj_weight);
  Matrix<T> h(L, I), last = Matrix<T>::Zero(1, I);
  for (Index j = 0; j < I; ++j) {
    const T lb = w.lower_bound.size() ? w.lower_bound(0, j) : T(0);
    T state = 0;
    for (Index t = 0; t < L; ++t) {
      const T log_f = nn::log_bounded_sigmoid(fp(t, j), lb);
      state = std::exp(log_f) * state + nn::silu(i(t, j)) * -std::expm1(log_f);
      h(t, j) = state;
    }
    last(0, j) = state;
  }
  for (Index t = 0; t < L; ++t) {
    const T inv = T(1) / std::sqrt(h.row(t).squaredNorm() / T(I) + T(c.norm_eps));
    for (Index j = 0; j < I; ++j) h(t, j) *= inv * w.g_norm_weight(0, j) * nn::silu(g(t, j));
  }
  if (final_state) *final_state = last;
  return nn::linear<T>(h, w.o_proj_weight);
}

namespace hgrn_detail {
/// LinearRecurrence(f, (1 - f) sigmoid(i)) or, without the activation, LinearRecurrence(f, 1 - f).
template <class T>
auto recurrence(const hgrn_activations<T>& s, bool with_activation) {
  Matrix<T> a = s.f.array().exp().matrix(), b(s.i.rows(), s.i.cols());
  for (Index k = 0; k < b.size(); ++k)
    b.data()[k] = -std::expm1(s.f.data()[k]) * (with_activation ? nn::sigmoid(s.i.data()[k]) : T(1));
  return linear_recurrence(std::move(a), std::move(b));
}
template <class T>
Matrix<T> silu_g(const hgrn_activations<T>& s) { return nn::map<T>(s.g, [](T v) { return nn::silu(v); }); }
}  // namespace hgrn_detail

/// The exact decomposition from activations; o_proj_weight empty gives the normed, gated inner output.
template <Scalar T>
auto attention(const hgrn_activations<T>& s) {
  s.check();
  const Index L = s.length(), I = s.input_dim();
  auto R = hgrn_detail::recurrence(s, true);
  const Matrix<T> h = apply(R, s.i);
  const auto n = group_norm(1, s.g_norm_weight, {.eps = s.norm_eps});
  auto H = diagonal(hgrn_detail::silu_g(s)) * n.bound_to(n.compute(h.data(), L, I)) * std::move(R);
  return make_decomposition<T>(s.i, std::move(H), Matrix<T>(Matrix<T>::Zero(L, I)), s.o_proj_weight);
}

/// The exact decomposition: hgrn_forward(w, u) == d.output(), x = i_proj(u).
template <Scalar T>
auto decompose(const hgrn_weights<T>& w, const Matrix<T>& u) { return attention(activations(w, u)); }

/// The exact decomposition (the named form of decompose).
template <Scalar T>
auto hgrn_decompose(const hgrn_weights<T>& w, const Matrix<T>& u) { return decompose(w, u); }

/// Zimerman et al.'s eq. 29: diag(SiLU g) LinearRecurrence(f, 1 - f) diag(sigmoid i), the norm dropped.
template <Scalar T>
auto hgrn_paper_attention(const hgrn_activations<T>& s) {
  s.check();
  return diagonal(hgrn_detail::silu_g(s)) * hgrn_detail::recurrence(s, false) *
         diagonal(nn::map<T>(s.i, [](T v) { return nn::sigmoid(v); }));
}
template <Scalar T>
auto hgrn_paper_attention(const hgrn_weights<T>& w, const Matrix<T>& u) { return hgrn_paper_attention(activations(w, u)); }

/// The state after the last token, fla's recurrent_state (1, I):
///   h[j] = sum_s exp(sum_{k>s} f_k[j]) (1 - exp f_s[j]) SiLU(i_s[j]), in log space (recurrent_state.hpp).
template <Scalar T>
Matrix<T> final_state(const hgrn_activations<T>& s) {
  s.check();
  const Index L = s.length(), I = s.input_dim();
  Matrix<T> h(1, I);
  for (Index j = 0; j < I; ++j)
    h(0, j) = decayed_sum<T>(
        L, [&](Index k) { return s.f(k, j); }, [&](Index q) { return -std::expm1(s.f(q, j)) * nn::silu(s.i(q, j)); });
  return h;
}

}  // namespace iattn::models
