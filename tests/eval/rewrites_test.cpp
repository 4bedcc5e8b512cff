// Every structured rewrite of Product (backend/cpu/product.hpp) against the dense product of the
// factors' oracles: diag*diag, diag*S, S*diag, S*conv (semiseparable plus a band), conv*S, the
// fused Mamba-1 chain, and the dense fallback (S*S, LR*flip).
#include <cstring>
#include <vector>

#include "support/expressions.hpp"

using namespace test;

namespace {

// Products with a lower band matrix M (M(t, s) = 0 unless 0 <= t - s < K: a causal convolution, a
// diagonal, their sums), by plain loops over the band: O(L^2 K) instead of O(L^3). X M runs along
// X's rows (the matrices are row-major) with M's band copied out once: column by column through
// Eigen's checked accessors, it was half of this file's time under the sanitizers.
MatD times_band(const MatD& X, const MatD& M, Index K) {  // X M
  const Index n = M.cols();
  std::vector<double> band(static_cast<std::size_t>(n * K), 0.0);  // band[s K + j] = M(s + j, s)
  for (Index s = 0; s < n; ++s)
    for (Index t = s; t < std::min<Index>(M.rows(), s + K); ++t) band[std::size_t(s * K + t - s)] = M(t, s);
  MatD Y = MatD::Zero(X.rows(), n);
  for (Index r = 0; r < X.rows(); ++r) {
    const double* x = X.data() + r * X.cols();
    double* y = Y.data() + r * n;
    for (Index s = 0; s < n; ++s)
      for (Index j = 0; j < K; ++j) {  // band entries past M's last row are 0: x is not read there
        const double m = band[std::size_t(s * K + j)];
        if (m != 0.0) y[s] += x[s + j] * m;
      }
  }
  return Y;
}
// A B for lower-triangular (causal) A and B: entry (t, s) sums A(t, k) B(k, s) over s <= k <= t
// only (L^3 / 6 multiplications instead of a dense product's L^3).
MatD causal_times_causal(const MatD& A, const MatD& B) {
  const Index L = A.rows();
  MatD Y = MatD::Zero(L, L);
  for (Index t = 0; t < L; ++t) {
    const double* a = A.data() + t * L;
    double* y = Y.data() + t * L;
    for (Index k = 0; k <= t; ++k) {
      const double* b = B.data() + k * L;
      for (Index s = 0; s <= k; ++s) y[s] += a[k] * b[s];
    }
  }
  return Y;
}
MatD band_times(const MatD& M, Index K, const MatD& X) {  // M X
  MatD Y = MatD::Zero(M.rows(), X.cols());
  for (Index t = 0; t < M.rows(); ++t)
    for (Index s = std::max<Index>(0, t - K + 1); s <= t; ++s)
      if (M(t, s) != 0.0) Y.row(t) += M(t, s) * X.row(s);
  return Y;
}

}  // namespace

