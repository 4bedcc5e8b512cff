// tests/cuda/kernel_cases.hpp: the CUDA backend's test cases, one source for both executions:
// emulated_kernels_test.cpp runs them on the host emulator (any C++ compiler, also under
// ThreadSanitizer), gpu_kernels_test.cu on a GPU. Each case runs a kernel through the public API
// (apply / materialize / row / col with iattn::cuda) and compares it with two independent oracles:
//   - the CPU backend on the same expression (itself tested against plain loops);
//   - a plain-loop oracle in double (the recurrences, and the dense matrices: written here, and
//     tests/support/oracles.hpp's, shared with the CPU tests).
// A case reports each comparison to `check(what, error, allowed)`: error = max |got - expected|,
// allowed = tol (1 + max |expected|), tol = 1e-4 in float and 1e-10 in double.
// Lengths hit the chunk (64 tokens), slice (32), tile (32) and block (128, 256 threads) tails.
#pragma once

#include "../support/oracles.hpp"  // rng(), uniform(), the dense band and recurrence oracles
#include "simt_kernels.hpp"

#include <iattn/cuda.hpp>
#include <iattn/iattn.hpp>

#include <algorithm>
#include <bit>
#include <cstdint>
#include <cmath>
#include <complex>
#include <limits>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace cuda_test {

using iattn::Index;
template <class T>
using Mat = iattn::Matrix<T>;
using MatD = iattn::Matrix<double>;

/// The lengths a run uses: elementwise kernels, chunked scans (chunks of 64, slices of 32) and
/// tiles (32). The emulator runs every thread of a block on its own std::thread, so its runs keep
/// the lengths that reach each tail and a few chunks; the GPU runs add long ones.
struct lengths {
  std::vector<Index> elementwise, scan, tiles;
  bool slices = true;  ///< the matrix cases also take rows and columns (barrier-free kernels)
  bool widest = true;  ///< the cases' widest configurations too (Transition's 32 lanes)
  /// The structured means of every head-shared core (Transition, complex, row-normalised), not
  /// only the Semiseparable's: their head path is the same kernel, their cores' materializations
  /// have cases of their own.
  bool every_core = true;
  /// Every option of the structured means and 16-bit storage (one head, ranges, |H^c|, head means,
  /// the chunk loop, every length); false: one run per kernel path (ThreadSanitizer, whose purpose
  /// there is the kernels' races, and the blocked means' serial schedules, their barriers).
  bool thorough = true;
};
/// The emulated concurrent schedule (float and double).
inline const lengths emulated = {{1, 7, 65, 257}, {1, 7, 64, 65, 1000}, {1, 31, 32, 33, 100}};
/// The emulated serial schedules: one barrier at a time, so fewer tokens; the matrix cases
/// without rows and columns (their kernels have no barrier to order).
inline const lengths serial = {{7, 65}, {7, 65, 130}, {33, 70}, false};
/// The serial schedules for the new matrix cases (bands, LinearRecurrence, products): one length
/// with a diagonal and an off-diagonal tile, enough for their barriers (the concurrent schedule
/// reaches every tail).
inline const lengths serial_matrices = {{7, 65}, {7, 65, 130}, {33}, false};
/// The serial schedules for the recurrences whose every token is a warp shuffle (Transition): the
/// emulator runs a shuffle's 32 lanes one at a time, so one scan length and one matrix length, and
/// at most 8 lanes per column.
inline const lengths serial_shuffles = {{7}, {65}, {33}, false, false};
/// The blocked means' serial schedules: one tile length, one run per path.
inline const lengths serial_structured = {{7}, {7}, {33}, false, true, true, false};
/// A GPU.
inline const lengths gpu = {{1, 7, 65, 257, 1000, 4097}, {1, 7, 64, 65, 257, 1000, 4097, 20000}, {1, 31, 32, 33, 100, 257, 1000}};

template <class T>
double tolerance() {
  return std::is_same_v<T, float> ? 1e-4 : 1e-10;
}

using test::uniform;

/// Reports max |got - expected| against tol (1 + max |expected|).
template <class Check, class A>
void compare(Check&& check, const std::string& what, const A& got, const MatD& expected, double tol) {
  if (got.rows() != expected.rows() || got.cols() != expected.cols()) {
    check(what + ": shape (" + std::to_string(got.rows()) + ", " + std::to_string(got.cols()) + ") != (" +
              std::to_string(expected.rows()) + ", " + std::to_string(expected.cols()) + ")",
          std::numeric_limits<double>::infinity(), 0.0);
    return;
  }
  const MatD g = got.template cast<double>();
  const double err = g.size() ? (g - expected).cwiseAbs().maxCoeff() : 0.0;
  const double scale = 1.0 + (expected.size() ? expected.cwiseAbs().maxCoeff() : 0.0);
  check(what, std::isfinite(err) ? err : std::numeric_limits<double>::infinity(), tol * scale);
}

inline std::string at(const char* name, Index L) { return std::string(name) + " L=" + std::to_string(L); }

// ---- the plain-loop oracles, double --------------------------------------------------------------

template <class T>
MatD loop_diagonal(const Mat<T>& d, const Mat<T>& x) {
  MatD y(x.rows(), x.cols());
  for (Index t = 0; t < x.rows(); ++t)
    for (Index c = 0; c < x.cols(); ++c) y(t, c) = double(d(d.rows() == 1 ? 0 : t, c)) * double(x(t, c));
  return y;
}
template <class T>
MatD loop_conv(const Mat<T>& w, const Mat<T>& x) {  // y_t = sum_k w[k] x_{t-K+1+k}
  const Index K = w.rows();
  MatD y = MatD::Zero(x.rows(), x.cols());
  for (Index t = 0; t < x.rows(); ++t)
    for (Index c = 0; c < x.cols(); ++c)
      for (Index k = 0; k < K; ++k)
        if (t - K + 1 + k >= 0) y(t, c) += double(w(k, c)) * double(x(t - K + 1 + k, c));
  return y;
}
template <class T>
MatD loop_recurrence(const Mat<T>& a, const Mat<T>& b, const Mat<T>& x) {  // h = a h + b x
  MatD y(x.rows(), x.cols());
  for (Index c = 0; c < x.cols(); ++c) {
    double h = 0;
    for (Index t = 0; t < x.rows(); ++t) y(t, c) = h = double(a(t, c)) * h + double(b(t, c)) * double(x(t, c));
  }
  return y;
}
/// The selective scan, through the node's own accessors (docs/design.md section 2).
template <class T>
MatD loop_scan(const iattn::Semiseparable<T>& S, const Mat<T>& x) {
  const Index L = x.rows(), D = x.cols(), N = S.state();
  MatD y(L, D);
  std::vector<double> s(static_cast<std::size_t>(N));
  for (Index c = 0; c < D; ++c) {
    const Index h = S.head_of(c), g = S.group_of_head(h);
    std::fill(s.begin(), s.end(), 0.0);
    for (Index t = 0; t < L; ++t) {
      double acc = 0;
      for (Index m = 0; m < N; ++m) {
        const double bx = double(S.B()(t, g * N + m)) * double(x(t, c)), cm = double(S.C()(t, g * N + m));
        double& st = s[std::size_t(m)];
        if (S.strict()) acc += cm * (st + (S.has_bonus() ? double(S.bonus()(h, m)) : 0.0) * bx);
        st = std::exp(double(S.log_decay(t, h, m))) * st + bx;
        if (!S.strict()) acc += cm * st;
      }
      y(t, c) = acc;
    }
  }
  return y;
}
/// Channel c's dense matrix: H[t, s] = sum_m C_t exp(sum_{k=s+1..t (strict: t-1)} lambda_k) B_s,
/// the strict diagonal C_t bonus B_t.
template <class T>
MatD loop_matrix(const iattn::Semiseparable<T>& S, Index c) {
  const Index L = S.length(), N = S.state(), h = S.head_of(c), g = S.group_of_head(h);
  MatD M = MatD::Zero(L, L);
  std::vector<double> sum(static_cast<std::size_t>(N));
  for (Index s = 0; s < L; ++s) {
    std::fill(sum.begin(), sum.end(), 0.0);
    for (Index t = s; t < L; ++t) {
      const Index k = S.strict() ? t - 1 : t;  // the decay sum gains token k
      double v = 0;
      for (Index m = 0; m < N; ++m) {
        if (t > s && k > s) sum[std::size_t(m)] += double(S.log_decay(k, h, m));
        const double e = (S.strict() && s == t) ? (S.has_bonus() ? double(S.bonus()(h, m)) : 0.0)
                                                : std::exp(sum[std::size_t(m)]);
        v += double(S.C()(t, g * N + m)) * e * double(S.B()(s, g * N + m));
      }
      M(t, s) = v;
    }
  }
  return M;
}

/// Channel c's (L, L) matrix of any expression the backend covers, from the plain loops: each
/// leaf's dense matrix, a product's as the product of its factors' (in double).
template <class T>
MatD dense(const iattn::Diagonal<T>& n, Index c, Index L) {
  return test::dense_diagonal(n.d().map().template cast<double>(), c, L);
}
template <class T>
MatD dense(const iattn::CausalConv<T>& n, Index c, Index L) {
  return test::dense_conv(n.w().map().template cast<double>(), c, L);
}
template <class T>
MatD dense(const iattn::LinearRecurrence<T>& n, Index c, Index) {
  return test::dense_linear_recurrence(n.a().map().template cast<double>(), n.b().map().template cast<double>(), c);
}
template <class T>
MatD dense(const iattn::Semiseparable<T>& n, Index c, Index) {
  return loop_matrix(n, c);
}
template <class T>
MatD dense(const iattn::GroupNorm<T>& n, Index c, Index L) {  // bound: its diagonal
  MatD m = MatD::Zero(L, L);
  const Index D = n.stats().channels;
  for (Index t = 0; t < L; ++t) m(t, t) = double(n.weight_at(c)) * double(n.stats().inv_sigma(t, c / (D / n.groups())));
  return m;
}
template <class T>
MatD dense(const iattn::Wkv<T>& n, Index c, Index L) {  // scores in double, each row's log-sum-exp
  MatD m = MatD::Zero(L, L);
  for (Index t = 0; t < L; ++t) {
    std::vector<double> score(t + 1);
    double top = -std::numeric_limits<double>::infinity();
    for (Index s = 0; s <= t; ++s) {
      double v = double(n.k()(s, c));
      if (s == t) v += double(n.u()(0, c));
      for (Index r = s + 1; r < t; ++r) v += double(n.decay(r, c));
      score[s] = v;
      top = std::max(top, v);
    }
    double sum = 0;
    for (Index s = 0; s <= t; ++s) sum += std::exp(score[s] - top);
    for (Index s = 0; s <= t; ++s) m(t, s) = std::exp(score[s] - top - std::log(sum));
  }
  return m;
}
template <class T, bool Causal>
MatD dense(const iattn::SoftmaxAttention<T, Causal>& n, Index c, Index L) {  // in double, each row's max out
  MatD m = MatD::Zero(L, L);
  const Index h = c / n.head_dim(), dk = n.key_dim();
  for (Index t = 0; t < L; ++t) {
    const Index end = Causal ? t + 1 : L;
    std::vector<double> score(end);
    double top = -std::numeric_limits<double>::infinity(), sum = 0;
    for (Index s = 0; s < end; ++s) {
      double v = 0;
      for (Index i = 0; i < dk; ++i) v += double(n.Q()(t, h * dk + i)) * double(n.K()(s, h * dk + i));
      score[s] = v * double(n.scale());
      top = std::max(top, score[s]);
    }
    for (Index s = 0; s < end; ++s) sum += std::exp(score[s] - top);
    for (Index s = 0; s < end; ++s) m(t, s) = std::exp(score[s] - top) / sum;
  }
  return m;
}
/// Channel c's matrix: H[t, s] = Re sum_m C_t[m] (e^{lambda_{s+1}} ... e^{lambda_t}) B_s[m], the
/// complex decays multiplied one token at a time in std::complex<double>.
template <class T>
MatD dense(const iattn::ComplexSemiseparable<T>& n, Index c, Index L) {
  using cplx = std::complex<double>;
  const Index N = n.state(), h = n.head_of(c), g = n.group_of_head(h);
  auto entry = [&](const iattn::coefficient<T>& re, const iattn::coefficient<T>& im, Index t, Index m) {
    return cplx(double(re(t, g * N + m)), double(im(t, g * N + m)));
  };
  std::vector<cplx> f(static_cast<std::size_t>(L * N));  // e^{lambda_t[m]}
  for (Index t = 0; t < L; ++t)
    for (Index m = 0; m < N; ++m)
      f[std::size_t(t * N + m)] = std::exp(cplx(double(n.log_mag_at(t, h, m)), double(n.angle_at(t, h, m))));
  MatD M = MatD::Zero(L, L);
  for (Index m = 0; m < N; ++m)
    for (Index s = 0; s < L; ++s) {
      cplx e = entry(n.B_re(), n.B_im(), s, m);  // e^{lambda_t} ... e^{lambda_{s+1}} B_s
      for (Index t = s; t < L; ++t) {
        if (t > s) e *= f[std::size_t(t * N + m)];
        M(t, s) += (entry(n.C_re(), n.C_im(), t, m) * e).real();
      }
    }
  return M;
}

