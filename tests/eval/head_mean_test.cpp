// The structured channel means (backend/cpu/head_mean.hpp) and their entry points: materialize_mean
// with mean_options (abs, head, channels), materialize_head_means and materialize_all, against the
// dense per-channel mean of materialize(H, c) summed with plain loops (and, for the Mamba-2-like
// composite, a plain-loop dense oracle), in double (1e-10 (1 + max)) and float (1e-4 relative):
// Mamba-2-like, RetNet-like, linear attention (and its row-normalised form), lambda = -inf resets,
// token-constant diagonals, signed factors for the abs mean, heads of P in {1, 3, 64}, N in
// {1, 5, 16}, L in {1, 7, 64, 257}; both paths forced and the automatic choice; the models' H.
#include "support/test_common.hpp"

#include <iattn/models/gla.hpp>
#include <iattn/models/linear_attention.hpp>
#include <iattn/models/mamba2.hpp>
#include <iattn/models/retnet.hpp>

using namespace test;
using iattn::cpu_detail::mean_path;

namespace {

/// Every channel's materialize(H, c) in double, once per expression (the oracle of every mean below).
template <class H>
std::vector<MatD> dense_channels(const H& h, Index L) {
  std::vector<MatD> out;
  for (Index c = 0; c < h.channels(); ++c) out.push_back(dd(iattn::materialize(h, c, L)));
  return out;
}

/// mean over channels [c0, c1) of the dense channel matrices (or of their |.|), plain loops over
/// the entries in storage order (Eigen's checked accessors, row by row, were a fifth of this test's
/// time under the sanitizers).
MatD dense_mean(const std::vector<MatD>& m, Index L, Index c0, Index c1, bool abs) {
  MatD out = MatD::Zero(L, L);
  double* o = out.data();
  bool square = true;
  for (Index c = c0; c < c1; ++c) square = square && m[std::size_t(c)].rows() == L && m[std::size_t(c)].cols() == L;
  REQUIRE(square);
  for (Index c = c0; c < c1; ++c) {
    const double* a = m[std::size_t(c)].data();
    for (Index i = 0; i < L * L; ++i) o[i] += abs ? std::abs(a[i]) : a[i];
  }
  for (Index i = 0; i < L * L; ++i) o[i] /= double(c1 - c0);
  return out;
}

template <class T>
double tol() { return std::is_same_v<T, float> ? 1e-4 : 1e-10; }

/// Every path and option of the mean for expression h against the oracle built from hd, the same
/// expression in double (h itself when T is double).
template <class T, class H, class HD>
void check_means(const H& h, const HD& hd, Index L, Index P, bool expect_heads) {
  using namespace iattn;
  namespace cd = iattn::cpu_detail;
  const Index D = h.channels();
  const cd::context cx{L, D};
  cd::head_plan<T> plan;
  REQUIRE(cd::make_head_plan<T>(h, cx, plan) == expect_heads);
  const std::vector<MatD> dense = dense_channels(hd, L);
  for (bool abs : {false, true}) {
    INFO("abs = " << abs);
    const MatD all = dense_mean(dense, L, 0, D, abs);
    check_close(materialize_mean(h, mean_options{.abs = abs}), all, tol<T>());
    for (mean_path path : {mean_path::channels, mean_path::heads})
      check_close(cd::materialize_mean<T>(h, cx, {0, D, abs}, path), all, tol<T>());
    // One head, and a range that straddles heads.
    const Index hh = D / P - 1;
    check_close(materialize_mean(h, mean_options{.abs = abs, .head = hh}), dense_mean(dense, L, hh * P, (hh + 1) * P, abs),
                tol<T>());
    const range r{P > 1 ? 1 : 0, std::min(D, P + 2)};
    check_close(materialize_mean(h, mean_options{.abs = abs, .channels = r}), dense_mean(dense, L, r.begin, r.end, abs),
                tol<T>());
    const Tensor3<T> heads = materialize_head_means(h, mean_options{.abs = abs});
    REQUIRE(heads.dims == std::array<Index, 3>{D / P, L, L});
    for (Index k = 0; k < D / P; k += std::max<Index>(1, D / P - 1))
      check_close(heads.slice(k), dense_mean(dense, L, k * P, (k + 1) * P, abs), tol<T>());
  }
  const Tensor3<T> every = materialize_all(h);
  REQUIRE(every.dims == std::array<Index, 3>{D, L, L});
  Tensor3<T> into(D, L, L, T(7));
  materialize_all_into(into, h);
  // materialize_all may take all_channels.hpp's path, materialize the tile path: the same matrix to
  // rounding (both against the dense oracle, in double).
  for (Index c = 0; c < D; c += std::max<Index>(1, D / 5)) {
    check_close(every.slice(c), dense[std::size_t(c)], tol<T>());
    REQUIRE(into.slice(c) == every.slice(c));
  }
}

template <class T>
struct mamba2_like {
  Mat<T> lam, B, C, z, dt, skip, sig, w, x, nw;
  Index H, P, G, N;
  mamba2_like(Index L, Index H_, Index P_, Index N_) : H(H_), P(P_), G(H_ > 1 ? 2 : 1), N(N_) {
    const Index D = H * P;
    lam = uniform<T>(L, H, -1.5, -0.01);
    for (Index t = 3; t < L; t += 50) lam(t, 0) = -std::numeric_limits<T>::infinity();  // resets
    B = normal<T>(L, G * N), C = normal<T>(L, G * N), z = normal<T>(L, D), dt = uniform<T>(L, D, 0.01, 0.5);
    skip = normal<T>(1, D), sig = uniform<T>(L, D, 0, 1), w = normal<T>(4, D, 0.5), x = normal<T>(L, D);
    nw = uniform<T>(1, D, 0.5, 1.5);
  }
  auto expr() const {
    using namespace iattn;
    const auto S = semiseparable(lam, B, C, {.heads = H, .head_dim = P, .groups = G});
    const auto body = diagonal(z) * (S * diagonal(dt) + diagonal(skip)) * diagonal(sig) * causal_conv(w);
    return bind(group_norm(G, nw) * body, x);
  }
  template <class U>
  mamba2_like<U> cast() const {
    mamba2_like<U> o(1, 1, 1, 1);
    o.lam = lam.template cast<U>(), o.B = B.template cast<U>(), o.C = C.template cast<U>(), o.z = z.template cast<U>();
    o.dt = dt.template cast<U>(), o.skip = skip.template cast<U>(), o.sig = sig.template cast<U>();
    o.w = w.template cast<U>(), o.x = x.template cast<U>(), o.nw = nw.template cast<U>();
    o.H = H, o.P = P, o.G = G, o.N = N;
    return o;
  }
};

}  // namespace

