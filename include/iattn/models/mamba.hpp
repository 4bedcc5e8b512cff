// iattn/models/mamba.hpp: the Mamba-1 block (mamba_ssm `Mamba`) as implicit attention.
//
// Forward (mamba_ssm's reference path, bias-free in_proj/x_proj/out_proj as in its defaults):
//   [x, z] = in_proj(u);  p = conv1d(x) + conv1d_bias;  a = SiLU(p)
//   [dt_in, B, C] = x_proj(a);  dt = softplus(dt_proj(dt_in) + dt_proj_bias);  A = -exp(A_log)
//   h_t = exp(dt_t A) h_{t-1} + dt_t B_t a_t;  y_t = C_t . h_t + D a_t;  out = out_proj(y * SiLU(z))
//
// Exact decomposition over the d_inner channels (docs/design.md section 6), inner input x = in_proj's x:
//   H    = diag(SiLU z) (S(dt (x) A, B, C) diag(dt) + diag(D)) diag(sigmoid p) M        M = conv
//   beta = diag(SiLU z) (S diag(dt) + diag(D)) (sigmoid(p) * conv1d_bias)
// since SiLU(p) = sigmoid(p) p and p = M x + bias. The papers' matrices drop D and the bias term:
//   s6_attention:       S diag(dt)                                   (Ali et al., eq. 12)
//   holistic_attention: diag(SiLU z) S diag(dt) diag(sigmoid p) M    (Zimerman et al., eq. 9)
//   and its Table 4 ablations through mamba_ablation {conv, gate, activation}.
//
// From activations (docs/models.md): mamba_activations holds x, z, delta, A, B, C, D, the conv and
// (optionally) out_proj; activations(w, u) computes them, attention(acts) is the decomposition
// (decompose(w, u) == attention(activations(w, u))), the paper variants take acts too, and
// final_state(acts) is the scan state after the last token (d_inner, d_state), mamba_ssm's ssm_state.
#pragma once

#include "../iattn.hpp"
#include "common.hpp"
#include "recurrent_state.hpp"

#include <cstdint>
#include <string>

namespace iattn::models {

struct mamba_config {
  Index d_model = 64;
  Index d_state = 16;  ///< N
  Index d_conv = 4;    ///< K
  Index expand = 2;    ///< d_inner = expand * d_model
  Index dt_rank = 0;   ///< 0: ceil(d_model / 16), as mamba_ssm's "auto"
  Index d_inner() const { return expand * d_model; }
  Index rank() const { return dt_rank > 0 ? dt_rank : (d_model + 15) / 16; }
};

/// mamba_ssm `Mamba` parameters; names follow its state_dict with '.' written '_'.
template <Scalar T>
struct mamba_weights {
  mamba_config config;
  Matrix<T> in_proj_weight;   ///< (2*d_inner, d_model)        in_proj.weight
  Matrix<T> conv1d_weight;    ///< (d_inner, d_conv)           conv1d.weight, PyTorch (d_inner, 1, d_conv)
  Matrix<T> conv1d_bias;      ///< (1, d_inner)                conv1d.bias
  Matrix<T> x_proj_weight;    ///< (dt_rank + 2*d_state, d_inner)  x_proj.weight
  Matrix<T> dt_proj_weight;   ///< (d_inner, dt_rank)          dt_proj.weight
  Matrix<T> dt_proj_bias;     ///< (1, d_inner)                dt_proj.bias
  Matrix<T> A_log;            ///< (d_inner, d_state)          A_log
  Matrix<T> D;                ///< (1, d_inner)                D
  Matrix<T> out_proj_weight;  ///< (d_model, d_inner)          out_proj.weight

