// iattn/models/griffin.hpp: the Griffin / Hawk temporal-mixing block (recurrentgemma's
// `RecurrentBlock` with its `RGLRU` and `Conv1D`) as implicit attention.
//
// Forward, with segment_pos the position of each token in its document (a reset where it is 0):
//   g = GELU_tanh(linear_y(u));  x = linear_x(u)
//   p_t = conv_1d_b + sum_{k<4} [segment_pos_t >= k] conv_1d_w[3-k] x_{t-k}      (document-masked conv)
//   i = sigmoid(input_gate(p)), r = sigmoid(a_gate(p))                          (block-diagonal linears)
//   log a_t = -8 r_t softplus(a_param);  m_t = sqrt(1 - a_t^2);  at a reset a_t = 0 and m_t = 1
//   h_t = a_t h_{t-1} + m_t i_t p_t;  out = linear_out(h * g)
//
// Exact decomposition over lru_width channels, inner input x = linear_x(u):
//   H    = diag(g) LinearRecurrence(a, m i) Mmask,  Mmask = sum_k diag([segment_pos >= k] w[3-k]) Lag_k
//   beta = diag(g) LinearRecurrence(a, m i) conv_1d_b
// paper_attention is Zimerman et al.'s eq. 17, diag(g) LinearRecurrence(a, m i) M (bias term dropped);
// with sqrt_normaliser = false it reproduces the reference fork that forces m = 1 (an ablation,
// not the model).
#pragma once