TEST_CASE("head mean: Mamba-2-like composite, every length, head width and state size", "[head_mean]") {
  for (Index L : {1, 7, 64, 257})
    for (Index P : {1, 3, 64})
      for (Index N : {1, 5, 16}) {
        if (L == 257 && P == 64 && N != 16) continue;  // the widest heads once at the longest length
        INFO("L = " << L << ", P = " << P << ", N = " << N);
        const mamba2_like<double> m(L, 2, P, N);
        const auto h = m.expr();
        check_means<double>(h, h, L, P, P >= 2);
        const auto mf = m.cast<float>();
        check_means<float>(mf.expr(), h, L, P, P >= 2);
      }
}

TEST_CASE("head mean: Mamba-2-like against a plain-loop dense oracle", "[head_mean]") {
  const Index L = 70, H = 2, P = 3, N = 5, D = H * P, G = 2;
  const mamba2_like<double> m(L, H, P, N);
  const auto h = m.expr();
  // The bound norm's diagonal, read back from the expression's first factor.
  MatD nrm(L, D);
  for (Index t = 0; t < L; ++t)
    for (Index c = 0; c < D; ++c) nrm(t, c) = h.left().value(t, c, D);
  MatD ref = MatD::Zero(L, L), refa = MatD::Zero(L, L);
  for (Index c = 0; c < D; ++c) {
    const MatD S = dense_semiseparable(m.lam, m.B, m.C, H, P, G, c);
    MatD core = S * dense_diagonal(m.dt, c, L) + dense_diagonal(m.skip, c, L);
    const MatD Hc = dense_diagonal(nrm, c, L) * dense_diagonal(m.z, c, L) * core * dense_diagonal(m.sig, c, L) *
                    dense_conv(m.w, c, L);
    ref += Hc / double(D);
    refa += Hc.cwiseAbs() / double(D);
  }
  check_close(iattn::materialize_mean(h), ref, 1e-10);
  check_close(iattn::materialize_mean(h, iattn::mean_options{.abs = true}), refa, 1e-10);
  check_close(iattn::materialize_mean(h, {.abs = true}), refa, 1e-10);  // the braced form
  check_close(iattn::materialize_mean(iattn::cpu{}, h, {.abs = true}), refa, 1e-10);
}

