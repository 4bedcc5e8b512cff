// iattn/models/s4d.hpp: the S4D layer (state-spaces' minimal `S4D` / `S4DKernel`, ZOH
// discretisation) as implicit attention: a linear time-invariant SSM is one long causal convolution.
//
// Forward, per channel h of H = d_model, N/2 complex modes n:
//   dt = exp(log_dt[h]);  A_n = -exp(log_A_real[h, n]) + i A_imag[h, n];  C'_n = C_n (exp(dt A_n) - 1) / A_n
//   x_n(t) = exp(dt A_n) x_n(t-1) + u_t[h];  y_t = 2 Re sum_n C'_n x_n(t) + D[h] u_t[h]     (the recurrence)
//   a = GELU(y) (exact, erf)
// The layer then applies `output_linear` (a 1x1 Conv1d to 2H channels and a GLU), a position-wise
// gated channel mixer outside the token mixing; the decomposition covers the layer up to `a` and
// returns an identity output projection (docs/models.md).
//
// Exact decomposition over the H channels, inner input x = u:
//   H = diag(Phi(y)) (CausalConv(k) + diag(D)),  k[l] = 2 Re sum_n C'_n exp(dt A_n l),  beta = 0
// since GELU(y) = Phi(y) y. The kernel k is L taps long (K = L).
//
// From activations (docs/models.md): s4d_activations holds u, the kernel k (H, L) and D;
// attention(acts) is the decomposition. No final_state: the activations hold the kernel, not the modes.
//
// As a complex recurrence (s4d_recurrence, s4d_recurrent_decompose): the same matrix as
// ComplexSemiseparable(rho = Re(dt A), theta = Im(dt A), B = 1, C = 2 C') with one head per channel
// and N/2 complex states, so H = diag(Phi(y)) (S_complex + diag(D)) is evaluated without the L-tap
// kernel (O(L N) per channel for apply instead of O(L^2)).
#pragma once

#include "../iattn.hpp"
#include "common.hpp"

#include <algorithm>
#include <complex>
#include <cstdint>
#include <numbers>
#include <string>
#include <vector>

namespace iattn::models {

struct s4d_config {
  Index d_model = 64;   ///< H
  Index d_state = 64;   ///< N (N/2 complex modes)
  double dt_min = 1e-3;
  double dt_max = 1e-1;
  Index modes() const { return d_state / 2; }
};

/// S4D parameters, '.' written '_': kernel.log_dt, kernel.C (complex, stored as view_as_real's
/// trailing (re, im) pair: here C_re and C_im), kernel.log_A_real, kernel.A_imag, D.
template <Scalar T>
struct s4d_weights {
  s4d_config config;
  Matrix<T> kernel_log_dt;      ///< (1, H)
  Matrix<T> kernel_C_re;        ///< (H, N/2)  kernel.C[..., 0]
  Matrix<T> kernel_C_im;        ///< (H, N/2)  kernel.C[..., 1]
  Matrix<T> kernel_log_A_real;  ///< (H, N/2)
  Matrix<T> kernel_A_imag;      ///< (H, N/2)
  Matrix<T> D;                  ///< (1, H)

