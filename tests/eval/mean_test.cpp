// materialize_mean's GEMM path (backend/cpu/mean.hpp) against the mean of dense per-channel
// matrices built with plain loops, in double: every decay form, strict with bonus, heads and groups,
// linear recurrences, convolutions of width 1 to 16 folded into the injection, sums and scales,
// several channel chunks, token blocks with tails, lambda = -inf, float against double.
#include "support/test_common.hpp"

#include <iattn/models/hyena.hpp>

#include <algorithm>
#include <vector>

#if defined(_OPENMP)
#include <omp.h>
#endif

using namespace test;

namespace {

/// mean_c of diag(P^c) Core^c diag(Q^c) Conv^c with Core^c given densely; P, Q (L or 1, D), empty = ones.
template <class CoreOf>
MatD mean_oracle(Index L, Index D, CoreOf&& core_of, const MatD& P, const MatD& Q, const MatD& w) {
  MatD out = MatD::Zero(L, L);
  const Index K = w.size() ? w.rows() : 1;
  auto at = [](const MatD& d, Index t, Index c) { return d.size() == 0 ? 1.0 : d(d.rows() == 1 ? 0 : t, c); };
  for (Index c = 0; c < D; ++c) {
    const MatD S = core_of(c);
    for (Index t = 0; t < L; ++t)
      for (Index sp = 0; sp <= t; ++sp) {
        double v = 0;
        for (Index lag = 0; lag < K && sp + lag <= t; ++lag)
          v += (w.size() ? w(K - 1 - lag, c) : 1.0) * at(Q, sp + lag, c) * S(t, sp + lag);
        out(t, sp) += at(P, t, c) * v / double(D);
      }
  }
  return out;
}

template <class H>
bool takes_gemm_path(const H& h, Index L) {
  iattn::cpu_detail::mean_terms<typename H::scalar> terms;
  return iattn::cpu_detail::expand_mean<typename H::scalar>(h, {L, h.channels()}, terms);
}

template <class T>
void check_mamba1(Index L, Index D, Index N, Index K) {
  INFO("L = " << L << ", D = " << D << ", N = " << N << ", K = " << K);
  const Mat<T> g = normal<T>(L, D), dt = uniform<T>(L, D, 0.001, 0.3), A = -uniform<T>(D, N, 0.5, 16.0);
  const Mat<T> B = normal<T>(L, N), C = normal<T>(L, N), sig = uniform<T>(L, D, 0, 1), w = normal<T>(K, D, 0.5);
  MatD lam(L, D * N);
  for (Index t = 0; t < L; ++t)
    for (Index c = 0; c < D; ++c)
      for (Index m = 0; m < N; ++m) lam(t, c * N + m) = double(dt(t, c)) * double(A(c, m));
  using namespace iattn;
  const auto H = diagonal(g) * semiseparable(factored_decay(dt, A), B, C, {.heads = D}) * diagonal(dt) *
                 diagonal(sig) * causal_conv(w);
  REQUIRE(takes_gemm_path(H, L));
  const MatD Q = dd(dt).cwiseProduct(dd(sig));
  const MatD ref = mean_oracle(L, D, [&](Index c) { return dense_semiseparable(lam, dd(B), dd(C), D, 1, 1, c); },
                               dd(g), Q, dd(w));
  check_close(materialize_mean(H), ref, std::is_same_v<T, float> ? 2e-5 : 1e-12);
}

}  // namespace

TEST_CASE("mean: Mamba-1 composite, every length, conv widths", "[mean]") {
  for (Index L : lengths)
    for (Index K : {1, 2, 4}) {
      check_mamba1<double>(L, L >= 1000 ? 3 : 5, 4, K);
      check_mamba1<float>(L, L >= 1000 ? 3 : 5, 4, K);
    }
  check_mamba1<double>(40, 3, 3, 16);  // the widest folded convolution
  check_mamba1<double>(7, 3, 3, 16);   // K > L
  // N = 16, K = 4: whole packs per channel at every SIMD width, so every token from K - 1 on takes
  // the fused token pass (mean_core_term::token_fused), blocks' first tokens and tails included.
  for (Index L : {Index(1), Index(3), Index(4), Index(5), Index(64), Index(67), Index(200)}) {
    check_mamba1<double>(L, 5, 16, 4);
    check_mamba1<float>(L, 5, 16, 4);
  }
  // Channels a multiple of the pack width: the fused pass in the channel-minor layout
  // (mean_core_term::token_lanes, fill_lanes). D = 72 at N = 16 takes chunks of 64 and 8 channels,
  // the second in the channel-major layout where a pack is 16 wide, so one call takes both.
  for (Index L : {Index(1), Index(4), Index(5), Index(67), Index(200)})
    for (Index D : {Index(16), Index(72)}) {
      check_mamba1<double>(L, D, 16, 4);
      check_mamba1<float>(L, D, 16, 4);
    }
}