TEST_CASE("head mean: RetNet-like, linear attention, signed factors, token-constant diagonals", "[head_mean]") {
  using namespace iattn;
  for (Index L : {1, 7, 64, 257})
    for (Index P : {3, 64})
      for (Index N : {1, 5, 16}) {
        if (L == 257 && N != 5) continue;  // the longest length once per head width
        INFO("L = " << L << ", P = " << P << ", N = " << N);
        const Index H = 2, D = H * P;
        const MatD B = normal<double>(L, H * N), C = normal<double>(L, H * N), g = normal<double>(L, D);
        const MatD v = normal<double>(L, D), rho = uniform<double>(L, D, 0.2, 1.0), cst = normal<double>(1, D);
        MatD lam(L, H);
        lam.col(0).setConstant(std::log(1 - 1.0 / 32));
        lam.col(1).setConstant(std::log(1 - 1.0 / 512));
        const auto S = semiseparable(lam, B, C, {.heads = H, .head_dim = P, .groups = H});
        const MatD x = normal<double>(L, D);
        const auto retnet = bind(diagonal(g) * group_norm<double>(H) * diagonal(rho) * S, x);
        check_means<double>(retnet, retnet, L, P, true);
        // Signed diagonals on both sides, one core, no convolution: |S| (|G||V|^T), with and
        // without a skip band, and a token-constant factor.
        const auto single = diagonal(g) * S * diagonal(v);
        check_means<double>(single, single, L, P, true);
        const auto banded = diagonal(cst) * (S * diagonal(v) + diagonal(cst)) * diagonal(g);
        check_means<double>(banded, banded, L, P, true);
        const auto two = 0.5 * (diagonal(g) * S * diagonal(v)) + (-2.0) * (S * diagonal(cst) * causal_conv(normal<double>(3, D)));
        check_means<double>(two, two, L, P, true);
        // Linear attention: no decay; row-normalised with positive features.
        const MatD zero = MatD::Zero(L, H), Bp = uniform<double>(L, H * N, 0.1, 1), Cp = uniform<double>(L, H * N, 0.1, 1);
        const auto lin = semiseparable(zero, B, C, {.heads = H, .head_dim = P, .groups = H}) * diagonal(v);
        check_means<double>(lin, lin, L, P, true);
        const auto normed = diagonal(rho) * row_normalize(semiseparable(zero, Bp, Cp, {.heads = H, .head_dim = P, .groups = H}));
        check_means<double>(normed, normed, L, P, true);
        const auto Sf = semiseparable(Mat<float>(lam.cast<float>()), Mat<float>(B.cast<float>()), Mat<float>(C.cast<float>()),
                                      {.heads = H, .head_dim = P, .groups = H});
        check_means<float>(diagonal(Mat<float>(g.cast<float>())) * Sf * diagonal(Mat<float>(v.cast<float>())), single, L, P,
                           true);
      }
}

TEST_CASE("head mean: per-state decays and resets share the head's core", "[head_mean]") {
  using namespace iattn;
  const Index L = 100, H = 3, P = 4, N = 5, D = H * P;
  MatD lam = uniform<double>(L, H * N, -0.8, -0.01);
  for (Index t = 20; t < L; t += 33) lam.row(t).setConstant(-std::numeric_limits<double>::infinity());
  const MatD B = normal<double>(L, N), C = normal<double>(L, N), g = normal<double>(L, D), w = normal<double>(2, D);
  const auto h = diagonal(g) * semiseparable(lam, B, C, {.heads = H, .head_dim = P}) * causal_conv(w);
  check_means<double>(h, h, L, P, true);
  // Strict form with a bonus (RWKV-6's shape with P > 1), alone and with a convolution.
  const MatD bonus = normal<double>(H, N), v = normal<double>(L, D);
  const auto strict = diagonal(g) * semiseparable(lam, B, C, bonus, {.heads = H, .head_dim = P}) * diagonal(v);
  check_means<double>(strict, strict, L, P, true);
  const auto strict_conv = strict * causal_conv(w);
  check_means<double>(strict_conv, strict_conv, L, P, true);
  // Rows right after a reset see nothing of the tokens before it (exact zeros).
  const MatD m = materialize_mean(h, mean_options{.abs = true});
  for (Index t = 20; t < L; t += 33)
    for (Index s = 0; s + 2 <= t; ++s) REQUIRE(m(t, s) == 0.0);
}

TEST_CASE("head mean: the models' H against per-channel means", "[head_mean]") {
  using namespace iattn;
  using namespace iattn::models;
  auto check = [](const auto& H, Index P) {
    const Index L = H.length(), D = H.channels();
    REQUIRE(cpu_detail::head_dim_of(H) == P);
    const std::vector<MatD> dense = dense_channels(H, L);
    for (bool abs : {false, true}) {
      check_close(materialize_mean(H, mean_options{.abs = abs}), dense_mean(dense, L, 0, D, abs), 1e-10);
      check_close(materialize_mean(H, mean_options{.abs = abs, .head = 1}), dense_mean(dense, L, P, 2 * P, abs), 1e-10);
    }
  };
  const MatD u = normal<double>(40, 32);
  check(mamba2_decompose(mamba2_init<double>({.d_model = 32, .d_state = 16, .headdim = 16, .ngroups = 2}, 3), u).H, 16);
  check(retnet_decompose(retnet_init<double>({.embed_dim = 32, .value_dim = 64, .num_heads = 4}, 4), u).H, 16);
  check(gla_decompose(gla_init<double>({.hidden_size = 32, .key_dim = 16, .value_dim = 32, .num_heads = 2, .gate_low_rank_dim = 8}, 5), u).H,
        16);
  check(linear_attention_decompose(linear_attention_init<double>({.d_model = 32, .n_heads = 2, .d_keys = 8, .d_values = 16}, 6), u).H,
        16);
}

