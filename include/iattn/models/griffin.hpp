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
//
// From activations (docs/models.md): griffin_activations holds x, y (the GELU gate branch), gate_x,
// log_a, segment_pos, the conv and (optionally) linear_out; attention(acts) is the decomposition,
// griffin_paper_attention(acts) eq. 17, final_state(acts) the RG-LRU state h (1, lru_width).
// conv_1d_w is recurrentgemma's Conv1D.w [temporal_width, width]; Hugging Face's recurrent_gemma
// stores conv_1d.weight as (lru_width, 1, 4): conv_1d_w = depthwise_taps(that weight flattened).
#pragma once

#include "../iattn.hpp"
#include "common.hpp"
#include "recurrent_state.hpp"

#include <cstdint>
#include <limits>
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
  Matrix<T> conv_1d_w, conv_1d_b;                ///< (4, lru_width) Conv1D.w [temporal_width, width], (1, lru_width)
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
/// recurrentgemma's document-masked Conv1D: p_t = b + sum_{k<4, k<=segment_pos_t} w[3-k] x_{t-k}.
template <class T>
Matrix<T> masked_conv1d(const Matrix<T>& x, const Matrix<T>& w, const Matrix<T>& b, const std::vector<Index>& seg) {
  const Index L = x.rows(), D = x.cols(), K = w.rows();
  Matrix<T> p(L, D);
  for (Index t = 0; t < L; ++t)
    for (Index ch = 0; ch < D; ++ch) {
      T acc = b.size() ? b(0, ch) : T(0);
      for (Index k = 0; k < K && k <= t; ++k)
        if (seg[std::size_t(t)] >= k) acc += w(K - 1 - k, ch) * x(t - k, ch);
      p(t, ch) = acc;
    }
  return p;
}
inline void check_segment_pos(const char* m, const std::vector<Index>& seg, Index L) {
  if (Index(seg.size()) != L) detail::require_shape(false, m, "segment_pos", Index(seg.size()), 1, "(L=" + std::to_string(L) + ", 1)");
}
}  // namespace griffin_detail

/// One forward pass's activations, named as recurrentgemma's `RecurrentBlock` / `RGLRU` name them.
/// Built by `activations(w, u, segment_pos)` or by hand; `attention(acts)` needs nothing else.
template <Scalar T>
struct griffin_activations {
  Matrix<T> x;                  ///< (L, lru_width)  linear_x(u): the inner input, before the conv
  Matrix<T> y;                  ///< (L, lru_width)  GELU_tanh(linear_y(u)): the output gate
  Matrix<T> gate_x;             ///< (L, lru_width)  sigmoid(input_gate(conv out))
  Matrix<T> log_a;              ///< (L, lru_width)  -8 sigmoid(a_gate(conv out)) softplus(a_param), <= 0 (before resets)
  std::vector<Index> segment_pos;  ///< (L): a reset (a = 0, multiplier 1) where it is 0
  Matrix<T> conv_1d_w;          ///< (temporal_width, lru_width)  Conv1D.w; tap temporal_width-1 multiplies x_t
  Matrix<T> conv_1d_b;          ///< (1, lru_width) or empty (no bias)
  Matrix<T> linear_out_weight;  ///< (width, lru_width) or empty (the decomposition stops before linear_out)
  Matrix<T> linear_out_bias;    ///< (1, width) or empty

  Index length() const { return x.rows(); }
  Index lru_width() const { return x.cols(); }