/// Channel c's matrix: H[t, s] = q_t^T A_t ... A_{s+1} k_s, the transitions
/// A_t = Diag(e^{lambda_t}) + sum_r b_{t,r} a_{t,r}^T formed as N x N matrices in double and
/// applied to k_s one token at a time.
template <class T>
MatD dense(const iattn::Transition<T>& n, Index c, Index L) {
  const Index N = n.state(), R = n.rank(), h = n.head_of(c);
  auto row = [&](const iattn::coefficient<T>& m, Index t, Index off) {
    Eigen::VectorXd v(N);
    for (Index i = 0; i < N; ++i) v(i) = double(m(t, off + i));
    return v;
  };
  std::vector<MatD> A(static_cast<std::size_t>(L));
  for (Index t = 0; t < L; ++t) {
    MatD a = MatD::Zero(N, N);
    for (Index i = 0; i < N; ++i) a(i, i) = std::exp(double(n.log_decay(t, h, i)));
    for (Index r = 0; r < R; ++r) a += row(n.b(), t, (h * R + r) * N) * row(n.a(), t, (h * R + r) * N).transpose();
    A[std::size_t(t)] = a;
  }
  MatD M = MatD::Zero(L, L);
  for (Index s = 0; s < L; ++s) {
    Eigen::VectorXd v = row(n.k(), s, h * N);  // A_t ... A_{s+1} k_s
    for (Index t = s; t < L; ++t) {
      if (t > s) v = A[std::size_t(t)] * v;
      M(t, s) = row(n.q(), t, h * N).dot(v);
    }
  }
  return M;
}
inline MatD dense(const iattn::Identity&, Index, Index L) { return MatD::Identity(L, L); }
template <class A, class B>
MatD dense(const iattn::Product<A, B>& n, Index c, Index L);
template <class A>
MatD dense(const iattn::Flip<A>& n, Index c, Index L);
template <class A>
MatD dense(const iattn::RowNormalize<A>& n, Index c, Index L);
template <class A>
MatD dense(const iattn::Scaled<A>& n, Index c, Index L) {
  return n.factor() * dense(n.inner(), c, L);
}
template <class A, class B>
MatD dense(const iattn::Sum<A, B>& n, Index c, Index L) {
  return dense(n.left(), c, L) + dense(n.right(), c, L);
}
template <class A>
MatD dense(const iattn::Flip<A>& n, Index c, Index L) {
  const MatD a = dense(n.inner(), c, L);
  MatD m(L, L);
  for (Index t = 0; t < L; ++t)
    for (Index s = 0; s < L; ++s) m(t, s) = a(L - 1 - t, L - 1 - s);
  return m;
}
template <class A>
MatD dense(const iattn::RowNormalize<A>& n, Index c, Index L) {
  MatD m = dense(n.inner(), c, L);
  for (Index t = 0; t < L; ++t) m.row(t) /= m.row(t).sum();
  return m;
}
template <class A, class B>
MatD dense(const iattn::Product<A, B>& n, Index c, Index L) {
  const MatD a = dense(n.left(), c, L), b = dense(n.right(), c, L);
  MatD m = MatD::Zero(L, L);
  for (Index t = 0; t < L; ++t)  // every entry: a flipped factor is not lower-triangular
    for (Index u = 0; u < L; ++u)
      for (Index s = 0; s < L; ++s) m(t, s) += a(t, u) * b(u, s);
  return m;
}

// ---- the Semiseparable forms under test ----------------------------------------------------------

enum class decay_form { per_state, per_head, factored };

struct ss_config {
  const char* name;
  Index H, P, G, N;
  decay_form decay;
  bool strict, bonus, resets;
};

/// Mamba-1 (factored, N = 16), GLA-like per-state decays with heads of 2 channels, Mamba-2-like
/// per-head decays with 2 groups and N = 40 with heads of 3 channels (apply: the chunked matrix
/// products, ssd_scan.hpp) or N = 12 with one channel per head (the channel layout, N <= 16),
/// RWKV-like strict forms with and without a bonus, wide states (N = 200: two states per thread,
/// 128 lanes), N = 5 with resets (lambda = -inf).
inline const std::vector<ss_config> ss_configs = {
    {"factored N=16", 6, 1, 1, 16, decay_form::factored, false, false, false},
    {"per-state H=3 P=2 N=5 resets", 3, 2, 1, 5, decay_form::per_state, false, false, true},
    {"per-head H=4 P=3 G=2 N=40 resets", 4, 3, 2, 40, decay_form::per_head, false, false, true},
    {"per-head H=4 P=1 G=2 N=12 resets", 4, 1, 2, 12, decay_form::per_head, false, false, true},
    {"strict bonus H=2 P=2 N=7", 2, 2, 1, 7, decay_form::per_state, true, true, false},
    {"strict no bonus factored N=3", 3, 1, 1, 3, decay_form::factored, true, false, true},
    {"per-head N=200", 2, 1, 1, 200, decay_form::per_head, false, false, false},
};

template <class T>
iattn::Semiseparable<T> make_semiseparable(const ss_config& k, Index L) {
  const Index H = k.H, G = k.G, N = k.N;
  // Decays in [-1, 0] (per token, so sums stay moderate), about a tenth of them resets.
  auto decays = [&](Index cols) {
    Mat<T> lam = uniform<T>(L, cols, -1.0, 0.0);
    if (k.resets)
      for (Index i = 0; i < lam.size(); i += 7) lam.data()[(i * 13) % lam.size()] = -std::numeric_limits<T>::infinity();
    return lam;
  };
  const Mat<T> B = uniform<T>(L, G * N, -1, 1), C = uniform<T>(L, G * N, -1, 1);
  const iattn::semiseparable_options o{.heads = H, .head_dim = k.P, .groups = G, .state = N, .strict = k.strict};
  if (k.decay == decay_form::factored) {
    const Mat<T> A = uniform<T>(H, N, -2.0, -0.1);
    Mat<T> dt = uniform<T>(L, H, 0.0, 0.5);
    if (k.resets)
      for (Index t = 3; t < L; t += 11) dt(t, t % H) = std::numeric_limits<T>::infinity();  // dt A = -inf
    if (k.bonus) return iattn::semiseparable(iattn::factored_decay(dt, A), B, C, uniform<T>(H, N, -1, 1), o);
    return iattn::semiseparable(iattn::factored_decay(dt, A), B, C, o);
  }
  const Mat<T> lam = decays(k.decay == decay_form::per_state ? H * N : H);
  if (k.bonus) return iattn::semiseparable(lam, B, C, uniform<T>(H, N, -1, 1), o);
  return iattn::semiseparable(lam, B, C, o);
}

// ---- the cases -----------------------------------------------------------------------------------

template <class T, class Check>
void diagonal_cases(iattn::cuda on, Check&& check, const lengths& ls) {
  for (Index L : ls.elementwise) {
    const Index D = 37;
    const Mat<T> x = uniform<T>(L, D, -1, 1);
    for (Index rows : {L, Index(1)}) {  // per token, and constant over tokens
      const auto H = iattn::diagonal(uniform<T>(rows, D, -2, 2));
      const Mat<T> y = iattn::apply(on, H, x);
      const std::string what = at(rows == 1 ? "diagonal (1, D)" : "diagonal (L, D)", L);
      compare(check, what + " vs cpu", y, iattn::apply(H, x).template cast<double>(), tolerance<T>());
      compare(check, what + " vs loops", y, loop_diagonal(H.d().map().eval(), x), tolerance<T>());
    }
  }
}

template <class T, class Check>
void causal_conv_cases(iattn::cuda on, Check&& check, const lengths& ls) {
  for (Index L : ls.elementwise)
    for (Index K : {Index(1), Index(4), L + 2}) {  // K = 1, Mamba's 4, and longer than the sequence
      const Index D = 37;
      const Mat<T> x = uniform<T>(L, D, -1, 1), w = uniform<T>(K, D, -1, 1);
      const auto H = iattn::causal_conv(w);
      const Mat<T> y = iattn::apply(on, H, x);
      const std::string what = at("causal_conv", L) + " K=" + std::to_string(K);
      compare(check, what + " vs cpu", y, iattn::apply(H, x).template cast<double>(), tolerance<T>());
      compare(check, what + " vs loops", y, loop_conv(w, x), tolerance<T>());
    }
}

template <class T, class Check>
void linear_recurrence_cases(iattn::cuda on, Check&& check, const lengths& ls) {
  for (Index L : ls.scan)
    for (Index D : {Index(5), Index(130)}) {  // one block of channels, and a tail past 128
      Mat<T> a = uniform<T>(L, D, -0.2, 1.0);
      for (Index t = 5; t < L; t += 97) a.row(t).setZero();  // resets
      const Mat<T> b = uniform<T>(L, D, -1, 1), x = uniform<T>(L, D, -1, 1);
      const auto H = iattn::linear_recurrence(a, b);
      const Mat<T> y = iattn::apply(on, H, x);
      const std::string what = at("linear_recurrence", L) + " D=" + std::to_string(D);
      compare(check, what + " vs cpu", y, iattn::apply(H, x).template cast<double>(), tolerance<T>());
      compare(check, what + " vs loops", y, loop_recurrence(a, b, x), tolerance<T>());
    }
}

template <class T, class Check>
void semiseparable_apply_cases(iattn::cuda on, Check&& check, const lengths& ls) {
  for (const ss_config& k : ss_configs)
    for (Index L : ls.scan) {
      const auto S = make_semiseparable<T>(k, L);
      const Mat<T> x = uniform<T>(L, S.channels(), -1, 1);
      const Mat<T> y = iattn::apply(on, S, x);
      const std::string what = at("semiseparable apply", L) + " " + k.name;
      compare(check, what + " vs cpu", y, iattn::apply(S, x).template cast<double>(), tolerance<T>());
      compare(check, what + " vs loops", y, loop_scan(S, x), tolerance<T>());
    }
}

/// One channel's matrix as the CUDA backend returned it (materialize) with some of its rows and
/// columns (row, col: (1, L) each), beside the CPU backend's matrix and the dense loops', in double.
struct matrix_result {
  MatD got, cpu, loops;
  std::vector<Index> row_at, col_at;
  std::vector<MatD> rows, cols;
};

/// Reports a matrix_result: the matrix, and each row and column, against the CPU backend's
/// matrix and the dense loops. (One function for every expression: the reports are not
/// instantiated per expression type.)
template <class Check>
void report_matrix(Check&& check, const matrix_result& r, const std::string& what, double tol) {
  compare(check, what + " materialize vs cpu", r.got, r.cpu, tol);
  compare(check, what + " materialize vs loops", r.got, r.loops, tol);
  for (std::size_t i = 0; i < r.row_at.size(); ++i) {
    const Index t = r.row_at[i];
    compare(check, what + " row t=" + std::to_string(t) + " vs cpu", r.rows[i], MatD(r.cpu.row(t)), tol);
    compare(check, what + " row t=" + std::to_string(t) + " vs loops", r.rows[i], MatD(r.loops.row(t)), tol);
  }
  for (std::size_t i = 0; i < r.col_at.size(); ++i) {
    const Index s = r.col_at[i];
    compare(check, what + " col s=" + std::to_string(s) + " vs cpu", r.cols[i], MatD(r.cpu.col(s).transpose()), tol);
    compare(check, what + " col s=" + std::to_string(s) + " vs loops", r.cols[i], MatD(r.loops.col(s).transpose()), tol);
  }
}

/// Channel c's matrix (materialize), rows t = L/2, L-1 (the full last row) and columns s = 0
/// (the full first column), L/2 against the CPU backend's matrix (materialize) and the dense
/// loops. (The CPU's own row and col, which return every channel, are compared once, on Mamba-1's
/// chain, in product_matrix_cases: instantiating them for every expression would cost more
/// compile time than they check, their rows being the CPU matrix's.)
template <class T, class Check, class H>
void matrix_checks(iattn::cuda on, Check&& check, const lengths& ls, const H& h, Index L, Index c,
                   const std::string& what) {
  matrix_result r;
  r.got = iattn::to_host(iattn::materialize(on, h, c, L)).template cast<double>();
  r.cpu = iattn::materialize(h, c, L).template cast<double>();
  r.loops = dense(h, c, L);
  if (ls.slices) {
    r.row_at = L == 1 ? std::vector<Index>{0} : std::vector<Index>{L / 2, L - 1};
    r.col_at = L == 1 ? std::vector<Index>{0} : std::vector<Index>{0, L / 2};
  }
  for (Index t : r.row_at) r.rows.push_back(iattn::to_host(iattn::row(on, h, t, c, L)).template cast<double>());
  for (Index s : r.col_at) r.cols.push_back(iattn::to_host(iattn::col(on, h, s, c, L)).template cast<double>());
  report_matrix(check, r, what + " c=" + std::to_string(c), tolerance<T>());
  if (!ls.slices) return;
  // block: a tall tile (taken by columns) and a wide one (by rows), against the CPU's matrix.
  const iattn::range tall_rows{L / 2, L}, tall_cols{L / 4, std::min(L, L / 4 + 3)};
  const iattn::range wide_rows{std::max<Index>(0, L - 2), L}, wide_cols{0, L};
  for (auto [rows, cols] : {std::pair{tall_rows, tall_cols}, std::pair{wide_rows, wide_cols}}) {
    const MatD want = r.cpu.block(rows.begin, cols.begin, rows.size(), cols.size());
    compare(check,
            what + " c=" + std::to_string(c) + " block rows [" + std::to_string(rows.begin) + ", " +
                std::to_string(rows.end) + ") cols [" + std::to_string(cols.begin) + ", " + std::to_string(cols.end) +
                ") vs cpu",
            iattn::to_host(iattn::block(on, h, c, rows, cols, L)), want, tolerance<T>());
  }
}

