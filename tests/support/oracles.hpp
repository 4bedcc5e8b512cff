// tests/support/oracles.hpp: what the CPU tests (through test_common.hpp) and the CUDA tests
// (tests/cuda/kernel_cases.hpp, compiled by nvcc too) share, free of Catch2 and of the CPU backend:
// the seeded random coefficients and the dense plain-loop oracles of the band and recurrence
// operators (docs/design.md section 2), in double.
#pragma once

#include <iattn/core/config.hpp>

#include <random>

namespace test {

using iattn::Index;
using MatD = iattn::Matrix<double>;

inline std::mt19937& rng() {
  static std::mt19937 g(12345);
  return g;
}

/// (r, c) values drawn uniformly from [lo, hi).
template <class T>
iattn::Matrix<T> uniform(Index r, Index c, double lo, double hi) {
  std::uniform_real_distribution<double> u(lo, hi);
  iattn::Matrix<T> m(r, c);
  for (Index i = 0; i < m.size(); ++i) m.data()[i] = T(u(rng()));
  return m;
}

// ---- dense oracles, double, plain loops --------------------------------------------------------

inline MatD dense_diagonal(const MatD& d, Index c, Index L) {
  MatD M = MatD::Zero(L, L);
  for (Index t = 0; t < L; ++t) M(t, t) = d(d.rows() == 1 ? 0 : t, c);
  return M;
}
inline MatD dense_conv(const MatD& w, Index c, Index L) {
  const Index K = w.rows();
  MatD M = MatD::Zero(L, L);
  for (Index t = 0; t < L; ++t)
    for (Index s = 0; s <= t; ++s)
      if (t - s < K) M(t, s) = w(K - 1 - (t - s), c);
  return M;
}
/// flip(M) = J M J (J the exchange matrix): entry (t, s) is M(L-1-t, L-1-s). Plain loops rather than
/// two dense products with J (2 L^3 multiplications, most of algebra_test's time under the sanitizers).
inline MatD dense_flip(const MatD& M) {
  const Index L = M.rows();
  MatD F(L, L);
  for (Index t = 0; t < L; ++t)
    for (Index s = 0; s < L; ++s) F(t, s) = M(L - 1 - t, L - 1 - s);
  return F;
}
inline MatD dense_linear_recurrence(const MatD& a, const MatD& b, Index c) {
  const Index L = a.rows();
  MatD M = MatD::Zero(L, L);
  for (Index s = 0; s < L; ++s) {
    double p = 1;  // prod_{k=s+1..t} a_k
    for (Index t = s; t < L; ++t) {
      if (t > s) p *= a(t, c);
      M(t, s) = p * b(s, c);
    }
  }
  return M;
}

}  // namespace test