  void check() const {
    const auto& c = config;
    using std::to_string;
    const char* m = "s4d";
    const std::string hn = "(d_model=" + to_string(c.d_model) + ", d_state/2=" + to_string(c.modes()) + ")", h1 = "(1, d_model=" + to_string(c.d_model) + ")";
    check_field(m, "kernel_log_dt", kernel_log_dt, 1, c.d_model, h1);
    check_field(m, "kernel_C_re", kernel_C_re, c.d_model, c.modes(), hn);
    check_field(m, "kernel_C_im", kernel_C_im, c.d_model, c.modes(), hn);
    check_field(m, "kernel_log_A_real", kernel_log_A_real, c.d_model, c.modes(), hn);
    check_field(m, "kernel_A_imag", kernel_A_imag, c.d_model, c.modes(), hn);
    check_field(m, "D", D, 1, c.d_model, h1);
  }
};

/// S4D-Lin initialisation: log_dt U(log dt_min, log dt_max), C complex standard normal (each part
/// N(0, 1/2)), A = -1/2 + i pi n, D standard normal.
template <Scalar T>
s4d_weights<T> s4d_init(const s4d_config& c, std::uint64_t seed = 0) {
  init::generator g(seed);
  s4d_weights<T> w;
  w.config = c;
  const Index H = c.d_model, M = c.modes();
  w.kernel_log_dt = init::uniform<T>(g, 1, H, std::log(c.dt_min), std::log(c.dt_max));
  w.kernel_C_re = init::normal<T>(g, H, M, std::sqrt(0.5));
  w.kernel_C_im = init::normal<T>(g, H, M, std::sqrt(0.5));
  w.kernel_log_A_real = Matrix<T>::Constant(H, M, T(std::log(0.5)));
  w.kernel_A_imag.resize(H, M);
  for (Index h = 0; h < H; ++h)
    for (Index n = 0; n < M; ++n) w.kernel_A_imag(h, n) = T(std::numbers::pi * double(n));
  w.D = init::normal<T>(g, 1, H, 1.0);
  return w;
}

namespace s4d_detail {
/// Per channel and mode: the discrete pole exp(dt A) and the ZOH output weight C'.
/// Returns dt A; sets the pole exp(dt A) and the weight C'.
template <class T>
std::complex<T> modes(const s4d_weights<T>& w, Index h, Index n, std::complex<T>& pole, std::complex<T>& weight) {
  const T dt = std::exp(w.kernel_log_dt(0, h));
  const std::complex<T> A(-std::exp(w.kernel_log_A_real(h, n)), w.kernel_A_imag(h, n));
  pole = std::exp(dt * A);
  weight = std::complex<T>(w.kernel_C_re(h, n), w.kernel_C_im(h, n)) * (pole - T(1)) / A;
  return dt * A;
}
template <class T>
T gelu(T v) { return T(0.5) * v * std::erfc(-v / std::numbers::sqrt2_v<T>); }
}  // namespace s4d_detail

/// The SSM output y = K * u + D u by the complex diagonal recurrence (the oracle's core).
template <Scalar T>
Matrix<T> s4d_ssm(const s4d_weights<T>& w, const Matrix<T>& u) {
  w.check();
  detail::require_shape(u.cols() == w.config.d_model, "s4d", "u", u.rows(), u.cols(), "(L, d_model=" + std::to_string(w.config.d_model) + ")");
  const Index L = u.rows(), H = w.config.d_model, M = w.config.modes();
  Matrix<T> y(L, H);
  for (Index h = 0; h < H; ++h) {
    const auto nm = static_cast<std::size_t>(M);
    std::vector<std::complex<T>> pole(nm), weight(nm), x(nm);
    for (Index n = 0; n < M; ++n) s4d_detail::modes(w, h, n, pole[std::size_t(n)], weight[std::size_t(n)]);
    for (Index t = 0; t < L; ++t) {
      T acc = 0;
      for (std::size_t n = 0; n < std::size_t(M); ++n) {
        x[n] = pole[n] * x[n] + u(t, h);
        acc += T(2) * (weight[n] * x[n]).real();
      }
      y(t, h) = acc + w.D(0, h) * u(t, h);
    }
  }
  return y;
}

/// The layer's forward up to its activation (the oracle): GELU(K * u + D u).
template <Scalar T>
Matrix<T> s4d_forward(const s4d_weights<T>& w, const Matrix<T>& u) {
  return nn::map<T>(s4d_ssm(w, u), [](T v) { return s4d_detail::gelu(v); });
}

/// The convolution kernel k (L, H), k[l, h] = 2 Re sum_n C'_n exp(dt A_n)^l, as CausalConv taps
/// (K = L, reversed: tap L-1-l holds lag l). An empty sequence gets the one tap of lag 0.
/// In double, each power from its exponent split chunk-relative: l = 64 b + j and
/// exp(dt A l) = exp(dt A 64 b) exp(dt A j), both factors exponentials of their own (no running
/// products, whose error would grow with l; the real part of every exponent <= 0): per mode
/// 64 + L / 64 exponentials instead of L, and one complex product's real part per (l, mode). (It
/// formed every (l, mode) exponential and recomputed the mode's pole and weight for each: 4.4 s for
/// 1024 channels of 32 modes at L = 1024 on a Zen 3 core pair.)
template <Scalar T>
Matrix<T> s4d_kernel_taps(const s4d_weights<T>& w, Index L) {
  w.check();
  L = std::max<Index>(L, 1);
  const Index H = w.config.d_model, M = w.config.modes();
  constexpr Index chunk = 64;
  const Index nj = std::min(L, chunk), nb = (L + chunk - 1) / chunk;
  Matrix<T> taps(L, H);
  std::vector<std::complex<double>> dtA(static_cast<std::size_t>(M)), weight(static_cast<std::size_t>(M)), ej(static_cast<std::size_t>(M * nj));
  std::vector<double> acc(static_cast<std::size_t>(nj));
  for (Index h = 0; h < H; ++h) {
    const double dt = std::exp(double(w.kernel_log_dt(0, h)));
    for (Index n = 0; n < M; ++n) {
      const std::complex<double> A(-std::exp(double(w.kernel_log_A_real(h, n))), double(w.kernel_A_imag(h, n)));
      const std::complex<double> a = dt * A, pole = std::exp(a);
      dtA[std::size_t(n)] = a;
      weight[std::size_t(n)] = std::complex<double>(double(w.kernel_C_re(h, n)), double(w.kernel_C_im(h, n))) * (pole - 1.0) / A;
      for (Index j = 0; j < nj; ++j) ej[std::size_t(n * nj + j)] = std::exp(a * double(j));
    }
    for (Index b = 0; b < nb; ++b) {
      std::fill(acc.begin(), acc.end(), 0.0);
      for (Index n = 0; n < M; ++n) {
        const std::complex<double> wb = weight[std::size_t(n)] * std::exp(dtA[std::size_t(n)] * double(b * chunk));
        const std::complex<double>* e = ej.data() + n * nj;
        for (Index j = 0; j < nj; ++j) acc[std::size_t(j)] += wb.real() * e[j].real() - wb.imag() * e[j].imag();
      }
      for (Index j = 0; j < nj && b * chunk + j < L; ++j) taps(L - 1 - (b * chunk + j), h) = T(2 * acc[std::size_t(j)]);
    }
  }
  return taps;
}

/// One forward pass's activations, named as state-spaces' `S4D.forward` names them: the input u,
/// the kernel k = S4DKernel(L) and the skip D. Built by `activations(w, u)` or by hand. An LTI layer
/// is one long convolution here: the activations hold its kernel, not the N/2 complex modes, so
/// there is no final_state (run s4d_ssm's recurrence for the modes' state).
template <Scalar T>
struct s4d_activations {
  Matrix<T> u;  ///< (L, H)        the layer input: the inner input
  Matrix<T> k;  ///< (H, L' >= L)  the SSM kernel, S4DKernel's (H, L) layout: k[h, l] is lag l
  Matrix<T> D;  ///< (1, H)