template <class T, class Check>
void semiseparable_matrix_cases(iattn::cuda on, Check&& check, const lengths& ls) {
  for (const ss_config& k : ss_configs)
    for (Index L : ls.tiles) {
      const auto S = make_semiseparable<T>(k, L);
      const Index c = (L % 2) ? S.channels() - 1 : 0;  // the last head, or the first
      matrix_checks<T>(on, check, ls, S, L, c, at("semiseparable", L) + " " + k.name);
    }
}

/// Diagonal (per token and constant) and CausalConv (K = 1, Mamba's 4, and 40: longer than most
/// of the lengths): materialize, rows and columns.
template <class T, class Check>
void band_matrix_cases(iattn::cuda on, Check&& check, const lengths& ls) {
  for (Index L : ls.tiles) {
    const Index D = 5, c = L % D;
    for (Index rows : {L, Index(1)}) {
      const auto H = iattn::diagonal(uniform<T>(rows, D, -2, 2));
      matrix_checks<T>(on, check, ls, H, L, c, at(rows == 1 ? "diagonal (1, D)" : "diagonal (L, D)", L));
    }
    for (Index K : {Index(1), Index(4), Index(40)}) {
      const auto H = iattn::causal_conv(uniform<T>(K, D, -1, 1));
      matrix_checks<T>(on, check, ls, H, L, c, at("causal_conv", L) + " K=" + std::to_string(K));
    }
  }
}

/// Decays in [-0.9, 1): negative ones, and resets (a = 0) inside the first two tiles and on the
/// third tile's edge token (the one the off-diagonal tiles' mid multiplies in).
template <class T>
iattn::LinearRecurrence<T> make_recurrence(Index L, Index D) {
  Mat<T> a = uniform<T>(L, D, -0.9, 1.0);
  for (Index t : {Index(5), Index(40), Index(64)})
    if (t < L) a.row(t).setZero();
  return iattn::linear_recurrence(a, uniform<T>(L, D, -1, 1));
}

template <class T, class Check>
void linear_recurrence_matrix_cases(iattn::cuda on, Check&& check, const lengths& ls) {
  for (Index L : ls.tiles) {
    const Index D = 5;
    const auto R = make_recurrence<T>(L, D);
    for (Index c : {Index(0), D - 1}) matrix_checks<T>(on, check, ls, R, L, c, at("linear_recurrence", L));
  }
}

/// Products covering every path of materialize (backend/cuda/product.hpp):
///   Mamba-1's (diag(z) S diag(dt)) conv(w): S's tiles, diag(z) in place, diag(dt) conv(w) fused;
///   (conv * diag) * LR * (diag * conv): a left band product factor by factor through a
///     temporary, the right band in one pass;
///   S * (LR * (diag * diag(1, D))): two scans' lower-triangular tile product, the right one's
///     product of diagonals in place.
template <class T, class Check>
void product_matrix_cases(iattn::cuda on, Check&& check, const lengths& ls) {
  for (Index L : ls.tiles) {
    const Index D = 6, N = 16, K = 4, c = (L % 2) ? D - 1 : 1;
    const Mat<T> dt = uniform<T>(L, D, 0.0, 0.5), A = uniform<T>(D, N, -2.0, -0.1);
    const auto S = iattn::semiseparable(iattn::factored_decay(dt, A), uniform<T>(L, N, -1, 1), uniform<T>(L, N, -1, 1),
                                        {.heads = D});
    const auto mamba = iattn::diagonal(uniform<T>(L, D, -1, 1)) * S * iattn::diagonal(dt) *
                       iattn::causal_conv(uniform<T>(K, D, -1, 1));
    matrix_checks<T>(on, check, ls, mamba, L, c, at("product diag*S*diag*conv", L));
    if (ls.slices) {  // the CPU's row(H, t) and col(H, s) (every channel, (D, L)): row c is the CUDA call's
      const Index k = L / 2;
      compare(check, at("product diag*S*diag*conv", L) + " row vs cpu row(H, t)",
              iattn::to_host(iattn::row(on, mamba, k, c)), MatD(iattn::row(mamba, k).row(c).template cast<double>()),
              tolerance<T>());
      compare(check, at("product diag*S*diag*conv", L) + " col vs cpu col(H, s)",
              iattn::to_host(iattn::col(on, mamba, k, c)), MatD(iattn::col(mamba, k).row(c).template cast<double>()),
              tolerance<T>());
    }
    const auto R = make_recurrence<T>(L, D);
    const auto banded = (iattn::causal_conv(uniform<T>(3, D, -1, 1)) * iattn::diagonal(uniform<T>(L, D, -1, 1))) * R *
                        (iattn::diagonal(uniform<T>(L, D, -1, 1)) * iattn::causal_conv(uniform<T>(K, D, -1, 1)));
    matrix_checks<T>(on, check, ls, banded, L, c, at("product (conv*diag)*LR*(diag*conv)", L));
    const auto S2 = make_semiseparable<T>(ss_configs[1], L);  // per-state decays with resets, D = 6
    const auto cores = S2 * (R * (iattn::diagonal(uniform<T>(L, D, -1, 1)) * iattn::diagonal(uniform<T>(1, D, -2, 2))));
    matrix_checks<T>(on, check, ls, cores, L, c, at("product S*(LR*(diag*diag))", L));
  }
}

/// A (n0, n1, n2) tensor of the CPU backend as the (n0 n1, n2) matrix the CUDA backend returns.
template <class T>
MatD stacked(const iattn::Tensor3<T>& t) {
  using RowMajor = Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
  return Eigen::Map<const RowMajor>(t.data(), t.dims[0] * t.dims[1], t.dims[2]).template cast<double>();
}

/// The mean of the dense loops' matrices (or of their absolute values) over channels [c0, c1).
inline MatD loop_mean(const std::vector<MatD>& dense_of, Index c0, Index c1, bool abs, Index L) {
  MatD m = MatD::Zero(L, L);
  for (Index c = c0; c < c1; ++c) m += abs ? MatD(dense_of[std::size_t(c)].cwiseAbs()) : dense_of[std::size_t(c)];
  return m / double(c1 - c0);
}

/// One structured-mean check: materialize_mean (and, where H has heads, materialize_head_means) of
/// h on the device against the dense loops' mean in double, and whether the structured path
/// (cuda.hpp's structured_means) served it. (Not against the CPU's means as well: each expression
/// type would instantiate them, and the test command's compile time is the budget; the CPU's
/// means have the same loop oracle in head_mean_test.)
template <class T, class Check, class H>
void check_structured_mean(iattn::cuda on, Check&& check, const std::string& name, const H& h, const iattn::mean_options& o,
                           bool structured, Index L, const lengths& ls) {
  if (!ls.thorough && (o.head || o.channels || o.abs)) return;  // one run per path
  const double tol = tolerance<T>();
  const Index D = h.channels();
  std::vector<MatD> dense_of;
  for (Index c = 0; c < D; ++c) dense_of.push_back(dense(h, c, L));
  const auto rq = iattn::detail::resolve_mean(h, o, "test");
  const long long before = iattn::cuda_detail::structured_means_taken().load();
  const MatD got = iattn::to_host(iattn::materialize_mean(on, h, o, L)).template cast<double>();
  const bool taken = iattn::cuda_detail::structured_means_taken().load() != before;
  const std::string what = at("structured mean", L) + " " + name;
  check(what + (structured ? ": structured path taken" : ": channel path kept"), taken == structured ? 0.0 : 1.0, 0.0);
  compare(check, what + " vs loops", got, loop_mean(dense_of, rq.c0, rq.c1, rq.abs, L), tol);
  if (o.head || o.channels || !ls.thorough) return;
  Index P = 0;
  try {
    P = iattn::detail::require_heads(h, "test");
  } catch (const std::invalid_argument&) {
    return;  // no heads (cores that disagree on head_dim): no head means
  }
  const MatD heads = iattn::to_host(iattn::materialize_head_means(on, h, {.abs = o.abs}, L)).template cast<double>();
  MatD loops(D / P * L, L);
  for (Index g = 0; g < D / P; ++g) loops.middleRows(g * L, L) = loop_mean(dense_of, g * P, (g + 1) * P, o.abs, L);
  compare(check, what + " head means vs loops", heads, loops, tol);
}

/// The structured means' head path (cuda.hpp's structured_means, kernels/head_mean.hpp) and the
/// expressions that keep the channel path, against the dense loops and the CPU, with the path
/// taken asserted.
template <class Check>
void head_mean_cases_float(iattn::cuda on, Check&& check, const lengths& ls) {
  using T = float;
  // The head path: each head's core once, the channels through their diagonals and taps (mean_cases'
  // expression takes it too, P = 2). A sum with a band term without a core (diag * conv), a scaled
  // strict core with a bonus and a per-token diagonal on both sides, a Mamba-2-like per-head core
  // with groups (P = 3), a constant diagonal; |H^c| of a single term without a convolution; a flip
  // and |H^c| of a convolution stay on the channel path.
  for (Index L : ls.tiles) {
    if (L != 1 && L != 33) continue;
    const auto S2 = make_semiseparable<T>(ss_configs[2], L);  // per-head H=4 P=3 G=2 N=40
    const auto S4 = make_semiseparable<T>(ss_configs[4], L);  // strict with bonus, H=2 P=2
    const Index D2 = S2.channels(), D4 = S4.channels(), K = 4;
    const auto mamba2 = iattn::diagonal(uniform<T>(L, D2, -1, 1)) * S2 * iattn::diagonal(uniform<T>(1, D2, 0.5, 1.5)) *
                            iattn::causal_conv(uniform<T>(K, D2, -1, 1)) +
                        iattn::diagonal(uniform<T>(L, D2, -1, 1)) * iattn::causal_conv(uniform<T>(3, D2, -1, 1));
    const auto strict = T(0.5) * (iattn::diagonal(uniform<T>(L, D4, -1, 1)) * S4 * iattn::diagonal(uniform<T>(L, D4, -1, 1))) +
                        iattn::diagonal(uniform<T>(1, D4, -1, 1));
    const auto single = iattn::diagonal(uniform<T>(L, D2, -1, 1)) * S2 * iattn::diagonal(uniform<T>(L, D2, -1, 1));
    const auto flipped = iattn::flip(single);
    auto run = [&](const std::string& name, const auto& h, const iattn::mean_options& o, bool structured) {
      check_structured_mean<T>(on, check, name, h, o, structured, L, ls);
    };
    run("mamba2 + band", mamba2, {}, true);
    run("mamba2 + band, head 2", mamba2, {.head = 2}, true);
    run("mamba2 + band, channels [2, 10) (across heads)", mamba2, {.channels = iattn::range{2, 10}}, true);
    run("mamba2 + band, abs", mamba2, {.abs = true}, false);
    run("0.5 strict bonus + diag", strict, {}, true);
    run("single term", single, {}, true);
    run("single term, abs", single, {.abs = true}, true);
    run("single term, abs, channels [1, 8)", single, {.abs = true, .channels = iattn::range{1, 8}}, true);
    run("flip", flipped, {}, false);
    // The other cores a head's channels share: Gated DeltaNet's transition behind a gate and a
    // convolution (H = 2, P = 3, N = 8, a reset), a complex-decay core (H = 2, P = 3, N = 3,
    // angles to +-40 rad), a row-normalised S (per-head, P = 3) in a sum with a flip-free band.
    if (ls.every_core) {
      const Index H = 2, P = 3, N = 8, D = H * P;
      Mat<T> key = uniform<T>(L, H * N, -1, 1);
      for (Index t = 0; t < L; ++t)
        for (Index j = 0; j < H * N; j += N) key.row(t).segment(j, N).normalize();
      Mat<T> g = uniform<T>(L, H, -0.5, 0);
      if (L > 3) g.row(3).setConstant(-std::numeric_limits<T>::infinity());
      const auto gdn = iattn::diagonal(uniform<T>(L, D, -1, 1)) *
                       iattn::gated_delta_rule(uniform<T>(L, H * N, -1, 1), key, uniform<T>(L, H, 0, 1.9), g,
                                               iattn::transition_options{.heads = H, .head_dim = P}) *
                       iattn::causal_conv(uniform<T>(K, D, -1, 1));
      run("gated delta rule", gdn, {}, true);
      run("gated delta rule, head 1", gdn, {.head = 1}, true);
      Mat<T> rho = uniform<T>(L, H * 3, -0.6, 0.0);
      const auto cs = iattn::diagonal(uniform<T>(L, D, -1, 1)) *
                      iattn::complex_semiseparable(rho, uniform<T>(L, H * 3, -40, 40), uniform<T>(L, 3, -1, 1),
                                                   uniform<T>(L, 3, -1, 1), uniform<T>(L, 3, -1, 1), uniform<T>(L, 3, -1, 1),
                                                   iattn::complex_semiseparable_options{.heads = H, .head_dim = P});
      run("complex decays, abs", cs, {.abs = true}, true);
      run("complex decays", cs, {}, true);
      const auto rn = iattn::row_normalize(
                          iattn::semiseparable(uniform<T>(L, H, -0.5, 0), uniform<T>(L, N, 0, 1), uniform<T>(L, N, 0, 1),
                                               {.heads = H, .head_dim = P})) +
                      iattn::diagonal(uniform<T>(L, D, -1, 1)) * iattn::causal_conv(uniform<T>(2, D, -1, 1));
      run("row_normalize(S) + band", rn, {}, true);
      // causal softmax attention between diagonals (H = 2, P = 3, dk = 5); the bidirectional
      // form keeps the channel path (the head path's cores are lower triangular)
      const iattn::softmax_options so{.heads = H, .head_dim = P, .scale = 2.0};
      const Mat<T> Q = uniform<T>(L, H * 5, -1, 1), Kq = uniform<T>(L, H * 5, -1, 1);
      const auto sm = iattn::diagonal(uniform<T>(L, D, -1, 1)) * iattn::softmax_attention(Q, Kq, so) *
                      iattn::diagonal(uniform<T>(L, D, -1, 1));
      run("softmax attention", sm, {}, true);
      run("softmax attention, abs", sm, {.abs = true}, true);
      run("bidirectional softmax attention", iattn::softmax_attention(Q, Kq, so, iattn::bidirectional), {}, false);
    }
  }
}

