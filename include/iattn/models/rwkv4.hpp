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
//
// From activations (docs/models.md): rwkv4_activations holds key, value, receptance, time_decay,
// time_first (and optionally output_weight, shift_state); attention(acts) is the decomposition,
// decompose(w, u) == attention(activations(w, u)), and final_state(acts) is Hugging Face's per-layer
// state (token shift, num/den/max: BlinkDL's aa, bb, pp).
#pragma once

#include "../iattn.hpp"
#include "common.hpp"

#include <cstdint>
#include <limits>
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

/// One forward pass's activations, named as Hugging Face's `RwkvSelfAttention.forward` /
/// `rwkv_linear_attention_cpu` name them, plus the layer parameters the WKV reads: everything
/// `attention(acts)` needs. Built by `activations(w, u)` or by hand (a hook's tensors).
template <Scalar T>
struct rwkv4_activations {
  Matrix<T> key;            ///< (L, A)      key(token-shifted hidden): the WKV's log-weights
  Matrix<T> value;          ///< (L, A)      value(token-shifted hidden): the inner input x
  Matrix<T> receptance;     ///< (L, A)      sigmoid(receptance(token-shifted hidden)), after the sigmoid
  Matrix<T> time_decay;     ///< (1, A)      the parameter; the per-token log-decay is -exp(time_decay)
  Matrix<T> time_first;     ///< (1, A)      the current token's log-bonus
  Matrix<T> output_weight;  ///< (hidden, A) or empty (the decomposition stops before the output Linear)
  Matrix<T> shift_state;    ///< (1, hidden) or empty: the layer input's last row hidden[-1] (zeros for L = 0); only final_state reads it

  Index length() const { return value.rows(); }
  Index channels() const { return value.cols(); }

  /// Throws std::invalid_argument naming the first field whose shape disagrees (L and A from value).
  void check() const {
    using std::to_string;
    const char* m = "rwkv4_activations";
    const Index L = length(), A = channels();
    const std::string LA = "(L=" + to_string(L) + ", A=" + to_string(A) + ")", A1 = "(1, A=" + to_string(A) + ")";
    check_field(m, "key", key, L, A, LA);
    check_field(m, "receptance", receptance, L, A, LA);
    check_field(m, "time_decay", time_decay, 1, A, A1);
    check_field(m, "time_first", time_first, 1, A, A1);
    if (output_weight.size() != 0)
      detail::require_shape(output_weight.cols() == A, m, "output_weight", output_weight.rows(), output_weight.cols(),
                            "(hidden, A=" + to_string(A) + ") or empty");
    if (shift_state.size() != 0)
      detail::require_shape(shift_state.rows() == 1, m, "shift_state", shift_state.rows(), shift_state.cols(), "(1, hidden) or empty");
  }
};

/// The time mixing's recurrent state after the last token, as Hugging Face's `state` (per layer) and
/// BlinkDL's RNN mode keep it: the token-shift input and the WKV numerator, denominator and running
/// maximum (BlinkDL's aa, bb, pp): num_state / den_state are the sums shifted by exp(-max_state).
template <Scalar T>
struct rwkv4_state {
  Matrix<T> shift_state;  ///< (1, hidden)  HF state[1][:, :, layer_id] = hidden[-1]
  Matrix<T> num_state;    ///< (1, A)       HF state[2]: sum_s exp(k_s + (L-1-s) w - max_state) v_s
  Matrix<T> den_state;    ///< (1, A)       HF state[3]: the same with v = 1
  Matrix<T> max_state;    ///< (1, A)       HF state[4]: max_s (k_s + (L-1-s) w), -inf for L = 0 (HF: -1e38)
};

/// The activations of one forward pass of the time mixing on u (L, hidden), output_weight included.
template <Scalar T>
rwkv4_activations<T> activations(const rwkv4_weights<T>& w, const Matrix<T>& u) {
  w.check();
  const Index L = u.rows(), Hd = w.config.hidden_size;
  detail::require_shape(u.cols() == Hd, "rwkv4", "u", u.rows(), u.cols(), "(L, hidden_size=" + std::to_string(Hd) + ")");
  auto mix = [&](const Matrix<T>& mu) {
    Matrix<T> m(L, Hd);
    for (Index t = 0; t < L; ++t)
      for (Index i = 0; i < Hd; ++i) m(t, i) = mu(0, i) * u(t, i) + (T(1) - mu(0, i)) * (t > 0 ? u(t - 1, i) : T(0));
    return m;
  };
  rwkv4_activations<T> a;
  a.key = nn::linear<T>(mix(w.time_mix_key), w.key_weight);
  a.value = nn::linear<T>(mix(w.time_mix_value), w.value_weight);
  a.receptance = nn::map<T>(nn::linear<T>(mix(w.time_mix_receptance), w.receptance_weight), [](T x) { return nn::sigmoid(x); });
  a.time_decay = w.time_decay;
  a.time_first = w.time_first;
  a.output_weight = w.output_weight;
  a.shift_state = L > 0 ? Matrix<T>(u.row(L - 1)) : Matrix<T>(Matrix<T>::Zero(1, Hd));
  return a;
}