/// A bidirectional layer built by hand (Vision Mamba's form), s (H_f + flip(H_b)), each direction
/// diag(z) (S diag(dt) + diag(skip)) diag(sig) conv(w): forward a Mamba-1-like S (factored decay,
/// P = 1, N = 5, K = 4), backward a Mamba-2-like S (a decay per head with resets, P = 3, G = 2,
/// N = 4, K = 3), so the two directions differ in state, heads, groups and convolution width.
template <class T>
struct bidir_like {
  static constexpr Index D = 6, Nf = 5, Nb = 4, Hb = 2, Gb = 2;
  Mat<T> dtf, Af, Bf, Cf, zf, skipf, sigf, wf, lamb, Bb, Cb, zb, dtb, sigb, wb;
  explicit bidir_like(Index L) {
    dtf = uniform<T>(L, D, 0.01, 0.6), Af = uniform<T>(D, Nf, -2.0, -0.05);
    Bf = normal<T>(L, Nf), Cf = normal<T>(L, Nf), zf = normal<T>(L, D), skipf = normal<T>(1, D);
    sigf = uniform<T>(L, D, 0, 1), wf = normal<T>(4, D, 0.5);
    lamb = uniform<T>(L, Hb, -1.2, -0.01);
    for (Index t = 2; t < L; t += 23) lamb(t, 1) = -std::numeric_limits<T>::infinity();  // resets
    Bb = normal<T>(L, Gb * Nb), Cb = normal<T>(L, Gb * Nb), zb = normal<T>(L, D), dtb = uniform<T>(L, D, 0.01, 0.5);
    sigb = uniform<T>(L, D, 0, 1), wb = normal<T>(3, D, 0.5);
  }
  template <bool Conv = true>
  auto expr() const {
    using namespace iattn;
    const auto Sf = semiseparable(factored_decay(dtf, Af), Bf, Cf, {.heads = D});
    const auto Sb = semiseparable(lamb, Bb, Cb, {.heads = Hb, .head_dim = D / Hb, .groups = Gb});
    if constexpr (Conv) {
      auto f = diagonal(zf) * (Sf * diagonal(dtf) + diagonal(skipf)) * diagonal(sigf) * causal_conv(wf);
      auto b = diagonal(zb) * (Sb * diagonal(dtb)) * diagonal(sigb) * causal_conv(wb);
      return T(0.5) * (std::move(f) + flip(std::move(b)));
    } else {
      auto f = diagonal(zf) * (Sf * diagonal(dtf) + diagonal(skipf));
      auto b = diagonal(zb) * (Sb * diagonal(dtb));
      return T(0.5) * (std::move(f) + flip(std::move(b)));
    }
  }
  /// Channel c's matrix from plain loops in double.
  MatD dense(Index c, bool conv) const {
    const Index L = dtf.rows();
    MatD lamf(L, D * Nf);  // the factored decay written out
    for (Index t = 0; t < L; ++t)
      for (Index h = 0; h < D; ++h)
        for (Index m = 0; m < Nf; ++m) lamf(t, h * Nf + m) = double(dtf(t, h)) * double(Af(h, m));
    MatD f = dense_diagonal(dd(zf), c, L) *
             (dense_semiseparable(lamf, dd(Bf), dd(Cf), D, 1, 1, c) * dense_diagonal(dd(dtf), c, L) +
              dense_diagonal(dd(skipf), c, L));
    MatD b = dense_diagonal(dd(zb), c, L) * dense_semiseparable(dd(lamb), dd(Bb), dd(Cb), Hb, D / Hb, Gb, c) *
             dense_diagonal(dd(dtb), c, L);
    if (conv) {
      f = f * dense_diagonal(dd(sigf), c, L) * dense_conv(dd(wf), c, L);
      b = b * dense_diagonal(dd(sigb), c, L) * dense_conv(dd(wb), c, L);
    }
    MatD out(L, L);
    for (Index t = 0; t < L; ++t)
      for (Index s = 0; s < L; ++s) out(t, s) = 0.5 * (f(t, s) + b(L - 1 - t, L - 1 - s));
    return out;
  }
};

/// diag(z) Sc conv(w) + flip_weight J Sc J for channel c: the oracle of a forward term with a
/// convolution plus a flipped core.
static MatD diag_core_conv_plus_flip(const MatD& Sc, const MatD& z, const MatD& w, Index c, Index L, double flip_weight) {
  MatD ref = dense_diagonal(z, c, L) * Sc * dense_conv(w, c, L);
  for (Index t = 0; t < L; ++t)
    for (Index u = 0; u < L; ++u) ref(t, u) += flip_weight * Sc(L - 1 - t, L - 1 - u);
  return ref;
}