TEMPLATE_TEST_CASE("product rewrites equal the dense products", "[rewrites]", float, double) {
  using T = TestType;
  using namespace iattn;
  const Index D = 3, N = 5;
  for (Index L : lengths) {
    INFO("L = " << L);
    const Mat<T> d = normal<T>(L, D), e = normal<T>(L, D), a = uniform<T>(L, D, 0.2, 0.95), b = normal<T>(L, D);
    const Mat<T> lam = uniform<T>(L, D * N, -1, -0.01), B = normal<T>(L, N), C = normal<T>(L, N);
    const Mat<T> w4 = normal<T>(4, D), wl = normal<T>(std::min<Index>(L, 80), D, 0.2);
    auto S = semiseparable(lam, B, C, {.heads = D});
    auto R = linear_recurrence(a, b);
    const double tol = tolerance<T>();
    for (Index c : {Index(0), D - 1}) {
      const MatD Dd = dense_diagonal(dd(d), c, L), De = dense_diagonal(dd(e), c, L);
      const MatD Sd = dense_semiseparable(dd(lam), dd(B), dd(C), D, 1, 1, c);
      const MatD Rd = dense_linear_recurrence(dd(a), dd(b), c);
      const MatD M4 = dense_conv(dd(w4), c, L), Ml = dense_conv(dd(wl), c, L);
      // the diagonal factors of the dense products as scalings (O(L^2) instead of O(L^3)): the
      // same matrices, and the L = 1000 cases stay cheap under the sanitizers
      const auto dD = Dd.diagonal().asDiagonal(), dE = De.diagonal().asDiagonal();
      const MatD Da = dense_diagonal(dd(a), c, L);
      const Index K4 = 4, Kl = wl.rows();
      const auto dA = Da.diagonal().asDiagonal();
      { INFO("diag(d) diag(e) = diag(d e)"); check_close(materialize(diagonal(d) * diagonal(e), c, L), MatD(dD * De), tol); }
      { INFO("diag(d) S = S(l, B, diag(d) C)"); check_close(materialize(diagonal(d) * S, c), dD * Sd, tol); }
      { INFO("S diag(e) = S(l, diag(e) B, C)"); check_close(materialize(S * diagonal(e), c), Sd * dE, tol); }
      { INFO("S conv = semiseparable plus a band");
        check_close(materialize(S * causal_conv(w4), c), times_band(Sd, M4, K4), tol);
        check_close(materialize(S * causal_conv(wl), c), times_band(Sd, Ml, Kl), tol);
      }
      { INFO("conv S"); check_close(materialize(causal_conv(w4) * S, c), band_times(M4, K4, Sd), tol); }
      { INFO("conv conv"); check_close(materialize(causal_conv(w4) * causal_conv(wl), c, L), times_band(M4, Ml, Kl), tol); }
      { INFO("LR conv (Griffin's recurrence after its conv)");
        check_close(materialize(diagonal(d) * R * causal_conv(w4), c), dD * times_band(Rd, M4, K4), tol);
      }
      { INFO("bands that are sums and products of diagonals and convolutions (Griffin's masked conv)");
        const auto band = diagonal(d) * causal_conv(w4) + diagonal(e) * causal_conv(wl) + 0.5 * diagonal(a);
        const MatD Bd = dD * M4 + dE * Ml + 0.5 * Da;
        check_close(materialize(band, c, L), Bd, tol);
        check_close(materialize(diagonal(d) * R * band, c), dD * times_band(Rd, Bd, Kl), tol);
        check_close(materialize(S * (causal_conv(w4) * diagonal(e) + diagonal(d)), c), times_band(Sd, MatD(M4 * dE + Dd), K4), tol);
        check_close(materialize(band * S, c), band_times(Bd, Kl, Sd), tol);
      }
      { INFO("fused diag S diag diag conv (Mamba-1 composite)");
        check_close(materialize(diagonal(d) * S * diagonal(e) * diagonal(a) * causal_conv(w4), c),
                    dD * times_band(MatD(Sd * dE * dA), M4, K4), tol);
      }
      { INFO("dense fallbacks: S S, R flip(R)");
        check_close(materialize(S * S, c), causal_times_causal(Sd, Sd), tol);
        if (L <= 257) {
          check_close(materialize(R * flip(R), c), Rd * dense_flip(Rd), tol);
        }
      }
    }
  }
}