  /// Throws std::invalid_argument naming the first field whose shape disagrees with the config.
  void check() const {
    const auto& c = config;
    const Index di = c.d_inner(), N = c.d_state, R = c.rank(), dm = c.d_model, K = c.d_conv;
    using std::to_string;
    const char* m = "mamba";
    check_field(m, "in_proj_weight", in_proj_weight, 2 * di, dm, "(2*d_inner=" + to_string(2 * di) + ", d_model=" + to_string(dm) + ")");
    check_field(m, "conv1d_weight", conv1d_weight, di, K, "(d_inner=" + to_string(di) + ", d_conv=" + to_string(K) + ")");
    check_field(m, "conv1d_bias", conv1d_bias, 1, di, "(1, d_inner=" + to_string(di) + ")");
    check_field(m, "x_proj_weight", x_proj_weight, R + 2 * N, di, "(dt_rank+2*d_state=" + to_string(R + 2 * N) + ", d_inner=" + to_string(di) + ")");
    check_field(m, "dt_proj_weight", dt_proj_weight, di, R, "(d_inner=" + to_string(di) + ", dt_rank=" + to_string(R) + ")");
    check_field(m, "dt_proj_bias", dt_proj_bias, 1, di, "(1, d_inner=" + to_string(di) + ")");
    check_field(m, "A_log", A_log, di, N, "(d_inner=" + to_string(di) + ", d_state=" + to_string(N) + ")");
    check_field(m, "D", D, 1, di, "(1, d_inner=" + to_string(di) + ")");
    check_field(m, "out_proj_weight", out_proj_weight, dm, di, "(d_model=" + to_string(dm) + ", d_inner=" + to_string(di) + ")");
  }
};

/// Random weights with mamba_ssm's initialisation: A_log = log(1..N) per channel, D = 1,
/// dt_proj.bias = softplus^-1(dt) with dt log-uniform in [1e-3, 1e-1] (floored at 1e-4),
/// dt_proj.weight U(+-dt_rank^-1/2), the rest PyTorch's default Linear/Conv1d init.
template <Scalar T>
mamba_weights<T> mamba_init(const mamba_config& c, std::uint64_t seed = 0) {
  init::generator g(seed);
  const Index di = c.d_inner(), N = c.d_state, R = c.rank();
  mamba_weights<T> w;
  w.config = c;
  w.in_proj_weight = init::torch_default<T>(g, 2 * di, c.d_model, c.d_model);
  w.conv1d_weight = init::torch_default<T>(g, di, c.d_conv, c.d_conv);
  w.conv1d_bias = init::torch_default<T>(g, 1, di, c.d_conv);
  w.x_proj_weight = init::torch_default<T>(g, R + 2 * N, di, di);
  const double std_dt = 1.0 / std::sqrt(double(R));
  w.dt_proj_weight = init::uniform<T>(g, di, R, -std_dt, std_dt);
  const Matrix<double> u = init::uniform<double>(g, 1, di, std::log(1e-3), std::log(1e-1));
  w.dt_proj_bias.resize(1, di);
  for (Index i = 0; i < di; ++i) w.dt_proj_bias(0, i) = T(nn::inverse_softplus(std::max(std::exp(u(0, i)), 1e-4)));
  w.A_log.resize(di, N);
  for (Index i = 0; i < di; ++i)
    for (Index n = 0; n < N; ++n) w.A_log(i, n) = T(std::log(double(n + 1)));
  w.D = Matrix<T>::Ones(1, di);
  w.out_proj_weight = init::torch_default<T>(g, c.d_model, di, di);
  return w;
}

/// One forward pass's activations: every token-wise tensor and every per-layer parameter the
/// decomposition reads, named as mamba_ssm's `Mamba.forward` / `selective_scan_fn` name them. Built
/// by `activations(w, u)` or by hand from a hook's tensors; `attention(acts)` needs nothing else.
/// s6(acts) and s6_attention(acts) read only delta, A, B and C.
template <Scalar T>
struct mamba_activations {
  Matrix<T> x;                ///< (L, d_inner)         in_proj's x half, before conv1d: the inner input
  Matrix<T> z;                ///< (L, d_inner)         in_proj's z half (the gate, before SiLU)
  Matrix<T> delta;            ///< (L, d_inner)         Δ = softplus(dt_proj(dt) + dt_proj.bias), >= 0
  Matrix<T> A;                ///< (d_inner, d_state)   -exp(A_log), <= 0
  Matrix<T> B;                ///< (L, d_state)
  Matrix<T> C;                ///< (L, d_state)
  Matrix<T> D;                ///< (1, d_inner)         the skip
  Matrix<T> conv1d_weight;    ///< (d_inner, d_conv)    conv1d.weight, PyTorch (d_inner, 1, d_conv)
  Matrix<T> conv1d_bias;      ///< (1, d_inner) or empty (no bias)
  Matrix<T> out_proj_weight;  ///< (d_model, d_inner) or empty (the decomposition stops before out_proj)