template <class T, bool Conv>
void check_bidir(Index L) {
  using namespace iattn;
  INFO("L = " << L << ", conv = " << Conv);
  const bidir_like<T> m(L);
  const auto h = m.template expr<Conv>();
  const Index D = bidir_like<T>::D;
  // The expression takes the structured path (all_channels.hpp): four terms, two of them flipped.
  std::vector<cpu_detail::all_term<T>> terms;
  REQUIRE(cpu_detail::expand_all_terms<T>(h, cpu_detail::context{L, D}, terms));
  REQUIRE(terms.size() == 3);
  REQUIRE(std::count_if(terms.begin(), terms.end(), [](const auto& a) { return a.flipped; }) == 1);
  const Tensor3<T> every = materialize_all(h);
  Tensor3<T> into(D, L, L, T(7));
  materialize_all_into(into, h);
  for (Index c = 0; c < D; ++c) {
    INFO("channel " << c);
    const MatD ref = m.dense(c, Conv);
    check_close(every.slice(c), ref, tol<T>());
    REQUIRE(into.slice(c) == every.slice(c));
    check_close(materialize(h, c), ref, tol<T>());  // the tile path, the same oracle
  }
}

TEST_CASE("materialize_all: flipped and forward diag * S * diag * conv terms against plain loops", "[head_mean][all]") {
  // 130 and 211: products written straight into the output in whole register blocks of columns
  // (48 with AVX-512 float) and a partial one, left and right of each row panel's middle columns.
  for (Index L : {1, 2, 3, 5, 15, 16, 17, 33, 100, 130, 211}) {
    check_bidir<double, true>(L);
    check_bidir<float, true>(L);
  }
  for (Index L : {1, 16, 37}) {
    check_bidir<double, false>(L);
    check_bidir<float, false>(L);
  }
  // A per-state decay (running products rather than one sum per block), forward and flipped.
  for (Index L : {1, 17, 50}) {
    INFO("per-state, L = " << L);
    const Index H = 2, P = 3, N = 5, D = H * P;
    MatD lam = uniform<double>(L, H * N, -0.9, -0.01);
    for (Index t = 4; t < L; t += 19) lam(t, 3) = -std::numeric_limits<double>::infinity();
    const MatD B = normal<double>(L, N), C = normal<double>(L, N), z = normal<double>(L, D), w = normal<double>(3, D);
    const auto S = iattn::semiseparable(lam, B, C, {.heads = H, .head_dim = P});
    const auto h = iattn::diagonal(z) * S * iattn::causal_conv(w) + 2.0 * iattn::flip(S);
    std::vector<iattn::cpu_detail::all_term<double>> terms;
    REQUIRE(iattn::cpu_detail::expand_all_terms<double>(h, iattn::cpu_detail::context{L, D}, terms));
    const iattn::Tensor3<double> all = iattn::materialize_all(h);
    for (Index c = 0; c < D; ++c) {
      const MatD Sc = dense_semiseparable(lam, B, C, H, P, 1, c);
      check_close(all.slice(c), diag_core_conv_plus_flip(Sc, z, w, c, L, 2.0), tol<double>());
    }
  }
  // A factored decay shared by the channels of each head (dt per head, A per head and state): the
  // gathered dt of channel c is its head's column; D = 12 and L = 50 leave channels and tokens past
  // the 8 x 8 transposes of the gather.
  for (Index L : {1, 17, 50}) {
    INFO("factored, head_dim 4, L = " << L);
    const Index H = 3, P = 4, N = 5, D = H * P;
    const MatD dt = uniform<double>(L, H, 0.01, 0.9), A = uniform<double>(H, N, -1.5, -0.1);
    const MatD B = normal<double>(L, N), C = normal<double>(L, N), z = normal<double>(L, D), w = normal<double>(4, D);
    MatD lam(L, H * N);
    for (Index t = 0; t < L; ++t)
      for (Index hh = 0; hh < H; ++hh)
        for (Index m = 0; m < N; ++m) lam(t, hh * N + m) = dt(t, hh) * A(hh, m);
    auto run = [&](auto one) {
      using T = decltype(one);
      auto cast = [](const MatD& x) { return Mat<T>(x.cast<T>()); };
      const auto S = iattn::semiseparable(iattn::factored_decay(cast(dt), cast(A)), cast(B), cast(C), {.heads = H, .head_dim = P});
      const auto h = iattn::diagonal(cast(z)) * S * iattn::causal_conv(cast(w)) + T(0.5) * iattn::flip(S);
      const iattn::Tensor3<T> all = iattn::materialize_all(h);
      for (Index c = 0; c < D; ++c) {
        const MatD Sc = dense_semiseparable(lam, B, C, H, P, 1, c);
        check_close(all.slice(c), diag_core_conv_plus_flip(Sc, z, w, c, L, 0.5), tol<T>());
      }
    };
    run(double{});
    run(float{});
  }
  // Bands (terms without a core), one wider than the widest convolution folded into a core, beside a
  // core: their taps, forward and flipped.
  for (Index L : {1, 9, 40}) {
    INFO("bands, L = " << L);
    const Index D = 5, N = 3;
    const MatD z = normal<double>(L, D), z2 = normal<double>(L, D), w20 = normal<double>(20, D), w3 = normal<double>(3, D);
    const MatD lam = uniform<double>(L, D * N, -0.7, -0.01), B = normal<double>(L, N), C = normal<double>(L, N);
    const auto S = iattn::semiseparable(lam, B, C, {.heads = D});
    const auto h = iattn::diagonal(z) * iattn::causal_conv(w20) + iattn::flip(iattn::diagonal(z2) * iattn::causal_conv(w3)) + S;
    std::vector<iattn::cpu_detail::all_term<double>> terms;
    REQUIRE(iattn::cpu_detail::expand_all_terms<double>(h, iattn::cpu_detail::context{L, D}, terms));
    const iattn::Tensor3<double> all = iattn::materialize_all(h);
    for (Index c = 0; c < D; ++c) {
      const MatD fwd = dense_diagonal(z, c, L) * dense_conv(w20, c, L), bwd = dense_diagonal(z2, c, L) * dense_conv(w3, c, L);
      MatD ref = fwd + dense_semiseparable(lam, B, C, D, 1, 1, c);
      for (Index t = 0; t < L; ++t)
        for (Index u = 0; u < L; ++u) ref(t, u) += bwd(L - 1 - t, L - 1 - u);
      check_close(all.slice(c), ref, tol<double>());
    }
  }
  // Only flipped terms (nothing writes left of the diagonal but the zeros), two forward terms with
  // cores (the second adds to the first's products in the output), widths 4 and 2.
  for (Index L : {7, 70, 150}) {
    INFO("one direction, L = " << L);
    const Index D = 4, N = 3;
    const MatD lam = uniform<double>(L, D * N, -0.7, -0.01), B = normal<double>(L, N), C = normal<double>(L, N);
    const MatD B2 = normal<double>(L, N), z = normal<double>(L, D), w4 = normal<double>(4, D), w2 = normal<double>(2, D);
    const auto S = iattn::semiseparable(lam, B, C, {.heads = D});
    const auto S2 = iattn::semiseparable(lam, B2, C, {.heads = D});
    const auto back = iattn::flip(iattn::diagonal(z) * S * iattn::causal_conv(w4));
    const auto two = iattn::diagonal(z) * S * iattn::causal_conv(w4) + 3.0 * (S2 * iattn::causal_conv(w2));
    std::vector<iattn::cpu_detail::all_term<double>> terms;
    REQUIRE(iattn::cpu_detail::expand_all_terms<double>(back, iattn::cpu_detail::context{L, D}, terms));
    REQUIRE(iattn::cpu_detail::expand_all_terms<double>(two, iattn::cpu_detail::context{L, D}, terms));
    const iattn::Tensor3<double> b = iattn::materialize_all(back), t = iattn::materialize_all(two);
    iattn::Tensor3<float> bf(D, L, L, 7.f);  // float, into a tensor holding other values
    const auto Sf = iattn::semiseparable(Mat<float>(lam.cast<float>()), Mat<float>(B.cast<float>()), Mat<float>(C.cast<float>()), {.heads = D});
    iattn::materialize_all_into(bf, iattn::flip(iattn::diagonal(Mat<float>(z.cast<float>())) * Sf * iattn::causal_conv(Mat<float>(w4.cast<float>()))));
    for (Index c = 0; c < D; ++c) {
      const MatD Sc = dense_semiseparable(lam, B, C, D, 1, 1, c), S2c = dense_semiseparable(lam, B2, C, D, 1, 1, c);
      const MatD f = dense_diagonal(z, c, L) * Sc * dense_conv(w4, c, L);
      MatD rb(L, L);
      for (Index i = 0; i < L; ++i)
        for (Index j = 0; j < L; ++j) rb(i, j) = f(L - 1 - i, L - 1 - j);
      check_close(b.slice(c), rb, tol<double>());
      check_close(bf.slice(c), rb, tol<float>());
      check_close(t.slice(c), f + 3.0 * S2c * dense_conv(w2, c, L), tol<double>());
    }
  }
  // Wide states (the one-pack diagonal block's whole register groups, forward and flipped) and wide
  // convolutions (K up to max_mean_conv: the tables' pads, a forward pack straddling two blocks, the
  // band's K - 1 diagonals); a per-state decay forward, a factored one flipped.
  for (auto [N, K] : {std::pair<Index, Index>{8, 5}, {9, 16}, {16, 4}, {16, 16}})
    for (Index L : {37, 150}) {
      INFO("N = " << N << ", K = " << K << ", L = " << L);
      const Index D = 3;
      const MatD lam = uniform<double>(L, D * N, -0.7, -0.01), B = normal<double>(L, N), C = normal<double>(L, N);
      const MatD dt = uniform<double>(L, D, 0.01, 0.5), A = uniform<double>(D, N, -1.5, -0.05);
      const MatD z = normal<double>(L, D), w = normal<double>(K, D, 0.5);
      auto f32 = [](const MatD& x) { return Mat<float>(x.cast<float>()); };
      const auto Sp = iattn::semiseparable(lam, B, C, {.heads = D});
      const auto Sa = iattn::semiseparable(iattn::factored_decay(dt, A), B, C, {.heads = D});
      const auto h = iattn::diagonal(z) * Sp * iattn::causal_conv(w) + iattn::flip(Sa * iattn::causal_conv(w));
      const auto Spf = iattn::semiseparable(f32(lam), f32(B), f32(C), {.heads = D});
      const auto Saf = iattn::semiseparable(iattn::factored_decay(f32(dt), f32(A)), f32(B), f32(C), {.heads = D});
      const auto hf = iattn::diagonal(f32(z)) * Spf * iattn::causal_conv(f32(w)) + iattn::flip(Saf * iattn::causal_conv(f32(w)));
      std::vector<iattn::cpu_detail::all_term<double>> terms;
      REQUIRE(iattn::cpu_detail::expand_all_terms<double>(h, iattn::cpu_detail::context{L, D}, terms));
      const iattn::Tensor3<double> all = iattn::materialize_all(h);
      const iattn::Tensor3<float> allf = iattn::materialize_all(hf);
      MatD lamf(L, D * N);
      for (Index t = 0; t < L; ++t)
        for (Index d = 0; d < D; ++d)
          for (Index m = 0; m < N; ++m) lamf(t, d * N + m) = dt(t, d) * A(d, m);
      for (Index c = 0; c < D; ++c) {
        const MatD fw = dense_diagonal(z, c, L) * dense_semiseparable(lam, B, C, D, 1, 1, c) * dense_conv(w, c, L);
        const MatD bw = dense_semiseparable(lamf, B, C, D, 1, 1, c) * dense_conv(w, c, L);
        MatD ref = fw;
        for (Index t = 0; t < L; ++t)
          for (Index u = 0; u < L; ++u) ref(t, u) += bw(L - 1 - t, L - 1 - u);
        check_close(all.slice(c), ref, tol<double>());
        check_close(allf.slice(c), ref, tol<float>());
      }
    }
  // Outside the structured path: a flip inside a product, a strict core; the tile path serves them.
  using namespace iattn;
  const bidir_like<double> m(9);
  const auto Sf = semiseparable(factored_decay(m.dtf, m.Af), m.Bf, m.Cf, {.heads = 6});
  std::vector<cpu_detail::all_term<double>> terms;
  const cpu_detail::context cx{9, 6};
  REQUIRE_FALSE(cpu_detail::expand_all_terms<double>(diagonal(m.zf) * flip(Sf), cx, terms));
  terms.clear();
  const auto strict = semiseparable(m.lamb, m.Bb, m.Cb, {.heads = 2, .head_dim = 3, .groups = 2, .strict = true});
  REQUIRE_FALSE(cpu_detail::expand_all_terms<double>(strict + flip(Sf), cx, terms));
  const auto mixed = diagonal(m.zf) * flip(Sf);
  const Tensor3<double> all = materialize_all(mixed);
  for (Index c = 0; c < 6; ++c) REQUIRE(all.slice(c) == materialize(mixed, c));
}

