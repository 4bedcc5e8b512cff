// iattn/models/rwkv7.hpp: RWKV-7 ("Goose", x070) time mixing as flash-linear-attention's
// `RWKV7Attention` defines it (the form of fla-hub's RWKV-7 checkpoints; transformers has no RWKV-7),
// as implicit attention.
//
// Forward on x (L, C) (the block's attn_norm output), H heads of N, value width V (C by default):
//   delta_t = x_{t-1} - x_t (x_{-1} = 0);  x? = x + delta * x_?  for ? in r, w, k, v, a, g
//   r = r_proj(xr), k = k_proj(xk), v = v_proj(xv)
//   w = -exp(-1/2) sigmoid(w_lora(xw))                    log-decay in (-0.607, 0); w_lora = tanh(xw W0^T) W2^T + b2
//   layer > 0: v = v + (v_first - v) sigmoid(v_lora(xv))  (value residual from layer 0's v)
//   a = sigmoid(a_lora(xa)),  g = sigmoid(xg G0^T) G2^T
//   kk = normalize_head(k * k_k),  k = k * (1 + (a - 1) * k_a)
//   S_t = Diag(exp w_t) S_{t-1} + (kk_t * a_t)(-kk_t)^T S_{t-1} + k_t v_t^T,   o_t = S_t^T r_t   (per head, (K, V))
//   p = GroupNorm_H(o; centred, eps = N * norm_eps, g_norm weight and bias)
//   p_t += (sum_m r_t[m] r_k[h, m] k_t[m]) v_t             (the bonus, per head, AFTER the norm)
//   out = o_proj(p * g)
// The official code keeps the transposed (V, K) state; fla's and this form are its transpose. The
// bonus is added to the normed output, as in the official x070 code (ln_x, then the r_k term) and
// fla's gate_output_correction (checked against fla's layer: tests/models/reference_test.cpp).
//
// Exact decomposition over the V value channels, inner input x = v (after the value residual):
//   H    = diag(g) (N T + diag(bonus)),   beta = g * (offset(N) + g_norm_bias)
// with T = transition(lambda = w, a = -kk, b = kk * a, q = r, k) (ops/transition.hpp: A_t = Diag(e^w) + b a^T,
// rank 1) and N the centred group norm bound to its actual input T v.
#pragma once

#include "../iattn.hpp"
#include "common.hpp"
#include "delta_rule.hpp"

#include <cmath>
#include <cstdint>
#include <string>

namespace iattn::models {

struct rwkv7_config {
  Index hidden_size = 64;  ///< C (= key_dim)
  Index head_dim = 16;     ///< N
  Index value_dim = 0;     ///< V; 0 means hidden_size
  Index decay_low_rank_dim = 8, a_low_rank_dim = 8, v_low_rank_dim = 8, gate_low_rank_dim = 16;
  Index layer_idx = 0;     ///< layers > 0 mix in layer 0's values (v_lora)
  Index num_hidden_layers = 2;
  double norm_eps = 1e-5;  ///< the group norm's eps is head_dim * norm_eps
  bool fuse_norm = true;   ///< kk = x / sqrt(sum x^2 + 1e-6) (fla's l2_norm); false: x / max(|x|, 1e-12) (F.normalize, the official form)
  Index num_heads() const { return hidden_size / head_dim; }
  Index v_dim() const { return value_dim ? value_dim : hidden_size; }
};

/// `RWKV7Attention` parameters, named as fla's state_dict ('.' written '_'); the v_lora fields are
/// empty in layer 0.
template <Scalar T>
struct rwkv7_weights {
  rwkv7_config config;
  Matrix<T> x_r, x_w, x_k, x_v, x_a, x_g;  ///< (1, C) each, token-shift mixes
  Matrix<T> k_k, k_a;                      ///< (1, C)
  Matrix<T> r_k;                           ///< (H, N)
  Matrix<T> r_proj_weight, k_proj_weight;  ///< (C, C)
  Matrix<T> v_proj_weight;                 ///< (V, C)
  Matrix<T> o_proj_weight;                 ///< (C, V)
  Matrix<T> w_lora_lora_0_weight, w_lora_lora_2_weight, w_lora_lora_2_bias;  ///< (Dw, C), (C, Dw), (1, C)
  Matrix<T> a_lora_lora_0_weight, a_lora_lora_2_weight, a_lora_lora_2_bias;  ///< (Da, C), (C, Da), (1, C)
  Matrix<T> v_lora_lora_0_weight, v_lora_lora_2_weight, v_lora_lora_2_bias;  ///< (Dv, C), (V, Dv), (1, V); layer > 0
  Matrix<T> g_lora_lora_0_weight, g_lora_lora_2_weight;                     ///< (Dg, C), (V, Dg)
  Matrix<T> g_norm_weight, g_norm_bias;                                      ///< (1, V)