TEST_CASE("mean: one scalar decay per channel, a 4-tap convolution (the channel-minor fused pass)", "[mean]") {
  // lambda (L, D) with every channel its own head: the fused pass's decay read as dt alone (Mode 2).
  for (Index L : {Index(4), Index(67), Index(130)})
    for (Index D : {Index(5), Index(16)}) {
      INFO("L = " << L << ", D = " << D);
      const Index N = 16;
      const MatD lam = uniform<double>(L, D, -2.0, -0.01), B = normal<double>(L, N), C = normal<double>(L, N);
      const MatD r = normal<double>(L, D), k = uniform<double>(L, D, 0.1, 2.0), w = normal<double>(4, D, 0.5);
      using namespace iattn;
      const MatD ref = mean_oracle(L, D, [&](Index c) { return dense_semiseparable(lam, B, C, D, 1, 1, c); }, r, k, w);
      const auto Hx = diagonal(r) * semiseparable(lam, B, C, {.heads = D}) * diagonal(k) * causal_conv(w);
      REQUIRE(takes_gemm_path(Hx, L));
      check_close(materialize_mean(Hx), ref, 1e-12);
      const Mat<float> lf = lam.cast<float>(), Bf = B.cast<float>(), Cf = C.cast<float>();
      const auto Hf = diagonal(Mat<float>(r.cast<float>())) * semiseparable(lf, Bf, Cf, {.heads = D}) *
                      diagonal(Mat<float>(k.cast<float>())) * causal_conv(Mat<float>(w.cast<float>()));
      check_close(materialize_mean(Hf), ref, 2e-5);
    }
}

TEST_CASE("mean: several channel chunks, heads split across chunks", "[mean]") {
  // N = 128: 8 channels per inner chunk of 1024, so 12 channels take two chunks, one head straddling.
  for (Index L : {Index(33), Index(100)}) {
    INFO("L = " << L);
    const Index H = 3, P = 4, G = 1, N = 128, D = H * P;
    const MatD lam = uniform<double>(L, H, -0.5, -0.01), B = normal<double>(L, G * N), C = normal<double>(L, G * N);
    const MatD z = normal<double>(L, D), dt = uniform<double>(L, D, 0.01, 0.2), w = normal<double>(4, D, 0.5);
    using namespace iattn;
    const auto Hx = diagonal(z) * semiseparable(lam, B, C, {.heads = H, .head_dim = P, .groups = G}) * diagonal(dt) *
                    causal_conv(w);
    REQUIRE(takes_gemm_path(Hx, L));
    const MatD ref = mean_oracle(L, D, [&](Index c) { return dense_semiseparable(lam, B, C, H, P, G, c); }, z, dt, w);
    check_close(materialize_mean(Hx), ref, 1e-12);
  }
}