/// The structured means' blocked (channel, state) products (kernels/mean_blocks.hpp): one channel
/// per head, against the dense loops and the CPU, with the path taken asserted.
template <class Check>
void blocked_mean_cases_float(iattn::cuda on, Check&& check, const lengths& ls) {
  using T = float;
  for (Index L : ls.tiles) {
    if (L != 1 && L != 33) continue;
    const Index K = 4;
    auto run = [&](const std::string& name, const auto& h, const iattn::mean_options& o, bool structured) {
      check_structured_mean<T>(on, check, name, h, o, structured, L, ls);
    };
    const auto mamba1 = iattn::diagonal(uniform<T>(L, 6, -1, 1)) * make_semiseparable<T>(ss_configs[0], L);
    // One channel per head: blocked products over (channel, state) pairs (mean_blocks.hpp).
    // Mamba-1's chain (factored decay, N = 16, conv K = 4); strict cores with a bonus (per-state
    // decays with resets, K = 3: the band is K - 1 + 1 wide) and without one (factored, resets,
    // no conv: the band is the diagonal); in a sum with a head-shared term and a band; chunks of
    // one and two channels (the chunk loop); |H^c| of a blocked term stays on the channel path.
    {
      const ss_config strict_p1{"strict bonus P=1 N=4 resets", 5, 1, 1, 4, decay_form::per_state, true, true, true};
      const auto S0 = make_semiseparable<T>(ss_configs[0], L);  // factored N=16, D = 6
      const auto S5 = make_semiseparable<T>(ss_configs[5], L);  // strict no bonus, factored, resets, D = 3
      const auto Sb = make_semiseparable<T>(strict_p1, L);      // D = 5
      const auto mamba1c = iattn::diagonal(uniform<T>(L, 6, -1, 1)) * S0 * iattn::diagonal(uniform<T>(L, 6, 0, 0.5)) *
                           iattn::causal_conv(uniform<T>(K, 6, -1, 1));
      const auto strict_bonus = iattn::diagonal(uniform<T>(L, 5, -1, 1)) * Sb * iattn::causal_conv(uniform<T>(3, 5, -1, 1));
      const auto strict_plain = T(2) * (S5 * iattn::diagonal(uniform<T>(1, 3, -1, 1)));
      run("mamba1 (one channel per head)", mamba1, {}, true);
      run("mamba1 chain with conv", mamba1c, {}, true);
      run("mamba1 chain with conv, channels [1, 5)", mamba1c, {.channels = iattn::range{1, 5}}, true);
      run("mamba1 chain with conv, abs", mamba1c, {.abs = true}, false);
      run("strict bonus, conv 3", strict_bonus, {}, true);
      run("2 strict no bonus", strict_plain, {}, true);
      const auto shared6 = iattn::diagonal(uniform<T>(L, 6, -1, 1)) * make_semiseparable<T>(ss_configs[1], L);  // P = 2
      run("mamba1 + head-shared + band", mamba1c + shared6 + iattn::diagonal(uniform<T>(L, 6, -1, 1)), {}, true);
      if (!ls.thorough) continue;
      const Index pairs = iattn::cuda_detail::blocked_mean_pairs();
      iattn::cuda_detail::blocked_mean_pairs() = 1;  // one channel per chunk
      run("mamba1 chain with conv, chunks of 1", mamba1c, {}, true);
      iattn::cuda_detail::blocked_mean_pairs() = 2 * 16;  // two channels per chunk
      run("mamba1 chain with conv, chunks of 2, head 3", mamba1c, {.head = 3}, true);
      iattn::cuda_detail::blocked_mean_pairs() = pairs;
    }
  }
}

/// The structured means' cases in float only: each expression type instantiates the device's
/// structured and channel paths and the dense oracle, and the test command's compile time is the
/// budget (the kernels' arithmetic is the same template in double).
template <class T, class Check>
void head_mean_cases(iattn::cuda on, Check&& check, const lengths& ls) {
  if constexpr (std::is_same_v<T, float>) head_mean_cases_float(on, check, ls);
}
template <class T, class Check>
void blocked_mean_cases(iattn::cuda on, Check&& check, const lengths& ls) {
  if constexpr (std::is_same_v<T, float>) blocked_mean_cases_float(on, check, ls);
}

/// materialize_all, materialize_mean (every channel, |H^c|, one head, a channel range) and
/// materialize_head_means of diag(g) S diag(dt) conv(w), S with 2 heads of 2 channels and resets,
/// against the CPU backend's and the dense loops'; an upload_scope copies a coefficient once;
/// the doors' errors.
template <class T, class Check>
void mean_cases(iattn::cuda on, Check&& check, const lengths& ls) {
  using iattn::mean_options;
  // The channel loop and the accumulation do not depend on the tile tails (materialize's cases above
  // take every length): one tile (L = 1) and two (33, a diagonal and an off-diagonal tile).
  const ss_config heads{"per-state H=2 P=2 N=5 resets", 2, 2, 1, 5, decay_form::per_state, false, false, true};
  for (Index L : ls.tiles) {
    if (L != 1 && L != 33) continue;
    const auto S = make_semiseparable<T>(heads, L);
    const Index D = S.channels(), P = S.head_dim(), K = 4;
    const auto h = iattn::diagonal(uniform<T>(L, D, -1, 1)) * S * iattn::diagonal(uniform<T>(L, D, 0.0, 0.5)) *
                   iattn::causal_conv(uniform<T>(K, D, -1, 1));
    const std::string what = at("means diag*S*diag*conv", L);
    const double tol = tolerance<T>();
    const MatD all = iattn::to_host(iattn::materialize_all(on, h, L)).template cast<double>();
    compare(check, what + " materialize_all vs cpu", all, stacked(iattn::materialize_all(h, L)), tol);
    std::vector<MatD> dense_of;
    MatD all_loops(D * L, L);
    for (Index c = 0; c < D; ++c) all_loops.middleRows(c * L, L) = dense_of.emplace_back(dense(h, c, L));
    compare(check, what + " materialize_all vs loops", all, all_loops, tol);
    const std::pair<const char*, mean_options> options[] = {
        {"every channel", {}},
        {"abs", {.abs = true}},
        {"head 1", {.head = 1}},
        {"channels [1, D-1), abs", {.abs = true, .channels = iattn::range{1, D - 1}}},
    };
    for (const auto& [name, o] : options) {
      const auto rq = iattn::detail::resolve_mean(h, o, "test");
      const MatD got = iattn::to_host(iattn::materialize_mean(on, h, o, L)).template cast<double>();
      compare(check, what + " materialize_mean " + name + " vs cpu", got,
              iattn::materialize_mean(h, o, L).template cast<double>(), tol);
      compare(check, what + " materialize_mean " + name + " vs loops", got, loop_mean(dense_of, rq.c0, rq.c1, rq.abs, L), tol);
    }
    for (Index k : {Index(0), L / 2, L - 1}) {  // every channel's row and column against the CPU and the loops
      MatD row_loops(D, L), col_loops(D, L);
      for (Index c = 0; c < D; ++c) {
        row_loops.row(c) = dense_of[std::size_t(c)].row(k);
        col_loops.row(c) = dense_of[std::size_t(c)].col(k).transpose();
      }
      const MatD r = iattn::to_host(iattn::row_all(on, h, k)).template cast<double>();
      const MatD q = iattn::to_host(iattn::col_all(on, h, k)).template cast<double>();
      compare(check, what + " row_all t=" + std::to_string(k) + " vs cpu", r, iattn::row(h, k).template cast<double>(), tol);
      compare(check, what + " row_all t=" + std::to_string(k) + " vs loops", r, row_loops, tol);
      compare(check, what + " col_all s=" + std::to_string(k) + " vs cpu", q, iattn::col(h, k).template cast<double>(), tol);
      compare(check, what + " col_all s=" + std::to_string(k) + " vs loops", q, col_loops, tol);
    }
    for (bool abs : {false, true}) {
      const MatD got = iattn::to_host(iattn::materialize_head_means(on, h, {.abs = abs}, L)).template cast<double>();
      const std::string name = what + (abs ? " materialize_head_means abs" : " materialize_head_means");
      compare(check, name + " vs cpu", got, stacked(iattn::materialize_head_means(h, {.abs = abs}, L)), tol);
      MatD loops(D / P * L, L);
      for (Index g = 0; g < D / P; ++g) loops.middleRows(g * L, L) = loop_mean(dense_of, g * P, (g + 1) * P, abs, L);
      compare(check, name + " vs loops", got, loops, tol);
    }
  }
  {  // one copy per coefficient inside a scope; a fresh copy per upload outside one
    namespace cd = iattn::cuda_detail;
    const auto S = make_semiseparable<T>(ss_configs[1], 9);
    auto same = [&](const std::string& what, bool ok) { check(what, ok ? 0.0 : std::numeric_limits<double>::infinity(), 0.0); };
    {
      const cd::upload_scope scope(on.stream);
      const auto b1 = cd::upload(S.B(), on.stream), b2 = cd::upload(S.B(), on.stream), c1 = cd::upload(S.C(), on.stream);
      same("upload_scope: the same coefficient borrows one copy", b1.data() == b2.data());
      same("upload_scope: another coefficient gets its own copy", c1.data() != b1.data());
      same("upload_scope: two coefficients, two copies", scope.uploads() == 2);
      Mat<T> back(S.B().rows(), S.B().cols());
      b2.download(back.data());
      compare(check, "upload_scope: the borrowed copy holds the values", back, S.B().map().template cast<double>(), 0.0);
    }
    const auto b1 = cd::upload(S.B(), on.stream), b2 = cd::upload(S.B(), on.stream);
    same("no upload_scope: each upload copies", b1.data() != b2.data() && cd::upload_scope::current() == nullptr);
  }
  {  // the doors: both options, head means with a head chosen, an expression without heads
    const Index L = 7;
    const auto S = make_semiseparable<T>(ss_configs[1], L);
    const auto d = iattn::diagonal(uniform<T>(L, 4, -1, 1));
    auto throws = [&](const std::string& what, auto&& call, const std::string& says) {
      std::string message;
      try {
        call();
      } catch (const std::invalid_argument& e) {
        message = e.what();
      }
      check(what + " (got: \"" + message + "\")",
            message.find(says) != std::string::npos ? 0.0 : std::numeric_limits<double>::infinity(), 0.0);
    };
    throws("materialize_mean with head and channels", [&] { (void)iattn::materialize_mean(on, S, {.head = 0, .channels = iattn::range{0, 2}}); },
           "options.head and options.channels are both set");
    throws("materialize_mean with head out of range", [&] { (void)iattn::materialize_mean(on, S, {.head = 3}); },
           "options.head = 3 is out of range [0, H=3)");  // S: ss_configs[1], 3 heads
    throws("materialize_head_means with a head", [&] { (void)iattn::materialize_head_means(on, S, {.head = 0}); },
           "must be unset");
    throws("materialize_head_means without heads", [&] { (void)iattn::materialize_head_means(on, d, {}, L); },
           "the expression has no heads");
    throws("row_all with t out of range", [&] { (void)iattn::row_all(on, S, L); }, "row_all(iattn::cuda, H, t): t = 7 is out of range [0, L=7)");
    throws("col_all with s negative", [&] { (void)iattn::col_all(on, S, -1); }, "col_all(iattn::cuda, H, s): s = -1 is out of range");
    throws("materialize_all of a conv without L", [&] { (void)iattn::materialize_all(on, iattn::causal_conv(uniform<T>(3, 2, -1, 1))); },
           "L");
  }
}

