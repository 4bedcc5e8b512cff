// iattn/models/hyena.hpp: the Hyena operator of order 2 (safari's `HyenaOperator`) as implicit
// attention: two data-controlled gates around one long convolution.
//
// Forward (order 2, no post-order FFN):
//   z = in_proj(u) (L, 3d);  z = short_filter(z) (depthwise causal Conv1d, width 3, bias)
//   [x0, x1, v] = split(z);  v = v * x1;  v = (h * v) + filter_bias * v;  y = v * x0;  out = out_proj(y)
// where h (L, d) is the long filter of the implicit HyenaFilter (an MLP of positional features times
// an exponential decay window). It depends on positions only, never on the data, so it enters here
// as a weight: `filter` holds filter_fn.filter(l_max) materialised, one row per lag.
//
// Exact decomposition over the d channels, inner input x = in_proj's v part (before the short filter):
//   H    = diag(x0) (CausalConv(h) + diag(filter_bias)) diag(x1) M_v,    M_v = the short filter on v
//   beta = diag(x0) (CausalConv(h) + diag(filter_bias)) (x1 * short_filter_bias_v)
//
// From activations (docs/models.md): hyena_activations holds in_proj_v, x0, x1, the short filter, the
// long filter k and its bias, and (optionally) out_proj; attention(acts) is the decomposition. A long
// convolution has no finite recurrent state here: no final_state.
#pragma once

#include "../iattn.hpp"
#include "common.hpp"

#include <algorithm>
#include <cstdint>
#include <string>

namespace iattn::models {

struct hyena_config {
  Index d_model = 64;
  Index l_max = 512;       ///< rows of the materialised long filter; L <= l_max
  Index short_filter_order = 3;
};

/// safari `HyenaOperator` parameters, '.' written '_'; `filter` is filter_fn.filter(l_max)[0] as (l_max, d).
template <Scalar T>
struct hyena_weights {
  hyena_config config;
  Matrix<T> in_proj_weight;       ///< (3d, d)
  Matrix<T> in_proj_bias;         ///< (1, 3d)
  Matrix<T> short_filter_weight;  ///< (3d, short_filter_order)   PyTorch (3d, 1, order)
  Matrix<T> short_filter_bias;    ///< (1, 3d)
  Matrix<T> filter;               ///< (l_max, d): lag l in row l
  Matrix<T> filter_bias;          ///< (1, d)   filter_fn.bias, the long filter's skip
  Matrix<T> out_proj_weight;      ///< (d, d)
  Matrix<T> out_proj_bias;        ///< (1, d)