/// The block's forward (the oracle), WKV by Hugging Face's running-max recurrence. final_state, when
/// given, receives the recurrence's state after the last token.
template <Scalar T>
Matrix<T> rwkv4_forward(const rwkv4_weights<T>& w, const Matrix<T>& u, rwkv4_state<T>* final_state = nullptr) {
  const auto s = activations(w, u);
  const Index L = u.rows(), A = w.config.attention_hidden_size;
  Matrix<T> y(L, A);
  if (final_state) {
    final_state->shift_state = s.shift_state;
    final_state->num_state.resize(1, A);
    final_state->den_state.resize(1, A);
    final_state->max_state.resize(1, A);
  }
  for (Index c = 0; c < A; ++c) {
    const T decay = -std::exp(w.time_decay(0, c)), first = w.time_first(0, c);
    T num = 0, den = 0, mx = -std::numeric_limits<T>::infinity();
    for (Index t = 0; t < L; ++t) {
      const T k = s.key(t, c), v = s.value(t, c);
      const T mo = std::max(mx, k + first);
      const T e1 = std::exp(mx - mo), e2 = std::exp(k + first - mo);
      y(t, c) = s.receptance(t, c) * (e1 * num + e2 * v) / (e1 * den + e2);
      const T ms = std::max(mx + decay, k);
      const T f1 = std::exp(mx + decay - ms), f2 = std::exp(k - ms);
      num = f1 * num + f2 * v;
      den = f1 * den + f2;
      mx = ms;
    }
    if (final_state) final_state->num_state(0, c) = num, final_state->den_state(0, c) = den, final_state->max_state(0, c) = mx;
  }
  return nn::linear<T>(y, w.output_weight);
}

namespace rwkv4_detail {
template <class T>
auto wkv_matrix(const Matrix<T>& time_decay, const Matrix<T>& key, const Matrix<T>& time_first) {
  return wkv(Matrix<T>(-time_decay.array().exp().matrix()), key, time_first);
}
}  // namespace rwkv4_detail

/// The WKV matrix alpha (before diag(receptance)): Wkv(w = -exp(time_decay), key, time_first),
/// evaluated in the log domain with running maxima (stable for any spread of keys).
template <Scalar T>
auto rwkv4_wkv(const rwkv4_activations<T>& a) {
  a.check();
  return rwkv4_detail::wkv_matrix(a.time_decay, a.key, a.time_first);
}
/// The WKV matrix of the time mixing on u (L, hidden): rwkv4_wkv(activations(w, u)).
template <Scalar T>
auto rwkv4_wkv(const rwkv4_weights<T>& w, const Matrix<T>& u) { return rwkv4_wkv(activations(w, u)); }

/// The exact decomposition from activations: H = diag(receptance) Wkv, x = value, beta = 0; with
/// output_weight empty, output() is the inner output receptance * wkv.
template <Scalar T>
auto attention(const rwkv4_activations<T>& a) {
  a.check();
  auto H = diagonal(a.receptance) * rwkv4_detail::wkv_matrix(a.time_decay, a.key, a.time_first);
  return make_decomposition<T>(a.value, std::move(H), Matrix<T>(Matrix<T>::Zero(a.length(), a.channels())), a.output_weight);
}

/// The exact decomposition: rwkv4_forward(w, u) == d.output(), x = value, beta = 0.
template <Scalar T>
auto decompose(const rwkv4_weights<T>& w, const Matrix<T>& u) { return attention(activations(w, u)); }

/// The exact decomposition (the named form of decompose).
template <Scalar T>
auto rwkv4_decompose(const rwkv4_weights<T>& w, const Matrix<T>& u) { return decompose(w, u); }

/// The recurrent state after the last token (rwkv4_state), from the activations in the log domain:
/// max_state = max_s (key_s + (L-1-s) w) first, then sums of exp(key_s + (L-1-s) w - max_state) <= 1.
template <Scalar T>
rwkv4_state<T> final_state(const rwkv4_activations<T>& a) {
  a.check();
  const Index L = a.length(), A = a.channels();
  rwkv4_state<T> st;
  st.shift_state = a.shift_state;
  st.num_state = Matrix<T>::Zero(1, A);
  st.den_state = Matrix<T>::Zero(1, A);
  st.max_state = Matrix<T>::Constant(1, A, -std::numeric_limits<T>::infinity());
  for (Index c = 0; c < A; ++c) {
    const T w = -std::exp(a.time_decay(0, c));
    auto score = [&](Index s) { return a.key(s, c) + T(L - 1 - s) * w; };
    T mx = -std::numeric_limits<T>::infinity();
    for (Index s = 0; s < L; ++s) mx = std::max(mx, score(s));
    T num = 0, den = 0;
    for (Index s = 0; s < L; ++s) {
      const T e = std::exp(score(s) - mx);
      num += e * a.value(s, c);
      den += e;
    }
    st.num_state(0, c) = num, st.den_state(0, c) = den, st.max_state(0, c) = mx;
  }
  return st;
}

}  // namespace iattn::models
