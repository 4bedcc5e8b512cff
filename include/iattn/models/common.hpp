// iattn/models/common.hpp: what every model helper shares.
//
// - decomposition<T, Op>: the exact split of a block, output = out_proj(apply(H, x) + beta).
// - nn: the token-wise building blocks of the plain forwards (linear layers in PyTorch's weight
//   layout, depthwise causal convolution, activations), written with loops so that the forwards
//   stay independent of the iattn operators they are checked against.
// - init: seeded random initialisers (PyTorch's default Linear/Conv1d init and friends).
// - check_field: weight shape checks that name the model, the field and the expected shape.
#pragma once

#include "../core/config.hpp"
#include "../core/error.hpp"
#include "../evaluate.hpp"

#include <cassert>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>

namespace iattn::models {

namespace nn {
template <class T>
Matrix<T> linear(const Matrix<T>& X, const Matrix<T>& W, const Matrix<T>& b = {});
}  // namespace nn

/// The exact decomposition of one block on one sequence: `output() == out_proj(apply(H, x) + beta)`
/// equals the block's own forward. x is the inner input (L, D), H acts on the D inner channels,
/// beta (L, D) collects every input-independent term (biases, centring), and the output projection
/// is a PyTorch Linear: weight (d_model, D), bias (1, d_model) or empty. An empty weight means no
/// projection (a decomposition built from activations without the layer's out_proj): output() is
/// then the inner output H x + beta.
template <Scalar T, class Op>
struct decomposition {
  using scalar_type = T;
  Matrix<T> x;
  Op H;
  Matrix<T> beta;
  Matrix<T> out_weight;
  Matrix<T> out_bias;

