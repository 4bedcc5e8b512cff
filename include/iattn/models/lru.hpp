// iattn/models/lru.hpp: the Linear Recurrent Unit (Orvieto et al. 2023, "Resurrecting Recurrent
// Neural Networks for Long Sequences", Appendix A) as implicit attention.
//
// Forward, H = d_model input/output channels, N complex states:
//   Lambda = exp(-exp(nu_log) + i exp(theta_log))           (N), |Lambda| < 1, token-independent
//   z_t = (B_re + i B_im) diag(exp(gamma_log)) u_t           (N) complex: the gamma-normalised input
//   x_t = Lambda * x_{t-1} + z_t,  x_{-1} = 0;   y_t = Re((C_re + i C_im) x_t) + D * u_t
// (gamma_log starts at log sqrt(1 - |Lambda|^2) and is trained freely.) The surrounding block (norm,
// GELU, GLU, residual) is position-wise and outside the decomposition, as for S4D.
//
// The LRU mixes channels through B and C, so its inner channels are not u's. Exact decomposition
// over 4N + H inner channels with x = [Re z | Im z | Re z | Im z | u]:
//   channel m          (Re z_m):  Re(Lambda^{t-s})           -> with the next block: Re x_m
//   channel N + m      (Im z_m):  Re(i Lambda^{t-s}) = -Im
//   channel 2N + m     (Re z_m):  Re(-i Lambda^{t-s}) = Im   -> with the next block: Im x_m
//   channel 3N + m     (Im z_m):  Re(Lambda^{t-s})
//   channel 4N + j     (u_j):     the identity (the D skip)
// i.e. H = ComplexSemiseparable(rho = -exp(nu_log), theta = exp(theta_log); B in {1, i}, C in {1, -i};
// one state per channel) + diag(skip mask), and out_proj = [C_re, C_re, -C_im, -C_im, diag(D)]
// (H, 4N + H), so that y = C_re Re x - C_im Im x + D u. beta = 0.
#pragma once

#include "../iattn.hpp"
#include "common.hpp"

#include <cmath>
#include <complex>
#include <cstdint>
#include <string>
#include <vector>

namespace iattn::models {

struct lru_config {
  Index d_model = 16;     ///< H
  Index d_hidden = 32;    ///< N complex states
  double r_min = 0.0;     ///< eigenvalue moduli drawn in [r_min, r_max] (ring init)
  double r_max = 1.0;
  double max_phase = 6.28;  ///< the paper's code uses 6.28
};

/// LRU parameters as the paper's code names them.
template <Scalar T>
struct lru_weights {
  lru_config config;
  Matrix<T> nu_log, theta_log, gamma_log;  ///< (1, N) each
  Matrix<T> B_re, B_im;                    ///< (N, H)
  Matrix<T> C_re, C_im;                    ///< (H, N)
  Matrix<T> D;                             ///< (1, H)

  void check() const {
    const auto& c = config;
    using std::to_string;
    const char* m = "lru";
    if (c.d_model < 1 || c.d_hidden < 1) detail::fail(m, "d_model and d_hidden must be >= 1");
    const Index H = c.d_model, N = c.d_hidden;
    const std::string n1 = "(1, d_hidden=" + to_string(N) + ")", nh = "(d_hidden=" + to_string(N) + ", d_model=" + to_string(H) + ")",
                      hn = "(d_model=" + to_string(H) + ", d_hidden=" + to_string(N) + ")";
    check_field(m, "nu_log", nu_log, 1, N, n1);
    check_field(m, "theta_log", theta_log, 1, N, n1);
    check_field(m, "gamma_log", gamma_log, 1, N, n1);
    check_field(m, "B_re", B_re, N, H, nh);
    check_field(m, "B_im", B_im, N, H, nh);
    check_field(m, "C_re", C_re, H, N, hn);
    check_field(m, "C_im", C_im, H, N, hn);
    check_field(m, "D", D, 1, H, "(1, d_model=" + to_string(H) + ")");
  }
  /// Lambda_m = exp(-exp(nu_log_m) + i exp(theta_log_m)) as (log |Lambda|, arg Lambda).
  T log_mag(Index m) const { return -std::exp(nu_log(0, m)); }
  T angle(Index m) const { return std::exp(theta_log(0, m)); }
};

/// The paper's init: ring-uniform eigenvalues (|Lambda|^2 uniform in [r_min^2, r_max^2], phase
/// uniform in [0, max_phase]), gamma = sqrt(1 - |Lambda|^2), B ~ N(0, 1/(2H)), C ~ N(0, 1/N), D ~ N(0, 1).
template <Scalar T>
lru_weights<T> lru_init(const lru_config& c, std::uint64_t seed = 0) {
  init::generator g(seed);
  lru_weights<T> w;
  w.config = c;
  const Index H = c.d_model, N = c.d_hidden;
  const Matrix<double> u1 = init::uniform<double>(g, 1, N, 0.0, 1.0), u2 = init::uniform<double>(g, 1, N, 0.0, 1.0);
  w.nu_log.resize(1, N);
  w.theta_log.resize(1, N);
  w.gamma_log.resize(1, N);
  for (Index m = 0; m < N; ++m) {
    const double r2 = u1(0, m) * (c.r_max * c.r_max - c.r_min * c.r_min) + c.r_min * c.r_min;
    const double nu = -0.5 * std::log(std::max(r2, 1e-300));
    w.nu_log(0, m) = T(std::log(std::max(nu, 1e-300)));
    w.theta_log(0, m) = T(std::log(std::max(c.max_phase * u2(0, m), 1e-300)));
    const double mod = std::exp(-nu);
    w.gamma_log(0, m) = T(std::log(std::sqrt(std::max(1 - mod * mod, 1e-300))));
  }
  w.B_re = init::normal<T>(g, N, H, 1.0 / std::sqrt(2.0 * double(H)));
  w.B_im = init::normal<T>(g, N, H, 1.0 / std::sqrt(2.0 * double(H)));
  w.C_re = init::normal<T>(g, H, N, 1.0 / std::sqrt(double(N)));
  w.C_im = init::normal<T>(g, H, N, 1.0 / std::sqrt(double(N)));
  w.D = init::normal<T>(g, 1, H, 1.0);
  return w;
}

/// The LRU's activations: its input u and its (token-independent) parameters, named as the paper's
/// code names them; z_re, z_im are the gamma-normalised input B_norm u.
template <Scalar T>
struct lru_activations {
  Matrix<T> u;                             ///< (L, H)
  Matrix<T> z_re, z_im;                    ///< (L, N)   B_norm u
  Matrix<T> nu_log, theta_log;             ///< (1, N)
  Matrix<T> C_re, C_im;                    ///< (H, N) or empty (the decomposition stops before C: output() is [Re x | Im x])
  Matrix<T> D;                             ///< (1, H)