TEST_CASE("mean: per-state decay, groups, strict form with bonus", "[mean]") {
  for (Index L : {Index(1), Index(2), Index(31), Index(32), Index(33), Index(97)})
    for (Index K : {1, 3}) {
      INFO("L = " << L << ", K = " << K);
      const Index H = 4, G = 2, N = 3, D = H;
      const MatD lam = uniform<double>(L, H * N, -1.0, -0.01), B = normal<double>(L, G * N), C = normal<double>(L, G * N);
      const MatD bonus = normal<double>(H, N), r = uniform<double>(L, D, 0, 1), k = uniform<double>(L, D, 0.1, 2.0);
      const MatD w = normal<double>(K, D, 0.5);
      using namespace iattn;
      const auto S = semiseparable(lam, B, C, bonus, {.heads = H, .groups = G});
      REQUIRE(S.strict());
      const auto Hx = diagonal(r) * S * diagonal(k) * causal_conv(w);
      REQUIRE(takes_gemm_path(Hx, L));
      const MatD ref =
          mean_oracle(L, D, [&](Index c) { return dense_semiseparable(lam, B, C, H, 1, G, c, true, &bonus); }, r, k, w);
      check_close(materialize_mean(Hx), ref, 1e-12);
      const auto plain = diagonal(r) * S;  // no conv: the bonus diagonal alone is the band
      check_close(materialize_mean(plain),
                  mean_oracle(L, D, [&](Index c) { return dense_semiseparable(lam, B, C, H, 1, G, c, true, &bonus); }, r,
                              MatD(), MatD()),
                  1e-12);
    }
}

TEST_CASE("mean: per-state decay with groups and a 4-tap convolution, not strict (the fused token pass)", "[mean]") {
  for (Index L : {Index(3), Index(4), Index(65), Index(130)}) {
    INFO("L = " << L);
    const Index H = 3, G = 3, N = 16, D = H;
    const MatD lam = uniform<double>(L, H * N, -2.0, -0.01), B = normal<double>(L, G * N), C = normal<double>(L, G * N);
    const MatD r = normal<double>(L, D), k = uniform<double>(L, D, 0.1, 2.0), w = normal<double>(4, D, 0.5);
    using namespace iattn;
    const auto S = semiseparable(lam, B, C, {.heads = H, .groups = G});
    REQUIRE_FALSE(S.strict());
    const MatD ref = mean_oracle(L, D, [&](Index c) { return dense_semiseparable(lam, B, C, H, 1, G, c); }, r, k, w);
    const auto Hx = diagonal(r) * S * diagonal(k) * causal_conv(w);
    REQUIRE(takes_gemm_path(Hx, L));
    check_close(materialize_mean(Hx), ref, 1e-12);
    const Mat<float> lf = lam.cast<float>(), Bf = B.cast<float>(), Cf = C.cast<float>();
    const auto Hf = diagonal(Mat<float>(r.cast<float>())) * semiseparable(lf, Bf, Cf, {.heads = H, .groups = G}) *
                    diagonal(Mat<float>(k.cast<float>())) * causal_conv(Mat<float>(w.cast<float>()));
    check_close(materialize_mean(Hf), ref, 2e-5);
  }
}

TEST_CASE("mean: linear recurrence with a masked convolution (Griffin's form)", "[mean]") {
  for (Index L : {Index(1), Index(7), Index(64), Index(257)}) {
    INFO("L = " << L);
    const Index D = 6;
    const MatD a = uniform<double>(L, D, -0.9, 0.99), b = normal<double>(L, D), gate = normal<double>(L, D);
    const MatD m1 = uniform<double>(L, D, 0, 1), m2 = uniform<double>(L, D, 0, 1);
    const MatD w1 = normal<double>(1, D), w2 = normal<double>(3, D);
    using namespace iattn;
    const auto Hx = diagonal(gate) * linear_recurrence(a, b) *
                    (diagonal(m1) * causal_conv(w1) + diagonal(m2) * causal_conv(w2));
    REQUIRE(takes_gemm_path(Hx, L));
    const auto lr = [&](Index c) { return dense_linear_recurrence(a, b, c); };
    const MatD ref = mean_oracle(L, D, lr, gate, m1, w1) + mean_oracle(L, D, lr, gate, m2, w2);
    check_close(materialize_mean(Hx), ref, 1e-12);
  }
}