TEMPLATE_TEST_CASE("diagonal chains fold into the scans' apply", "[rewrites][fold]", float, double) {
  using T = TestType;
  using namespace iattn;
  const Index H = 4, P = 3, D = H * P, N = 5;
  for (Index L : {Index(1), Index(7), Index(257)}) {
    INFO("L = " << L);
    const Mat<T> g = normal<T>(L, D), dt = uniform<T>(L, D, 0.01, 0.3), u = normal<T>(L, D), k1 = normal<T>(1, D), k2 = normal<T>(1, D);
    const Mat<T> lam = uniform<T>(L, H, -1, -0.01), B = normal<T>(L, N), C = normal<T>(L, N), x = normal<T>(L, D), w4 = normal<T>(4, D);
    const Mat<T> dth = uniform<T>(L, D, 0.01, 0.3), A = uniform<T>(D, N, -2, -0.1), a = uniform<T>(L, D, 0.2, 0.95), b = normal<T>(L, D);
    const auto S = semiseparable(lam, B, C, {.heads = H, .head_dim = P});                   // per head, P > 1
    const auto F = semiseparable(factored_decay(dth, A), B, C, {.heads = D});              // Mamba-1's scan
    const auto R = linear_recurrence(a, b);
    auto dense_of = [&](const auto& e) { return [&](Index c) { return MatD(materialize(e, c, L).template cast<double>()); }; };
    const double tol = tolerance<T>();
    {
      INFO("diag diag S diag diag conv, constant (1, D) diagonals on both sides");
      const auto e = diagonal(k1) * diagonal(g) * S * diagonal(dt) * diagonal(k2) * causal_conv(w4);
      check_close(apply(e, x), dense_apply(dense_of(e), dd(x)), tol);
    }
    {
      INFO("the Mamba-1 composite on the channel-vectorised scan");
      const auto e = diagonal(g) * F * diagonal(dt) * diagonal(u) * causal_conv(w4);
      check_close(apply(e, x), dense_apply(dense_of(e), dd(x)), tol);
    }
    {
      INFO("diag LR diag, and a chain whose core has no folded apply (conv)");
      check_close(apply(diagonal(g) * R * diagonal(u), x), dense_apply(dense_of(diagonal(g) * R * diagonal(u)), dd(x)), tol);
      const auto e = diagonal(k1) * causal_conv(w4) * diagonal(u);
      check_close(apply(e, x), dense_apply(dense_of(e), dd(x)), tol);
    }
    {
      INFO("scalings fold through sums: a skip diagonal, and a second core");
      const auto e = diagonal(g) * (F * diagonal(dt) + diagonal(k1)) * diagonal(u) * causal_conv(w4);
      check_close(apply(e, x), dense_apply(dense_of(e), dd(x)), tol);
      const auto e2 = diagonal(k2) * (S + R * diagonal(u) + diagonal(g)) * diagonal(dt);
      check_close(apply(e2, x), dense_apply(dense_of(e2), dd(x)), tol);
    }
  }
}

// Runs kernel on groups of G packs of z and requires every lane to equal exp2 of the same lane bit
// for bit, and within 2e-7 relative of the true 2^z where accurate(z) holds.
template <int G, class Kernel, class Accurate>
void require_lanes_equal_exp2(std::vector<float> z, Kernel&& kernel, Accurate&& accurate) {
  using P = iattn::simd::pack<float, iattn::simd::width<float>>;
  constexpr int W = iattn::simd::width<float>;
  while (z.size() % (G * W)) z.push_back(-1.f / float(z.size()));
  for (std::size_t i = 0; i < z.size(); i += G * W) {
    P a[G];
    for (int k = 0; k < G; ++k) a[k] = P::load(z.data() + i + std::size_t(k * W));
    kernel(a);
    for (int k = 0; k < G; ++k) {
      float got[W], want[W];
      a[k].store(got);
      exp2(P::load(z.data() + i + std::size_t(k * W))).store(want);
      for (int l = 0; l < W; ++l) {
        const float zi = z[i + std::size_t(k * W + l)];
        INFO("z = " << zi);
        REQUIRE(std::memcmp(&got[l], &want[l], sizeof(float)) == 0);
        if (accurate(zi)) REQUIRE(std::abs(double(got[l]) / std::exp2(double(zi)) - 1.0) < 2e-7);
      }
    }
  }
}