/// A device_expression (to_device(H, on)) of diag(g) S diag(dt) conv(w), S with 2 heads of 2 channels:
/// every call through it gives exactly the plain call's result; its coefficients are copied by the
/// first calls and never again (a second round of every call adds no copy); a scope nested in
/// another on the same stream shares its copies; another stream is refused.
template <class T, class Check>
void resident_cases(iattn::cuda on, Check&& check, const lengths& ls) {
  namespace cd = iattn::cuda_detail;
  auto same = [&](const std::string& what, bool ok) { check(what, ok ? 0.0 : std::numeric_limits<double>::infinity(), 0.0); };
  const ss_config heads{"per-state H=2 P=2 N=5 resets", 2, 2, 1, 5, decay_form::per_state, false, false, true};
  for (Index L : ls.tiles) {
    if (L != 1 && L != 33) continue;
    const auto S = make_semiseparable<T>(heads, L);
    const Index D = S.channels(), K = 4;
    const auto h = iattn::diagonal(uniform<T>(L, D, -1, 1)) * S * iattn::diagonal(uniform<T>(L, D, 0.0, 0.5)) *
                   iattn::causal_conv(uniform<T>(K, D, -1, 1));
    const std::string what = at("device_expression diag*S*diag*conv", L);
    const auto hd = iattn::to_device(h, on);
    same(what + ": nothing copied before the first call", hd.coefficients_on_device() == 0);
    const Mat<T> x = uniform<T>(L, D, -1, 1);
    const iattn::device_matrix<T> xd = iattn::to_device(x, on);
    const Index c = D - 1, t = L - 1;
    auto host = [](const iattn::device_matrix<T>& m) { return MatD(iattn::to_host(m).template cast<double>()); };
    std::size_t copies = 0;
    // Host-to-device copies a call starts (one process-wide counter: the GPU test is single-threaded,
    // and the emulated test runs this case alone).
    auto copies_by = [](auto&& call) {
      const long long before = cd::host_to_device_copies().load();
      (void)call();
      return cd::host_to_device_copies().load() - before;
    };
    for (int round = 0; round < 2; ++round) {
      const std::string r = what + (round ? " (second round)" : "");
      if (round == 1) {
        same(r + ": apply copies nothing", copies_by([&] { return iattn::apply(on, hd, xd); }) == 0);
        same(r + ": materialize copies nothing", copies_by([&] { return iattn::materialize(on, hd, c); }) == 0);
        same(r + ": materialize_all copies nothing", copies_by([&] { return iattn::materialize_all(on, hd); }) == 0);
        same(r + ": materialize_mean copies nothing", copies_by([&] { return iattn::materialize_mean(on, hd); }) == 0);
        same(r + ": materialize_head_means copies nothing",
             copies_by([&] { return iattn::materialize_head_means(on, hd); }) == 0);
        same(r + ": row copies its unit vector only", copies_by([&] { return iattn::row(on, hd, t, c); }) == 1);
        same(r + ": row_all copies its unit vector only", copies_by([&] { return iattn::row_all(on, hd, t); }) == 1);
        same(r + ": without the device_expression, materialize copies the coefficients",
             copies_by([&] { return iattn::materialize(on, h, c); }) >= 4);
      }
      compare(check, r + " apply", host(iattn::apply(on, hd, xd)), host(iattn::apply(on, h, xd)), 0.0);
      compare(check, r + " apply, host matrices", iattn::apply(on, hd, x).template cast<double>(),
              host(iattn::apply(on, h, xd)), 0.0);
      compare(check, r + " materialize", host(iattn::materialize(on, hd, c)), host(iattn::materialize(on, h, c)), 0.0);
      compare(check, r + " row", host(iattn::row(on, hd, t, c)), host(iattn::row(on, h, t, c)), 0.0);
      compare(check, r + " col", host(iattn::col(on, hd, 0, c)), host(iattn::col(on, h, 0, c)), 0.0);
      compare(check, r + " row_all", host(iattn::row_all(on, hd, t)), host(iattn::row_all(on, h, t)), 0.0);
      compare(check, r + " col_all", host(iattn::col_all(on, hd, 0)), host(iattn::col_all(on, h, 0)), 0.0);
      compare(check, r + " materialize_all", host(iattn::materialize_all(on, hd)), host(iattn::materialize_all(on, h)), 0.0);
      compare(check, r + " materialize_mean abs", host(iattn::materialize_mean(on, hd, {.abs = true})),
              host(iattn::materialize_mean(on, h, {.abs = true})), 0.0);
      compare(check, r + " materialize_head_means", host(iattn::materialize_head_means(on, hd)),
              host(iattn::materialize_head_means(on, h)), 0.0);
      if (round == 0) {
        copies = hd.coefficients_on_device();
        same(r + ": the first calls copied the coefficients", copies > 0);
      } else {
        same(r + ": no coefficient copied again (" + std::to_string(copies) + " kept, " +
                 std::to_string(hd.coefficients_on_device()) + " now)",
             hd.coefficients_on_device() == copies);
      }
    }
    // Another stream: refused before anything runs, naming the call.
#if defined(__CUDACC__)
    cudaStream_t other = nullptr;
    iattn::simt::check(cudaStreamCreate(&other), "cudaStreamCreate");
    const iattn::cuda elsewhere{other};
#else
    const iattn::cuda elsewhere{iattn::simt::emulated_stream{on.stream.order == iattn::simt::schedule::serial_forward
                                                                 ? iattn::simt::schedule::serial_reverse
                                                                 : iattn::simt::schedule::serial_forward}};
#endif
    std::string message;
    try {
      (void)iattn::apply(elsewhere, hd, xd);
    } catch (const std::invalid_argument& e) {
      message = e.what();
    }
    same(what + ": another stream is refused (got: \"" + message + "\")",
         message.find("apply(iattn::cuda, device_expression, X)") != std::string::npos &&
             message.find("made on another stream") != std::string::npos);
#if defined(__CUDACC__)
    iattn::simt::check(cudaStreamDestroy(other), "cudaStreamDestroy");
#endif
  }
  {  // a scope nested in another on the same stream shares its copies
    const auto S = make_semiseparable<T>(ss_configs[1], 9);
    const cd::upload_scope outer(on.stream);
    {
      const cd::upload_scope inner(on.stream);
      (void)cd::upload(S.B(), on.stream);
      same("nested upload_scope: the inner copy is the outer's", outer.uploads() == 1 && inner.uploads() == 1);
    }
    const auto b = cd::upload(S.B(), on.stream);
    same("nested upload_scope: kept after the inner scope ends", outer.uploads() == 1);
    Mat<T> back(S.B().rows(), S.B().cols());
    b.download(back.data());
    compare(check, "nested upload_scope: the kept copy holds the values", back, S.B().map().template cast<double>(), 0.0);
  }
}

/// Mamba-1's chain diag(silu z) * S(dt (x) A, B, C) * diag(dt) * conv(w), and the device-buffer
/// overload (to_device, apply on device matrices, to_host).
template <class T, class Check>
void product_cases(iattn::cuda on, Check&& check, const lengths& ls) {
  for (Index L : ls.scan) {
    const Index D = 6, N = 16, K = 4;
    const Mat<T> dt = uniform<T>(L, D, 0.0, 0.5), A = uniform<T>(D, N, -2.0, -0.1);
    const auto S = iattn::semiseparable(iattn::factored_decay(dt, A), uniform<T>(L, N, -1, 1), uniform<T>(L, N, -1, 1),
                                        {.heads = D});
    const auto H = iattn::diagonal(uniform<T>(L, D, -1, 1)) * S * iattn::diagonal(dt) *
                   iattn::causal_conv(uniform<T>(K, D, -1, 1));
    const Mat<T> x = uniform<T>(L, D, -1, 1);
    const iattn::device_matrix<T> xd = iattn::to_device(x, on);
    const Mat<T> y = iattn::to_host(iattn::apply(on, H, xd));
    compare(check, at("product diag*S*diag*conv", L) + " vs cpu", y, iattn::apply(H, x).template cast<double>(),
            tolerance<T>());
    // The diagonals a scan folds in (product.hpp, scan_fold), per token and constant, in every
    // association, in both scan layouts (N = 16: one thread per channel; N = 40: lanes).
    for (const ss_config& k : {ss_configs[0], ss_configs[2]}) {
      const auto Sk = make_semiseparable<T>(k, L);
      const Index Dk = Sk.channels();
      const Mat<T> xk = uniform<T>(L, Dk, -1, 1);
      const auto z = iattn::diagonal(uniform<T>(L, Dk, -1, 1));
      const auto e = iattn::diagonal(uniform<T>(1, Dk, -2, 2));
      const std::string what = at("scan fold", L) + " " + k.name + " ";
      compare(check, what + "diag*S", iattn::apply(on, z * Sk, xk), iattn::apply(z * Sk, xk).template cast<double>(),
              tolerance<T>());
      compare(check, what + "S*diag(1,D)", iattn::apply(on, Sk * e, xk),
              iattn::apply(Sk * e, xk).template cast<double>(), tolerance<T>());
      compare(check, what + "diag(1,D)*(S*diag)", iattn::apply(on, e * (Sk * z), xk),
              iattn::apply(e * (Sk * z), xk).template cast<double>(), tolerance<T>());
      compare(check, what + "diag*S*diag vs loops", iattn::apply(on, z * Sk * e, xk),
              loop_diagonal(z.d().map().template cast<double>().eval(),
                            loop_scan(Sk, loop_diagonal(e.d().map().eval(), xk).template cast<T>().eval())),
              tolerance<T>());
    }
  }
}

/// The SIMT interface itself: barriers and static shared memory (neighbour_sum), 2-D indices,
/// dynamic shared memory and block_sum, shuffles and warp sums, against host loops.
template <class T, class Check>
void simt_cases(iattn::cuda on, Check&& check, const lengths&) {
  using iattn::cuda_detail::device_buffer;
  const iattn::simt::stream s = on.stream;
  {  // neighbour sums over 3 blocks and a partial one
    const Index n = 700;
    const Mat<T> in = uniform<T>(1, n, -1, 1);
    const device_buffer<T> din(in.data(), n, s);
    device_buffer<T> dout(n, s);
    iattn::simt::launch("neighbour_sum", &simt_test::neighbour_sum<true, T>, {{3}, {256}, 0}, s, din.data(), dout.data(), n);
    Mat<T> out(1, n);
    dout.download(out.data());
    MatD expected(1, n);
    for (Index i = 0; i < n; ++i) {
      const Index r = i / 256 * 256 + (i % 256 + 1) % 256;
      expected(0, i) = double(in(0, i)) + (r < n ? double(in(0, r)) : 0.0);
    }
    compare(check, "simt neighbour_sum (barrier, static shared)", out, expected, tolerance<T>());
  }
  {  // 2-D blocks (32, 3) on a (2, 3) grid: indices, dynamic shared memory, block sums
    const iattn::simt::dims grid{2, 3}, block{32, 3};
    const Index per = 96, blocks = 6, n = per * blocks;
    const Mat<T> in = uniform<T>(1, n, -1, 1);
    const device_buffer<T> din(in.data(), n, s);
    device_buffer<T> dout(n, s), dsums(blocks, s);
    iattn::simt::launch("indices_and_block_sum", &simt_test::indices_and_block_sum<T>, {grid, block, 3 * sizeof(T)}, s,
                        din.data(), dout.data(), dsums.data());
    Mat<T> out(1, n), sums(1, blocks);
    dout.download(out.data());
    dsums.download(sums.data());
    MatD eo(1, n), es = MatD::Zero(1, blocks);
    for (Index b = 0; b < blocks; ++b)
      for (Index r = 0; r < per; ++r) {
        eo(0, b * per + r) = double(r % 32 + 10 * (r / 32) + 100 * (b % 2) + 1000 * (b / 2));
        es(0, b) += double(in(0, b * per + r));
      }
    compare(check, "simt 2-D indices", out, eo, 0.0);
    compare(check, "simt block_sum (dynamic shared)", sums, es, tolerance<T>());
  }
  {  // the grid-stride loop of the elementwise kernels: 2 blocks for 65 x 37 entries
    const Index L = 65, D = 37;
    const Mat<T> d = uniform<T>(L, D, -1, 1), x = uniform<T>(L, D, -1, 1);
    const device_buffer<T> dd(d.data(), L * D, s), dx(x.data(), L * D, s);
    device_buffer<T> dy(L * D, s);
    iattn::simt::launch("diagonal_apply", &iattn::cuda_detail::diagonal_apply<T>,
                        {{2}, {iattn::cuda_detail::elementwise_threads}, 0}, s,
                        iattn::cuda_detail::diagonal_args<T>{dd.data(), L, dx.data(), dy.data(), L, D});
    Mat<T> y(L, D);
    dy.download(y.data());
    compare(check, "simt grid-stride loop (diagonal_apply, 2 blocks)", y, loop_diagonal(d, x), tolerance<T>());
  }
  // shuffles over 2 warps: xor masks and down deltas at widths 32, 8 and 4
  for (const auto& [mask, delta, width] : {std::tuple{1, 1u, 32}, std::tuple{17, 5u, 32}, std::tuple{5, 3u, 8}, std::tuple{3, 2u, 4}}) {
    const Index n = 64;
    const Mat<T> in = uniform<T>(1, n, -1, 1);
    const device_buffer<T> din(in.data(), n, s);
    device_buffer<T> dout(3 * n, s);
    iattn::simt::launch("shuffles", &simt_test::shuffles<T>, {{2}, {32}, 0}, s, din.data(), dout.data(), mask, delta, width);
    Mat<T> out(1, 3 * n);
    dout.download(out.data());
    MatD expected(1, 3 * n);
    for (Index i = 0; i < n; ++i) {
      const Index lane = i % 32, seg = lane / width * width, base = i - lane;
      const Index x = lane ^ mask, d = lane % width + delta;
      expected(0, 3 * i) = double(in(0, x >= seg + width ? i : base + x));
      expected(0, 3 * i + 1) = double(in(0, d >= width ? i : i + delta));
      double sum = 0;
      for (Index l = seg; l < seg + width; ++l) sum += double(in(0, base + l));
      expected(0, 3 * i + 2) = sum;
    }
    compare(check, "simt shuffles mask=" + std::to_string(mask) + " delta=" + std::to_string(delta) +
                       " width=" + std::to_string(width),
            out, expected, tolerance<T>());
  }
}

