// iattn/models/mamba.hpp: the Mamba-1 block (mamba_ssm `Mamba`) as implicit attention.
//
// Forward (mamba_ssm's reference path, bias-free in_proj/x_proj/out_proj as in its defaults):
//   [x, z] = in_proj(u);  p = conv1d(x) + conv1d_bias;  a = SiLU(p)
//   [dt_in, B, C] = x_proj(a);  dt = softplus(dt_proj(dt_in) + dt_proj_bias);  A = -exp(A_log)
//   h_t = exp(dt_t A) h_{t-1} + dt_t B_t a_t;  y_t = C_t . h_t + D a_t;  out = out_proj(y * SiLU(z))
//
// Exact decomposition over the d_inner channels (design.md section 4), inner input x = in_proj's x:
//   H    = diag(SiLU z) (S(dt (x) A, B, C) diag(dt) + diag(D)) diag(sigmoid p) M        M = conv
//   beta = diag(SiLU z) (S diag(dt) + diag(D)) (sigmoid(p) * conv1d_bias)
// since SiLU(p) = sigmoid(p) p and p = M x + bias. The papers' matrices drop D and the bias term:
//   s6_attention:       S diag(dt)                                   (Ali et al., eq. 12)
//   holistic_attention: diag(SiLU z) S diag(dt) diag(sigmoid p) M    (Zimerman et al., eq. 9)
//   and its Table 4 ablations through mamba_ablation {conv, gate, activation}.
#pragma once

#include "../iattn.hpp"
#include "common.hpp"

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

/// The token-wise quantities of one forward pass (everything the scan is controlled by).
template <Scalar T>
struct mamba_activations {
  Matrix<T> x, z, p, a, dt, B, C, A;  // (L, di) x4, (L, di), (L, N), (L, N), (di, N)
};

template <Scalar T>
mamba_activations<T> mamba_project(const mamba_weights<T>& w, const Matrix<T>& u) {
  w.check();
  const auto& c = w.config;
  detail::require_shape(u.cols() == c.d_model, "mamba", "u", u.rows(), u.cols(), "(L, d_model=" + std::to_string(c.d_model) + ")");
  const Index di = c.d_inner(), N = c.d_state, R = c.rank();
  mamba_activations<T> s;
  const Matrix<T> xz = nn::linear<T>(u, w.in_proj_weight);
  s.x = xz.leftCols(di);
  s.z = xz.rightCols(di);
  s.p = nn::causal_conv1d<T>(s.x, w.conv1d_weight, w.conv1d_bias);
  s.a = nn::map<T>(s.p, [](T v) { return nn::silu(v); });
  const Matrix<T> dbl = nn::linear<T>(s.a, w.x_proj_weight);
  s.dt = nn::map<T>(nn::linear<T>(Matrix<T>(dbl.leftCols(R)), w.dt_proj_weight, w.dt_proj_bias), [](T v) { return nn::softplus(v); });
  s.B = dbl.middleCols(R, N);
  s.C = dbl.rightCols(N);
  s.A = -w.A_log.array().exp().matrix();
  return s;
}

/// The block's plain recurrent forward before out_proj: u (L, d_model) -> y * SiLU(z) (L, d_inner).
template <Scalar T>
Matrix<T> mamba_inner_forward(const mamba_weights<T>& w, const Matrix<T>& u) {
  const auto s = mamba_project(w, u);
  const Index L = u.rows(), di = w.config.d_inner(), N = w.config.d_state;
  Matrix<T> y(L, di), h = Matrix<T>::Zero(di, N);
  for (Index t = 0; t < L; ++t)
    for (Index c = 0; c < di; ++c) {
      T acc = 0;
      for (Index n = 0; n < N; ++n) {
        h(c, n) = std::exp(s.dt(t, c) * s.A(c, n)) * h(c, n) + s.dt(t, c) * s.B(t, n) * s.a(t, c);
        acc += s.C(t, n) * h(c, n);
      }
      y(t, c) = (acc + w.D(0, c) * s.a(t, c)) * nn::silu(s.z(t, c));
    }
  return y;
}