  /// Throws std::invalid_argument naming the first field whose shape disagrees (L, lru_width from x).
  void check() const {
    using std::to_string;
    const char* m = "griffin_activations";
    const Index L = x.rows(), D = x.cols();
    const std::string LD = "(L=" + to_string(L) + ", lru_width=" + to_string(D) + ")", D1 = "(1, lru_width=" + to_string(D) + ")";
    check_field(m, "y", y, L, D, LD);
    check_field(m, "gate_x", gate_x, L, D, LD);
    check_field(m, "log_a", log_a, L, D, LD);
    griffin_detail::check_segment_pos(m, segment_pos, L);
    detail::require_shape(conv_1d_w.cols() == D && conv_1d_w.rows() >= 1, m, "conv_1d_w", conv_1d_w.rows(), conv_1d_w.cols(),
                          "(temporal_width, lru_width=" + to_string(D) + ")");
    if (conv_1d_b.size() != 0) check_field(m, "conv_1d_b", conv_1d_b, 1, D, D1 + " or empty");
    if (linear_out_weight.size() != 0) {
      detail::require_shape(linear_out_weight.cols() == D, m, "linear_out_weight", linear_out_weight.rows(), linear_out_weight.cols(),
                            "(width, lru_width=" + to_string(D) + ") or empty");
      if (linear_out_bias.size() != 0)
        check_field(m, "linear_out_bias", linear_out_bias, 1, linear_out_weight.rows(), "(1, width=" + to_string(linear_out_weight.rows()) + ") or empty");
    }
    if ((log_a.array() > T(0)).any()) detail::fail(m, "log_a must be <= 0");
  }
  /// The document-masked conv output p (L, lru_width), the RG-LRU's input.
  Matrix<T> conv_out() const { return griffin_detail::masked_conv1d<T>(x, conv_1d_w, conv_1d_b, segment_pos); }
  /// The recurrence's coefficients: a (0 at a reset) and its input scale b = multiplier * gate_x with
  /// multiplier sqrt(1 - a^2) (1 at a reset, or everywhere when sqrt_normaliser is false).
  void recurrence(Matrix<T>& a, Matrix<T>& b, bool sqrt_normaliser = true) const {
    const Index L = length(), D = lru_width();
    a.resize(L, D);
    b.resize(L, D);
    for (Index t = 0; t < L; ++t) {
      const bool reset = segment_pos[std::size_t(t)] == 0;
      for (Index ch = 0; ch < D; ++ch) {
        const T la = log_a(t, ch);
        a(t, ch) = reset ? T(0) : std::exp(la);
        const T mult = reset || !sqrt_normaliser ? T(1) : std::sqrt(-std::expm1(T(2) * la));  // sqrt(1 - a^2)
        b(t, ch) = mult * gate_x(t, ch);
      }
    }
  }
};

/// The activations of one forward pass on u (L, width); segment_pos empty means one document.
template <Scalar T>
griffin_activations<T> activations(const griffin_weights<T>& w, const Matrix<T>& u, std::vector<Index> segment_pos = {}) {
  w.check();
  const auto& c = w.config;
  const Index L = u.rows();
  detail::require_shape(u.cols() == c.width, "griffin", "u", u.rows(), u.cols(), "(L, width=" + std::to_string(c.width) + ")");
  if (segment_pos.empty()) segment_pos = single_segment(L);
  griffin_detail::check_segment_pos("griffin", segment_pos, L);
  griffin_activations<T> s;
  s.segment_pos = std::move(segment_pos);
  s.y = nn::map<T>(nn::linear<T>(u, w.linear_y_weight, w.linear_y_bias), [](T v) { return nn::gelu_tanh(v); });
  s.x = nn::linear<T>(u, w.linear_x_weight, w.linear_x_bias);
  s.conv_1d_w = w.conv_1d_w;
  s.conv_1d_b = w.conv_1d_b;
  const Matrix<T> p = s.conv_out();
  s.gate_x = nn::map<T>(griffin_detail::block_diagonal(p, w.rg_lru_input_gate_w, w.rg_lru_input_gate_b, c.num_heads), [](T v) { return nn::sigmoid(v); });
  const Matrix<T> ga = griffin_detail::block_diagonal(p, w.rg_lru_a_gate_w, w.rg_lru_a_gate_b, c.num_heads);
  s.log_a.resize(L, c.lru_width);
  for (Index t = 0; t < L; ++t)
    for (Index ch = 0; ch < c.lru_width; ++ch) s.log_a(t, ch) = T(-8) * nn::sigmoid(ga(t, ch)) * nn::softplus(w.rg_lru_a_param(0, ch));
  s.linear_out_weight = w.linear_out_weight;
  s.linear_out_bias = w.linear_out_bias;
  return s;
}