TEST_CASE("mean: sums, scales, identity, skip diagonals and bound group norms", "[mean]") {
  const Index L = 70, D = 5, N = 4;
  const MatD lam = uniform<double>(L, D * N, -0.6, -0.01), B = normal<double>(L, N), C = normal<double>(L, N);
  const MatD g = normal<double>(L, D), skip = normal<double>(1, D), w = normal<double>(4, D, 0.5);
  using namespace iattn;
  const auto S = semiseparable(lam, B, C, {.heads = D});
  const auto Hx = 0.5 * (diagonal(g) * (S + diagonal(skip)) * causal_conv(w)) + 2.0 * identity();
  REQUIRE(takes_gemm_path(Hx, L));
  const auto dense_S = [&](Index c) { return dense_semiseparable(lam, B, C, D, 1, 1, c); };
  MatD ref = 0.5 * mean_oracle(L, D, dense_S, g, MatD(), w);
  ref += 0.5 * mean_oracle(L, D, [&](Index) { return MatD(MatD::Identity(L, L)); }, g.cwiseProduct(MatD::Ones(L, 1) * skip),
                           MatD(), w);
  ref += 2.0 * MatD::Identity(L, L);
  check_close(materialize_mean(Hx), ref, 1e-12);

  // Band terms alone over channels that fill packs and leave a tail (their sums over the channels
  // by packs): diag * conv, conv alone, a diagonal and the identity.
  {
    const Index Db = 37, Lb = 40;
    const MatD gb = normal<double>(Lb, Db), wb = normal<double>(3, Db, 0.5), db = normal<double>(1, Db);
    const auto Hb = diagonal(gb) * causal_conv(wb) + 0.25 * causal_conv(wb) + diagonal(db) + identity();
    REQUIRE(takes_gemm_path(Hb, Lb));
    const auto eye = [&](Index) { return MatD(MatD::Identity(Lb, Lb)); };
    MatD refb = mean_oracle(Lb, Db, eye, gb, MatD(), wb) + 0.25 * mean_oracle(Lb, Db, eye, MatD(), MatD(), wb) +
                mean_oracle(Lb, Db, eye, MatD::Ones(Lb, 1) * db, MatD(), MatD()) + MatD(MatD::Identity(Lb, Lb));
    check_close(materialize_mean(Hb), refb, 1e-12);
    const auto Hf = diagonal(Mat<float>(gb.cast<float>())) * causal_conv(Mat<float>(wb.cast<float>())) + identity();
    check_close(materialize_mean(Hf), mean_oracle(Lb, Db, eye, gb, MatD(), wb) + MatD(MatD::Identity(Lb, Lb)), 2e-6);
  }

  // A bound RMS group norm is a diagonal on the left.
  const MatD x = normal<double>(L, D);
  const auto normed = bind(group_norm(1, uniform<double>(1, D, 0.5, 1.5)) * diagonal(g) * S * causal_conv(w), x);
  REQUIRE(takes_gemm_path(normed, L));
  MatD mean = MatD::Zero(L, L);
  for (Index c = 0; c < D; ++c) mean += MatD(materialize(normed, c)) / double(D);  // the tile path
  check_close(materialize_mean(normed), mean, 1e-12);
}

TEST_CASE("mean: zero decays and long strong decay stay exact and finite", "[mean]") {
  const Index L = 300, D = 4, N = 8;
  MatD lam = uniform<double>(L, D * N, -3.0, -0.5);
  // Zero decays inside blocks of G and at the first token of one (128: its pair with the block
  // before it, and the decay that the second of a pair of row blocks carries).
  std::vector<Index> zero;
  for (Index t = 10; t < L; t += 37) zero.push_back(t);
  zero.push_back(128);
  for (Index t : zero) lam.row(t).setConstant(-std::numeric_limits<double>::infinity());
  const MatD B = normal<double>(L, N), C = normal<double>(L, N), w = normal<double>(4, D, 0.5);
  using namespace iattn;
  const auto Hd = semiseparable(lam, B, C, {.heads = D}) * causal_conv(w);
  const MatD ref = mean_oracle(L, D, [&](Index c) { return dense_semiseparable(lam, B, C, D, 1, 1, c); }, MatD(), MatD(), w);
  check_close(materialize_mean(Hd), ref, 1e-12);
  const Mat<float> lf = lam.cast<float>(), Bf = B.cast<float>(), Cf = C.cast<float>(), wf = w.cast<float>();
  const Mat<float> mf = materialize_mean(semiseparable(lf, Bf, Cf, {.heads = D}) * causal_conv(wf));
  REQUIRE(mf.allFinite());
  check_close(mf, ref, 1e-5);
  // Rows right after a zero decay see nothing of the tokens before it.
  for (Index t : zero)
    for (Index s = 0; s + 4 <= t; ++s) REQUIRE(mf(t, s) == 0.0f);
}