TEST_CASE("materialize_all: a result large enough to be streamed out", "[head_mean][all]") {
  // D L^2 floats >= stream_min_bytes: every row panel is formed in the cache and copied out with
  // streaming stores. L odd, so channels and panels start at every alignment; the tensor holds
  // other values first, so an element left unwritten shows.
  using namespace iattn;
  const Index L = 301, D = 64, N = 4;
  REQUIRE(std::size_t(D * L * L) * sizeof(float) >= cpu_detail::stream_min_bytes);
  const MatD dt = uniform<double>(L, D, 0.01, 0.4), A = uniform<double>(D, N, -1.5, -0.05);
  const MatD B = normal<double>(L, N), C = normal<double>(L, N), z = normal<double>(L, D), w = normal<double>(4, D, 0.5);
  const MatD lamb = uniform<double>(L, D, -0.8, -0.01), Bb = normal<double>(L, N), Cb = normal<double>(L, N);
  auto f = [](const MatD& x) { return Mat<float>(x.cast<float>()); };
  const auto Sf = semiseparable(factored_decay(f(dt), f(A)), f(B), f(C), {.heads = D});
  const auto Sb = semiseparable(f(lamb), f(Bb), f(Cb), {.heads = D});
  const auto h = diagonal(f(z)) * Sf * diagonal(f(dt)) * causal_conv(f(w)) + flip(Sb * causal_conv(f(w)));
  std::vector<cpu_detail::all_term<float>> terms;
  REQUIRE(cpu_detail::expand_all_terms<float>(h, cpu_detail::context{L, D}, terms));
  Tensor3<float> all(D, L, L, 7.f);
  materialize_all_into(all, h);
  for (Index c = 0; c < D; ++c) {
    INFO("channel " << c);
    check_close(all.slice(c), MatD(materialize(h, c).cast<double>()), tol<float>());  // the tile path
  }
  for (Index c : {Index(0), Index(37)}) {  // and plain loops in double
    INFO("channel " << c << " against the dense oracle");
    MatD lamf(L, D * N);
    for (Index t = 0; t < L; ++t)
      for (Index d = 0; d < D; ++d)
        for (Index m = 0; m < N; ++m) lamf(t, d * N + m) = dt(t, d) * A(d, m);
    const MatD fw = dense_diagonal(z, c, L) * dense_semiseparable(lamf, B, C, D, 1, 1, c) * dense_diagonal(dt, c, L) *
                    dense_conv(w, c, L);
    const MatD bw = dense_semiseparable(lamb, Bb, Cb, D, 1, 1, c) * dense_conv(w, c, L);
    MatD ref = fw;
    for (Index t = 0; t < L; ++t)
      for (Index u = 0; u < L; ++u) ref(t, u) += bw(L - 1 - t, L - 1 - u);
    check_close(all.slice(c), ref, tol<float>());
  }
}

