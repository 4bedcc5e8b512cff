// ComplexSemiseparable against an independent dense oracle (std::complex<double>, plain loops, the
// decays multiplied step by step), float and double: materialize, apply, row/col (the transposed
// scan), tiles, channel means, compositions, flip; theta = 0 against the real Semiseparable; resets;
// long sequences with large angles in float against double; decays fixed over tokens; L = 0; errors.
#include "support/test_common.hpp"

#include <complex>
#include <limits>

#if defined(_OPENMP)
#include <omp.h>
#endif

using namespace test;

namespace {

using cplx = std::complex<double>;

/// The matrix of channel c: H[t, s] = Re sum_m C_t[m] (prod_{k=s+1..t} e^{lambda_k[m]}) B_s[m], the
/// products formed one token at a time. rho and theta are (L, H*N) or (1, H*N).
MatD dense_complex(const MatD& rho, const MatD& theta, const MatD& Br, const MatD& Bi, const MatD& Cr, const MatD& Ci,
                   Index H, Index P, Index G, Index c) {
  const Index L = Br.rows(), N = Br.cols() / G, h = c / P, g = h / (H / G);
  std::vector<cplx> f(static_cast<std::size_t>(L * N)), acc(static_cast<std::size_t>(N));
  for (Index t = 0; t < L; ++t)
    for (Index m = 0; m < N; ++m)
      f[std::size_t(t * N + m)] = std::exp(cplx(rho(rho.rows() == 1 ? 0 : t, h * N + m),
                                                theta(theta.rows() == 1 ? 0 : t, h * N + m)));
  MatD M = MatD::Zero(L, L);
  for (Index s = 0; s < L; ++s) {
    std::fill(acc.begin(), acc.end(), cplx(1.0, 0.0));
    for (Index t = s; t < L; ++t) {
      cplx v = 0;
      for (Index m = 0; m < N; ++m) {
        cplx& a = acc[std::size_t(m)];
        if (t > s) a *= f[std::size_t(t * N + m)];
        v += cplx(Cr(t, g * N + m), Ci(t, g * N + m)) * a * cplx(Br(s, g * N + m), Bi(s, g * N + m));
      }
      M(t, s) = v.real();
    }
  }
  return M;
}

template <class T>
struct coeffs {
  Index H, P, G, N;
  Mat<T> rho, theta, Br, Bi, Cr, Ci;
  iattn::complex_semiseparable_options opts() const { return {.heads = H, .head_dim = P, .groups = G}; }
  auto op() const { return iattn::complex_semiseparable(rho, theta, Br, Bi, Cr, Ci, opts()); }
  Index D() const { return H * P; }
  /// The oracle of channel c (one per head: the head's channels share it).
  MatD dense(Index c) const { return dense_complex(dd(rho), dd(theta), dd(Br), dd(Bi), dd(Cr), dd(Ci), H, P, G, c); }
  std::vector<MatD> dense_heads() const {
    std::vector<MatD> m;
    for (Index h = 0; h < H; ++h) m.push_back(dense(h * P));
    return m;
  }
};

/// Random coefficients: rho in [rho_lo, rho_hi] (decays), theta in [-theta_max, theta_max].
template <class T>
coeffs<T> random_coeffs(Index L, Index H, Index P, Index G, Index N, double rho_lo = -0.5, double rho_hi = -0.01,
                        double theta_max = 3.14159, Index decay_rows = -1) {
  const Index dr = decay_rows < 0 ? L : decay_rows;
  return {H, P, G, N,
          uniform<T>(dr, H * N, rho_lo, rho_hi), uniform<T>(dr, H * N, -theta_max, theta_max),
          normal<T>(L, G * N), normal<T>(L, G * N), normal<T>(L, G * N), normal<T>(L, G * N)};
}

/// Every evaluation of S against the per-head oracles M (channel c uses M[c / P]).
template <class T, class Op>
void check_all(const coeffs<T>& k, const Op& S, const std::vector<MatD>& M, double tol) {
  const Index L = k.Br.rows(), D = k.D();
  auto oracle = [&](Index c) -> const MatD& { return M[std::size_t(c / k.P)]; };
  // materialize: first, a middle and the last channel
  for (Index c : {Index(0), D / 2, D - 1}) check_close(iattn::materialize(S, c), oracle(c), tol);
  // apply
  const Mat<T> x = normal<T>(L, D);
  check_close(iattn::apply(S, x), dense_apply(oracle, dd(x)), tol);
  // row and col: the transposed and the forward scan of a unit vector
  for (Index t : {Index(0), L / 2, L - 1}) {
    const MatD r = dd(iattn::row(S, t)), q = dd(iattn::col(S, t));
    for (Index c : {Index(0), D - 1}) {
      check_close(r.row(c), oracle(c).row(t), tol);
      check_close(q.row(c), oracle(c).col(t).transpose(), tol);
    }
  }
  // tiles: one below the diagonal, one across it, one above it (zero)
  auto tile = [&](Index r0, Index r1, Index c0, Index c1) {
    r0 = std::clamp<Index>(r0, 0, L), r1 = std::clamp<Index>(r1, r0, L);
    c0 = std::clamp<Index>(c0, 0, L), c1 = std::clamp<Index>(c1, c0, L);
    INFO("tile rows [" << r0 << ", " << r1 << "), cols [" << c0 << ", " << c1 << ")");
    const Index c = D - 1;
    check_close(iattn::block(S, c, {r0, r1}, {c0, c1}), oracle(c).block(r0, c0, r1 - r0, c1 - c0), tol);
  };
  tile(L - 70, L, 0, 50);
  tile(L / 3, L / 3 + 80, L / 3 - 10, L / 3 + 90);
  tile(L / 2 + 3, L / 2 + 40, 1, L / 2 + 17);
  tile(0, L / 2, L / 2, L);
  // the channel mean
  MatD mean = MatD::Zero(L, L);
  for (const MatD& m : M) mean += m * double(k.P);
  mean /= double(D);
  check_close(iattn::materialize_mean(S), mean, tol);
}

template <class T>
void run_case(Index L, Index H, Index P, Index G, Index N) {
  INFO("L = " << L << ", H = " << H << ", P = " << P << ", G = " << G << ", N = " << N);
  const coeffs<T> k = random_coeffs<T>(L, H, P, G, N);
  const auto S = k.op();
  REQUIRE(S.length() == L);
  REQUIRE(S.channels() == H * P);
  REQUIRE(S.state() == N);
  check_all(k, S, k.dense_heads(), tolerance<T>());
}

}  // namespace