  /// Y W^T + b: the output projection of an inner sequence Y (L, D).
  Matrix<T> project(const Matrix<T>& Y) const {
    if (out_weight.size() == 0) return Y;
    return nn::linear<T>(Y, out_weight, out_bias);
  }
  /// The block output rebuilt from the decomposition.
  Matrix<T> output() const { return project(Matrix<T>(apply(H, x) + beta)); }
};

template <Scalar T, class Op>
decomposition<T, Op> make_decomposition(Matrix<T> x, Op H, Matrix<T> beta, Matrix<T> out_weight,
                                        Matrix<T> out_bias = {}) {
  return {std::move(x), std::move(H), std::move(beta), std::move(out_weight), std::move(out_bias)};
}

/// Throws unless M is (rows, cols): "<model>: <field> has shape (r, c) but expected <expected>".
template <class M>
void check_field(const char* model, const char* field, const M& m, Index rows, Index cols, const std::string& expected) {
  detail::require_shape(m.rows() == rows && m.cols() == cols, model, field, m.rows(), m.cols(), expected);
}

/// A PyTorch depthwise Conv1d weight (D, 1, K), flattened to (D, K) as the weights structs keep it,
/// in `causal_conv`'s tap layout (K, D): taps(k, c) = w(c, k). Throws unless w is (D, K) with K >= 1.
template <class M>
Matrix<typename M::Scalar> depthwise_taps(const M& w) {
  detail::require_shape(w.cols() >= 1, "depthwise_taps", "w", w.rows(), w.cols(),
                        "(D, K): PyTorch's depthwise Conv1d weight (D, 1, K) without the singleton");
  return w.transpose();
}

/// HGRN's forget-gate lower bound (1, width): optional (empty means 0), each value in [0, 1).
template <class M>
void check_lower_bound(const char* model, const M& lb, Index width, const std::string& expected) {
  if (lb.size() == 0) return;
  check_field(model, "lower_bound", lb, 1, width, expected);
  for (Index j = 0; j < width; ++j)
    if (!(lb(0, j) >= 0 && lb(0, j) < 1))
      detail::fail(model, "lower_bound[" + std::to_string(j) + "] is " + std::to_string(double(lb(0, j))) + " but must lie in [0, 1)");
}

namespace nn {

template <class T>
T sigmoid(T v) {
  return v >= 0 ? T(1) / (T(1) + std::exp(-v)) : std::exp(v) / (T(1) + std::exp(v));
}
template <class T>
T silu(T v) { return v * sigmoid(v); }
/// log(sigmoid(v)) without overflow or cancellation.
template <class T>
T log_sigmoid(T v) { return v >= 0 ? -std::log1p(std::exp(-v)) : v - std::log1p(std::exp(v)); }
/// log(lb + (1 - lb) sigmoid(v)) for a lower bound lb in [0, 1) (HGRN's forget gate), as
/// logaddexp(log lb, log1p(-lb) + logsigmoid(v)): both terms <= 0, no cancellation.
template <class T>
T log_bounded_sigmoid(T v, T lb) {
  if (lb == T(0)) return log_sigmoid(v);
  const T a = std::log(lb), b = std::log1p(-lb) + log_sigmoid(v), m = std::max(a, b);
  return m + std::log1p(std::exp(std::min(a, b) - m));
}
/// log(1 + e^v), as torch.nn.functional.softplus (threshold 20).
template <class T>
T softplus(T v) { return v > T(20) ? v : std::log1p(std::exp(v)); }
/// The inverse of softplus for v > 0: v + log(-expm1(-v)).
template <class T>
T inverse_softplus(T v) { return v + std::log(-std::expm1(-v)); }
/// GELU, tanh approximation (recurrentgemma's jax.nn.gelu default).
template <class T>
T gelu_tanh(T v) {
  const T k = T(0.7978845608028654);  // sqrt(2/pi)
  return T(0.5) * v * (T(1) + std::tanh(k * (v + T(0.044715) * v * v * v)));
}

template <class T, class F>
Matrix<T> map(const Matrix<T>& X, F&& f) {
  Matrix<T> Y(X.rows(), X.cols());
  for (Index i = 0; i < X.size(); ++i) Y.data()[i] = f(X.data()[i]);
  return Y;
}

/// X W^T (+ b): a PyTorch Linear with weight (out, in) and bias (1, out) or empty. The library's
/// product kernel (backend/cpu/gemm.hpp), parallel over X's rows; not Eigen's GEMM, whose
/// instantiation is the largest part of a model's compile time.
template <class T>
Matrix<T> linear(const Matrix<T>& X, const Matrix<T>& W, const Matrix<T>& b) {
  const Index L = X.rows(), out = W.rows(), in = X.cols();
  assert(W.cols() == in && (b.size() == 0 || b.size() == out));
  Matrix<T> Y(L, out);
  cpu_detail::gemm_scratch<T> s;
  cpu_detail::gemm<T>(s, L, out, in, T(1), X.data(), in, W.data(), W.cols(), false, Y.data(), out, false, true);
  if (b.size() != 0)
    for (Index t = 0; t < L; ++t)
      for (Index o = 0; o < out; ++o) Y(t, o) += b(0, o);
  return Y;
}

/// Depthwise causal Conv1d as PyTorch's Conv1d(groups=D, padding=K-1)[..., :L], weight (D, K)
/// (PyTorch's (D, 1, K) without the singleton), bias (1, D) or empty: y_t[c] = b[c] + sum_k w[c, k] x_{t-K+1+k}[c].
template <class T>
Matrix<T> causal_conv1d(const Matrix<T>& X, const Matrix<T>& w, const Matrix<T>& b = {}) {
  const Index L = X.rows(), D = X.cols(), K = w.cols();
  Matrix<T> Y(L, D);
  for (Index t = 0; t < L; ++t)
    for (Index c = 0; c < D; ++c) {
      T acc = b.size() ? b(0, c) : T(0);
      for (Index k = 0; k < K; ++k) {
        const Index s = t - K + 1 + k;
        if (s >= 0) acc += w(c, k) * X(s, c);
      }
      Y(t, c) = acc;
    }
  return Y;
}

/// The matrix-state recurrence of gated linear attention (fla's fused_recurrent_gla / _rwkv6), per
/// head h with keys (L, H*dk) and values (L, H*dv), g the log-decay (L, H*dk):
///   S_t = diag(exp g_t) S_{t-1} + k_t v_t^T,   o_t = q_t^T S_t                  (no bonus)
///   o_t = q_t^T (S_{t-1} + diag(bonus_h) k_t v_t^T), then S_t as above           (RWKV-6, bonus (H, dk))
/// final_state, when given, receives S after the last token, (H*dk, dv): head h's (dk, dv) block in
/// rows h*dk.. (fla's final_state (H, dk, dv) flattened).
template <class T>
Matrix<T> gated_state_scan(const Matrix<T>& q, const Matrix<T>& k, const Matrix<T>& v, const Matrix<T>& g,
                           Index heads, const Matrix<T>& bonus = {}, Matrix<T>* final_state = nullptr) {
  const Index L = q.rows(), dk = q.cols() / heads, dv = v.cols() / heads;
  Matrix<T> o(L, v.cols());
  for (Index h = 0; h < heads; ++h) {
    Matrix<T> S = Matrix<T>::Zero(dk, dv);
    for (Index t = 0; t < L; ++t) {
      if (bonus.size() == 0) {
        for (Index i = 0; i < dk; ++i) {
          const T decay = std::exp(g(t, h * dk + i)), key = k(t, h * dk + i);
          for (Index j = 0; j < dv; ++j) S(i, j) = decay * S(i, j) + key * v(t, h * dv + j);
        }
      }
      for (Index j = 0; j < dv; ++j) {
        T acc = 0;
        for (Index i = 0; i < dk; ++i) {
          const T state = bonus.size() ? S(i, j) + bonus(h, i) * k(t, h * dk + i) * v(t, h * dv + j) : S(i, j);
          acc += q(t, h * dk + i) * state;
        }
        o(t, h * dv + j) = acc;
      }
      if (bonus.size() != 0) {
        for (Index i = 0; i < dk; ++i) {
          const T decay = std::exp(g(t, h * dk + i)), key = k(t, h * dk + i);
          for (Index j = 0; j < dv; ++j) S(i, j) = decay * S(i, j) + key * v(t, h * dv + j);
        }
      }
    }
    if (final_state) {
      if (h == 0) final_state->resize(heads * dk, dv);
      final_state->middleRows(h * dk, dk) = S;
    }
  }
  return o;
}

/// Normalises each row's `groups` contiguous groups of X in place: (x - mu) / sqrt(var + eps) with
/// mu = 0 unless centered (RMS norm), then times weight (1, D) and plus bias (1, D) when given.
template <class T>
void group_norm_rows(Matrix<T>& X, Index groups, double eps, bool centered, const Matrix<T>& weight = {},
                     const Matrix<T>& bias = {}) {
  const Index D = X.cols(), Dg = D / groups;
  for (Index t = 0; t < X.rows(); ++t)
    for (Index g = 0; g < groups; ++g) {
      auto seg = X.row(t).segment(g * Dg, Dg);
      const T mu = centered ? seg.mean() : T(0);
      const T inv = T(1) / std::sqrt((seg.array() - mu).square().mean() + T(eps));
      for (Index j = 0; j < Dg; ++j) {
        const Index c = g * Dg + j;
        seg(j) = (seg(j) - mu) * inv * (weight.size() ? weight(0, c) : T(1)) + (bias.size() ? bias(0, c) : T(0));
      }
    }
}

}  // namespace nn

namespace init {

/// A seeded generator; every model initialiser draws its tensors from one, in field order.
using generator = std::mt19937_64;

template <class T>
Matrix<T> uniform(generator& g, Index rows, Index cols, double lo, double hi) {
  std::uniform_real_distribution<double> d(lo, hi);
  Matrix<T> m(rows, cols);
  for (Index i = 0; i < m.size(); ++i) m.data()[i] = T(d(g));
  return m;
}
template <class T>
Matrix<T> normal(generator& g, Index rows, Index cols, double sd) {
  std::normal_distribution<double> d(0.0, sd);
  Matrix<T> m(rows, cols);
  for (Index i = 0; i < m.size(); ++i) m.data()[i] = T(d(g));
  return m;
}
/// PyTorch's default nn.Linear / nn.Conv1d init: U(-1/sqrt(fan_in), 1/sqrt(fan_in)).
template <class T>
Matrix<T> torch_default(generator& g, Index rows, Index cols, Index fan_in) {
  const double b = 1.0 / std::sqrt(double(fan_in));
  return uniform<T>(g, rows, cols, -b, b);
}

/// Glorot's uniform init of a (fan_out, fan_in) weight: U(+-gain sqrt(6 / (fan_in + fan_out))).
template <class T>
Matrix<T> xavier_uniform(generator& g, Index rows, Index cols, double gain) {
  const double b = gain * std::sqrt(6.0 / double(rows + cols));
  return uniform<T>(g, rows, cols, -b, b);
}

}  // namespace init

/// A sample input (L, d_model) for examples and tests: standard normal, seeded.
template <Scalar T>
Matrix<T> sample_input(Index L, Index d_model, std::uint64_t seed = 7) {
  init::generator g(seed);
  return init::normal<T>(g, L, d_model, 1.0);
}

}  // namespace iattn::models