TEST_CASE("stream_copy: every alignment and length", "[head_mean][all]") {
  std::vector<float> src(600), dst(700);
  for (std::size_t i = 0; i < src.size(); ++i) src[i] = float(i) + 0.5f;
  for (Index off = 0; off < 20; ++off)
    for (Index n : {0, 1, 3, 15, 16, 17, 31, 64, 65, 100, 255, 256, 257, 511, 600}) {
      std::fill(dst.begin(), dst.end(), -1.f);
      iattn::cpu_detail::stream_copy(dst.data() + off, src.data(), n);
      iattn::cpu_detail::stream_fence();
      Index wrong = 0;
      for (Index i = 0; i < Index(dst.size()); ++i)
        wrong += dst[std::size_t(i)] != (i >= off && i < off + n ? src[std::size_t(i - off)] : -1.f);
      INFO("offset " << off << ", n " << n);
      REQUIRE(wrong == 0);
    }
}

TEST_CASE("head mean: expressions without heads, empty sequences", "[head_mean]") {
  using namespace iattn;
  const Index L = 30, D = 4, N = 3;
  const MatD lam = uniform<double>(L, D * N, -0.6, -0.01), B = normal<double>(L, N), C = normal<double>(L, N);
  const auto S = semiseparable(lam, B, C, {.heads = D});  // Mamba-1: one channel per head
  const auto h = S * causal_conv(normal<double>(3, D));
  check_means<double>(h, h, L, 1, false);
  const auto conv = causal_conv(normal<double>(3, D));  // no heads at all: channel ranges only
  check_close(materialize_mean(conv, mean_options{.abs = true, .channels = range{1, 3}}, L), dense_mean(dense_channels(conv, L), L, 1, 3, true),
              1e-12);
  const auto S0 = semiseparable(MatD(0, 2), MatD(0, N), MatD(0, N), {.heads = 2, .head_dim = 3});
  REQUIRE(materialize_mean(S0, mean_options{.abs = true, .head = 1}).size() == 0);
  REQUIRE(materialize_head_means(S0).dims == std::array<Index, 3>{2, 0, 0});
  REQUIRE(materialize_all(S0).dims == std::array<Index, 3>{6, 0, 0});
}