  Index length() const { return u.rows(); }
  void check() const {
    using std::to_string;
    const char* m = "lru_activations";
    const Index L = u.rows(), H = u.cols(), N = nu_log.cols();
    detail::require_shape(nu_log.rows() == 1 && N >= 1, m, "nu_log", nu_log.rows(), nu_log.cols(), "(1, N) with N >= 1");
    check_field(m, "theta_log", theta_log, 1, N, "(1, N=" + to_string(N) + ")");
    check_field(m, "z_re", z_re, L, N, "(L=" + to_string(L) + ", N=" + to_string(N) + ")");
    check_field(m, "z_im", z_im, L, N, "(L=" + to_string(L) + ", N=" + to_string(N) + ")");
    if (C_re.size() || C_im.size()) {
      check_field(m, "C_re", C_re, H, N, "(H=" + to_string(H) + ", N=" + to_string(N) + ")");
      check_field(m, "C_im", C_im, H, N, "(H=" + to_string(H) + ", N=" + to_string(N) + ")");
    }
    check_field(m, "D", D, 1, H, "(1, H=" + to_string(H) + ")");
  }
};

/// The activations on u (L, d_model).
template <Scalar T>
lru_activations<T> activations(const lru_weights<T>& w, const Matrix<T>& u) {
  w.check();
  detail::require_shape(u.cols() == w.config.d_model, "lru", "u", u.rows(), u.cols(), "(L, d_model=" + std::to_string(w.config.d_model) + ")");
  lru_activations<T> a;
  a.u = u;
  const Matrix<T> gam = w.gamma_log.array().exp().matrix();
  Matrix<T> Bre = w.B_re, Bim = w.B_im;
  for (Index m = 0; m < Bre.rows(); ++m) Bre.row(m) *= gam(0, m), Bim.row(m) *= gam(0, m);
  a.z_re = nn::linear<T>(u, Bre);
  a.z_im = nn::linear<T>(u, Bim);
  a.nu_log = w.nu_log;
  a.theta_log = w.theta_log;
  a.C_re = w.C_re;
  a.C_im = w.C_im;
  a.D = w.D;
  return a;
}

/// The LRU's plain complex recurrence (the oracle). final_state, when given, receives x_{L-1} as
/// (N, 2): [Re, Im].
template <Scalar T>
Matrix<T> lru_forward(const lru_weights<T>& w, const Matrix<T>& u, Matrix<T>* final_state = nullptr) {
  const auto a = activations(w, u);
  const Index L = u.rows(), H = u.cols(), N = w.config.d_hidden;
  std::vector<std::complex<T>> lam(static_cast<std::size_t>(N)), x(static_cast<std::size_t>(N));
  for (Index m = 0; m < N; ++m) lam[std::size_t(m)] = std::exp(std::complex<T>(w.log_mag(m), w.angle(m)));
  Matrix<T> y(L, H);
  for (Index t = 0; t < L; ++t) {
    for (Index m = 0; m < N; ++m) x[std::size_t(m)] = lam[std::size_t(m)] * x[std::size_t(m)] + std::complex<T>(a.z_re(t, m), a.z_im(t, m));
    for (Index o = 0; o < H; ++o) {
      T acc = w.D(0, o) * u(t, o);
      for (Index m = 0; m < N; ++m) acc += (std::complex<T>(w.C_re(o, m), w.C_im(o, m)) * x[std::size_t(m)]).real();
      y(t, o) = acc;
    }
  }
  if (final_state) {
    final_state->resize(N, 2);
    for (Index m = 0; m < N; ++m) (*final_state)(m, 0) = x[std::size_t(m)].real(), (*final_state)(m, 1) = x[std::size_t(m)].imag();
  }
  return y;
}

/// The complex recurrence of the header comment over 4N + H channels (one state each), plus the
/// skip mask: the decomposition's H.
template <Scalar T>
auto lru_operator(const lru_activations<T>& a) {
  a.check();
  const Index L = a.length(), H = a.u.cols(), N = a.nu_log.cols(), Dp = 4 * N + H;
  Matrix<T> rho = Matrix<T>::Zero(1, Dp), theta = Matrix<T>::Zero(1, Dp);
  Matrix<T> Bre = Matrix<T>::Zero(L, Dp), Bim = Matrix<T>::Zero(L, Dp), Cre = Matrix<T>::Zero(L, Dp), Cim = Matrix<T>::Zero(L, Dp);
  for (Index blk = 0; blk < 4; ++blk)
    for (Index m = 0; m < N; ++m) {
      const Index c = blk * N + m;
      rho(0, c) = -std::exp(a.nu_log(0, m));
      theta(0, c) = std::exp(a.theta_log(0, m));
      (blk == 0 || blk == 2 ? Bre : Bim).col(c).setOnes();      // B = 1 on Re z, i on Im z
      if (blk < 2) Cre.col(c).setOnes();                        // C = 1: the real part
      else Cim.col(c).setConstant(T(-1));                       // C = -i: the imaginary part
    }
  Matrix<T> mask = Matrix<T>::Zero(1, Dp);
  mask.rightCols(H).setOnes();
  return complex_semiseparable(std::move(rho), std::move(theta), std::move(Bre), std::move(Bim), std::move(Cre), std::move(Cim),
                               {.heads = Dp, .head_dim = 1, .groups = Dp, .state = 1}) +
         diagonal(std::move(mask));
}

/// The exact decomposition from activations (see the header comment): x = [Re z | Im z | Re z | Im z | u],
/// out_proj = [C_re, C_re, -C_im, -C_im, diag(D)]. With C empty, output() is (L, 4N + H) (no projection).
template <Scalar T>
auto attention(const lru_activations<T>& a) {
  a.check();
  const Index L = a.length(), H = a.u.cols(), N = a.nu_log.cols();
  Matrix<T> x(L, 4 * N + H);
  x << a.z_re, a.z_im, a.z_re, a.z_im, a.u;
  Matrix<T> out;
  if (a.C_re.size()) {
    out.resize(H, 4 * N + H);
    out << a.C_re, a.C_re, -a.C_im, -a.C_im, Matrix<T>(a.D.row(0).asDiagonal());
  }
  return make_decomposition<T>(std::move(x), lru_operator(a), Matrix<T>(Matrix<T>::Zero(L, 4 * N + H)), std::move(out));
}

/// The exact decomposition: lru_forward(w, u) == d.output().
template <Scalar T>
auto decompose(const lru_weights<T>& w, const Matrix<T>& u) { return attention(activations(w, u)); }

/// The exact decomposition (the named form of decompose).
template <Scalar T>
auto lru_decompose(const lru_weights<T>& w, const Matrix<T>& u) { return decompose(w, u); }

/// The state after the last token, x_{L-1} as (N, 2) [Re, Im], as sum_s Lambda^{L-1-s} z_s with the
/// powers formed from the log (exp((L-1-s) log Lambda): the real part of the exponent <= 0), not by
/// the recurrence.
template <Scalar T>
Matrix<T> final_state(const lru_activations<T>& a) {
  a.check();
  const Index L = a.length(), N = a.nu_log.cols();
  Matrix<T> S = Matrix<T>::Zero(N, 2);
  for (Index m = 0; m < N; ++m) {
    const std::complex<double> logl(-std::exp(double(a.nu_log(0, m))), std::exp(double(a.theta_log(0, m))));
    std::complex<double> acc = 0;
    for (Index s = 0; s < L; ++s) acc += std::exp(double(L - 1 - s) * logl) * std::complex<double>(a.z_re(s, m), a.z_im(s, m));
    S(m, 0) = T(acc.real());
    S(m, 1) = T(acc.imag());
  }
  return S;
}

}  // namespace iattn::models