  void check() const {
    const auto& c = config;
    using std::to_string;
    const char* m = "rwkv7";
    if (c.head_dim < 1 || c.hidden_size % c.head_dim != 0 || c.v_dim() % c.num_heads() != 0)
      detail::fail(m, "head_dim " + to_string(c.head_dim) + " must divide hidden_size = " + to_string(c.hidden_size) +
                          ", and the heads must divide value_dim = " + to_string(c.v_dim()));
    const Index C = c.hidden_size, V = c.v_dim();
    const std::string Cs = to_string(C), Vs = to_string(V), c1 = "(1, hidden_size=" + Cs + ")", v1 = "(1, value_dim=" + Vs + ")";
    for (auto [f, mat] : {std::pair<const char*, const Matrix<T>*>{"x_r", &x_r}, {"x_w", &x_w}, {"x_k", &x_k}, {"x_v", &x_v},
                          {"x_a", &x_a}, {"x_g", &x_g}, {"k_k", &k_k}, {"k_a", &k_a}})
      check_field(m, f, *mat, 1, C, c1);
    check_field(m, "r_k", r_k, c.num_heads(), c.head_dim, "(num_heads=" + to_string(c.num_heads()) + ", head_dim=" + to_string(c.head_dim) + ")");
    check_field(m, "r_proj_weight", r_proj_weight, C, C, "(hidden_size=" + Cs + ", hidden_size=" + Cs + ")");
    check_field(m, "k_proj_weight", k_proj_weight, C, C, "(hidden_size=" + Cs + ", hidden_size=" + Cs + ")");
    check_field(m, "v_proj_weight", v_proj_weight, V, C, "(value_dim=" + Vs + ", hidden_size=" + Cs + ")");
    check_field(m, "o_proj_weight", o_proj_weight, C, V, "(hidden_size=" + Cs + ", value_dim=" + Vs + ")");
    auto lora = [&](const char* f0, const Matrix<T>& w0, const char* f2, const Matrix<T>& w2, Index r, Index out) {
      check_field(m, f0, w0, r, C, "(" + to_string(r) + ", hidden_size=" + Cs + ")");
      check_field(m, f2, w2, out, r, "(" + to_string(out) + ", " + to_string(r) + ")");
    };
    lora("w_lora_lora_0_weight", w_lora_lora_0_weight, "w_lora_lora_2_weight", w_lora_lora_2_weight, c.decay_low_rank_dim, C);
    check_field(m, "w_lora_lora_2_bias", w_lora_lora_2_bias, 1, C, c1);
    lora("a_lora_lora_0_weight", a_lora_lora_0_weight, "a_lora_lora_2_weight", a_lora_lora_2_weight, c.a_low_rank_dim, C);
    check_field(m, "a_lora_lora_2_bias", a_lora_lora_2_bias, 1, C, c1);
    if (c.layer_idx > 0) {
      lora("v_lora_lora_0_weight", v_lora_lora_0_weight, "v_lora_lora_2_weight", v_lora_lora_2_weight, c.v_low_rank_dim, V);
      check_field(m, "v_lora_lora_2_bias", v_lora_lora_2_bias, 1, V, v1);
    } else if (v_lora_lora_0_weight.size() != 0) {
      detail::fail(m, "v_lora_lora_0_weight is given but layer 0 has no value residual (expected empty)");
    }
    lora("g_lora_lora_0_weight", g_lora_lora_0_weight, "g_lora_lora_2_weight", g_lora_lora_2_weight, c.gate_low_rank_dim, V);
    check_field(m, "g_norm_weight", g_norm_weight, 1, V, v1);
    check_field(m, "g_norm_bias", g_norm_bias, 1, V, v1);
  }
};

namespace rwkv7_detail {
/// A (rows, cols) matrix with orthonormal rows or columns times gain (PyTorch's orthogonal_ init:
/// the Q of a Gaussian draw's QR with R's diagonal positive, here by modified Gram-Schmidt). The
/// draw is held column-major so that every column the orthogonalisation walks is contiguous: on
/// the row-major Matrix each column was a strided walk through the whole draw, and
/// rwkv7_init(hidden_size = 1024) took 42 s (0.8 s now; g++ 12 -O2, Zen 3).
template <class T>
Matrix<T> orthogonal(init::generator& g, Index rows, Index cols, double gain) {
  const bool tall = rows >= cols;
  Eigen::MatrixXd M = init::normal<double>(g, tall ? rows : cols, tall ? cols : rows, 1.0);
  for (Index j = 0; j < M.cols(); ++j) {
    auto cj = M.col(j);
    for (Index i = 0; i < j; ++i) cj -= M.col(i).dot(cj) * M.col(i);
    cj.normalize();
  }
  Matrix<double> Q = tall ? Matrix<double>(M) : Matrix<double>(M.transpose());
  return (Q * gain).cast<T>();
}
}  // namespace rwkv7_detail

/// fla's `_initialize_weights` for layer config.layer_idx of num_hidden_layers (the official x070
/// init): the token-shift mixes 1 - (n/C)^(p (1 - l/Lyr)), w0 = www + 0.5 + 2.5 zigzag, a0, v0, k_k,
/// k_a, r_k and the g_norm weight as the reference sets them, orthogonal r/k/v projections (gains 1,
/// 0.1, 1) and second LoRA layers (x 0.1), zero first LoRA layers and o_proj. With the zero o_proj
/// the layer's output is 0, as the reference's at init; tests draw their own.
template <Scalar T>
rwkv7_weights<T> rwkv7_init(const rwkv7_config& c, std::uint64_t seed = 0) {
  init::generator g(seed);
  rwkv7_weights<T> w;
  w.config = c;
  const Index C = c.hidden_size, V = c.v_dim(), N = c.head_dim, H = c.num_heads();
  const double l = double(c.layer_idx), Lyr = double(std::max<Index>(c.num_hidden_layers, 1));
  const double r01 = Lyr > 1 ? l / (Lyr - 1) : 0.0, r1to0 = 1.0 - l / Lyr;
  Matrix<T> lin(1, C), zig(1, C), www(1, C);
  for (Index n = 0; n < C; ++n) {
    lin(0, n) = T(double(n) / double(std::max<Index>(C - 1, 1)) - 0.5);
    double z = (double(n % N) - double(N - 1) / 2) / std::max(double(N - 1) / 2, 1e-12);
    zig(0, n) = T(z * std::abs(z));
    www(0, n) = T(-6 + 6 * std::pow(double(n) / double(std::max<Index>(C - 1, 1)), 1 + std::pow(r01, 0.3)));
  }
  auto mix = [&](double p) {
    Matrix<T> x(1, C);
    for (Index n = 0; n < C; ++n) x(0, n) = T(1 - std::pow(double(n) / double(C), p * r1to0));
    return x;
  };
  w.x_r = mix(0.2), w.x_w = mix(0.9), w.x_k = mix(0.7), w.x_v = mix(0.7), w.x_a = mix(0.9), w.x_g = mix(0.2);
  w.k_k = (T(0.71) - T(0.1) * lin.array()).matrix();
  w.k_a = Matrix<T>::Constant(1, C, T(1.02));
  w.r_k = Matrix<T>::Constant(H, N, T(-0.04));
  w.r_proj_weight = rwkv7_detail::orthogonal<T>(g, C, C, 1.0);
  w.k_proj_weight = rwkv7_detail::orthogonal<T>(g, C, C, 0.1);
  w.v_proj_weight = rwkv7_detail::orthogonal<T>(g, V, C, 1.0);
  w.o_proj_weight = Matrix<T>::Zero(C, V);
  w.w_lora_lora_0_weight = Matrix<T>::Zero(c.decay_low_rank_dim, C);
  w.w_lora_lora_2_weight = rwkv7_detail::orthogonal<T>(g, C, c.decay_low_rank_dim, 0.1);
  w.w_lora_lora_2_bias = (www.array() + T(0.5) + T(2.5) * zig.array()).matrix();
  w.a_lora_lora_0_weight = Matrix<T>::Zero(c.a_low_rank_dim, C);
  w.a_lora_lora_2_weight = rwkv7_detail::orthogonal<T>(g, C, c.a_low_rank_dim, 0.1);
  w.a_lora_lora_2_bias = (T(-0.19) + T(0.3) * zig.array() + T(0.4) * lin.array()).matrix();
  if (c.layer_idx > 0) {
    w.v_lora_lora_0_weight = Matrix<T>::Zero(c.v_low_rank_dim, C);
    w.v_lora_lora_2_weight = rwkv7_detail::orthogonal<T>(g, V, c.v_low_rank_dim, 0.1);
    w.v_lora_lora_2_bias = Matrix<T>::Constant(1, V, T(0.73));
    for (Index n = 0; n < V && n < C; ++n) w.v_lora_lora_2_bias(0, n) -= T(0.4) * lin(0, n);
  }
  w.g_lora_lora_0_weight = Matrix<T>::Zero(c.gate_low_rank_dim, C);
  w.g_lora_lora_2_weight = rwkv7_detail::orthogonal<T>(g, V, c.gate_low_rank_dim, 0.1);
  w.g_norm_weight = Matrix<T>::Constant(1, V, T(std::pow((l + 1) / Lyr, 0.7)));
  w.g_norm_bias = Matrix<T>::Zero(1, V);
  return w;
}

/// One forward pass's activations, named as fla's `RWKV7Attention.forward` names them (k after its
/// update by a and k_a, v after the value residual), plus the parameters the decomposition reads.
template <Scalar T>
struct rwkv7_activations {
  Matrix<T> r;       ///< (L, C)  receptance: the recurrence's q
  Matrix<T> w;       ///< (L, C)  log-decay in (-0.607, 0)
  Matrix<T> k;       ///< (L, C)  keys after k * (1 + (a - 1) k_a)
  Matrix<T> v;       ///< (L, V)  values after the value residual: the inner input x
  Matrix<T> a;       ///< (L, C)  in-context learning rate sigmoid(a_lora(xa))
  Matrix<T> kk;      ///< (L, C)  normalised removal keys
  Matrix<T> g;       ///< (L, V)  output gate
  Matrix<T> r_k;     ///< (H, N)  bonus weights
  Matrix<T> g_norm_weight, g_norm_bias;  ///< (1, V) each, or empty
  Matrix<T> o_proj_weight;               ///< (C', V) or empty
  Index num_heads = 4;
  double norm_eps = 16e-5;  ///< the group norm's eps: head_dim * config.norm_eps

