// iattn/models/rwkv4.hpp: RWKV-4 time mixing (Hugging Face `RwkvSelfAttention`) as implicit attention.
//
// Forward, with u_{-1} = 0 (no carried state):
//   k = key(mu_k u_t + (1-mu_k) u_{t-1}), v = value(...mu_v...), r = sigmoid(receptance(...mu_r...))
//   w = -exp(time_decay), bonus = time_first
//   wkv_t = (sum_{s<t} e^{(t-1-s) w + k_s} v_s + e^{bonus + k_t} v_t) / (same with v = 1)
//   out = output(r * wkv)
// The oracle evaluates wkv with Hugging Face's running-max recurrence (rwkv_linear_attention_cpu).
//
// Exact decomposition over the attention channels, inner input x = v (token shift and projection
// included, so nothing is dropped):
//   H = diag(r) Wkv(w, k, time_first),   beta = 0
// Wkv (ops/wkv.hpp) is row_normalize(S_strict(lambda = w, B = e^k, C = 1, bonus = e^{time_first}))
// evaluated in the log domain with running maxima, so keys of any spread (+-80 in float) are exact.
// The paper's eq. 21 is the same matrix; it writes v_t = x_t, which our x = v makes exact.
#pragma once

#include "../iattn.hpp"
#include "common.hpp"

#include <cstdint>
#include <string>

namespace iattn::models {

struct rwkv4_config {
  Index hidden_size = 64;
  Index attention_hidden_size = 64;  ///< A, the channels H acts on
  Index layer_id = 0;                ///< for the initialiser's depth-dependent ratios
  Index num_hidden_layers = 1;
};

/// Hugging Face `RwkvSelfAttention` parameters (state_dict names, '.' written '_').
template <Scalar T>
struct rwkv4_weights {
  rwkv4_config config;
  Matrix<T> time_decay;           ///< (1, A)
  Matrix<T> time_first;           ///< (1, A)
  Matrix<T> time_mix_key;         ///< (1, hidden)   PyTorch (1, 1, hidden)
  Matrix<T> time_mix_value;       ///< (1, hidden)
  Matrix<T> time_mix_receptance;  ///< (1, hidden)
  Matrix<T> key_weight;           ///< (A, hidden)
  Matrix<T> value_weight;         ///< (A, hidden)
  Matrix<T> receptance_weight;    ///< (A, hidden)
  Matrix<T> output_weight;        ///< (hidden, A)