TEMPLATE_TEST_CASE("complex_semiseparable matches the dense oracle", "[complex_semiseparable]", float, double) {
  // The whole grid up to L = 257; at L = 1000 (the oracle costs L^2 N per head) four corners of it.
  for (Index L : {Index(1), Index(7), Index(64), Index(257)})
    for (Index H : {Index(1), Index(3)})
      for (Index P : {Index(1), Index(4)})
        for (Index G : (H == 1 ? std::vector<Index>{1} : std::vector<Index>{1, H}))
          for (Index N : {Index(1), Index(5), Index(16)}) run_case<TestType>(L, H, P, G, N);
  run_case<TestType>(1000, 1, 1, 1, 16);
  run_case<TestType>(1000, 3, 4, 3, 16);
  run_case<TestType>(1000, 3, 1, 1, 5);
  run_case<TestType>(1000, 3, 4, 1, 1);
}

TEMPLATE_TEST_CASE("complex_semiseparable: decays fixed over tokens, (1, H*N)", "[complex_semiseparable]", float, double) {
  using T = TestType;
  for (Index L : {Index(1), Index(7), Index(200)}) {
    INFO("L = " << L);
    // both fixed (S4D, LRU)
    const coeffs<T> k = random_coeffs<T>(L, 3, 2, 3, 5, -0.3, -0.01, 3.14159, 1);
    const auto S = k.op();
    REQUIRE(S.constant_log_mag());
    REQUIRE(S.constant_angle());
    // the oracle reads the same decays broadcast to (L, H*N)
    coeffs<T> full = k;
    full.rho = k.rho.replicate(L, 1), full.theta = k.theta.replicate(L, 1);
    const auto M = full.dense_heads();
    check_all(k, S, M, tolerance<T>());
    check_close(iattn::materialize(S, 3), iattn::materialize(full.op(), 3), tolerance<T>());
    // a fixed magnitude with a per-token angle, and the converse
    coeffs<T> a = full, b = full;
    a.rho = k.rho, b.theta = k.theta;
    check_all(a, a.op(), M, tolerance<T>());
    check_all(b, b.op(), M, tolerance<T>());
  }
}