#include "../iattn.hpp"
#include "common.hpp"

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace iattn::models {

struct griffin_config {
  Index width = 64;      ///< d_model
  Index lru_width = 64;  ///< D, the recurrence's channels
  Index num_heads = 4;   ///< blocks of the block-diagonal gates; must divide lru_width
  static constexpr Index conv1d_temporal_width = 4;
  Index block_width() const { return lru_width / num_heads; }
};

/// recurrentgemma `RecurrentBlock` parameters, state_dict names with '.' written '_'. The
/// block-diagonal gate weights (num_heads, bw, bw) are stored flattened as (lru_width, bw):
/// row h*bw + i, column j holds w[h, i, j].
template <Scalar T>
struct griffin_weights {
  griffin_config config;
  Matrix<T> linear_y_weight, linear_y_bias;      ///< (lru_width, width), (1, lru_width)
  Matrix<T> linear_x_weight, linear_x_bias;      ///< (lru_width, width), (1, lru_width)
  Matrix<T> linear_out_weight, linear_out_bias;  ///< (width, lru_width), (1, width)
  Matrix<T> conv_1d_w, conv_1d_b;                ///< (4, lru_width), (1, lru_width)
  Matrix<T> rg_lru_a_param;                      ///< (1, lru_width)
  Matrix<T> rg_lru_input_gate_w, rg_lru_input_gate_b;  ///< (lru_width, bw), (1, lru_width)
  Matrix<T> rg_lru_a_gate_w, rg_lru_a_gate_b;          ///< (lru_width, bw), (1, lru_width)

  void check() const {
    const auto& c = config;
    using std::to_string;
    const char* m = "griffin";
    if (c.num_heads < 1 || c.lru_width % c.num_heads != 0)
      detail::fail(m, "num_heads " + to_string(c.num_heads) + " must divide lru_width = " + to_string(c.lru_width));
    const Index D = c.lru_width, W = c.width, bw = c.block_width();
    const std::string dw = "(lru_width=" + to_string(D) + ", width=" + to_string(W) + ")", d1 = "(1, lru_width=" + to_string(D) + ")";
    const std::string gw = "(lru_width=" + to_string(D) + ", block_width=" + to_string(bw) + ")";
    check_field(m, "linear_y_weight", linear_y_weight, D, W, dw);
    check_field(m, "linear_y_bias", linear_y_bias, 1, D, d1);
    check_field(m, "linear_x_weight", linear_x_weight, D, W, dw);
    check_field(m, "linear_x_bias", linear_x_bias, 1, D, d1);
    check_field(m, "linear_out_weight", linear_out_weight, W, D, "(width=" + to_string(W) + ", lru_width=" + to_string(D) + ")");
    check_field(m, "linear_out_bias", linear_out_bias, 1, W, "(1, width=" + to_string(W) + ")");
    check_field(m, "conv_1d_w", conv_1d_w, 4, D, "(temporal_width=4, lru_width=" + to_string(D) + ")");
    check_field(m, "conv_1d_b", conv_1d_b, 1, D, d1);
    check_field(m, "rg_lru_a_param", rg_lru_a_param, 1, D, d1);
    check_field(m, "rg_lru_input_gate_w", rg_lru_input_gate_w, D, bw, gw);
    check_field(m, "rg_lru_input_gate_b", rg_lru_input_gate_b, 1, D, d1);
    check_field(m, "rg_lru_a_gate_w", rg_lru_a_gate_w, D, bw, gw);
    check_field(m, "rg_lru_a_gate_b", rg_lru_a_gate_b, 1, D, d1);
  }
};

/// recurrentgemma's initialisation: a = sqrt(U(0.9^2, 0.999^2)) stored as a_param = softplus^-1(-log a);
/// gates N(0, 1/bw) with zero biases; linears N(0, 1/fan_in) with zero biases; conv N(0, 1/4), zero bias.
template <Scalar T>
griffin_weights<T> griffin_init(const griffin_config& c, std::uint64_t seed = 0) {
  init::generator g(seed);
  griffin_weights<T> w;
  w.config = c;
  const Index D = c.lru_width, W = c.width, bw = c.block_width();
  auto zeros = [](Index n) { return Matrix<T>(Matrix<T>::Zero(1, n)); };
  w.linear_y_weight = init::normal<T>(g, D, W, std::sqrt(1.0 / double(W)));
  w.linear_y_bias = zeros(D);
  w.linear_x_weight = init::normal<T>(g, D, W, std::sqrt(1.0 / double(W)));
  w.linear_x_bias = zeros(D);
  w.linear_out_weight = init::normal<T>(g, W, D, std::sqrt(1.0 / double(D)));
  w.linear_out_bias = zeros(W);
  w.conv_1d_w = init::normal<T>(g, 4, D, std::sqrt(1.0 / 4.0));
  w.conv_1d_b = zeros(D);
  const Matrix<double> u = init::uniform<double>(g, 1, D, 0.9 * 0.9 + 1e-8, 0.999 * 0.999 + 1e-8);
  w.rg_lru_a_param.resize(1, D);
  for (Index i = 0; i < D; ++i) w.rg_lru_a_param(0, i) = T(std::log(std::expm1(-0.5 * std::log(u(0, i)))));
  w.rg_lru_input_gate_w = init::normal<T>(g, D, bw, std::sqrt(1.0 / double(bw)));
  w.rg_lru_input_gate_b = zeros(D);
  w.rg_lru_a_gate_w = init::normal<T>(g, D, bw, std::sqrt(1.0 / double(bw)));
  w.rg_lru_a_gate_b = zeros(D);
  return w;
}

/// Positions 0..L-1: one document.
inline std::vector<Index> single_segment(Index L) {
  std::vector<Index> s(static_cast<std::size_t>(L));
  for (Index t = 0; t < L; ++t) s[std::size_t(t)] = t;
  return s;
}

template <Scalar T>
struct griffin_activations {
  Matrix<T> x, gate, p, a, b;  // (L, D) each: b = m * i, the recurrence's input scale
  std::vector<Index> segment_pos;
};

namespace griffin_detail {
template <class T>
Matrix<T> block_diagonal(const Matrix<T>& X, const Matrix<T>& w, const Matrix<T>& b, Index heads) {
  const Index L = X.rows(), D = X.cols(), bw = D / heads;
  Matrix<T> Y(L, D);
  for (Index t = 0; t < L; ++t)
    for (Index h = 0; h < heads; ++h)
      for (Index j = 0; j < bw; ++j) {
        T acc = b(0, h * bw + j);
        for (Index i = 0; i < bw; ++i) acc += X(t, h * bw + i) * w(h * bw + i, j);
        Y(t, h * bw + j) = acc;
      }
  return Y;
}
}  // namespace griffin_detail

template <Scalar T>
griffin_activations<T> griffin_project(const griffin_weights<T>& w, const Matrix<T>& u, std::vector<Index> segment_pos,
                                       bool sqrt_normaliser = true) {
  w.check();
  const auto& c = w.config;
  const Index L = u.rows(), D = c.lru_width;
  detail::require_shape(u.cols() == c.width, "griffin", "u", u.rows(), u.cols(), "(L, width=" + std::to_string(c.width) + ")");
  if (Index(segment_pos.size()) != L)
    detail::require_shape(false, "griffin", "segment_pos", Index(segment_pos.size()), 1, "(L=" + std::to_string(L) + ", 1)");
  griffin_activations<T> s;
  s.segment_pos = std::move(segment_pos);
  s.gate = nn::map<T>(nn::linear<T>(u, w.linear_y_weight, w.linear_y_bias), [](T v) { return nn::gelu_tanh(v); });
  s.x = nn::linear<T>(u, w.linear_x_weight, w.linear_x_bias);
  s.p.resize(L, D);
  for (Index t = 0; t < L; ++t)
    for (Index ch = 0; ch < D; ++ch) {
      T acc = w.conv_1d_b(0, ch);
      for (Index k = 0; k < 4 && k <= t; ++k)
        if (s.segment_pos[std::size_t(t)] >= k) acc += w.conv_1d_w(3 - k, ch) * s.x(t - k, ch);
      s.p(t, ch) = acc;
    }
  const Matrix<T> gx = griffin_detail::block_diagonal(s.p, w.rg_lru_input_gate_w, w.rg_lru_input_gate_b, c.num_heads);
  const Matrix<T> ga = griffin_detail::block_diagonal(s.p, w.rg_lru_a_gate_w, w.rg_lru_a_gate_b, c.num_heads);
  s.a.resize(L, D);
  s.b.resize(L, D);
  for (Index t = 0; t < L; ++t) {
    const bool reset = s.segment_pos[std::size_t(t)] == 0;
    for (Index ch = 0; ch < D; ++ch) {
      const T log_a = T(-8) * nn::sigmoid(ga(t, ch)) * nn::softplus(w.rg_lru_a_param(0, ch));
      const T a = std::exp(log_a);
      const T m = reset || !sqrt_normaliser ? T(1) : std::sqrt(-std::expm1(T(2) * log_a));  // sqrt(1 - a^2)
      s.a(t, ch) = reset ? T(0) : a;
      s.b(t, ch) = m * nn::sigmoid(gx(t, ch));
    }
  }
  return s;
}

/// The block's plain recurrent forward (the oracle). segment_pos defaults to one document.
template <Scalar T>
Matrix<T> griffin_forward(const griffin_weights<T>& w, const Matrix<T>& u, std::vector<Index> segment_pos = {}) {
  if (segment_pos.empty()) segment_pos = single_segment(u.rows());
  const auto s = griffin_project(w, u, std::move(segment_pos));
  const Index L = u.rows(), D = w.config.lru_width;
  Matrix<T> y(L, D);
  std::vector<T> h(static_cast<std::size_t>(D), T(0));
  for (Index t = 0; t < L; ++t)
    for (Index ch = 0; ch < D; ++ch) {
      h[std::size_t(ch)] = s.a(t, ch) * h[std::size_t(ch)] + s.b(t, ch) * s.p(t, ch);
      y(t, ch) = h[std::size_t(ch)] * s.gate(t, ch);
    }
  return nn::linear<T>(y, w.linear_out_weight, w.linear_out_bias);
}

namespace griffin_detail {
/// sum_k diag([segment_pos >= k] w[3-k]) Lag_k: the document-masked conv as an expression.
template <class T, std::size_t... K>
auto masked_conv(const griffin_weights<T>& w, const std::vector<Index>& seg, Index L, std::index_sequence<K...>) {
  const Index D = w.config.lru_width;
  auto term = [&](Index k) {
    Matrix<T> coef(L, D), lag = Matrix<T>::Zero(k + 1, D);
    lag.row(0).setOnes();  // taps (k+1, D): tap 0 multiplies x_{t-k}
    for (Index t = 0; t < L; ++t)
      for (Index ch = 0; ch < D; ++ch) coef(t, ch) = seg[std::size_t(t)] >= k ? w.conv_1d_w(3 - k, ch) : T(0);
    return diagonal(std::move(coef)) * causal_conv(std::move(lag));
  };
  return (term(Index(K)) + ...);
}
}  // namespace griffin_detail

/// The exact decomposition: griffin_forward(w, u, segment_pos) == d.output().
template <Scalar T>
auto griffin_decompose(const griffin_weights<T>& w, const Matrix<T>& u, std::vector<Index> segment_pos = {}) {
  if (segment_pos.empty()) segment_pos = single_segment(u.rows());
  const auto s = griffin_project(w, u, std::move(segment_pos));
  const Index L = u.rows();
  auto core = diagonal(Matrix<T>(s.gate)) * linear_recurrence(Matrix<T>(s.a), Matrix<T>(s.b));
  Matrix<T> bias_in(L, w.config.lru_width);
  bias_in.rowwise() = w.conv_1d_b.row(0);
  Matrix<T> beta = apply(core, bias_in);
  auto H = core * griffin_detail::masked_conv(w, s.segment_pos, L, std::make_index_sequence<4>{});
  return make_decomposition<T>(s.x, std::move(H), std::move(beta), w.linear_out_weight, w.linear_out_bias);
}

/// Zimerman et al.'s eq. 17 on one document: diag(g) LinearRecurrence(a, m i) M, conv-bias term
/// dropped. sqrt_normaliser = false sets m = 1 (the reference fork's simplification).
template <Scalar T>
auto griffin_paper_attention(const griffin_weights<T>& w, const Matrix<T>& u, bool sqrt_normaliser = true) {
  const auto s = griffin_project(w, u, single_segment(u.rows()), sqrt_normaliser);
  return diagonal(Matrix<T>(s.gate)) * linear_recurrence(Matrix<T>(s.a), Matrix<T>(s.b)) *
         causal_conv(Matrix<T>(w.conv_1d_w));
}

}  // namespace iattn::models
