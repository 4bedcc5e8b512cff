// iattn/backend/cpu/toeplitz_mean.hpp: the channel mean of a time-invariant expression, a Toeplitz
// matrix.
//
// A term w * diag(post) * Core * diag(pre) * [conv] of mean.hpp's expansion has Toeplitz channel
// matrices, H^c[t, s] = k_c[t - s] for s <= t, when nothing in it depends on the token:
//   - its diagonals are fixed over tokens ((1, D) rows, or L = 1);
//   - its core, if any, is a ComplexSemiseparable whose decays are given once for all tokens
//     ((1, H*N) rows of rho and theta) and whose projections B, C hold the same values at every
//     token, with a convolution of at most max_mean_conv taps after it; a term without a core is
//     a band (a diagonal, or a convolution of any width).
// The LRU is such a sum (its complex recurrence and its skip mask; S4D run as a recurrence too).
// Then
//   mean_c H^c [t, s] = g[t - s],   g[n] = (1/|C|) sum_{c in C} k_c[n]   (|k_c[n]| for |H^c|),
// with k_c the sum of the channel's terms, in O(|C| N L) instead of the tile path's O(|C| N L^2)
// (the LRU at d_model 1024, L = 1024: 447 ms on the tile path, docs/performance.md):
//   k_c[n] = w post_c pre_c sum_{lag <= min(n, K-1)} tap_c(lag) Re sum_m C[g, m] lambda[h, m]^(n-lag) B[g, m].
// The powers are chunk-relative, in double: lambda^(64 b + j) = e^(64 b rho) (cos, sin)(64 b theta,
// reduced mod 2 pi) times lambda^j, the latter by products of lambda (j < 64); lambda^0 = 1 exactly
// (the diagonal never reads a decay, as in the recurrence) and rho = -inf gives exact zeros past it.
// No exp argument is positive when rho <= 0.
#pragma once

#include "../../core/means.hpp"
#include "../../ops/complex_semiseparable.hpp"
#include "mean.hpp"
#include "parallel.hpp"

#include <algorithm>
#include <cmath>
#include <complex>
#include <limits>
#include <vector>