  void check() const {
    const Index A = config.attention_hidden_size, Hd = config.hidden_size;
    using std::to_string;
    const char* m = "rwkv4";
    const std::string a1 = "(1, attention_hidden_size=" + to_string(A) + ")", h1 = "(1, hidden_size=" + to_string(Hd) + ")";
    const std::string ah = "(attention_hidden_size=" + to_string(A) + ", hidden_size=" + to_string(Hd) + ")";
    check_field(m, "time_decay", time_decay, 1, A, a1);
    check_field(m, "time_first", time_first, 1, A, a1);
    check_field(m, "time_mix_key", time_mix_key, 1, Hd, h1);
    check_field(m, "time_mix_value", time_mix_value, 1, Hd, h1);
    check_field(m, "time_mix_receptance", time_mix_receptance, 1, Hd, h1);
    check_field(m, "key_weight", key_weight, A, Hd, ah);
    check_field(m, "value_weight", value_weight, A, Hd, ah);
    check_field(m, "receptance_weight", receptance_weight, A, Hd, ah);
    check_field(m, "output_weight", output_weight, Hd, A, "(hidden_size=" + to_string(Hd) + ", attention_hidden_size=" + to_string(A) + ")");
  }
};

/// Hugging Face's RWKV initialisation of the time-mixing parameters (decay speeds from -5 to 3 with
/// a depth-dependent curve, time_first = log 0.3 plus a zigzag, mixing ratios from the channel
/// index); projections with PyTorch's default Linear init.
template <Scalar T>
rwkv4_weights<T> rwkv4_init(const rwkv4_config& c, std::uint64_t seed = 0) {
  init::generator g(seed);
  rwkv4_weights<T> w;
  w.config = c;
  const Index A = c.attention_hidden_size, Hd = c.hidden_size;
  const double r01 = c.num_hidden_layers > 1 ? double(c.layer_id) / double(c.num_hidden_layers - 1) : 0.0;
  const double r10 = 1.0 - double(c.layer_id) / double(c.num_hidden_layers);
  w.time_decay.resize(1, A);
  w.time_first.resize(1, A);
  for (Index h = 0; h < A; ++h) {
    const double f = A > 1 ? double(h) / double(A - 1) : 0.0;
    w.time_decay(0, h) = T(-5.0 + 8.0 * std::pow(f, 0.7 + 1.3 * r01));
    w.time_first(0, h) = T(std::log(0.3) + 0.5 * double((h + 1) % 3 - 1));
  }
  w.time_mix_key.resize(1, Hd);
  w.time_mix_value.resize(1, Hd);
  w.time_mix_receptance.resize(1, Hd);
  for (Index i = 0; i < Hd; ++i) {
    const double tw = double(i) / double(Hd);
    w.time_mix_key(0, i) = T(std::pow(tw, r10));
    w.time_mix_value(0, i) = T(std::pow(tw, r10) + 0.3 * r01);
    w.time_mix_receptance(0, i) = T(std::pow(tw, 0.5 * r10));
  }
  w.key_weight = init::torch_default<T>(g, A, Hd, Hd);
  w.value_weight = init::torch_default<T>(g, A, Hd, Hd);
  w.receptance_weight = init::torch_default<T>(g, A, Hd, Hd);
  w.output_weight = init::torch_default<T>(g, Hd, A, A);
  return w;
}

template <Scalar T>
struct rwkv4_activations {
  Matrix<T> k, v, r;  // (L, A); r after the sigmoid
};

template <Scalar T>
rwkv4_activations<T> rwkv4_project(const rwkv4_weights<T>& w, const Matrix<T>& u) {
  w.check();
  const Index L = u.rows(), Hd = w.config.hidden_size;
  detail::require_shape(u.cols() == Hd, "rwkv4", "u", u.rows(), u.cols(), "(L, hidden_size=" + std::to_string(Hd) + ")");
  auto mix = [&](const Matrix<T>& mu) {
    Matrix<T> m(L, Hd);
    for (Index t = 0; t < L; ++t)
      for (Index i = 0; i < Hd; ++i) m(t, i) = mu(0, i) * u(t, i) + (T(1) - mu(0, i)) * (t > 0 ? u(t - 1, i) : T(0));
    return m;
  };
  rwkv4_activations<T> s;
  s.k = nn::linear<T>(mix(w.time_mix_key), w.key_weight);
  s.v = nn::linear<T>(mix(w.time_mix_value), w.value_weight);
  s.r = nn::map<T>(nn::linear<T>(mix(w.time_mix_receptance), w.receptance_weight), [](T x) { return nn::sigmoid(x); });
  return s;
}

/// The block's forward (the oracle), WKV by Hugging Face's running-max recurrence.
template <Scalar T>
Matrix<T> rwkv4_forward(const rwkv4_weights<T>& w, const Matrix<T>& u) {
  const auto s = rwkv4_project(w, u);
  const Index L = u.rows(), A = w.config.attention_hidden_size;
  Matrix<T> y(L, A);
  for (Index c = 0; c < A; ++c) {
    const T decay = -std::exp(w.time_decay(0, c)), first = w.time_first(0, c);
    T num = 0, den = 0, mx = -std::numeric_limits<T>::infinity();
    for (Index t = 0; t < L; ++t) {
      const T k = s.k(t, c), v = s.v(t, c);
      const T mo = std::max(mx, k + first);
      const T e1 = std::exp(mx - mo), e2 = std::exp(k + first - mo);
      y(t, c) = s.r(t, c) * (e1 * num + e2 * v) / (e1 * den + e2);
      const T ms = std::max(mx + decay, k);
      const T f1 = std::exp(mx + decay - ms), f2 = std::exp(k - ms);
      num = f1 * num + f2 * v;
      den = f1 * den + f2;
      mx = ms;
    }
  }
  return nn::linear<T>(y, w.output_weight);
}

/// The WKV matrix alpha (before diag(r)): Wkv(w = -exp(time_decay), k, time_first), evaluated in the
/// log domain with running maxima (stable for any spread of keys).
template <Scalar T>
auto rwkv4_wkv(const rwkv4_weights<T>& w, const Matrix<T>& k) {
  return wkv(Matrix<T>(-w.time_decay.array().exp().matrix()), Matrix<T>(k), Matrix<T>(w.time_first));
}

/// The exact decomposition: rwkv4_forward(w, u) == d.output(), x = v, beta = 0.
template <Scalar T>
auto rwkv4_decompose(const rwkv4_weights<T>& w, const Matrix<T>& u) {
  const auto s = rwkv4_project(w, u);
  auto H = diagonal(Matrix<T>(s.r)) * rwkv4_wkv(w, s.k);
  return make_decomposition<T>(s.v, std::move(H), Matrix<T>(Matrix<T>::Zero(u.rows(), w.config.attention_hidden_size)),
                               w.output_weight);
}

}  // namespace iattn::models