TEMPLATE_TEST_CASE("mean: sums with flipped terms (Vision Mamba's form), signed, abs and channel ranges", "[mean]", float,
                   double) {
  // H = s (diag(g) S_f diag(q) conv_f + diag(k)) + s flip(diag(g') S_b diag(q') conv_b): the signed
  // mean is taken term by term (a flipped term's as J mean J), the abs mean on the tile path; both
  // against per-channel dense matrices from plain loops.
  using T = TestType;
  const Index D = 5, N = 3, K = 4;
  for (Index L : {Index(1), Index(9), Index(70)}) {
    INFO("L = " << L);
    struct side {
      Mat<T> g, dt, A, B, C, w;
      MatD lam;
    };
    auto make = [&] {
      side d{normal<T>(L, D), uniform<T>(L, D, 0.001, 0.3), -uniform<T>(D, N, 0.5, 8.0), normal<T>(L, N), normal<T>(L, N),
             normal<T>(K, D, 0.5), MatD(L, D * N)};
      for (Index t = 0; t < L; ++t)
        for (Index c = 0; c < D; ++c)
          for (Index m = 0; m < N; ++m) d.lam(t, c * N + m) = double(d.dt(t, c)) * double(d.A(c, m));
      return d;
    };
    const side f = make(), b = make();
    const Mat<T> skip = normal<T>(1, D);
    using namespace iattn;
    auto term = [&](const side& d) {
      return diagonal(d.g) * semiseparable(factored_decay(d.dt, d.A), d.B, d.C, {.heads = D}) * diagonal(d.dt) *
             causal_conv(d.w);
    };
    const T s = T(0.5);
    const auto H = s * (term(f) + diagonal(skip)) + s * flip(term(b));
    auto channel = [&](const side& d, Index c) {  // channel c of one side's term, dense
      const MatD S = dense_semiseparable(d.lam, dd(d.B), dd(d.C), D, 1, 1, c);
      return mean_oracle(L, 1, [&](Index) { return S; }, dd(d.g).col(c), dd(d.dt).col(c), dd(d.w).col(c));
    };
    std::vector<MatD> dense;
    for (Index c = 0; c < D; ++c) {
      MatD m = channel(f, c) + MatD(double(skip(0, c)) * MatD::Identity(L, L));
      m += channel(b, c).reverse();
      dense.push_back(0.5 * m);
    }
    auto mean_of = [&](Index c0, Index c1, bool abs) {
      MatD m = MatD::Zero(L, L);
      for (Index c = c0; c < c1; ++c) m += (abs ? MatD(dense[std::size_t(c)].cwiseAbs()) : dense[std::size_t(c)]) / double(c1 - c0);
      return m;
    };
    const double tol = std::is_same_v<T, float> ? 2e-5 : 1e-12;
    check_close(materialize_mean(H), mean_of(0, D, false), tol);
    check_close(materialize_mean(H, {.channels = range{1, 4}}), mean_of(1, 4, false), tol);
    check_close(materialize_mean(H, {.abs = true}), mean_of(0, D, true), tol);
    MatD flipped = MatD::Zero(L, L);  // a flip alone
    for (Index c = 0; c < D; ++c) flipped += channel(b, c).reverse() / double(D);
    check_close(materialize_mean(flip(term(b))), flipped, tol);
  }
}

TEST_CASE("mean: expressions outside the form take the tile path", "[mean]") {
  const Index L = 20, D = 3, N = 2;
  const MatD lam = uniform<double>(L, D * N, -0.6, -0.01), B = normal<double>(L, N), C = normal<double>(L, N);
  using namespace iattn;
  const auto S = semiseparable(lam, B, C, {.heads = D});
  REQUIRE_FALSE(takes_gemm_path(flip(S), L));
  REQUIRE_FALSE(takes_gemm_path(S * S, L));                                    // two cores
  REQUIRE_FALSE(takes_gemm_path(causal_conv(normal<double>(2, D)) * S, L));    // conv not rightmost
  REQUIRE_FALSE(takes_gemm_path(S * causal_conv(normal<double>(17, D)), L));   // conv wider than 16
  REQUIRE(takes_gemm_path(causal_conv(normal<double>(40, D)), L));            // a band on its own
  MatD mean = MatD::Zero(L, L);
  for (Index c = 0; c < D; ++c) mean += MatD(materialize(S * S, c)) / double(D);
  check_close(materialize_mean(S * S), mean, 1e-12);
}