TEST_CASE("exp2_n: the interleaved decay kernel equals exp2 lane by lane", "[rewrites][simd]") {
  const float inf = std::numeric_limits<float>::infinity();
  std::vector<float> z = {0.f, -1.f, -0.5f, 0.5f, -126.9f, -127.f, -127.5f, -300.f, -inf, 127.9f, 128.f, 500.f, 1e-30f, -3.3f};
  for (int i = 0; i < 300; ++i) z.push_back(-40.f + 0.1337f * float(i));
  require_lanes_equal_exp2<4>(z, [](auto& a) { exp2_n(a); },
                              [](float zi) { return std::isfinite(zi) && zi > -126.f && zi < 127.f; });
}

// apply_slabs hands the caller's X and Y to a chain diag * scan * diag * conv (rows read and written
// in place, the convolution formed per token inside the scan): D = 300 is three slabs (128, 128,
// 44), so the row strides differ from the slab width. dt has negative entries at some tokens and A
// one positive entry in one case, so the Mamba-1 scan takes both its exp kernels (exp2_bounded_n
// when every exponent dt * A log2(e) of the token is in [-125, 0], exp2_n otherwise) and switches
// between them mid-scan (positive exponents: options.allow_growth).
TEMPLATE_TEST_CASE("the Mamba-1 composite streams rows in place, across slabs and both exp kernels", "[rewrites][fold]",
                   float, double) {
  using T = TestType;
  using namespace iattn;
  const Index D = 300, N = 4;
  for (Index L : {Index(1), Index(7), Index(70)})
    for (Index K : {Index(4), L})
      for (bool mixed : {false, true}) {
        INFO("L = " << L << ", K = " << K << (mixed ? ", mixed signs" : ", dt >= 0 and A <= 0"));
        const Mat<T> g = normal<T>(L, D), u = normal<T>(L, D), B = normal<T>(L, N), C = normal<T>(L, N);
        const Mat<T> x = normal<T>(L, D), w = normal<T>(K, D, 0.5);
        Mat<T> dt = uniform<T>(L, D, 0.01, 0.3), A = -uniform<T>(D, N, 0.1, 2.0);
        if (mixed) {
          for (Index t = 1; t < L; t += 3) dt(t, (7 * t) % D) = T(-0.05);  // exponents > 0 at these tokens
          A(200, 1) = T(0.5);  // and everywhere in the third slab
        }
        const auto e = diagonal(g) * semiseparable(factored_decay(dt, A), B, C, {.heads = D, .allow_growth = mixed}) * diagonal(dt) *
                       diagonal(u) * causal_conv(w);
        auto dense = [&](Index c) { return MatD(materialize(e, c, L).template cast<double>()); };
        check_close(apply(e, x), dense_apply(dense, dd(x)), tolerance<T>());
        for (Index t : {Index(0), L - 1}) {
          const MatD r = row(e, t).template cast<double>();
          for (Index c : {Index(0), Index(299)}) check_close(r.row(c), dense(c).row(t), tolerance<T>());
        }
      }
}

TEST_CASE("exp2_bounded_n equals exp2 bit for bit on [-125, 0]", "[rewrites][simd]") {
  std::vector<float> z = {0.f, -0.f, -0.5f, -1.5f, -2.5f, -124.5f, -124.9f, -125.f, -1e-30f, -1e-40f};
  for (int i = 0; i < 2000; ++i) z.push_back(-0.0625f * float(i) - 0.0001f * float(i % 7));
  require_lanes_equal_exp2<2>(z, [](auto& a) { exp2_bounded_n(a); }, [](float) { return true; });
  using P = iattn::simd::pack<float, iattn::simd::width<float>>;
  P one[1] = {P::broadcast(0.f)};
  exp2_bounded_n(one);
  float got[iattn::simd::width<float>];
  one[0].store(got);
  REQUIRE(got[0] == 1.f);
}