/// Every case above, for one scalar type.
/// Sums and scalar multiples (backend/cuda/scaled.hpp): 0.5 S + 2 LR, and inside products as a
/// band's neighbour, diag(z) (S + LR) and (LR + diag(d)) conv(w) (a Sum of a band is not a band to
/// the banded rewrites, so it is materialized and multiplied): apply against the CPU backend and
/// the loops, materialize, rows and columns against the CPU's matrix and the dense loops.
template <class T, class Check>
void composite_cases(iattn::cuda on, Check&& check, const lengths& ls) {
  for (Index L : ls.tiles) {
    const auto S = make_semiseparable<T>(ss_configs[0], L);
    const Index D = S.channels(), c = (L % 2) ? D - 1 : 2;
    const auto R = make_recurrence<T>(L, D);
    const auto z = iattn::diagonal(uniform<T>(L, D, -1, 1));
    const auto sum = 0.5 * S + 2.0 * R;
    const auto left = z * (S + R);
    const auto right = (R + iattn::diagonal(uniform<T>(1, D, -2, 2))) * iattn::causal_conv(uniform<T>(4, D, -1, 1));
    const Mat<T> x = uniform<T>(L, D, -1, 1);
    const std::string what = at("composite", L);
    compare(check, what + " 0.5 S + 2 LR apply vs cpu", iattn::apply(on, sum, x),
            iattn::apply(sum, x).template cast<double>(), tolerance<T>());
    compare(check, what + " 0.5 S + 2 LR apply vs loops", iattn::apply(on, sum, x),
            MatD(0.5 * loop_scan(S, x) + 2.0 * loop_recurrence(R.a().map().eval(), R.b().map().eval(), x)),
            tolerance<T>());
    compare(check, what + " diag (S + LR) apply vs cpu", iattn::apply(on, left, x),
            iattn::apply(left, x).template cast<double>(), tolerance<T>());
    compare(check, what + " (LR + diag) conv apply vs cpu", iattn::apply(on, right, x),
            iattn::apply(right, x).template cast<double>(), tolerance<T>());
    matrix_checks<T>(on, check, ls, sum, L, c, what + " 0.5 S + 2 LR");
    matrix_checks<T>(on, check, ls, left, L, c, what + " diag (S + LR)");
    matrix_checks<T>(on, check, ls, right, L, c, what + " (LR + diag) conv");
  }
}

/// Flip (J A J, anti-causal) alone, twice, in a Vision-Mamba-shaped sum, and in products whose
/// matrices are not lower-triangular: a band on either side of a flipped core, and a general
/// product of a causal and an anti-causal factor (every entry of the (L, L) result).
template <class T, class Check>
void flip_cases(iattn::cuda on, Check&& check, const lengths& ls) {
  for (Index L : ls.tiles) {
    const auto S = make_semiseparable<T>(ss_configs[0], L);
    const Index D = S.channels(), c = (L % 2) ? D - 1 : 1;
    const auto R = make_recurrence<T>(L, D);
    const auto w = iattn::causal_conv(uniform<T>(4, D, -1, 1));
    const auto fs = iattn::flip(S);
    const auto twice = iattn::flip(iattn::flip(R));
    const auto vim = iattn::diagonal(uniform<T>(L, D, -1, 1)) * (S + iattn::flip(R));
    const auto right_band = iattn::flip(S) * w;
    const auto left_band = w * iattn::flip(R);
    const auto mixed = S * iattn::flip(R);
    const Mat<T> x = uniform<T>(L, D, -1, 1);
    const std::string what = at("flip", L);
    compare(check, what + " flip(S) apply vs loops", iattn::apply(on, fs, x),
            MatD(loop_scan(S, Mat<T>(x.colwise().reverse())).colwise().reverse()), tolerance<T>());
    compare(check, what + " flip(flip(LR)) apply vs cpu", iattn::apply(on, twice, x),
            iattn::apply(twice, x).template cast<double>(), tolerance<T>());
    compare(check, what + " diag (S + flip(LR)) apply vs cpu", iattn::apply(on, vim, x),
            iattn::apply(vim, x).template cast<double>(), tolerance<T>());
    compare(check, what + " S flip(LR) apply vs cpu", iattn::apply(on, mixed, x),
            iattn::apply(mixed, x).template cast<double>(), tolerance<T>());
    matrix_checks<T>(on, check, ls, fs, L, c, what + " flip(S)");
    matrix_checks<T>(on, check, ls, twice, L, c, what + " flip(flip(LR))");
    matrix_checks<T>(on, check, ls, vim, L, c, what + " diag (S + flip(LR))");
    matrix_checks<T>(on, check, ls, right_band, L, c, what + " flip(S) conv");
    matrix_checks<T>(on, check, ls, left_band, L, c, what + " conv flip(LR)");
    matrix_checks<T>(on, check, ls, mixed, L, c, what + " S flip(LR)");
  }
}

/// RowNormalize (each row divided by its sum, r = A 1): of a recurrence with positive decays and
/// inputs (every row sum positive), of a product with bands, of a flipped recurrence, and inside a
/// sum.
template <class T, class Check>
void row_normalize_cases(iattn::cuda on, Check&& check, const lengths& ls) {
  for (Index L : ls.tiles) {
    const Index D = 5, c = L % D;
    const Mat<T> a = uniform<T>(L, D, 0.1, 0.9), b = uniform<T>(L, D, 0.5, 1.5);
    const auto P = iattn::linear_recurrence(a, b);
    const auto rn = iattn::row_normalize(P);
    const auto banded = iattn::row_normalize(iattn::diagonal(uniform<T>(L, D, 0.5, 2)) * P *
                                             iattn::causal_conv(uniform<T>(4, D, 0.1, 1)));
    const auto flipped = iattn::row_normalize(iattn::flip(P));
    const auto summed = 0.5 * iattn::row_normalize(P) + iattn::diagonal(uniform<T>(L, D, -1, 1));
    const Mat<T> x = uniform<T>(L, D, -1, 1);
    const std::string what = at("row_normalize", L);
    const MatD num = loop_recurrence(a, b, x), den = loop_recurrence(a, b, Mat<T>(Mat<T>::Ones(L, D)));
    compare(check, what + " rn(LR) apply vs loops", iattn::apply(on, rn, x), MatD(num.cwiseQuotient(den)),
            tolerance<T>());
    compare(check, what + " rn(diag LR conv) apply vs cpu", iattn::apply(on, banded, x),
            iattn::apply(banded, x).template cast<double>(), tolerance<T>());
    compare(check, what + " rn(flip(LR)) apply vs cpu", iattn::apply(on, flipped, x),
            iattn::apply(flipped, x).template cast<double>(), tolerance<T>());
    compare(check, what + " 0.5 rn(LR) + diag apply vs cpu", iattn::apply(on, summed, x),
            iattn::apply(summed, x).template cast<double>(), tolerance<T>());
    matrix_checks<T>(on, check, ls, rn, L, c, what + " rn(LR)");
    matrix_checks<T>(on, check, ls, banded, L, c, what + " rn(diag LR conv)");
    matrix_checks<T>(on, check, ls, flipped, L, c, what + " rn(flip(LR))");
    matrix_checks<T>(on, check, ls, summed, L, c, what + " 0.5 rn(LR) + diag");
  }
}

/// GroupNorm: apply with statistics from its own input (RMS and centred, with and without a
/// weight, after a mixer, inside a RowNormalize and a Flip) against the CPU and plain loops; bind
/// on the device against the CPU's bind (statistics, and the bound expression's matrices, rows and
/// columns against the CPU and dense loops).
template <class T, class Check>
void group_norm_cases(iattn::cuda on, Check&& check, const lengths& ls) {
  for (Index L : ls.tiles) {
    const Index D = 6, G = 2, Dg = D / G, c = L % D;
    const Mat<T> w = uniform<T>(1, D, 0.5, 1.5);
    const auto rms = iattn::group_norm(G, w);
    const auto centred = iattn::group_norm(G, w, {.eps = 1e-3, .centered = true});
    const auto plain = iattn::group_norm<T>(G);  // no weight: it does not fix D; bound before use
    const auto R = make_recurrence<T>(L, D);
    const auto mixer = rms * (R * iattn::causal_conv(uniform<T>(4, D, -1, 1)));  // a norm after the mixer
    const auto rn = iattn::row_normalize(centred * iattn::linear_recurrence(uniform<T>(L, D, 0.1, 0.9),
                                                                            uniform<T>(L, D, 0.5, 1.5)));
    const auto flipped = iattn::flip(centred * R);
    const Mat<T> x = uniform<T>(L, D, -1, 1);
    const std::string what = at("group_norm", L);
    MatD expected(L, D);  // the RMS norm by plain loops
    for (Index t = 0; t < L; ++t)
      for (Index g = 0; g < G; ++g) {
        double ss = 0;
        for (Index k = 0; k < Dg; ++k) ss += double(x(t, g * Dg + k)) * double(x(t, g * Dg + k));
        for (Index k = 0; k < Dg; ++k)
          expected(t, g * Dg + k) = double(w(0, g * Dg + k)) * double(x(t, g * Dg + k)) / std::sqrt(ss / Dg + 1e-5);
      }
    compare(check, what + " rms apply vs loops", iattn::apply(on, rms, x), expected, tolerance<T>());
    compare(check, what + " centred apply vs cpu", iattn::apply(on, centred, x),
            iattn::apply(centred, x).template cast<double>(), tolerance<T>());
    compare(check, what + " norm after a mixer apply vs cpu", iattn::apply(on, mixer, x),
            iattn::apply(mixer, x).template cast<double>(), tolerance<T>());
    compare(check, what + " rn(norm LR) apply vs cpu", iattn::apply(on, rn, x),
            iattn::apply(rn, x).template cast<double>(), tolerance<T>());
    compare(check, what + " flip(norm LR) apply vs cpu", iattn::apply(on, flipped, x),
            iattn::apply(flipped, x).template cast<double>(), tolerance<T>());
    // bind on the device: the statistics as the CPU's bind takes them
    const auto bp = iattn::bind(on, plain, x), bp_cpu = iattn::bind(plain, x);
    compare(check, what + " bind: inv_sigma vs cpu", bp.stats().inv_sigma, bp_cpu.stats().inv_sigma.template cast<double>(),
            tolerance<T>());
    const auto bc = iattn::bind(on, centred, x), bc_cpu = iattn::bind(centred, x);
    compare(check, what + " bind centred: mean vs cpu", bc.stats().mean, bc_cpu.stats().mean.template cast<double>(),
            tolerance<T>());
    compare(check, what + " bound (no weight) apply vs cpu", iattn::apply(on, bp, x),
            iattn::apply(bp_cpu, x).template cast<double>(), tolerance<T>());
    const auto bm = iattn::bind(on, mixer, x), bm_cpu = iattn::bind(mixer, x);
    compare(check, what + " bind after a mixer: inv_sigma vs cpu", bm.left().stats().inv_sigma,
            bm_cpu.left().stats().inv_sigma.template cast<double>(), tolerance<T>());
    matrix_checks<T>(on, check, ls, bp, L, c, what + " bound norm");
    matrix_checks<T>(on, check, ls, bm, L, c, what + " bound norm after a mixer");
    matrix_checks<T>(on, check, ls, iattn::bind(on, rn, x), L, c, what + " bound rn(norm LR)");
    matrix_checks<T>(on, check, ls, iattn::bind(on, flipped, x), L, c, what + " bound flip(norm LR)");
  }
}