/// The block's plain recurrent forward (the oracle). segment_pos defaults to one document;
/// final_state, when given, receives the RG-LRU state after the last token (1, lru_width).
template <Scalar T>
Matrix<T> griffin_forward(const griffin_weights<T>& w, const Matrix<T>& u, std::vector<Index> segment_pos = {},
                          Matrix<T>* final_state = nullptr) {
  w.check();
  const auto& c = w.config;
  const Index L = u.rows(), D = c.lru_width;
  detail::require_shape(u.cols() == c.width, "griffin", "u", u.rows(), u.cols(), "(L, width=" + std::to_string(c.width) + ")");
  if (segment_pos.empty()) segment_pos = single_segment(L);
  griffin_detail::check_segment_pos("griffin", segment_pos, L);
  const Matrix<T> gate = nn::map<T>(nn::linear<T>(u, w.linear_y_weight, w.linear_y_bias), [](T v) { return nn::gelu_tanh(v); });
  const Matrix<T> p = griffin_detail::masked_conv1d<T>(nn::linear<T>(u, w.linear_x_weight, w.linear_x_bias), w.conv_1d_w, w.conv_1d_b, segment_pos);
  const Matrix<T> gx = griffin_detail::block_diagonal(p, w.rg_lru_input_gate_w, w.rg_lru_input_gate_b, c.num_heads);
  const Matrix<T> ga = griffin_detail::block_diagonal(p, w.rg_lru_a_gate_w, w.rg_lru_a_gate_b, c.num_heads);
  Matrix<T> y(L, D), h = Matrix<T>::Zero(1, D);
  for (Index t = 0; t < L; ++t) {
    const bool reset = segment_pos[std::size_t(t)] == 0;
    for (Index ch = 0; ch < D; ++ch) {
      const T log_a = T(-8) * nn::sigmoid(ga(t, ch)) * nn::softplus(w.rg_lru_a_param(0, ch)), a = std::exp(log_a);
      const T m = reset ? T(1) : std::sqrt(-std::expm1(T(2) * log_a));  // sqrt(1 - a^2)
      h(0, ch) = (reset ? T(0) : a) * h(0, ch) + m * nn::sigmoid(gx(t, ch)) * p(t, ch);
      y(t, ch) = h(0, ch) * gate(t, ch);
    }
  }
  if (final_state) *final_state = h;
  return nn::linear<T>(y, w.linear_out_weight, w.linear_out_bias);
}

namespace griffin_detail {
/// sum_k diag([segment_pos >= k] w[K-1-k]) Lag_k: the document-masked conv as an expression.
/// Without a document boundary inside the conv's reach (segment_pos[t] >= min(t, taps - 1) for
/// every t: the mask is 1 wherever Lag_k reads a token) each diagonal is one row (1, D), constant
/// over tokens, so apply reads 4 rows instead of 4 (L, D) tensors (issue 22: Griffin's apply was
/// bound by that traffic, superlinear in L once the tensors left the cache).
template <class T, std::size_t... K>
auto masked_conv(const Matrix<T>& w, const std::vector<Index>& seg, Index L, std::index_sequence<K...>) {
  const Index D = w.cols(), taps = w.rows();
  bool unmasked = true;
  for (Index t = 0; t < L && unmasked; ++t) unmasked = seg[std::size_t(t)] >= std::min(t, taps - 1);
  auto term = [&](Index k) {
    Matrix<T> coef(unmasked ? 1 : L, D), lag = Matrix<T>::Zero(k + 1, D);
    lag.row(0).setOnes();  // taps (k+1, D): tap 0 multiplies x_{t-k}
    for (Index t = 0; t < coef.rows(); ++t)
      for (Index ch = 0; ch < D; ++ch)
        coef(t, ch) = k < taps && (unmasked || seg[std::size_t(t)] >= k) ? w(taps - 1 - k, ch) : T(0);
    return diagonal(std::move(coef)) * causal_conv(std::move(lag));
  };
  return (term(Index(K)) + ...);
}
}  // namespace griffin_detail