  Index length() const { return u.rows(); }

  /// Throws std::invalid_argument naming the first field whose shape disagrees (L, H from u).
  void check() const {
    using std::to_string;
    const char* m = "s4d_activations";
    const Index L = u.rows(), H = u.cols();
    detail::require_shape(k.rows() == H && k.cols() >= std::max<Index>(L, 1), m, "k", k.rows(), k.cols(),
                          "(H=" + to_string(H) + ", L' >= L=" + to_string(L) + ")");
    check_field(m, "D", D, 1, H, "(1, H=" + to_string(H) + ")");
  }
  /// The kernel as CausalConv taps (max(L, 1), H): tap L-1-l holds lag l.
  Matrix<T> taps() const {
    const Index L = std::max<Index>(length(), 1);
    return k.leftCols(L).rowwise().reverse().transpose();
  }
};

/// The activations on u (L, d_model): u itself, the kernel of length max(L, 1), D.
template <Scalar T>
s4d_activations<T> activations(const s4d_weights<T>& w, const Matrix<T>& u) {
  w.check();
  detail::require_shape(u.cols() == w.config.d_model, "s4d", "u", u.rows(), u.cols(), "(L, d_model=" + std::to_string(w.config.d_model) + ")");
  return {u, s4d_kernel_taps(w, u.rows()).colwise().reverse().transpose(), w.D};
}

/// The exact decomposition from activations, x = u, identity output projection (H, H).
template <Scalar T>
auto attention(const s4d_activations<T>& a) {
  a.check();
  const Index L = a.length(), H = a.u.cols();
  auto ssm = causal_conv(a.taps()) + diagonal(a.D);
  const Matrix<T> y = apply(ssm, a.u);  // the pre-activation, for the frozen Phi(y)
  auto Hop = diagonal(nn::map<T>(y, [](T v) { return T(0.5) * std::erfc(-v / std::numbers::sqrt2_v<T>); })) * std::move(ssm);
  return make_decomposition<T>(a.u, std::move(Hop), Matrix<T>(Matrix<T>::Zero(L, H)), Matrix<T>(Matrix<T>::Identity(H, H)));
}

/// The exact decomposition: s4d_forward(w, u) == d.output(), x = u, identity output projection.
template <Scalar T>
auto decompose(const s4d_weights<T>& w, const Matrix<T>& u) { return attention(activations(w, u)); }

/// The exact decomposition (the named form of decompose).
template <Scalar T>
auto s4d_decompose(const s4d_weights<T>& w, const Matrix<T>& u) { return decompose(w, u); }

/// The SSM's kernel as a complex recurrence over L tokens: per channel h (one head each, P = 1),
/// N/2 states with log-decay dt A_n (rho = Re, theta = Im, token-independent (1, H*N/2) rows), B = 1
/// and C = 2 C' (the ZOH weight). materialize(s4d_recurrence(w, L), h) equals the long
/// convolution's Toeplitz matrix of s4d_kernel_taps(w, L).
template <Scalar T>
ComplexSemiseparable<T> s4d_recurrence(const s4d_weights<T>& w, Index L) {
  w.check();
  const Index H = w.config.d_model, M = w.config.modes();
  Matrix<T> rho(1, H * M), theta(1, H * M), Cre(L, H * M), Cim(L, H * M);
  for (Index h = 0; h < H; ++h)
    for (Index n = 0; n < M; ++n) {
      std::complex<T> pole, weight;
      const std::complex<T> dtA = s4d_detail::modes(w, h, n, pole, weight);
      rho(0, h * M + n) = dtA.real();
      theta(0, h * M + n) = dtA.imag();
      Cre.col(h * M + n).setConstant(T(2) * weight.real());
      Cim.col(h * M + n).setConstant(T(2) * weight.imag());
    }
  return complex_semiseparable(std::move(rho), std::move(theta), Matrix<T>(Matrix<T>::Ones(L, H * M)),
                               Matrix<T>(Matrix<T>::Zero(L, H * M)), std::move(Cre), std::move(Cim),
                               {.heads = H, .head_dim = 1, .groups = H, .state = M});
}

/// The exact decomposition with the SSM as a complex recurrence instead of a long convolution:
/// s4d_forward(w, u) == d.output(); same x, beta and output projection as s4d_decompose.
template <Scalar T>
auto s4d_recurrent_decompose(const s4d_weights<T>& w, const Matrix<T>& u) {
  w.check();
  detail::require_shape(u.cols() == w.config.d_model, "s4d", "u", u.rows(), u.cols(), "(L, d_model=" + std::to_string(w.config.d_model) + ")");
  const Index L = u.rows(), H = u.cols();
  auto ssm = s4d_recurrence(w, L) + diagonal(w.D);
  const Matrix<T> y = apply(ssm, u);
  auto Hop = diagonal(nn::map<T>(y, [](T v) { return T(0.5) * std::erfc(-v / std::numbers::sqrt2_v<T>); })) * std::move(ssm);
  return make_decomposition<T>(u, std::move(Hop), Matrix<T>(Matrix<T>::Zero(L, H)), Matrix<T>(Matrix<T>::Identity(H, H)));
}

}  // namespace iattn::models