  void check() const {
    const auto& c = config;
    using std::to_string;
    const char* m = "hyena";
    const Index d = c.d_model;
    const std::string sd = to_string(d), s3 = to_string(3 * d);
    check_field(m, "in_proj_weight", in_proj_weight, 3 * d, d, "(3*d_model=" + s3 + ", d_model=" + sd + ")");
    check_field(m, "in_proj_bias", in_proj_bias, 1, 3 * d, "(1, 3*d_model=" + s3 + ")");
    check_field(m, "short_filter_weight", short_filter_weight, 3 * d, c.short_filter_order,
                "(3*d_model=" + s3 + ", short_filter_order=" + to_string(c.short_filter_order) + ")");
    check_field(m, "short_filter_bias", short_filter_bias, 1, 3 * d, "(1, 3*d_model=" + s3 + ")");
    check_field(m, "filter", filter, c.l_max, d, "(l_max=" + to_string(c.l_max) + ", d_model=" + sd + ")");
    check_field(m, "filter_bias", filter_bias, 1, d, "(1, d_model=" + sd + ")");
    check_field(m, "out_proj_weight", out_proj_weight, d, d, "(d_model=" + sd + ", d_model=" + sd + ")");
    check_field(m, "out_proj_bias", out_proj_bias, 1, d, "(1, d_model=" + sd + ")");
  }
};

/// PyTorch's default init for the projections and the short filter; filter_bias standard normal (as
/// HyenaFilter); the long filter a standard normal draw under HyenaFilter's exponential modulation
/// exp(-t |delta_c|), t = l / (l_max - 1), delta_c from log(1e-2)/0.3 to log(1e-2)/1.5 over channels.
template <Scalar T>
hyena_weights<T> hyena_init(const hyena_config& c, std::uint64_t seed = 0) {
  init::generator g(seed);
  hyena_weights<T> w;
  w.config = c;
  const Index d = c.d_model, K = c.short_filter_order;
  w.in_proj_weight = init::torch_default<T>(g, 3 * d, d, d);
  w.in_proj_bias = init::torch_default<T>(g, 1, 3 * d, d);
  w.short_filter_weight = init::torch_default<T>(g, 3 * d, K, K);
  w.short_filter_bias = init::torch_default<T>(g, 1, 3 * d, K);
  w.filter = init::normal<T>(g, c.l_max, d, 1.0);
  const double fast = std::log(1e-2) / 0.3, slow = std::log(1e-2) / 1.5;
  for (Index ch = 0; ch < d; ++ch) {
    const double delta = std::abs(d > 1 ? fast + (slow - fast) * double(ch) / double(d - 1) : fast);
    for (Index l = 0; l < c.l_max; ++l)
      w.filter(l, ch) *= T(std::exp(-delta * (c.l_max > 1 ? double(l) / double(c.l_max - 1) : 0.0)));
  }
  w.filter_bias = init::normal<T>(g, 1, d, 1.0);
  w.out_proj_weight = init::torch_default<T>(g, d, d, d);
  w.out_proj_bias = init::torch_default<T>(g, 1, d, d);
  return w;
}

/// One forward pass's activations, named after safari's `HyenaOperator.forward` (x[0], x[1], the
/// filter k and its bias). Built by `activations(w, u)` or by hand; `attention(acts)` needs nothing
/// else. A long convolution has no finite recurrent state here, so there is no final_state.
template <Scalar T>
struct hyena_activations {
  Matrix<T> in_proj_v;            ///< (L, d)  in_proj(u)'s v part, before short_filter: the inner input
  Matrix<T> x0;                   ///< (L, d)  x[0] after short_filter: the output gate
  Matrix<T> x1;                   ///< (L, d)  x[1] after short_filter: the gate before the long conv
  Matrix<T> short_filter_weight;  ///< (d, order): short_filter.weight's v rows, or the whole (3d, order)
  Matrix<T> short_filter_bias;    ///< (1, d) v part, or the whole (1, 3d), or empty (no bias)
  Matrix<T> k;                    ///< (L' >= L, d)  filter_fn.filter(L')[0]: lag l in row l
  Matrix<T> bias;                 ///< (1, d)  filter_fn.bias
  Matrix<T> out_proj_weight;      ///< (d_model, d) or empty (the decomposition stops before out_proj)
  Matrix<T> out_proj_bias;        ///< (1, d_model) or empty

  Index length() const { return in_proj_v.rows(); }