namespace iattn::cpu_detail {

/// Whether every row of x equals its first (bitwise: a NaN makes the rows differ).
template <class T>
bool rows_constant(const coefficient<T>& x) {
  const Index n = x.cols();
  for (Index t = 1; t < x.rows(); ++t)
    if (!std::equal(x.row(t), x.row(t) + n, x.row(0))) return false;
  return true;
}

/// Whether the term's channel matrices are Toeplitz (see the header comment).
template <class T>
bool toeplitz_term(const mean_term<T>& t, Index L) {
  auto fixed = [L](const diag_factors<T>& d) {
    return std::all_of(d.f.begin(), d.f.end(), [L](const typename diag_factors<T>::factor& x) { return x.rows == 1 || L <= 1; });
  };
  if (!fixed(t.post) || !fixed(t.pre)) return false;
  if (!t.has_core()) return true;  // a band
  if (t.kind != mean_term<T>::core_kind::complex || t.S != nullptr || t.R != nullptr) return false;
  if (t.conv && t.conv->width() > max_mean_conv) return false;
  const auto& cs = *static_cast<const ComplexSemiseparable<T>*>(t.node);
  if (L > 1 && !(cs.constant_log_mag() && cs.constant_angle())) return false;
  return rows_constant(cs.B_re()) && rows_constant(cs.B_im()) && rows_constant(cs.C_re()) && rows_constant(cs.C_im());
}

/// Whether toeplitz_mean takes the terms: at least one time-invariant complex core, and every term
/// time-invariant.
template <class T>
bool toeplitz_mean_takes(const mean_terms<T>& terms, Index L) {
  bool core = false;
  for (const auto& t : terms) {
    if (!toeplitz_term(t, L)) return false;
    core = core || t.has_core();
  }
  return core;
}

/// kern[n] += scale * Re sum_m C[g, m] lambda[h, m]^n B[g, m] for n < L, the powers chunk-relative.
template <class T>
void add_complex_kernel(const ComplexSemiseparable<T>& cs, Index c, double scale, Index L, std::vector<double>& kern,
                        std::vector<std::complex<double>>& pw) {
  using cd = std::complex<double>;
  constexpr Index chunk = 64;
  constexpr double two_pi = 6.283185307179586476925286766559;
  const Index N = cs.state(), h = cs.head_of(c), g = cs.group_of_head(h);
  pw.resize(std::size_t(chunk));
  for (Index m = 0; m < N; ++m) {
    const double rho = double(cs.log_mag()(0, h * N + m)), theta = double(cs.angle()(0, h * N + m));
    const Index bg = g * N + m;
    const cd a = cd(double(cs.C_re()(0, bg)), double(cs.C_im()(0, bg))) * cd(double(cs.B_re()(0, bg)), double(cs.B_im()(0, bg))) * scale;
    const bool reset = rho == -std::numeric_limits<double>::infinity();  // lambda = 0 exactly, whatever theta
    const cd lam = reset ? cd(0, 0) : std::exp(rho) * cd(std::cos(theta), std::sin(theta));
    pw[0] = cd(1, 0);
    for (Index j = 1; j < chunk; ++j) pw[std::size_t(j)] = pw[std::size_t(j - 1)] * lam;
    for (Index b0 = 0; b0 < L; b0 += chunk) {
      cd block(1, 0);  // lambda^b0
      if (b0 > 0) {
        const double n = double(b0);
        const double phase = std::remainder(n * theta, two_pi);
        block = reset ? cd(0, 0) : std::exp(n * rho) * cd(std::cos(phase), std::sin(phase));
      }
      const cd ab = a * block;
      const Index e = std::min(L, b0 + chunk);
      for (Index n = b0; n < e; ++n) kern[std::size_t(n)] += (ab * pw[std::size_t(n - b0)]).real();
    }
  }
}

/// The mean over channels [rq.c0, rq.c1) of a sum of time-invariant terms (toeplitz_mean_takes), of
/// H^c or of |H^c| (rq.abs): lower-triangular Toeplitz.
template <class T>
Matrix<T> toeplitz_mean(const mean_terms<T>& terms, const context& cx, detail::mean_request rq) {
  const Index L = cx.L, D = cx.D, nc = rq.c1 - rq.c0;
  Matrix<T> out = Matrix<T>::Zero(L, L);
  if (L == 0 || nc <= 0) return out;
  const Index nt = std::max<Index>(1, max_threads());
  std::vector<std::vector<double>> part(std::size_t(nt), std::vector<double>(std::size_t(L), 0.0));
  struct scratch {
    std::vector<double> kern, core;
    std::vector<std::complex<double>> pw;
    std::vector<T> fac;
  };
  std::vector<scratch> sc(static_cast<std::size_t>(nt));
  parallel_for(nc, [&](Index i) {
    const std::size_t th = std::min<std::size_t>(std::size_t(thread_index()), sc.size() - 1);
    scratch& s = sc[th];
    const Index c = rq.c0 + i;
    s.kern.assign(std::size_t(L), 0.0);
    for (const auto& t : terms) {
      auto at = [&](const diag_factors<T>& d) {
        const T* r = d.row(0, D, c, 1, s.fac);
        return r ? double(r[0]) : 1.0;
      };
      const double scale = t.weight * at(t.post) * at(t.pre);
      const Index K = t.width();
      if (!t.has_core()) {  // a band: the diagonal, or the convolution's taps
        for (Index n = 0; n < std::min(K, L); ++n) s.kern[std::size_t(n)] += scale * (t.conv ? double(t.conv->tap(n, c)) : 1.0);
        continue;
      }
      const auto& cs = *static_cast<const ComplexSemiseparable<T>*>(t.node);
      if (!t.conv) {
        add_complex_kernel(cs, c, scale, L, s.kern, s.pw);
        continue;
      }
      s.core.assign(std::size_t(L), 0.0);
      add_complex_kernel(cs, c, scale, L, s.core, s.pw);
      for (Index n = 0; n < L; ++n) {
        double v = 0;
        for (Index lag = 0; lag < K && lag <= n; ++lag) v += double(t.conv->tap(lag, c)) * s.core[std::size_t(n - lag)];
        s.kern[std::size_t(n)] += v;
      }
    }
    std::vector<double>& p = part[th];
    for (Index n = 0; n < L; ++n) p[std::size_t(n)] += rq.abs ? std::abs(s.kern[std::size_t(n)]) : s.kern[std::size_t(n)];
  });
  std::vector<double> g(std::size_t(L), 0.0);
  for (const auto& p : part)
    for (Index n = 0; n < L; ++n) g[std::size_t(n)] += p[std::size_t(n)];
  for (Index t = 0; t < L; ++t)
    for (Index s = 0; s <= t; ++s) out(t, s) = T(g[std::size_t(t - s)] / double(nc));
  return out;
}

}  // namespace iattn::cpu_detail