/// The exact decomposition from activations; linear_out_weight empty gives the inner output h * y.
/// The masked conv is written for recurrentgemma's temporal width 4 (wider conv_1d_w throws).
template <Scalar T>
auto attention(const griffin_activations<T>& s) {
  s.check();
  if (s.conv_1d_w.rows() > griffin_config::conv1d_temporal_width)
    detail::require_shape(false, "griffin_activations", "conv_1d_w", s.conv_1d_w.rows(), s.conv_1d_w.cols(), "(temporal_width <= 4, lru_width)");
  const Index L = s.length(), D = s.lru_width();
  Matrix<T> a, b;
  s.recurrence(a, b);
  auto core = diagonal(s.y) * linear_recurrence(std::move(a), std::move(b));
  Matrix<T> beta = Matrix<T>::Zero(L, D);
  if (s.conv_1d_b.size() != 0) {
    Matrix<T> bias_in(L, D);
    bias_in.rowwise() = s.conv_1d_b.row(0);
    beta = apply(core, bias_in);
  }
  auto H = core * griffin_detail::masked_conv(s.conv_1d_w, s.segment_pos, L, std::make_index_sequence<griffin_config::conv1d_temporal_width>{});
  return make_decomposition<T>(s.x, std::move(H), std::move(beta), s.linear_out_weight, s.linear_out_bias);
}

/// The exact decomposition: griffin_forward(w, u, segment_pos) == d.output().
template <Scalar T>
auto decompose(const griffin_weights<T>& w, const Matrix<T>& u, std::vector<Index> segment_pos = {}) {
  return attention(activations(w, u, std::move(segment_pos)));
}

/// The exact decomposition (the named form of decompose).
template <Scalar T>
auto griffin_decompose(const griffin_weights<T>& w, const Matrix<T>& u, std::vector<Index> segment_pos = {}) {
  return decompose(w, u, std::move(segment_pos));
}

/// Zimerman et al.'s eq. 17: diag(y) LinearRecurrence(a, m gate_x) M with the plain conv M, the
/// conv-bias term dropped. sqrt_normaliser = false sets m = 1 (the reference fork's simplification).
/// The recurrence still resets where segment_pos is 0; the paper's M knows no documents.
template <Scalar T>
auto griffin_paper_attention(const griffin_activations<T>& s, bool sqrt_normaliser = true) {
  s.check();
  Matrix<T> a, b;
  s.recurrence(a, b, sqrt_normaliser);
  return diagonal(s.y) * linear_recurrence(std::move(a), std::move(b)) * causal_conv(s.conv_1d_w);
}
/// Eq. 17 on one document.
template <Scalar T>
auto griffin_paper_attention(const griffin_weights<T>& w, const Matrix<T>& u, bool sqrt_normaliser = true) {
  return griffin_paper_attention(activations(w, u), sqrt_normaliser);
}

/// The RG-LRU state after the last token, recurrentgemma's rg_lru_state (1, lru_width):
///   h[c] = sum_s exp(sum_{k>s} log a_k[c]) b_s[c] p_s[c],  log a = -inf at a reset,
/// in log space (recurrent_state.hpp); p the masked conv output, b = multiplier * gate_x.
template <Scalar T>
Matrix<T> final_state(const griffin_activations<T>& s) {
  s.check();
  const Matrix<T> p = s.conv_out();
  Matrix<T> a, b;
  s.recurrence(a, b);
  const Index L = s.length(), D = s.lru_width();
  const T neg_inf = -std::numeric_limits<T>::infinity();
  Matrix<T> h(1, D);
  for (Index ch = 0; ch < D; ++ch)
    h(0, ch) = decayed_sum<T>(
        L, [&](Index k) { return s.segment_pos[std::size_t(k)] == 0 ? neg_inf : s.log_a(k, ch); },
        [&](Index q) { return b(q, ch) * p(q, ch); });
  return h;
}

}  // namespace iattn::models