TEST_CASE("head mean: bad arguments throw naming the argument and the shapes", "[head_mean]") {
  using namespace iattn;
  const Index L = 10, H = 2, P = 3, N = 2;
  const MatD lam = uniform<double>(L, H, -0.6, -0.01), B = normal<double>(L, N), C = normal<double>(L, N);
  const auto S = semiseparable(lam, B, C, {.heads = H, .head_dim = P});
  auto message = [](auto&& f) {
    try {
      f();
    } catch (const std::invalid_argument& e) {
      return std::string(e.what());
    }
    return std::string("no throw");
  };
  CHECK(message([&] { materialize_mean(S, mean_options{.head = 2}); }) ==
        "materialize_mean: options.head = 2 is out of range [0, H=2) (D=6, P=3)");
  CHECK(message([&] { materialize_mean(S, mean_options{.head = -1}); }).find("options.head = -1") != std::string::npos);
  CHECK(message([&] { materialize_mean(S, mean_options{.channels = range{2, 2}}); }) ==
        "materialize_mean: options.channels = [2, 2) is not a non-empty range inside [0, D=6)");
  CHECK(message([&] { materialize_mean(S, mean_options{.channels = range{4, 7}}); }).find("[4, 7)") != std::string::npos);
  CHECK(message([&] { materialize_mean(S, mean_options{.head = 0, .channels = range{0, 1}}); }).find("both set") !=
        std::string::npos);
  CHECK(message([&] { materialize_mean(causal_conv(normal<double>(2, 3)), mean_options{.head = 0}, L); })
            .find("has no heads") != std::string::npos);
  CHECK(message([&] { materialize_head_means(S, mean_options{.head = 0}); }).find("must be unset") != std::string::npos);
  Tensor3<double> wrong(6, L, L + 1);
  CHECK(message([&] { materialize_all_into(wrong, S); }) ==
        "materialize_all_into: out has shape (6, 10, 11) but expected (D=6, L=10, L=10)");
  const auto unbound = group_norm<double>(1) * S;
  CHECK(message([&] { materialize_all(unbound); }).find("unbound GroupNorm") != std::string::npos);
}