/// Wkv (RWKV's normalised WKV): per-token and constant decays, a reset (w = -inf), keys of a wide
/// spread (+-30: the log domain's running maxima), alone and behind RWKV-4's receptance diagonal:
/// apply, materialize, rows and columns against the CPU and the score matrix by plain loops.
template <class T, class Check>
void wkv_cases(iattn::cuda on, Check&& check, const lengths& ls) {
  for (Index L : ls.tiles) {
    const Index D = 5, c = L % D;
    Mat<T> w = uniform<T>(L, D, -1, 0);
    if (L > 3) w.row(3).setConstant(-std::numeric_limits<T>::infinity());
    const Mat<T> k = uniform<T>(L, D, -3, 3), wide = uniform<T>(L, D, -30, 30), u = uniform<T>(1, D, -1, 1);
    const auto per_token = iattn::wkv(w, k, u);
    const auto constant = iattn::wkv(uniform<T>(1, D, -1, -0.01), wide, u);
    const auto rwkv4 = iattn::diagonal(uniform<T>(L, D, 0, 1)) * iattn::wkv(uniform<T>(1, D, -1, -0.01), k, u);
    const Mat<T> x = uniform<T>(L, D, -1, 1);
    const std::string what = at("wkv", L);
    MatD expected(L, D);
    for (Index ch = 0; ch < D; ++ch) expected.col(ch) = dense(per_token, ch, L) * x.col(ch).template cast<double>();
    compare(check, what + " per-token decays, a reset: apply vs loops", iattn::apply(on, per_token, x), expected,
            tolerance<T>());
    compare(check, what + " constant decay, keys +-30: apply vs cpu", iattn::apply(on, constant, x),
            iattn::apply(constant, x).template cast<double>(), tolerance<T>());
    compare(check, what + " diag wkv apply vs cpu", iattn::apply(on, rwkv4, x),
            iattn::apply(rwkv4, x).template cast<double>(), tolerance<T>());
    {  // the chunked apply at chunks of 8 tokens: a chunk of resets, tails; keys +-30 across chunks
      const Index chunk = iattn::cuda_detail::wkv_chunk();
      iattn::cuda_detail::wkv_chunk() = 8;
      compare(check, what + " per-token decays, a reset: apply in chunks of 8 vs loops", iattn::apply(on, per_token, x),
              expected, tolerance<T>());
      compare(check, what + " constant decay, keys +-30: apply in chunks of 8 vs cpu", iattn::apply(on, constant, x),
              iattn::apply(constant, x).template cast<double>(), tolerance<T>());
      iattn::cuda_detail::wkv_chunk() = chunk;
    }
    matrix_checks<T>(on, check, ls, per_token, L, c, what + " per-token decays, a reset");
    matrix_checks<T>(on, check, ls, constant, L, c, what + " constant decay, keys +-30");
    matrix_checks<T>(on, check, ls, rwkv4, L, c, what + " diag wkv");
  }
}

/// ComplexSemiseparable: per-token magnitudes and angles (angles up to +-40 rad, a reset at token
/// 3) with heads, channels per head and groups, and decays fixed over tokens (the LRU's and
/// S4D's form); N = 3 (one lane of 4), 40 (64 lanes) and 300 (128 lanes of 3): apply against plain
/// loops at the scan's chunk tails, materialize, rows and columns, alone and as Mamba-3's
/// diag * S * conv.
template <class T, class Check>
void complex_semiseparable_cases(iattn::cuda on, Check&& check, const lengths& ls) {
  struct config {
    const char* name;
    Index H, P, G, N;
    bool fixed;  // rho and theta one row for every token
  };
  const config configs[] = {{"per-token, H=2 P=3 G=1 N=3", 2, 3, 1, 3, false},
                            {"fixed decays, H=4 P=1 G=2 N=40", 4, 1, 2, 40, true},
                            {"per-token, H=1 P=2 N=300", 1, 2, 1, 300, false}};
  auto make = [](const config& k, Index L) {
    const Index rows = k.fixed ? 1 : L;
    Mat<T> rho = uniform<T>(rows, k.H * k.N, -0.6, 0.0);
    if (!k.fixed && L > 3) rho.row(3).setConstant(-std::numeric_limits<T>::infinity());
    const double angles = k.fixed ? 3.2 : 40.0;
    return iattn::complex_semiseparable(rho, uniform<T>(rows, k.H * k.N, -angles, angles),
                                        uniform<T>(L, k.G * k.N, -1, 1), uniform<T>(L, k.G * k.N, -1, 1),
                                        uniform<T>(L, k.G * k.N, -1, 1), uniform<T>(L, k.G * k.N, -1, 1),
                                        iattn::complex_semiseparable_options{.heads = k.H, .head_dim = k.P, .groups = k.G});
  };
  // simt::sincos, the scan's own (host and device): against std::sin and std::cos in double.
  for (double range : {1.0, 100.0, 1.5e6}) {
    double err = 0;
    const Mat<T> x = uniform<T>(1, 4096, -range, range);
    for (Index i = 0; i < x.cols(); ++i) {
      T s, c;
      iattn::simt::sincos(x(0, i), s, c);
      err = std::max({err, std::abs(double(s) - std::sin(double(x(0, i)))), std::abs(double(c) - std::cos(double(x(0, i))))});
    }
    check("simt::sincos |x| <= " + std::to_string(range), err, std::is_same_v<T, float> ? 2e-7 : 5e-16);
  }
  for (const config& k : configs) {
    const Index D = k.H * k.P;
    for (Index L : ls.scan) {
      if (k.N > 100 && L > 100) continue;  // the wide state at the chunk tails only
      const auto S = make(k, L);
      const Mat<T> x = uniform<T>(L, D, -1, 1);
      MatD expected(L, D);
      for (Index ch = 0; ch < D; ++ch) expected.col(ch) = dense(S, ch, L) * x.col(ch).template cast<double>();
      compare(check, at("complex semiseparable", L) + " " + k.name + ": apply vs loops", iattn::apply(on, S, x),
              expected, tolerance<T>());
    }
    for (Index L : ls.tiles) {
      if (k.N > 100 && L > 40) continue;
      const auto S = make(k, L);
      const Index c = L % D;
      matrix_checks<T>(on, check, ls, S, L, c, at("complex semiseparable", L) + " " + k.name);
      const auto mamba3 = iattn::diagonal(uniform<T>(L, D, -1, 1)) * S * iattn::causal_conv(uniform<T>(4, D, -1, 1));
      const Mat<T> x = uniform<T>(L, D, -1, 1);
      compare(check, at("diag complex conv", L) + " " + k.name + ": apply vs cpu", iattn::apply(on, mamba3, x),
              iattn::apply(mamba3, x).template cast<double>(), tolerance<T>());
      matrix_checks<T>(on, check, ls, mamba3, L, c, at("diag complex conv", L) + " " + k.name);
    }
  }
}

/// Transition, the delta-rule family: Gated DeltaNet (one gate per head, L2-normalised keys, a
/// reset g = -inf at token 3; H = 2 heads of P = 3, N = 8: one lane of 8 states), KDA (per-key
/// gates, N = 40: 8 lanes of 8), DeltaProduct's rank 2 through transition() (N = 130: 32 lanes
/// of 8, the widest), and rank 0 (a diagonal recurrence, N = 3: one lane of 4): apply against the
/// dense transitions' products at the lengths of the scan cases (up to 65 tokens for the wide
/// states; also in chunks of 4 tokens, the chunked apply's passes, and with P = 10, two column
/// groups of its carry), materialize, rows and columns, alone and (the narrow states) behind a
/// diagonal and a convolution.
template <class T, class Check>
void transition_cases(iattn::cuda on, Check&& check, const lengths& ls) {
  struct config {
    const char* name;
    Index H, P, N, R;
    int form;  // 0 gated delta rule, 1 KDA, 2 transition() with rank R
    bool apply_only = false;
  };
  const config configs[] = {{"gated delta rule, H=2 P=3 N=8", 2, 3, 8, 1, 0},
                            {"kimi delta rule, H=1 P=2 N=40", 1, 2, 40, 1, 1},
                            {"rank 2, H=1 P=1 N=130", 1, 1, 130, 2, 2},
                            {"rank 0, H=2 P=1 N=3", 2, 1, 3, 0, 2},
                            // the chunked apply's carry in two groups of value columns per head
                            {"gated delta rule, H=2 P=10 N=8", 2, 10, 8, 1, 0, true}};
  auto normalised = [](Mat<T> m, Index N) {  // each head's key of unit length, as the models'
    for (Index t = 0; t < m.rows(); ++t)
      for (Index j = 0; j < m.cols(); j += N) m.row(t).segment(j, N).normalize();
    return m;
  };
  auto make = [&](const config& k, Index L) {
    const Index H = k.H, N = k.N;
    const iattn::transition_options o{.heads = H, .head_dim = k.P};
    const Mat<T> q = uniform<T>(L, H * N, -1, 1), key = normalised(uniform<T>(L, H * N, -1, 1), N);
    const Mat<T> beta = uniform<T>(L, H, 0, 1.9);
    if (k.form == 0) {
      Mat<T> g = uniform<T>(L, H, -0.5, 0);
      if (L > 3) g.row(3).setConstant(-std::numeric_limits<T>::infinity());
      return iattn::gated_delta_rule(q, key, beta, g, o);
    }
    if (k.form == 1) return iattn::kimi_delta_rule(q, key, beta, uniform<T>(L, H * N, -0.5, 0), o);
    const Mat<T> a = uniform<T>(L, H * k.R * N, -1, 1), b = Mat<T>(uniform<T>(L, H * k.R * N, -1, 1) / T(N));
    return iattn::transition(uniform<T>(L, H * N, -0.3, 0), a, b, q, key,
                             iattn::transition_options{.heads = H, .head_dim = k.P, .rank = k.R});
  };
  for (const config& k : configs) {
    if (k.N > 100 && !ls.widest) continue;
    const Index D = k.H * k.P;
    const bool wide = k.N > 16;  // several lanes: the emulator's shuffles are slow, so shorter lengths
    for (Index L : ls.scan) {
      if (wide && L > 65) continue;
      const auto S = make(k, L);
      const Mat<T> x = uniform<T>(L, D, -1, 1);
      MatD expected(L, D);
      for (Index ch = 0; ch < D; ++ch) expected.col(ch) = dense(S, ch, L) * x.col(ch).template cast<double>();
      // The sequential scan (one chunk), then the chunked apply: chunks of 4 tokens up to 65 tokens
      // (many chunks, a chunk with the reset, tails), of 64 beyond. Its transition products take
      // N columns per head, N / 4 blocks of the emulator's 128 threads for the widest: the wide
      // states take it at one short length.
      const Index chunk = iattn::cuda_detail::transition_chunk();
      iattn::cuda_detail::transition_chunk() = std::max(L, chunk);
      compare(check, at("transition", L) + " " + k.name + ": apply vs the transitions' products", iattn::apply(on, S, x),
              expected, tolerance<T>());
      // Segments of 3 chunks (the scratch budget; the state carried between segments); one run
      // (segments of 1 chunk) unless thorough.
      const Index scratch = iattn::cuda_detail::transition_scratch(), per_segment = ls.thorough ? 3 : 1;
      iattn::cuda_detail::transition_chunk() = L <= 65 ? 4 : chunk;
      iattn::cuda_detail::transition_scratch() = per_segment * (D * k.N + k.H * k.N * k.N);
      if (L > 4 && ((!wide && ls.thorough) || L < 16))
        compare(check, at("transition", L) + " " + k.name + ": chunked apply (chunks of " +
                           std::to_string(iattn::cuda_detail::transition_chunk()) + ", segments of " +
                           std::to_string(per_segment) + ") vs the transitions' products",
                iattn::apply(on, S, x), expected, tolerance<T>());
      iattn::cuda_detail::transition_chunk() = chunk;
      iattn::cuda_detail::transition_scratch() = scratch;
    }
    for (Index L : ls.tiles) {
      if (k.apply_only) break;
      if (wide && L > 33) continue;
      if (k.N > 100 && L != 1 && L != 33) continue;  // the widest: the lengths around one warp's worth
      const auto S = make(k, L);
      const Index c = L % D;
      matrix_checks<T>(on, check, ls, S, L, c, at("transition", L) + " " + k.name);
      if (wide) continue;  // the products' own passes do not depend on N
      const auto gdn = iattn::diagonal(uniform<T>(L, D, -1, 1)) * S * iattn::causal_conv(uniform<T>(4, D, -1, 1));
      const Mat<T> x = uniform<T>(L, D, -1, 1);
      compare(check, at("diag transition conv", L) + " " + k.name + ": apply vs cpu", iattn::apply(on, gdn, x),
              iattn::apply(gdn, x).template cast<double>(), tolerance<T>());
      matrix_checks<T>(on, check, ls, gdn, L, c, at("diag transition conv", L) + " " + k.name);
    }
  }
}