  /// Throws std::invalid_argument naming the first field whose shape disagrees (L, d from in_proj_v).
  void check() const {
    using std::to_string;
    const char* m = "hyena_activations";
    const Index L = in_proj_v.rows(), d = in_proj_v.cols();
    const std::string Ld = "(L=" + to_string(L) + ", d=" + to_string(d) + ")", d1 = "(1, d=" + to_string(d) + ")";
    check_field(m, "x0", x0, L, d, Ld);
    check_field(m, "x1", x1, L, d, Ld);
    detail::require_shape((short_filter_weight.rows() == d || short_filter_weight.rows() == 3 * d) && short_filter_weight.cols() >= 1, m,
                          "short_filter_weight", short_filter_weight.rows(), short_filter_weight.cols(),
                          "(d=" + to_string(d) + " or 3d=" + to_string(3 * d) + ", order)");
    if (short_filter_bias.size() != 0)
      detail::require_shape(short_filter_bias.rows() == 1 && (short_filter_bias.cols() == d || short_filter_bias.cols() == 3 * d), m,
                            "short_filter_bias", short_filter_bias.rows(), short_filter_bias.cols(), d1 + ", (1, 3d) or empty");
    detail::require_shape(k.cols() == d && k.rows() >= std::max<Index>(L, 1), m, "k", k.rows(), k.cols(), "(L' >= L=" + to_string(L) + ", d=" + to_string(d) + ")");
    check_field(m, "bias", bias, 1, d, d1);
    if (out_proj_weight.size() != 0) {
      detail::require_shape(out_proj_weight.cols() == d, m, "out_proj_weight", out_proj_weight.rows(), out_proj_weight.cols(),
                            "(d_model, d=" + to_string(d) + ") or empty");
      if (out_proj_bias.size() != 0)
        check_field(m, "out_proj_bias", out_proj_bias, 1, out_proj_weight.rows(), "(1, d_model=" + to_string(out_proj_weight.rows()) + ") or empty");
    }
  }
};

/// The activations of one forward pass on u (L, d_model), the whole short filter and out_proj included.
template <Scalar T>
hyena_activations<T> activations(const hyena_weights<T>& w, const Matrix<T>& u) {
  w.check();
  const auto& c = w.config;
  detail::require_shape(u.cols() == c.d_model, "hyena", "u", u.rows(), u.cols(), "(L, d_model=" + std::to_string(c.d_model) + ")");
  detail::require_shape(u.rows() <= c.l_max, "hyena", "u", u.rows(), u.cols(), "(L <= l_max=" + std::to_string(c.l_max) + ", d_model)");
  const Index d = c.d_model;
  const Matrix<T> z = nn::linear<T>(u, w.in_proj_weight, w.in_proj_bias);
  const Matrix<T> zc = nn::causal_conv1d<T>(z, w.short_filter_weight, w.short_filter_bias);
  hyena_activations<T> s;
  s.in_proj_v = z.rightCols(d);
  s.x0 = zc.leftCols(d);
  s.x1 = zc.middleCols(d, d);
  s.short_filter_weight = w.short_filter_weight;
  s.short_filter_bias = w.short_filter_bias;
  s.k = w.filter.topRows(std::max<Index>(u.rows(), 1));
  s.bias = w.filter_bias;
  s.out_proj_weight = w.out_proj_weight;
  s.out_proj_bias = w.out_proj_bias;
  return s;
}

/// The operator's forward (the oracle): the long convolution as a direct sum over lags.
template <Scalar T>
Matrix<T> hyena_forward(const hyena_weights<T>& w, const Matrix<T>& u) {
  w.check();
  const auto& c = w.config;
  detail::require_shape(u.cols() == c.d_model, "hyena", "u", u.rows(), u.cols(), "(L, d_model=" + std::to_string(c.d_model) + ")");
  detail::require_shape(u.rows() <= c.l_max, "hyena", "u", u.rows(), u.cols(), "(L <= l_max=" + std::to_string(c.l_max) + ", d_model)");
  const Index L = u.rows(), d = c.d_model;
  const Matrix<T> zc = nn::causal_conv1d<T>(nn::linear<T>(u, w.in_proj_weight, w.in_proj_bias), w.short_filter_weight, w.short_filter_bias);
  const Matrix<T> g = zc.rightCols(d).cwiseProduct(zc.middleCols(d, d));
  Matrix<T> y(L, d);
  for (Index t = 0; t < L; ++t)
    for (Index ch = 0; ch < d; ++ch) {
      T acc = w.filter_bias(0, ch) * g(t, ch);
      for (Index l = 0; l <= t; ++l) acc += w.filter(l, ch) * g(t - l, ch);
      y(t, ch) = acc * zc(t, ch);
    }
  return nn::linear<T>(y, w.out_proj_weight, w.out_proj_bias);
}

/// The exact decomposition from activations, x = in_proj_v; out_proj_weight empty gives y.
template <Scalar T>
auto attention(const hyena_activations<T>& s) {
  s.check();
  const Index L = s.length(), d = s.in_proj_v.cols();
  // CausalConv tap L-1-l holds lag l
  auto core = diagonal(s.x0) * (causal_conv(s.k.topRows(std::max<Index>(L, 1)).colwise().reverse()) + diagonal(s.bias)) * diagonal(s.x1);
  Matrix<T> beta = Matrix<T>::Zero(L, d);
  if (s.short_filter_bias.size() != 0) {
    Matrix<T> bias_in = Matrix<T>::Ones(L, d);
    bias_in.array().rowwise() *= s.short_filter_bias.row(0).tail(d).array();
    beta = apply(core, bias_in);
  }
  auto M = causal_conv(depthwise_taps(s.short_filter_weight.bottomRows(d)));  // the v rows: the last d of (d or 3d)
  return make_decomposition<T>(s.in_proj_v, std::move(core) * std::move(M), std::move(beta), s.out_proj_weight, s.out_proj_bias);
}

/// The exact decomposition: hyena_forward(w, u) == d.output(), x = in_proj's v part.
template <Scalar T>
auto decompose(const hyena_weights<T>& w, const Matrix<T>& u) { return attention(activations(w, u)); }

/// The exact decomposition (the named form of decompose).
template <Scalar T>
auto hyena_decompose(const hyena_weights<T>& w, const Matrix<T>& u) { return decompose(w, u); }

}  // namespace iattn::models
