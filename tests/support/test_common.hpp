// tests/support/test_common.hpp: Catch2 (2.13 or 3), random coefficients, the tolerance helper and
// the dense oracles: every operator's matrix built with plain loops from docs/design.md section 2, in double.
// The helpers the CUDA tests share (random coefficients, the band and recurrence oracles) are in
// oracles.hpp, which nvcc compiles too.
#pragma once

#if defined(IATTN_CATCH2_V3)
#include <catch2/catch_all.hpp>
#else
#include <catch2/catch.hpp>
#endif

#include <iattn/iattn.hpp>

#include "oracles.hpp"  // rng(), uniform(), dense_diagonal/conv/linear_recurrence (nvcc-safe)

#include <cmath>
#include <limits>
#include <random>
#include <vector>

namespace test {

using iattn::Index;
template <class T>
using Mat = iattn::Matrix<T>;
using MatD = iattn::Matrix<double>;

/// The lengths every operator is tested at: SIMD tails, one and several tiles.
inline const std::vector<Index> lengths = {1, 2, 7, 64, 257, 1000};

template <class T>
T tolerance() {
  return std::is_same_v<T, float> ? T(1e-4) : T(1e-10);
}

template <class T>
Mat<T> normal(Index r, Index c, double sd = 1.0) {
  std::normal_distribution<double> n(0.0, sd);
  Mat<T> m(r, c);
  for (Index i = 0; i < m.size(); ++i) m.data()[i] = T(n(rng()));
  return m;
}

/// max |a - b| <= tol * (1 + max |b|), reported with the figures when it fails.
template <class A, class B>
void check_close(const A& a, const B& b, double tol) {
  REQUIRE(a.rows() == b.rows());
  REQUIRE(a.cols() == b.cols());
  const MatD ad = a.template cast<double>(), bd = b.template cast<double>();
  const double scale = 1.0 + (bd.size() ? bd.cwiseAbs().maxCoeff() : 0.0);
  const double err = ad.size() ? (ad - bd).cwiseAbs().maxCoeff() : 0.0;
  INFO("max abs error " << err << ", allowed " << tol * scale);
  REQUIRE(std::isfinite(err));
  REQUIRE(err <= tol * scale);
}

// ---- dense oracles, double, plain loops --------------------------------------------------------
template <class M>
MatD dd(const M& m) { return m.template cast<double>(); }

/// Semiseparable with H heads, P channels per head, G groups; strict with an optional bonus (H, N).
/// The decay from s to t, exp(sum_{k=s+1..t} lambda_k) (strict: ..t-1), is kept as the running
/// product of the tokens' exp(lambda_k), each formed once (a reset, lambda = -inf, gives 0 from there
/// on either way); the loops read the row-major data directly. Under the sanitizers, an exp per
/// (t, s, state) and Eigen's checked accessors made this oracle most of semiseparable_test's time.
inline MatD dense_semiseparable(const MatD& lam, const MatD& B, const MatD& C, Index H, Index P, Index G, Index c,
                                bool strict = false, const MatD* bonus = nullptr) {
  const Index L = lam.rows(), N = B.cols() / G, h = c / P, g = h / (H / G);
  const bool per_state = lam.cols() != H;
  std::vector<double> E(static_cast<std::size_t>(L * N));  // E[k N + m] = exp(lambda_k) of state m
  for (Index k = 0; k < L; ++k)
    for (Index m = 0; m < N; ++m) E[std::size_t(k * N + m)] = std::exp(lam(k, per_state ? h * N + m : h));
  std::vector<double> diag_e(static_cast<std::size_t>(N), 1.0);  // the factor at t = s
  if (strict)
    for (Index m = 0; m < N; ++m) diag_e[std::size_t(m)] = bonus ? (*bonus)(h, m) : 0.0;
  MatD M = MatD::Zero(L, L);
  std::vector<double> p(static_cast<std::size_t>(N));
  for (Index s = 0; s < L; ++s) {
    std::fill(p.begin(), p.end(), 1.0);  // prod_{k=s+1..t} exp(lambda_k)  (strict: ..t-1)
    const double* b = B.data() + s * B.cols() + g * N;
    for (Index t = s; t < L; ++t) {
      const Index k = strict ? t - 1 : t;
      if (t > s && k > s)
        for (Index m = 0; m < N; ++m) p[std::size_t(m)] *= E[std::size_t(k * N + m)];
      const double* e = t == s ? diag_e.data() : p.data();
      const double* ct = C.data() + t * C.cols() + g * N;
      double v = 0;
      for (Index m = 0; m < N; ++m) v += ct[m] * e[m] * b[m];
      M(t, s) = v;
    }
  }
  return M;
}
/// y[:, c] = M^c x[:, c] for per-channel dense matrices given by a function c -> MatD.
template <class F>
MatD dense_apply(F&& matrix_of, const MatD& x) {
  MatD y(x.rows(), x.cols());
  for (Index c = 0; c < x.cols(); ++c) y.col(c) = matrix_of(c) * x.col(c);
  return y;
}

}  // namespace test