/// Identity (no channel count or scalar type of its own): beside a recurrence (R + I), as a
/// product's factor (diag * I), scaled inside a sum (2 I + R: the scaled Identity takes the sum's D)
/// and flipped (diag * flip(I)): apply against plain loops, materialize, rows, columns and tiles.
template <class T, class Check>
void identity_cases(iattn::cuda on, Check&& check, const lengths& ls) {
  for (Index L : ls.tiles) {
    const Index D = 3, c = L % D;
    const auto R = iattn::linear_recurrence(uniform<T>(L, D, 0, 1), uniform<T>(L, D, -1, 1));
    const auto d = iattn::diagonal(uniform<T>(L, D, -2, 2));
    const auto plus = R + iattn::identity();
    const auto times = d * iattn::identity();
    const auto scaled = T(2) * iattn::identity() + R;
    const auto flipped = d * iattn::flip(iattn::identity());
    const Mat<T> x = uniform<T>(L, D, -1, 1);
    auto loops = [&](const auto& h) {
      MatD y(L, D);
      for (Index ch = 0; ch < D; ++ch) y.col(ch) = dense(h, ch, L) * x.col(ch).template cast<double>();
      return y;
    };
    compare(check, at("R + I", L) + ": apply vs loops", iattn::apply(on, plus, x), loops(plus), tolerance<T>());
    compare(check, at("diag * I", L) + ": apply vs loops", iattn::apply(on, times, x), loops(times), tolerance<T>());
    compare(check, at("2 I + R", L) + ": apply vs loops", iattn::apply(on, scaled, x), loops(scaled), tolerance<T>());
    compare(check, at("diag * flip(I)", L) + ": apply vs loops", iattn::apply(on, flipped, x), loops(flipped),
            tolerance<T>());
    matrix_checks<T>(on, check, ls, plus, L, c, at("R + I", L));
    matrix_checks<T>(on, check, ls, times, L, c, at("diag * I", L));
    matrix_checks<T>(on, check, ls, scaled, L, c, at("2 I + R", L));
  }
}

/// SoftmaxAttention, causal and bidirectional (H = 2 heads of P = 3 channels, dk = 4, scores
/// scaled up so the rows' maxima matter), alone and behind a diagonal: apply, materialize, rows and
/// columns against the CPU and plain loops.
template <class T, class Check>
void softmax_cases(iattn::cuda on, Check&& check, const lengths& ls) {
  for (Index L : ls.tiles) {
    const Index H = 2, P = 3, dk = 4, D = H * P, c = L % D;
    const Mat<T> Q = uniform<T>(L, H * dk, -2, 2), K = uniform<T>(L, H * dk, -2, 2);
    const iattn::softmax_options o{.heads = H, .head_dim = P, .scale = 2.0};
    const auto causal = iattn::softmax_attention(Q, K, o);
    const auto both = iattn::softmax_attention(Q, K, o, iattn::bidirectional);
    const auto gated = iattn::diagonal(uniform<T>(L, D, -1, 1)) * causal;
    const Mat<T> x = uniform<T>(L, D, -1, 1);
    const std::string what = at("softmax", L);
    MatD expected(L, D);
    for (Index ch = 0; ch < D; ++ch) expected.col(ch) = dense(causal, ch, L) * x.col(ch).template cast<double>();
    compare(check, what + " causal apply vs loops", iattn::apply(on, causal, x), expected, tolerance<T>());
    compare(check, what + " bidirectional apply vs cpu", iattn::apply(on, both, x),
            iattn::apply(both, x).template cast<double>(), tolerance<T>());
    compare(check, what + " diag softmax apply vs cpu", iattn::apply(on, gated, x),
            iattn::apply(gated, x).template cast<double>(), tolerance<T>());
    matrix_checks<T>(on, check, ls, causal, L, c, what + " causal");
    matrix_checks<T>(on, check, ls, both, L, c, what + " bidirectional");
    matrix_checks<T>(on, check, ls, gated, L, c, what + " diag softmax");
  }
}

// ---- 16-bit storage (float16, bfloat16) ----------------------------------------------------------

/// S's unit roundoff: float16 keeps 11 significant bits, bfloat16 8.
template <class S>
double unit_roundoff() {
  return std::is_same_v<S, iattn::float16> ? std::ldexp(1.0, -11) : std::ldexp(1.0, -8);
}
template <class S>
const char* storage_label() {
  return std::is_same_v<S, iattn::float16> ? "float16" : "bfloat16";
}

/// x rounded to S and read back (what a 16-bit X holds), on the host.
template <class S>
Mat<float> rounded(const Mat<float>& x) {
  Mat<float> r(x.rows(), x.cols());
  for (Index i = 0; i < x.size(); ++i) r.data()[i] = iattn::to_float(iattn::round_to<S>(x.data()[i]));
  return r;
}

/// Reports a 16-bit result against float's (one rounding to S allowed on top of float's
/// tolerance): error = max over entries of |got - expected| - u |expected|, u S's unit roundoff.
template <class Check>
void compare_rounded(Check&& check, const std::string& what, const Mat<float>& got, const MatD& expected, double u) {
  if (got.rows() != expected.rows() || got.cols() != expected.cols()) {
    check(what + ": shape mismatch", std::numeric_limits<double>::infinity(), 0.0);
    return;
  }
  double err = 0;
  for (Index i = 0; i < got.size(); ++i) {
    const double e = std::abs(double(got.data()[i]) - expected.data()[i]) - u * std::abs(expected.data()[i]);
    err = std::max(err, std::isnan(e) ? std::numeric_limits<double>::infinity() : e);
  }
  check(what, err, 1e-4 * (1.0 + (expected.size() ? expected.cwiseAbs().maxCoeff() : 0.0)));
}

/// Floats that reach every branch of the rounding: zeros, subnormal and normal float16 ranges,
/// exact ties (odd and even), the overflow thresholds, infinities and NaN; and values drawn over
/// the exponent range.
inline Mat<float> rounding_probes() {
  std::vector<float> v = {0.0f, -0.0f, 1.0f, -1.0f, 65504.0f, 65519.0f, 65520.0f, -65520.0f, 1e5f, 6.1035156e-5f,
                          5.9604645e-8f, 2.9802322e-8f, 2.9802326e-8f, 1e-30f, 1.0009765625f /* float16 tie, even */,
                          1.0029296875f /* float16 tie, odd */, 1.00390625f /* bfloat16 tie, even */,
                          1.01171875f /* bfloat16 tie, odd */, 3.3895314e38f, 3.4028235e38f,
                          std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity(),
                          std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::denorm_min()};
  std::uniform_real_distribution<double> mant(1, 2), expo(-30, 20);
  for (int i = 0; i < 1000; ++i) v.push_back(float((i % 2 ? -1 : 1) * mant(test::rng()) * std::exp2(std::floor(expo(test::rng())))));
  Mat<float> m(1, Index(v.size()));
  for (std::size_t i = 0; i < v.size(); ++i) m(0, Index(i)) = v[i];
  return m;
}

/// One storage type S: the conversion kernels against the host's rounding (the same bits), and Y =
/// H X with X and Y in S for Mamba-1's chain, a Vision-Mamba-like bidirectional sum and a
/// GroupNorm after a recurrence (bind from 16-bit X), against the CPU backend on X's rounded values.
template <class S, class Check>
void storage16_one(iattn::cuda on, Check&& check, const lengths& ls) {
  const std::string label = storage_label<S>();
  const double u = unit_roundoff<S>();
  {  // the conversion kernels: the host's bits exactly
    const Mat<float> p = rounding_probes();
    const iattn::device_matrix<S> n = iattn::convert<S>(on, iattn::to_device(p, on));
    const Mat<float> back = iattn::to_host(n);                            // widened on the host
    const Mat<float> wide = iattn::to_host(iattn::convert<float>(on, n));  // widened on the device
    double bad = 0;
    for (Index i = 0; i < p.size(); ++i) {
      const float want = iattn::to_float(iattn::round_to<S>(p(0, i)));
      const bool same = (std::isnan(want) && std::isnan(back(0, i)) && std::isnan(wide(0, i))) ||
                        (std::bit_cast<std::uint32_t>(want) == std::bit_cast<std::uint32_t>(back(0, i)) &&
                         std::bit_cast<std::uint32_t>(want) == std::bit_cast<std::uint32_t>(wide(0, i)));
      bad += same ? 0 : 1;
    }
    check(label + ": convert kernels vs the host's rounding (" + std::to_string(p.size()) + " probes, mismatches)", bad, 0.0);
    Mat<float> finite = uniform<float>(1, 1000, -6e4, 6e4);  // within both types' range
    for (Index i = 0; i < p.size(); ++i)
      if (std::isfinite(p(0, i)) && std::abs(p(0, i)) < 6e4f) finite(0, i % 1000) = p(0, i);
    check(label + ": to_device<S> (rounded on the host) vs convert<S> (on the device)",
          (iattn::to_host(iattn::to_device<S>(finite, on)) -
           iattn::to_host(iattn::convert<float>(on, iattn::convert<S>(on, iattn::to_device(finite, on)))))
              .cwiseAbs()
              .maxCoeff(),
          0.0);
  }
  for (Index L : ls.scan) {
    if (L > (ls.thorough ? 257 : 7)) continue;
    const Index D = 6, N = 16, K = 4;
    const Mat<float> dt = uniform<float>(L, D, 0.0, 0.5), A = uniform<float>(D, N, -2.0, -0.1);
    const auto S1 = iattn::semiseparable(iattn::factored_decay(dt, A), uniform<float>(L, N, -1, 1),
                                         uniform<float>(L, N, -1, 1), {.heads = D});
    const auto mamba = iattn::diagonal(uniform<float>(L, D, -1, 1)) * S1 * iattn::diagonal(dt) *
                       iattn::causal_conv(uniform<float>(K, D, -1, 1));
    const auto S2 = iattn::semiseparable(uniform<float>(L, 2, -0.5, 0), uniform<float>(L, N, -1, 1),
                                         uniform<float>(L, N, -1, 1), {.heads = 2, .head_dim = 3});
    const auto vim = iattn::diagonal(uniform<float>(L, D, -1, 1)) * (mamba + iattn::flip(S2 * iattn::diagonal(dt)));
    const auto norm = iattn::group_norm(2, uniform<float>(1, D, 0.5, 1.5)) *
                      iattn::linear_recurrence(uniform<float>(L, D, 0.1, 0.9), uniform<float>(L, D, 0.5, 1.5));
    const Mat<float> x = Mat<float>(uniform<float>(L, D, -1, 1) * 3.0f);
    const Mat<float> xq = rounded<S>(x);
    const iattn::device_matrix<S> xd = iattn::to_device<S>(x, on);
    const std::string what = at("16-bit storage", L) + " " + label;
    auto run = [&](const char* name, const auto& h) {
      const iattn::device_matrix<S> y = iattn::apply(on, h, xd);
      compare_rounded(check, what + " apply " + name + " vs cpu on rounded X", iattn::to_host(y),
                      iattn::apply(h, xq).template cast<double>(), u);
    };
    run("diag*S*diag*conv", mamba);
    run("diag*(H_f + flip(H_b))", vim);
    run("norm*LR", norm);
    const auto resident = iattn::to_device(mamba, on);
    compare_rounded(check, what + " apply device_expression vs cpu on rounded X", iattn::to_host(iattn::apply(on, resident, xd)),
                    iattn::apply(mamba, xq).template cast<double>(), u);
    // bind from 16-bit X: the statistics of X's rounded values
    const auto bound = iattn::bind(on, norm, xd);
    compare(check, what + " bind: materialize vs cpu bound on rounded X", iattn::to_host(iattn::materialize(on, bound, L % D)),
            iattn::materialize(iattn::bind(norm, xq), L % D).template cast<double>(), tolerance<float>());
  }
}

/// 16-bit storage (float type only: the storage computes in float).
template <class T, class Check>
void storage16_cases(iattn::cuda on, Check&& check, const lengths& ls) {
  if constexpr (std::is_same_v<T, float>) {
    storage16_one<iattn::float16>(on, check, ls);
    storage16_one<iattn::bfloat16>(on, check, ls);
  }
}

template <class T, class Check>
void all_cases(iattn::cuda on, Check&& check, const lengths& ls) {
  simt_cases<T>(on, check, ls);
  diagonal_cases<T>(on, check, ls);
  causal_conv_cases<T>(on, check, ls);
  linear_recurrence_cases<T>(on, check, ls);
  semiseparable_apply_cases<T>(on, check, ls);
  semiseparable_matrix_cases<T>(on, check, ls);
  product_cases<T>(on, check, ls);
  band_matrix_cases<T>(on, check, ls);
  linear_recurrence_matrix_cases<T>(on, check, ls);
  product_matrix_cases<T>(on, check, ls);
  composite_cases<T>(on, check, ls);
  flip_cases<T>(on, check, ls);
  row_normalize_cases<T>(on, check, ls);
  group_norm_cases<T>(on, check, ls);
  wkv_cases<T>(on, check, ls);
  complex_semiseparable_cases<T>(on, check, ls);
  transition_cases<T>(on, check, ls);
  identity_cases<T>(on, check, ls);
  softmax_cases<T>(on, check, ls);
  mean_cases<T>(on, check, ls);
  head_mean_cases<T>(on, check, ls);
  blocked_mean_cases<T>(on, check, ls);
  resident_cases<T>(on, check, ls);
  storage16_cases<T>(on, check, ls);
}

}  // namespace cuda_test