  Index length() const { return r.rows(); }
  Index head_dim() const { return r.cols() / num_heads; }

  void check() const {
    using std::to_string;
    const char* m = "rwkv7_activations";
    if (num_heads < 1) detail::fail(m, "num_heads must be >= 1");
    const Index L = length(), C = r.cols(), V = v.cols(), H = num_heads;
    detail::require_shape(C >= 1 && C % H == 0, m, "r", r.rows(), r.cols(), "(L, H*N) with H=" + to_string(H));
    detail::require_shape(V >= 1 && V % H == 0 && v.rows() == L, m, "v", v.rows(), v.cols(), "(L=" + to_string(L) + ", V) with H dividing V");
    const std::string LC = "(L=" + to_string(L) + ", C=" + to_string(C) + ")", LV = "(L=" + to_string(L) + ", V=" + to_string(V) + ")";
    check_field(m, "w", w, L, C, LC);
    check_field(m, "k", k, L, C, LC);
    check_field(m, "a", a, L, C, LC);
    check_field(m, "kk", kk, L, C, LC);
    check_field(m, "g", g, L, V, LV);
    check_field(m, "r_k", r_k, H, C / H, "(H=" + to_string(H) + ", N=" + to_string(C / H) + ")");
    if (g_norm_weight.size()) check_field(m, "g_norm_weight", g_norm_weight, 1, V, "(1, V=" + to_string(V) + ") or empty");
    if (g_norm_bias.size()) check_field(m, "g_norm_bias", g_norm_bias, 1, V, "(1, V=" + to_string(V) + ") or empty");
    if (o_proj_weight.size() != 0)
      detail::require_shape(o_proj_weight.cols() == V, m, "o_proj_weight", o_proj_weight.rows(), o_proj_weight.cols(),
                            "(hidden, V=" + to_string(V) + ") or empty");
  }
  /// The bonus per value channel (L, V): sum_m r_t[m] r_k[h, m] k_t[m] for the channel's head h.
  Matrix<T> bonus() const {
    const Index L = length(), H = num_heads, N = head_dim(), dv = v.cols() / H;
    Matrix<T> out(L, v.cols());
    for (Index t = 0; t < L; ++t)
      for (Index h = 0; h < H; ++h) {
        T acc = 0;
        for (Index m = 0; m < N; ++m) acc += r(t, h * N + m) * r_k(h, m) * k(t, h * N + m);
        out.row(t).segment(h * dv, dv).setConstant(acc);
      }
    return out;
  }
  /// The low-rank factors of A_t = Diag(exp w) + b a^T: a = -kk, b = kk * a (the learning rate).
  Matrix<T> removal_a() const { return -kk; }
  Matrix<T> removal_b() const { return kk.cwiseProduct(a); }
};

/// The activations of one forward pass on x (L, C); layers > 0 need layer 0's values v_first (L, V)
/// (layer 0's activations' v).
template <Scalar T>
rwkv7_activations<T> activations(const rwkv7_weights<T>& wt, const Matrix<T>& x, const Matrix<T>& v_first = {}) {
  wt.check();
  const auto& c = wt.config;
  const Index L = x.rows(), C = c.hidden_size, V = c.v_dim(), H = c.num_heads(), N = c.head_dim;
  detail::require_shape(x.cols() == C, "rwkv7", "x", x.rows(), x.cols(), "(L, hidden_size=" + std::to_string(C) + ")");
  if (c.layer_idx > 0)
    detail::require_shape(v_first.rows() == L && v_first.cols() == V, "rwkv7", "v_first", v_first.rows(), v_first.cols(),
                          "(L=" + std::to_string(L) + ", value_dim=" + std::to_string(V) + "): layer 0's values, needed by layer " +
                              std::to_string(c.layer_idx));
  Matrix<T> delta(L, C);
  for (Index t = 0; t < L; ++t) delta.row(t) = (t > 0 ? Matrix<T>(x.row(t - 1)) : Matrix<T>(Matrix<T>::Zero(1, C))) - x.row(t);
  auto lerp = [&](const Matrix<T>& mu) {
    Matrix<T> y = x;
    y.array() += delta.array().rowwise() * mu.row(0).array();
    return y;
  };
  const Matrix<T> xr = lerp(wt.x_r), xw = lerp(wt.x_w), xk = lerp(wt.x_k), xv = lerp(wt.x_v), xa = lerp(wt.x_a), xg = lerp(wt.x_g);
  rwkv7_activations<T> s;
  s.r = nn::linear<T>(xr, wt.r_proj_weight);
  Matrix<T> k = nn::linear<T>(xk, wt.k_proj_weight);
  s.v = nn::linear<T>(xv, wt.v_proj_weight);
  const Matrix<T> wl = nn::linear<T>(nn::map<T>(nn::linear<T>(xw, wt.w_lora_lora_0_weight), [](T z) { return std::tanh(z); }),
                                     wt.w_lora_lora_2_weight, wt.w_lora_lora_2_bias);
  s.w = nn::map<T>(wl, [](T z) { return T(-0.6065306597126334) * nn::sigmoid(z); });
  if (c.layer_idx > 0) {
    const Matrix<T> mixv = nn::linear<T>(nn::linear<T>(xv, wt.v_lora_lora_0_weight), wt.v_lora_lora_2_weight, wt.v_lora_lora_2_bias);
    for (Index i = 0; i < s.v.size(); ++i) s.v.data()[i] += (v_first.data()[i] - s.v.data()[i]) * nn::sigmoid(mixv.data()[i]);
  }
  s.a = nn::map<T>(nn::linear<T>(nn::linear<T>(xa, wt.a_lora_lora_0_weight), wt.a_lora_lora_2_weight, wt.a_lora_lora_2_bias),
                   [](T z) { return nn::sigmoid(z); });
  s.g = nn::linear<T>(nn::map<T>(nn::linear<T>(xg, wt.g_lora_lora_0_weight), [](T z) { return nn::sigmoid(z); }), wt.g_lora_lora_2_weight);
  Matrix<T> kkin = k;
  kkin.array().rowwise() *= wt.k_k.row(0).array();
  s.kk.resize(L, C);
  for (Index t = 0; t < L; ++t)
    for (Index h = 0; h < H; ++h) {
      const auto seg = kkin.row(t).segment(h * N, N);
      const T ss = seg.squaredNorm();
      const T inv = c.fuse_norm ? T(1) / std::sqrt(ss + T(1e-6)) : T(1) / std::max(std::sqrt(ss), T(1e-12));
      s.kk.row(t).segment(h * N, N) = seg * inv;
    }
  for (Index t = 0; t < L; ++t)
    for (Index j = 0; j < C; ++j) k(t, j) *= T(1) + (s.a(t, j) - T(1)) * wt.k_a(0, j);
  s.k = std::move(k);
  s.r_k = wt.r_k;
  s.g_norm_weight = wt.g_norm_weight;
  s.g_norm_bias = wt.g_norm_bias;
  s.o_proj_weight = wt.o_proj_weight;
  s.num_heads = H;
  s.norm_eps = double(N) * c.norm_eps;
  return s;
}

/// The layer's plain recurrent forward (the oracle). final_state, when given, receives the state
/// after the last token (H*N, V/H) in the (K, V) orientation: fla's state (H, K, V) flattened (the
/// official code's (H, V, K) transposed).
template <Scalar T>
Matrix<T> rwkv7_forward(const rwkv7_weights<T>& wt, const Matrix<T>& x, const Matrix<T>& v_first = {}, Matrix<T>* final_state = nullptr) {
  const auto s = activations(wt, x, v_first);
  Matrix<T> o = nn::dplr_scan<T>(s.r, s.k, s.v, s.w, s.removal_a(), s.removal_b(), s.num_heads, final_state);
  nn::group_norm_rows<T>(o, s.num_heads, s.norm_eps, true, s.g_norm_weight, s.g_norm_bias);
  o += s.bonus().cwiseProduct(s.v);  // the bonus bypasses the norm
  o.array() *= s.g.array();
  return nn::linear<T>(o, wt.o_proj_weight);
}

/// The time-mixing transition T (no bonus, norm or gate): A_t = Diag(exp w_t) - (kk_t * a_t) kk_t^T,
/// q = r, k as updated, per head.
template <Scalar T>
Transition<T> rwkv7_transition(const rwkv7_activations<T>& s) {
  s.check();
  return transition(s.w, s.removal_a(), s.removal_b(), s.r, s.k,
                    transition_options{.heads = s.num_heads, .head_dim = s.v.cols() / s.num_heads, .state = s.head_dim(), .rank = 1});
}

/// The exact decomposition from activations (see the header comment).
template <Scalar T>
auto attention(const rwkv7_activations<T>& s) {
  s.check();
  const Index L = s.length(), V = s.v.cols(), H = s.num_heads;
  auto tr = rwkv7_transition(s);
  const Matrix<T> o = apply(tr, s.v);  // the norm's actual input: the recurrence's output, no bonus
  const group_norm_options opts{.eps = s.norm_eps, .centered = true};
  const auto n = s.g_norm_weight.size() ? group_norm(H, s.g_norm_weight, opts) : group_norm<T>(H, opts);
  const auto nb = n.bound_to(n.compute(o.data(), L, V));
  Matrix<T> shift = offset(nb);
  if (s.g_norm_bias.size() != 0) shift.rowwise() += s.g_norm_bias.row(0);
  Matrix<T> beta = s.g.cwiseProduct(shift);
  return make_decomposition<T>(s.v, diagonal(s.g) * (nb * std::move(tr) + diagonal(s.bonus())), std::move(beta), s.o_proj_weight);
}

/// The exact decomposition: rwkv7_forward(w, x, v_first) == d.output(), inner input x = v.
template <Scalar T>
auto decompose(const rwkv7_weights<T>& w, const Matrix<T>& x, const Matrix<T>& v_first = {}) {
  return attention(activations(w, x, v_first));
}

/// The exact decomposition (the named form of decompose).
template <Scalar T>
auto rwkv7_decompose(const rwkv7_weights<T>& w, const Matrix<T>& x, const Matrix<T>& v_first = {}) {
  return decompose(w, x, v_first);
}

/// The state after the last token, (H*N, V/H) in the (K, V) orientation, from the backward running
/// product (models/delta_rule.hpp); the bonus is not part of the state.
template <Scalar T>
Matrix<T> final_state(const rwkv7_activations<T>& s) {
  s.check();
  return dplr_final_state<T>(s.k, s.v, s.w, s.removal_a(), s.removal_b(), s.num_heads);
}

}  // namespace iattn::models