TEMPLATE_TEST_CASE("mean: a convolution as the core, diag * conv * diag * conv (the Hyena's form)", "[mean][toeplitz]", float,
                   double) {
  // toeplitz_mean.hpp: the long convolution is each channel's Toeplitz core, the short one its
  // injection; gates varying over tokens take the entry-by-entry form, gates fixed over tokens the
  // kernels' form. Against mean_oracle in double, signed and |.|, all channels and a range; the
  // Hyena's own decomposition against the forced tile path.
  using T = TestType;
  namespace cd = iattn::cpu_detail;
  const double tol = std::is_same_v<T, float> ? 2e-5 : 1e-12;
  for (Index L : {Index(1), Index(9), Index(70)}) {
    INFO("L = " << L);
    const Index D = 5, KL = std::max<Index>(1, L - 2), K = 3;
    const Mat<T> x0 = normal<T>(L, D), x1 = normal<T>(L, D), bias = normal<T>(1, D), h = normal<T>(KL, D, 0.5),
                 w = normal<T>(K, D), f0 = normal<T>(1, D), f1 = normal<T>(1, D);
    using namespace iattn;
    auto hyena = [&](const Mat<T>& a, const Mat<T>& b) {
      return diagonal(a) * (causal_conv(h) + diagonal(bias)) * diagonal(b) * causal_conv(w);
    };
    auto oracle = [&](const MatD& a, const MatD& b, Index c0, Index c1, bool abs) {
      // the dense per-channel matrices, then their (|.|) mean over [c0, c1)
      MatD out = MatD::Zero(L, L);
      for (Index c = c0; c < c1; ++c) {
        const MatD M = dense_diagonal(a, c, L) * (dense_conv(dd(h), c, L) + dense_diagonal(dd(bias), c, L)) *
                       dense_diagonal(b, c, L) * dense_conv(dd(w), c, L);
        out += abs ? MatD(M.cwiseAbs()) : M;
      }
      return MatD(out / double(c1 - c0));
    };
    for (bool gated : {true, false}) {
      INFO("gates varying over tokens: " << gated);
      const Mat<T>& a = gated ? x0 : f0;
      const Mat<T>& b = gated ? x1 : f1;
      const auto H = hyena(a, b);
      cd::mean_terms<T> terms;
      REQUIRE(cd::expand_terms<T>(H, {L, D}, terms));
      REQUIRE(terms.size() == 2);
      REQUIRE(std::count_if(terms.begin(), terms.end(), [](const auto& t) { return t.tconv != nullptr; }) == 1);
      REQUIRE(cd::toeplitz_mean_takes(terms, L, false));
      REQUIRE(cd::toeplitz_mean_takes(terms, L, true) == (!gated || L == 1));
      for (bool abs : {false, true}) {
        INFO("abs = " << abs);
        check_close(materialize_mean(H, mean_options{.abs = abs}, L), oracle(dd(a), dd(b), 0, D, abs), tol);
        check_close(materialize_mean(H, mean_options{.abs = abs, .channels = range{1, 4}}, L), oracle(dd(a), dd(b), 1, 4, abs), tol);
      }
    }
  }
  // The Hyena's decomposition: the same means as the per-channel tile path, and the same bits on
  // every call and any number of threads.
  const auto w = iattn::models::hyena_init<T>({.d_model = 12, .l_max = 40}, 3);
  const auto dec = iattn::models::hyena_decompose(w, normal<T>(33, 12));
  const cd::context cx{33, dec.H.channels()};
  for (bool abs : {false, true})
    check_close(materialize_mean(dec.H, iattn::mean_options{.abs = abs}),
                dd(cd::materialize_mean<T>(dec.H, cx, {0, cx.D, abs}, cd::mean_path::channels)), tol);
  const Mat<T> first = iattn::materialize_mean(dec.H);
#if defined(_OPENMP)
  const int threads0 = omp_get_max_threads();
  for (int threads : {1, 2, 3, 4}) {
    omp_set_num_threads(threads);
    REQUIRE((iattn::materialize_mean(dec.H).array() == first.array()).all());
  }
  omp_set_num_threads(threads0);
#else
  REQUIRE((iattn::materialize_mean(dec.H).array() == first.array()).all());
#endif
}