  Index length() const { return x.rows(); }
  Index d_inner() const { return x.cols(); }
  Index d_state() const { return A.cols(); }

  /// The fields s6 reads: delta (L, D), A (D, N) <= 0, B and C (L, N), with L and D from delta.
  void check_scan() const {
    using std::to_string;
    const char* m = "mamba_activations";
    const Index L = delta.rows(), di = delta.cols();
    check_field(m, "A", A, di, A.cols(), "(d_inner=" + to_string(di) + ", d_state)");
    const std::string LN = "(L=" + to_string(L) + ", d_state=" + to_string(A.cols()) + ")";
    check_field(m, "B", B, L, A.cols(), LN);
    check_field(m, "C", C, L, A.cols(), LN);
    if ((A.array() > T(0)).any()) detail::fail(m, "A must be <= 0 (A = -exp(A_log))");
    if ((delta.array() < T(0)).any()) detail::fail(m, "delta must be >= 0 (softplus output)");
  }
  /// Throws std::invalid_argument naming the first field whose shape disagrees (L and d_inner from x).
  void check() const {
    using std::to_string;
    const char* m = "mamba_activations";
    const Index L = x.rows(), di = x.cols();
    const std::string LD = "(L=" + to_string(L) + ", d_inner=" + to_string(di) + ")", D1 = "(1, d_inner=" + to_string(di) + ")";
    check_field(m, "z", z, L, di, LD);
    check_field(m, "delta", delta, L, di, LD);
    check_scan();
    check_field(m, "D", D, 1, di, D1);
    detail::require_shape(conv1d_weight.rows() == di && conv1d_weight.cols() >= 1, m, "conv1d_weight", conv1d_weight.rows(),
                          conv1d_weight.cols(), "(d_inner=" + to_string(di) + ", d_conv)");
    if (conv1d_bias.size() != 0) check_field(m, "conv1d_bias", conv1d_bias, 1, di, D1 + " or empty");
    if (out_proj_weight.size() != 0)
      detail::require_shape(out_proj_weight.cols() == di, m, "out_proj_weight", out_proj_weight.rows(), out_proj_weight.cols(),
                            "(d_model, d_inner=" + to_string(di) + ") or empty");
  }
  /// p = conv1d(x) + conv1d_bias (L, d_inner): the SiLU's argument, a = SiLU(p) is the scan's input.
  Matrix<T> conv_out() const { return nn::causal_conv1d<T>(x, conv1d_weight, conv1d_bias); }
};

/// The activations of one forward pass of the block on u (L, d_model), out_proj_weight included.
template <Scalar T>
mamba_activations<T> activations(const mamba_weights<T>& w, const Matrix<T>& u) {
  w.check();
  const auto& c = w.config;
  detail::require_shape(u.cols() == c.d_model, "mamba", "u", u.rows(), u.cols(), "(L, d_model=" + std::to_string(c.d_model) + ")");
  const Index di = c.d_inner(), N = c.d_state, R = c.rank();
  mamba_activations<T> s;
  const Matrix<T> xz = nn::linear<T>(u, w.in_proj_weight);
  s.x = xz.leftCols(di);
  s.z = xz.rightCols(di);
  s.conv1d_weight = w.conv1d_weight;
  s.conv1d_bias = w.conv1d_bias;
  const Matrix<T> a = nn::map<T>(s.conv_out(), [](T v) { return nn::silu(v); });
  const Matrix<T> dbl = nn::linear<T>(a, w.x_proj_weight);
  s.delta = nn::map<T>(nn::linear<T>(Matrix<T>(dbl.leftCols(R)), w.dt_proj_weight, w.dt_proj_bias), [](T v) { return nn::softplus(v); });
  s.B = dbl.middleCols(R, N);
  s.C = dbl.rightCols(N);
  s.A = -w.A_log.array().exp().matrix();
  s.D = w.D;
  s.out_proj_weight = w.out_proj_weight;
  return s;
}

/// The block's plain recurrent forward before out_proj: u (L, d_model) -> y * SiLU(z) (L, d_inner).
/// final_state, when given, receives the scan state after the last token (d_inner, d_state).
template <Scalar T>
Matrix<T> mamba_inner_forward(const mamba_weights<T>& w, const Matrix<T>& u, Matrix<T>* final_state = nullptr) {
  w.check();
  const auto& c = w.config;
  detail::require_shape(u.cols() == c.d_model, "mamba", "u", u.rows(), u.cols(), "(L, d_model=" + std::to_string(c.d_model) + ")");
  const Index L = u.rows(), di = c.d_inner(), N = c.d_state, R = c.rank();
  const Matrix<T> xz = nn::linear<T>(u, w.in_proj_weight);
  const Matrix<T> a = nn::map<T>(nn::causal_conv1d<T>(Matrix<T>(xz.leftCols(di)), w.conv1d_weight, w.conv1d_bias), [](T v) { return nn::silu(v); });
  const Matrix<T> dbl = nn::linear<T>(a, w.x_proj_weight);
  const Matrix<T> dt = nn::map<T>(nn::linear<T>(Matrix<T>(dbl.leftCols(R)), w.dt_proj_weight, w.dt_proj_bias), [](T v) { return nn::softplus(v); });
  Matrix<T> y(L, di), h = Matrix<T>::Zero(di, N);
  for (Index t = 0; t < L; ++t)
    for (Index ch = 0; ch < di; ++ch) {
      T acc = 0;
      for (Index n = 0; n < N; ++n) {
        h(ch, n) = std::exp(-dt(t, ch) * std::exp(w.A_log(ch, n))) * h(ch, n) + dt(t, ch) * dbl(t, R + n) * a(t, ch);
        acc += dbl(t, R + N + n) * h(ch, n);
      }
      y(t, ch) = (acc + w.D(0, ch) * a(t, ch)) * nn::silu(xz(t, di + ch));
    }
  if (final_state) *final_state = h;
  return y;
}

/// The block's plain recurrent forward (the oracle): u (L, d_model) -> (L, d_model).
template <Scalar T>
Matrix<T> mamba_forward(const mamba_weights<T>& w, const Matrix<T>& u, Matrix<T>* final_state = nullptr) {
  return nn::linear<T>(mamba_inner_forward(w, u, final_state), w.out_proj_weight);
}

/// The selective scan as an operator on a = SiLU(p): S(delta (x) A, B, C), one head per channel.
template <Scalar T>
auto s6(const mamba_activations<T>& a) {
  a.check_scan();
  return semiseparable(factored_decay(a.delta, a.A), a.B, a.C, {.heads = a.delta.cols()});
}

namespace mamba_detail {
template <class T>
Matrix<T> silu_z(const mamba_activations<T>& a) { return nn::map<T>(a.z, [](T v) { return nn::silu(v); }); }
template <class T>
Matrix<T> sigmoid_p(const mamba_activations<T>& a) { return nn::map<T>(a.conv_out(), [](T v) { return nn::sigmoid(v); }); }
}  // namespace mamba_detail

/// The exact decomposition from activations (see the header comment); out_proj_weight empty gives
/// the inner output y * SiLU(z).
template <Scalar T>
auto attention(const mamba_activations<T>& a) {
  a.check();
  const Matrix<T> sig = mamba_detail::sigmoid_p(a);
  auto core = diagonal(mamba_detail::silu_z(a)) * (s6(a) * diagonal(a.delta) + diagonal(a.D));
  Matrix<T> beta = Matrix<T>::Zero(a.length(), a.d_inner());
  if (a.conv1d_bias.size() != 0) {
    Matrix<T> bias_in = sig;
    bias_in.array().rowwise() *= a.conv1d_bias.row(0).array();
    beta = apply(core, bias_in);
  }
  auto H = core * diagonal(sig) * causal_conv(depthwise_taps(a.conv1d_weight));
  return make_decomposition<T>(a.x, std::move(H), std::move(beta), a.out_proj_weight);
}

/// The exact decomposition: mamba_forward(w, u) == d.output().
template <Scalar T>
auto decompose(const mamba_weights<T>& w, const Matrix<T>& u) { return attention(activations(w, u)); }

/// The exact decomposition: mamba_forward(w, u) == d.output() (the named form of decompose).
template <Scalar T>
auto mamba_decompose(const mamba_weights<T>& w, const Matrix<T>& u) { return decompose(w, u); }

/// The scan state after the last token, mamba_ssm's ssm_state / selective_scan's last_state
/// (d_inner, d_state): h[c, n] = sum_s exp(sum_{k>s} delta_k[c] A[c, n]) delta_s[c] B_s[n] a_s[c],
/// a = SiLU(p), in log space (recurrent_state.hpp). The D skip is not part of the state.
template <Scalar T>
Matrix<T> final_state(const mamba_activations<T>& a) {
  a.check();
  const Matrix<T> act = nn::map<T>(a.conv_out(), [](T v) { return nn::silu(v); });
  const Index L = a.length(), D = a.d_inner(), N = a.d_state();
  Matrix<T> h(D, N);
  for (Index c = 0; c < D; ++c)
    for (Index n = 0; n < N; ++n)
      h(c, n) = decayed_sum<T>(
          L, [&](Index k) { return a.delta(k, c) * a.A(c, n); }, [&](Index s) { return a.delta(s, c) * a.B(s, n) * act(s, c); });
  return h;
}

/// Ali et al.'s hidden attention of S6 (eq. 12): S(delta (x) A, B, C) diag(delta), acting on a = SiLU(p).
template <Scalar T>
auto s6_attention(const mamba_activations<T>& a) { return s6(a) * diagonal(a.delta); }
template <Scalar T>
auto s6_attention(const mamba_weights<T>& w, const Matrix<T>& u) { return s6_attention(activations(w, u)); }

/// Which factors of the holistic matrix to keep: Zimerman et al.'s Table 4 ablations.
struct mamba_ablation {
  bool conv = true;        ///< M
  bool gate = true;        ///< diag(SiLU z)
  bool activation = true;  ///< diag(sigmoid p)
};

/// Zimerman et al.'s holistic Mamba matrix (eq. 9): diag(SiLU z) S diag(delta) diag(sigmoid p) M,
/// the D skip and the conv-bias term dropped as in the paper; factors left out per the ablation.
template <mamba_ablation Keep = mamba_ablation{}, Scalar T>
auto holistic_attention(const mamba_activations<T>& a) {
  a.check();
  auto core = s6(a) * diagonal(a.delta);
  auto gated = [&] {
    if constexpr (Keep.gate) return diagonal(mamba_detail::silu_z(a)) * core;
    else return core;
  }();
  auto act = [&] {
    if constexpr (Keep.activation) return gated * diagonal(mamba_detail::sigmoid_p(a));
    else return gated;
  }();
  if constexpr (Keep.conv) return act * causal_conv(depthwise_taps(a.conv1d_weight));
  else return act;
}
template <mamba_ablation Keep = mamba_ablation{}, Scalar T>
auto holistic_attention(const mamba_weights<T>& w, const Matrix<T>& u) { return holistic_attention<Keep>(activations(w, u)); }

}  // namespace iattn::models