TEMPLATE_TEST_CASE("complex_semiseparable: channel means of time-invariant operators are Toeplitz (the LRU's form)",
                   "[complex_semiseparable][mean]", float, double) {
  // Decays fixed over tokens and B, C equal at every token (toeplitz_mean.hpp): the mean is formed
  // from each channel's kernel, against the mean of the dense oracles (plain loops, double), signed
  // and |.|, all channels and ranges; with diagonals fixed over tokens, a convolution, a skip mask,
  // scales, heads of several channels, groups and a reset. A diagonal that varies over tokens takes
  // the entry-by-entry form; a B that varies takes the other paths; the same means.
  using T = TestType;
  namespace cd = iattn::cpu_detail;
  const double tol = tolerance<T>();
  for (Index L : {Index(1), Index(7), Index(130)})
    for (Index P : {Index(1), Index(2)}) {
      INFO("L = " << L << ", P = " << P);
      const Index H = 6, G = 3, N = 3, D = H * P, K = 4;
      coeffs<T> k = random_coeffs<T>(L, H, P, G, N, -0.4, -0.01, 3.14159, 1);
      k.rho(0, 4) = -std::numeric_limits<T>::infinity();  // a reset: only the diagonal is left of that state
      for (auto* m : {&k.Br, &k.Bi, &k.Cr, &k.Ci}) *m = Mat<T>(m->row(0).replicate(L, 1));
      coeffs<T> full = k;  // the oracle reads the decays broadcast to (L, H*N)
      full.rho = k.rho.replicate(L, 1), full.theta = k.theta.replicate(L, 1);
      const std::vector<MatD> M = full.dense_heads();
      const Mat<T> p = normal<T>(1, D), q = uniform<T>(1, D, 0.1, 1.0), w = normal<T>(K, D), mask = uniform<T>(1, D, 0, 1);
      const auto S = k.op();
      const auto E = T(0.5) * iattn::diagonal(p) * S * iattn::diagonal(q) * iattn::causal_conv(w) + S +
                     iattn::diagonal(mask) * iattn::causal_conv(w);
      std::vector<MatD> ME;
      for (Index c = 0; c < D; ++c) {
        const MatD& Sc = M[std::size_t(c / P)];
        ME.push_back(0.5 * dense_diagonal(dd(p), c, L) * Sc * dense_diagonal(dd(q), c, L) * dense_conv(dd(w), c, L) + Sc +
                     dense_diagonal(dd(mask), c, L) * dense_conv(dd(w), c, L));
      }
      auto takes = [&](const auto& h, bool fixed_only = true) {
        cd::mean_terms<T> terms;
        return cd::expand_terms<T>(h, {L, D}, terms) && cd::toeplitz_mean_takes(terms, L, fixed_only);
      };
      REQUIRE(takes(E));
      REQUIRE(takes(S + iattn::diagonal(mask)));
      auto mean_of = [&](const std::vector<MatD>& m, Index c0, Index c1, bool abs) {
        MatD r = MatD::Zero(L, L);
        for (Index c = c0; c < c1; ++c) r += abs ? MatD(m[std::size_t(c)].cwiseAbs()) : m[std::size_t(c)];
        return MatD(r / double(c1 - c0));
      };
      // The same bits on every call and any number of threads (the channels summed in a fixed order).
      {
        const Mat<T> first = iattn::materialize_mean(E);
#if defined(_OPENMP)
        const int threads0 = omp_get_max_threads();
        for (int threads : {1, 2, 3, 4}) {
          omp_set_num_threads(threads);
#else
        for (int threads : {1, 1}) {
#endif
          INFO("threads = " << threads);
          REQUIRE((iattn::materialize_mean(E).array() == first.array()).all());
        }
#if defined(_OPENMP)
        omp_set_num_threads(threads0);
#endif
      }
      for (bool abs : {false, true}) {
        INFO("abs = " << abs);
        check_close(iattn::materialize_mean(E, iattn::mean_options{.abs = abs}), mean_of(ME, 0, D, abs), tol);
        const iattn::range r{1, D - 2};
        check_close(iattn::materialize_mean(E, iattn::mean_options{.abs = abs, .channels = r}), mean_of(ME, 1, D - 2, abs), tol);
        // the tile path (forced) agrees
        check_close(cd::materialize_mean<T>(E, {L, D}, {0, D, abs}, cd::mean_path::channels), mean_of(ME, 0, D, abs), tol);
      }
      // B varying over tokens, a diagonal varying over tokens: not Toeplitz, other paths, same oracle
      if (L > 1) {
        coeffs<T> kv = k;
        kv.Br(L - 1, 0) += T(1);
        const auto Sv = kv.op();
        REQUIRE_FALSE(takes(Sv + iattn::diagonal(mask), false));
        coeffs<T> fullv = kv;
        fullv.rho = kv.rho.replicate(L, 1), fullv.theta = kv.theta.replicate(L, 1);
        const std::vector<MatD> Mv = fullv.dense_heads();
        std::vector<MatD> MV;
        for (Index c = 0; c < D; ++c) MV.push_back(Mv[std::size_t(c / P)] + dense_diagonal(dd(mask), c, L));
        check_close(iattn::materialize_mean(Sv + iattn::diagonal(mask)), mean_of(MV, 0, D, false), tol);
        // gates varying over tokens: every entry a sum over the channels (where no head path applies)
        const Mat<T> pv = normal<T>(L, D);
        REQUIRE_FALSE(takes(iattn::diagonal(pv) * S));
        REQUIRE(takes(iattn::diagonal(pv) * S, false));
        std::vector<MatD> MP;
        for (Index c = 0; c < D; ++c) MP.push_back(dense_diagonal(dd(pv), c, L) * M[std::size_t(c / P)]);
        for (bool abs : {false, true})
          check_close(iattn::materialize_mean(iattn::diagonal(pv) * S, iattn::mean_options{.abs = abs}), mean_of(MP, 0, D, abs), tol);
      }
    }
}

TEMPLATE_TEST_CASE("complex_semiseparable: compositions and flip", "[complex_semiseparable]", float, double) {
  using T = TestType;
  for (Index L : {Index(7), Index(64), Index(257)}) {
    INFO("L = " << L);
    const coeffs<T> k = random_coeffs<T>(L, 3, 2, 3, 5);
    const Index D = k.D();
    const auto S = k.op();
    const std::vector<MatD> M = k.dense_heads();
    const Mat<T> g = normal<T>(L, D), d = uniform<T>(L, D, 0.1, 1.0), w = normal<T>(4, D), x = normal<T>(L, D);
    const double tol = tolerance<T>();
    // diag(g) S diag(d) conv(w)
    const auto E = iattn::diagonal(g) * S * iattn::diagonal(d) * iattn::causal_conv(w);
    std::vector<MatD> ME;
    for (Index c = 0; c < D; ++c)
      ME.push_back(dense_diagonal(dd(g), c, L) * M[std::size_t(c / k.P)] * dense_diagonal(dd(d), c, L) *
                   dense_conv(dd(w), c, L));
    auto dense_E = [&](Index c) -> const MatD& { return ME[std::size_t(c)]; };
    check_close(iattn::apply(E, x), dense_apply(dense_E, dd(x)), tol);
    for (Index c : {Index(0), D - 1}) check_close(iattn::materialize(E, c), dense_E(c), tol);
    const MatD rE = dd(iattn::row(E, L - 1)), cE = dd(iattn::col(E, L / 2));
    for (Index c = 0; c < D; ++c) {
      check_close(rE.row(c), dense_E(c).row(L - 1), tol);
      check_close(cE.row(c), dense_E(c).col(L / 2).transpose(), tol);
    }
    MatD mean = MatD::Zero(L, L);
    for (Index c = 0; c < D; ++c) mean += dense_E(c);
    check_close(iattn::materialize_mean(E), mean / double(D), tol);
    // S + diag(d)
    const auto Sd = S + iattn::diagonal(d);
    auto dense_Sd = [&](Index c) { return MatD(M[std::size_t(c / k.P)] + dense_diagonal(dd(d), c, L)); };
    check_close(iattn::apply(Sd, x), dense_apply(dense_Sd, dd(x)), tol);
    check_close(iattn::materialize(Sd, 2), dense_Sd(2), tol);
    // flip(S) = J S J
    const auto F = iattn::flip(S);
    auto dense_F = [&](Index c) {
      const MatD& m = M[std::size_t(c / k.P)];
      return MatD(m.reverse());  // rows and columns reversed
    };
    check_close(iattn::apply(F, x), dense_apply(dense_F, dd(x)), tol);
    check_close(iattn::materialize(F, D - 1), dense_F(D - 1), tol);
    const MatD rF = dd(iattn::row(F, 1 % L));
    for (Index c = 0; c < D; ++c) check_close(rF.row(c), dense_F(c).row(1 % L), tol);
  }
}

TEMPLATE_TEST_CASE("complex_semiseparable with theta = 0 is the real Semiseparable", "[complex_semiseparable]", float, double) {
  using T = TestType;
  for (Index L : {Index(7), Index(130), Index(257)}) {
    INFO("L = " << L);
    coeffs<T> k = random_coeffs<T>(L, 4, 2, 2, 6);
    k.theta.setZero();
    const double tol = tolerance<T>();
    const iattn::semiseparable_options so{.heads = 4, .head_dim = 2, .groups = 2};
    const auto Sr = iattn::semiseparable(k.rho, k.Br, k.Cr, so), Si = iattn::semiseparable(k.rho, k.Bi, k.Ci, so);
    // Re((Cr + i Ci) e^rho (Br + i Bi)) = S(rho, Br, Cr) - S(rho, Bi, Ci)
    const auto S = k.op();
    for (Index c : {Index(0), Index(3), Index(7)})
      check_close(iattn::materialize(S, c), dd(iattn::materialize(Sr, c)) - dd(iattn::materialize(Si, c)), tol);
    const Mat<T> x = normal<T>(L, 8);
    check_close(iattn::apply(S, x), dd(iattn::apply(Sr, x)) - dd(iattn::apply(Si, x)), tol);
    // with real B and C it is S(rho, Br, Cr) itself
    coeffs<T> r = k;
    r.Bi.setZero(), r.Ci.setZero();
    const auto S0 = r.op();
    check_close(iattn::apply(S0, x), iattn::apply(Sr, x), tol);
    check_close(iattn::materialize(S0, 5), iattn::materialize(Sr, 5), tol);
    check_close(iattn::row(S0, L - 1), iattn::row(Sr, L - 1), tol);
  }
}

TEMPLATE_TEST_CASE("complex_semiseparable: a reset (rho = -inf) cuts earlier tokens off exactly", "[complex_semiseparable]", float, double) {
  using T = TestType;
  const Index L = 200, N = 4;
  coeffs<T> k = random_coeffs<T>(L, 2, 1, 1, N);
  const T inf = std::numeric_limits<T>::infinity();
  for (Index m = 0; m < N; ++m) k.rho(100, m) = -inf;  // head 0, every state, token 100
  k.rho(37, N + 2) = -inf;                             // head 1, one state
  k.rho(150, N + 1) = -inf;
  const auto S = k.op();
  const MatD M0 = dd(iattn::materialize(S, 0));
  REQUIRE(M0.allFinite());
  for (Index t = 100; t < L; ++t)
    for (Index s = 0; s < 100; ++s) REQUIRE(M0(t, s) == 0.0);
  REQUIRE(M0(150, 120) != 0.0);
  check_all(k, S, k.dense_heads(), tolerance<T>());
}

// Large angles (|theta| up to 1e3 per token) over L = 100000 tokens, float against double with the
// same (float) coefficients: the scans reduce each token's angle on its own, the tiles keep
// block-relative angles and block totals mod 2 pi.
TEST_CASE("complex_semiseparable: L = 100000 with large angles, float against double", "[complex_semiseparable][long]") {
  const Index L = 100000, H = 2, P = 2, N = 4, D = H * P;
  const coeffs<float> kf = random_coeffs<float>(L, H, P, 1, N, -0.02, -0.001, 1000.0);
  const coeffs<double> kd{H, P, 1, N, dd(kf.rho), dd(kf.theta), dd(kf.Br), dd(kf.Bi), dd(kf.Cr), dd(kf.Ci)};
  const auto Sf = kf.op();
  const auto Sd = kd.op();
  const Mat<float> x = normal<float>(L, D);
  const MatD yd = iattn::apply(Sd, dd(x));
  check_close(iattn::apply(Sf, x), yd, 1e-4);
  for (Index t : {L / 2, L - 1}) {
    check_close(iattn::row(Sf, t), iattn::row(Sd, t), 1e-4);
    check_close(iattn::col(Sf, L - 1 - t), iattn::col(Sd, L - 1 - t), 1e-4);
  }
  // the double scan against the oracle on a window: the decays forget the earlier tokens
  const MatD M = dense_complex(kd.rho.bottomRows(300), kd.theta.bottomRows(300), kd.Br.bottomRows(300),
                               kd.Bi.bottomRows(300), kd.Cr.bottomRows(300), kd.Ci.bottomRows(300), H, P, 1, 0);
  const MatD r = dd(iattn::row(Sd, L - 1));
  check_close(r.row(0).tail(300), M.row(299), 1e-10);
}

// Pure rotations (|a| = 1 up to 1e-6 per token, the LRU on the unit circle) keep far tokens alive,
// so tiles far below the diagonal depend on angles summed over the whole sequence.
TEMPLATE_TEST_CASE("complex_semiseparable: far tiles of pure rotations at L = 100000", "[complex_semiseparable][long]", float, double) {
  using T = TestType;
  const Index L = 100000, N = 3;
  const coeffs<float> kf = random_coeffs<float>(L, 1, 1, 1, N, -1e-6, 0.0, 1000.0);
  const coeffs<T> k{1, 1, 1, N, kf.rho.cast<T>(), kf.theta.cast<T>(), kf.Br.cast<T>(), kf.Bi.cast<T>(),
                    kf.Cr.cast<T>(), kf.Ci.cast<T>()};
  const auto S = k.op();
  // The oracle entry by long-double Neumaier sums of the exponents from s+1 to t.
  auto entry = [&](Index t, Index s) {
    double v = 0;
    for (Index m = 0; m < N; ++m) {
      long double rs = 0, as = 0, rc = 0, ac = 0;
      auto add = [](long double& sum, long double& comp, long double v2) {
        const long double u = sum + v2;
        comp += std::fabs(sum) >= std::fabs(v2) ? (sum - u) + v2 : (v2 - u) + sum;
        sum = u;
      };
      for (Index q = s + 1; q <= t; ++q) add(rs, rc, (long double)kf.rho(q, m)), add(as, ac, (long double)kf.theta(q, m));
      const cplx e = std::exp(cplx(double(rs + rc), double(std::remainder(as + ac, 2 * 3.14159265358979323846264338327950288L))));
      v += (cplx(kf.Cr(t, m), kf.Ci(t, m)) * e * cplx(kf.Br(s, m), kf.Bi(s, m))).real();
    }
    return v;
  };
  const double tol = std::is_same_v<T, float> ? 1e-4 : 1e-10;
  for (auto [r0, c0] : {std::pair<Index, Index>{L - 64, 0}, std::pair<Index, Index>{L - 100, L / 2 - 7},
                         std::pair<Index, Index>{70000, 69950}}) {
    INFO("tile at (" << r0 << ", " << c0 << ")");
    const MatD blk = dd(iattn::block(S, 0, {r0, r0 + 64}, {c0, c0 + 64}));
    MatD want = MatD::Zero(8, 8), got(8, 8);
    for (Index i = 0; i < 8; ++i)
      for (Index j = 0; j < 8; ++j) {
        const Index t = r0 + 8 * i + 7 * (i % 2), s = c0 + 8 * j + 3 * (j % 2);
        got(i, j) = blk(t - r0, s - c0);
        if (s <= t) want(i, j) = entry(t, s);
      }
    check_close(got, want, tol);
  }
}

TEST_CASE("complex_semiseparable: one channel at L = 4096, float against double", "[complex_semiseparable][long]") {
  const Index L = 4096, N = 8;
  const coeffs<float> kf = random_coeffs<float>(L, 1, 1, 1, N, -0.01, 0.0, 1000.0);
  const coeffs<double> kd{1, 1, 1, N, dd(kf.rho), dd(kf.theta), dd(kf.Br), dd(kf.Bi), dd(kf.Cr), dd(kf.Ci)};
  const Mat<float> Mf = iattn::materialize(kf.op(), 0);
  const MatD Md = iattn::materialize(kd.op(), 0);
  check_close(Mf, Md, 1e-4);
  // the double matrix against the oracle on its last 300 tokens' rows, where they start
  // (the first 3796 columns of those rows by the tile path; the oracle window starts at L - 300)
  const MatD W = dense_complex(kd.rho.bottomRows(300), kd.theta.bottomRows(300), kd.Br.bottomRows(300),
                               kd.Bi.bottomRows(300), kd.Cr.bottomRows(300), kd.Ci.bottomRows(300), 1, 1, 1, 0);
  check_close(Md.bottomRightCorner(300, 300), W, 1e-10);
}

// Angles past the pack reduction's exact range (4096 in float) take std::cos / std::sin in double;
// NaN angles and log-magnitudes propagate.
TEMPLATE_TEST_CASE("complex_semiseparable: huge and non-finite angles", "[complex_semiseparable]", float, double) {
  using T = TestType;
  const Index L = 90;
  coeffs<T> k = random_coeffs<T>(L, 2, 2, 1, 5, -0.5, -0.01, 2e6);
  check_all(k, k.op(), k.dense_heads(), tolerance<T>());
  k.theta(40, 7) = std::numeric_limits<T>::quiet_NaN();
  k.rho(20, 1) = std::numeric_limits<T>::quiet_NaN();
  const auto S = k.op();
  const Mat<T> x = normal<T>(L, 4), y = iattn::apply(S, x);
  REQUIRE(std::isnan(y(45, 2)));   // head 1 (channels 2, 3), state 2, after token 40
  REQUIRE(std::isfinite(y(39, 2)));
  REQUIRE(std::isnan(y(25, 0)));   // head 0, state 1, after token 20
  REQUIRE(std::isfinite(y(19, 0)));
  const Mat<T> M = iattn::materialize(S, 3);
  REQUIRE(std::isnan(M(45, 10)));
  REQUIRE(std::isfinite(M(39, 10)));
  REQUIRE(std::isfinite(M(45, 41)));  // s = 41: token 40's angle is not in the product
}

TEMPLATE_TEST_CASE("complex_semiseparable: L = 0", "[complex_semiseparable]", float, double) {
  using T = TestType;
  for (Index rows : {Index(0), Index(1)}) {
    const Mat<T> rho = Mat<T>::Zero(rows, 6), theta = Mat<T>::Zero(rows, 6), B = Mat<T>::Zero(0, 3);
    const auto S = iattn::complex_semiseparable(rho, theta, B, B, B, B, {.heads = 2, .head_dim = 2});
    REQUIRE(S.length() == 0);
    REQUIRE(S.state() == 3);
    REQUIRE(iattn::apply(S, Mat<T>(0, 4)).rows() == 0);
    REQUIRE(iattn::materialize(S, 1).size() == 0);
    REQUIRE(iattn::materialize_mean(S).size() == 0);
    REQUIRE_THROWS_AS(iattn::row(S, 0), std::invalid_argument);
  }
}

TEST_CASE("complex_semiseparable: each wrong shape names its argument", "[complex_semiseparable][errors]") {
  using Catch::Matchers::Contains;
  const Index L = 6, H = 2, G = 1, N = 3;
  const MatD rho = uniform<double>(L, H * N, -1, 0), th = normal<double>(L, H * N), B = normal<double>(L, G * N);
  const iattn::complex_semiseparable_options o{.heads = H};
  REQUIRE_NOTHROW(iattn::complex_semiseparable(rho, th, B, B, B, B, o));
  const MatD bad_rows = normal<double>(L + 1, G * N), bad_cols = normal<double>(L, G * N + 1);
  const char* gn = "(L=6, G*N=3)";
  REQUIRE_THROWS_WITH(iattn::complex_semiseparable(rho, th, bad_rows, B, B, B, o), Contains("B_re") && Contains("(7, 3)") && Contains(gn));
  REQUIRE_THROWS_WITH(iattn::complex_semiseparable(rho, th, B, bad_cols, B, B, o), Contains("B_im") && Contains("(6, 4)") && Contains(gn));
  REQUIRE_THROWS_WITH(iattn::complex_semiseparable(rho, th, B, B, bad_rows, B, o), Contains("C_re") && Contains("(7, 3)") && Contains(gn));
  REQUIRE_THROWS_WITH(iattn::complex_semiseparable(rho, th, B, B, B, bad_cols, o), Contains("C_im") && Contains("(6, 4)") && Contains(gn));
  const MatD rho_bad = uniform<double>(L, H * N + 2, -1, 0), th_bad = normal<double>(L - 2, H * N);
  REQUIRE_THROWS_WITH(iattn::complex_semiseparable(rho_bad, th, B, B, B, B, o),
                      Contains("log_mag") && Contains("(6, 8)") && Contains("H*N=6"));
  REQUIRE_THROWS_WITH(iattn::complex_semiseparable(rho, th_bad, B, B, B, B, o),
                      Contains("angle") && Contains("(4, 6)") && Contains("L=6"));
  REQUIRE_THROWS_WITH(iattn::complex_semiseparable(rho, th, B, B, B, B, {.heads = 0}), Contains("options.heads"));
  REQUIRE_THROWS_WITH(iattn::complex_semiseparable(rho, th, B, B, B, B, {.heads = 2, .groups = 3}), Contains("options.groups"));
  REQUIRE_THROWS_WITH(iattn::complex_semiseparable(rho, th, B, B, B, B, {.heads = 2, .state = 4}),
                      Contains("B_re") && Contains("G*N=4"));
  // apply's input
  const auto S = iattn::complex_semiseparable(rho, th, B, B, B, B, o);
  REQUIRE_THROWS_WITH(iattn::apply(S, MatD(L, 3)), Contains("X") && Contains("(6, 3)") && Contains("D=2"));
}

TEST_CASE("complex_semiseparable: a positive log-magnitude is a domain error unless allow_growth", "[complex_semiseparable][errors]") {
  using Catch::Matchers::Contains;
  const Index L = 5, N = 4;
  MatD rho = uniform<double>(L, N, -1, 0);
  const MatD th = normal<double>(L, N), B = normal<double>(L, N);
  rho(2, 3) = 0.5;
  REQUIRE_THROWS_AS(iattn::complex_semiseparable(rho, th, B, B, B, B, {.heads = 1}), std::domain_error);
  REQUIRE_THROWS_WITH(iattn::complex_semiseparable(rho, th, B, B, B, B, {.heads = 1}),
                      Contains("log_mag[2, 3]") && Contains("0.5") && Contains("allow_growth"));
  const MatD fixed = MatD::Constant(1, N, 0.25);
  REQUIRE_THROWS_WITH(iattn::complex_semiseparable(fixed, th, B, B, B, B, {.heads = 1}), Contains("log_mag[0, 0]"));
  // allow_growth accepts it, and the matrix is still the oracle's
  const auto S = iattn::complex_semiseparable(rho, th, B, B, B, B, {.heads = 1, .allow_growth = true});
  check_close(iattn::materialize(S, 0), dense_complex(rho, th, B, B, B, B, 1, 1, 1, 0), 1e-10);
  // NaN passes the check and propagates
  rho(2, 3) = std::numeric_limits<double>::quiet_NaN();
  const auto Sn = iattn::complex_semiseparable(rho, th, B, B, B, B, {.heads = 1});
  REQUIRE_FALSE(iattn::materialize(Sn, 0).allFinite());
}

TEST_CASE("complex_semiseparable: the pack sin/cos against std::sin/std::cos", "[complex_semiseparable][simd]") {
  auto run = [](auto zero, double lim, double tol) {
    using T = decltype(zero);
    constexpr int W = iattn::simd::width<T>;
    using Pk = iattn::simd::pack<T, W>;
    T in[W], s[W], c[W];
    double worst = 0;
    for (double x = -lim; x <= lim; x += lim / 20011.0) {
      for (int i = 0; i < W; ++i) in[i] = T(x + i * 1e-3);
      Pk ps, pc;
      iattn::cpu_detail::complex_ss::sincos<T>(Pk::load(in), ps, pc);
      ps.store(s), pc.store(c);
      for (int i = 0; i < W; ++i)
        worst = std::max({worst, std::abs(s[i] - std::sin(double(in[i]))), std::abs(c[i] - std::cos(double(in[i])))});
    }
    INFO("limit " << lim << ": worst absolute error " << worst);
    REQUIRE(worst <= tol);
  };
  run(0.0f, 4096.0, 3e-7);
  run(0.0f, 3.0, 2e-7);
  run(0.0, 1048576.0, 3e-16);
  run(0.0, 3.0, 3e-16);
}