namespace {

/// Dense per-channel WKV matrices from plain loops in double: score, its row log-sum-exp, exp.
/// w (L or 1, D), k (L, D), u (1, D), r (L or 1, D) or empty; abs takes |r|.
MatD wkv_mean_oracle(const MatD& w, const MatD& k, const MatD& u, const MatD& r, Index c0, Index c1, bool abs) {
  const Index L = k.rows();
  MatD out = MatD::Zero(L, L);
  for (Index c = c0; c < c1; ++c)
    for (Index t = 0; t < L; ++t) {
      std::vector<double> score(std::size_t(t + 1));
      double decay = 0, mx = -INFINITY;
      score[std::size_t(t)] = u(0, c) + k(t, c);
      for (Index s = t - 1; s >= 0; --s) {  // decay = sum_{s<q<t} w_q
        score[std::size_t(s)] = decay + k(s, c);
        decay += w(w.rows() == 1 ? 0 : s, c);
      }
      for (double v : score) mx = std::max(mx, v);
      double z = 0;
      for (double v : score) z += std::exp(v - mx);
      const double rt = r.size() ? r(r.rows() == 1 ? 0 : t, c) : 1.0;
      for (Index s = 0; s <= t; ++s)
        out(t, s) += (abs ? std::abs(rt) : rt) * std::exp(score[std::size_t(s)] - mx) / z / double(c1 - c0);
    }
  return out;
}

template <class T>
void check_wkv_mean(Index L, Index D, bool per_token, bool resets, double key_range) {
  INFO("L = " << L << ", D = " << D << ", per-token w " << per_token << ", resets " << resets << ", keys +-" << key_range);
  Mat<T> w = -uniform<T>(per_token ? L : 1, D, 0.0, 1.5);
  if (resets)
    for (Index t = 5; t < w.rows(); t += 23) w.row(t).setConstant(-std::numeric_limits<T>::infinity());
  const Mat<T> k = uniform<T>(L, D, -key_range, key_range), u = normal<T>(1, D), r = normal<T>(L, D);
  using namespace iattn;
  const auto H = diagonal(r) * wkv(w, k, u);
  const double tol = std::is_same_v<T, float> ? 2e-5 : 1e-12;
  check_close(materialize_mean(H), wkv_mean_oracle(dd(w), dd(k), dd(u), dd(r), 0, D, false), tol);
  check_close(materialize_mean(H, {.abs = true}), wkv_mean_oracle(dd(w), dd(k), dd(u), dd(r), 0, D, true), tol);
  check_close(materialize_mean(wkv(w, k, u)), wkv_mean_oracle(dd(w), dd(k), dd(u), MatD(), 0, D, false), tol);
  if (D >= 4) {  // one head of a range, and a scale
    const mean_options o{.channels = range{D / 4, 2 * (D / 4)}};
    check_close(materialize_mean(H, o), wkv_mean_oracle(dd(w), dd(k), dd(u), dd(r), D / 4, 2 * (D / 4), false), tol);
    check_close(materialize_mean(T(0.5) * H), MatD(0.5 * wkv_mean_oracle(dd(w), dd(k), dd(u), dd(r), 0, D, false)), tol);
  }
}

}  // namespace

TEST_CASE("mean: RWKV-4's diag(r) Wkv as blocked products (wkv_mean.hpp)", "[mean][wkv]") {
  for (Index L : {1, 2, 15, 16, 17, 47, 100})
    for (bool per_token : {false, true}) {
      check_wkv_mean<double>(L, 9, per_token, per_token, 3.0);
      check_wkv_mean<float>(L, 9, per_token, per_token, 3.0);
    }
  // Keys of +-80 in float (e^80 would overflow a factor taken alone), tails of every pack width.
  check_wkv_mean<float>(70, 37, false, false, 80.0);
  check_wkv_mean<double>(70, 37, true, true, 80.0);
  // More channels than one chunk of 512, and a long row block count.
  check_wkv_mean<double>(40, 530, false, false, 5.0);
  check_wkv_mean<float>(333, 20, false, false, 5.0);
}