/// The block's plain recurrent forward (the oracle): u (L, d_model) -> (L, d_model).
template <Scalar T>
Matrix<T> mamba_forward(const mamba_weights<T>& w, const Matrix<T>& u) {
  return nn::linear<T>(mamba_inner_forward(w, u), w.out_proj_weight);
}

namespace mamba_detail {
template <class T>
auto s6(const mamba_activations<T>& s, Index di) {
  return semiseparable(factored_decay(Matrix<T>(s.dt), Matrix<T>(s.A)), Matrix<T>(s.B), Matrix<T>(s.C), {.heads = di});
}
template <class T>
Matrix<T> gate(const mamba_activations<T>& s) { return nn::map<T>(s.z, [](T v) { return nn::silu(v); }); }
template <class T>
Matrix<T> sigmoid_p(const mamba_activations<T>& s) { return nn::map<T>(s.p, [](T v) { return nn::sigmoid(v); }); }
template <class T>
Matrix<T> conv_taps(const mamba_weights<T>& w) { return w.conv1d_weight.transpose(); }  // (K, d_inner)
}  // namespace mamba_detail

/// The exact decomposition: mamba_forward(w, u) == d.output() (see the header comment).
template <Scalar T>
auto mamba_decompose(const mamba_weights<T>& w, const Matrix<T>& u) {
  using namespace mamba_detail;
  const auto s = mamba_project(w, u);
  const Index di = w.config.d_inner();
  const Matrix<T> sig = sigmoid_p(s);
  auto core = diagonal(gate(s)) * (s6(s, di) * diagonal(Matrix<T>(s.dt)) + diagonal(Matrix<T>(w.D)));
  Matrix<T> bias_in = sig;
  bias_in.array().rowwise() *= w.conv1d_bias.row(0).array();
  Matrix<T> beta = apply(core, bias_in);
  auto H = core * diagonal(Matrix<T>(sig)) * causal_conv(conv_taps(w));  // owned copies: sig is a local
  return make_decomposition<T>(s.x, std::move(H), std::move(beta), w.out_proj_weight);
}

/// Ali et al.'s hidden attention of S6 (eq. 12): S(dt (x) A, B, C) diag(dt), acting on a = SiLU(p).
template <Scalar T>
auto s6_attention(const mamba_weights<T>& w, const Matrix<T>& u) {
  const auto s = mamba_project(w, u);
  return mamba_detail::s6(s, w.config.d_inner()) * diagonal(Matrix<T>(s.dt));
}

/// Which factors of the holistic matrix to keep: Zimerman et al.'s Table 4 ablations.
struct mamba_ablation {
  bool conv = true;        ///< M
  bool gate = true;        ///< diag(SiLU z)
  bool activation = true;  ///< diag(sigmoid p)
};

/// Zimerman et al.'s holistic Mamba matrix (eq. 9): diag(SiLU z) S diag(dt) diag(sigmoid p) M, the
/// D skip and the conv-bias term dropped as in the paper; factors left out per the ablation.
template <mamba_ablation Keep = mamba_ablation{}, Scalar T>
auto holistic_attention(const mamba_weights<T>& w, const Matrix<T>& u) {
  using namespace mamba_detail;
  const auto s = mamba_project(w, u);
  const Index di = w.config.d_inner();
  auto core = s6(s, di) * diagonal(Matrix<T>(s.dt));
  auto gated = [&] {
    if constexpr (Keep.gate) return diagonal(gate(s)) * core;
    else return core;
  }();
  auto act = [&] {
    if constexpr (Keep.activation) return gated * diagonal(sigmoid_p(s));
    else return gated;
  }();
  if constexpr (Keep.conv) return act * causal_conv(conv_taps(w));
  else return act;
}

}  // namespace iattn::models
