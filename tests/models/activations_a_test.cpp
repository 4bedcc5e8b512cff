// The activation-level doors (issue 19, part 2) of Mamba, Mamba-2, Vision Mamba, Griffin, HGRN,
// HGRN2, S4D and Hyena: decompose(w, u) == attention(activations(w, u)); attention(acts) against the
// models' own recurrent forwards, with and without the output projection; activations built by hand
// against dense matrices written with loops from the formulas; the paper variants from activations;
// final_state against the oracles' states; shape errors naming the field; depthwise_taps.
#include "support/model_checks.hpp"

#include <iattn/models/griffin.hpp>
#include <iattn/models/hgrn.hpp>
#include <iattn/models/hgrn2.hpp>
#include <iattn/models/hyena.hpp>
#include <iattn/models/mamba.hpp>
#include <iattn/models/mamba2.hpp>
#include <iattn/models/s4d.hpp>
#include <iattn/models/vision_mamba.hpp>

using namespace test;
using namespace iattn::models;
using Catch::Matchers::Contains;
using iattn::Matrix;

namespace {

const std::vector<Index> act_lengths = {1, 5, 64};

/// Two decompositions (or operators, through `op`) are the same: x, beta, output and a few channels'
/// matrices agree to a few ulps (they are computed by the same code path, so nearly bitwise).
template <class T, class D1, class D2>
void check_same_decomposition(const D1& a, const D2& b) {
  const double tol = 8 * double(std::numeric_limits<T>::epsilon());
  check_close(dd(a.x), dd(b.x), tol);
  check_close(dd(a.beta), dd(b.beta), tol);
  check_close(dd(a.output()), dd(b.output()), tol);
  const Index D = a.x.cols(), L = a.x.rows();
  for (Index c : {Index(0), D / 2, D - 1})
    check_close(dd(Matrix<T>(iattn::materialize(a.H, c, L))), dd(Matrix<T>(iattn::materialize(b.H, c, L))), tol);
}
template <class T, class H1, class H2>
void check_same_operator(const H1& a, const H2& b, Index D, Index L) {
  const double tol = 8 * double(std::numeric_limits<T>::epsilon());
  for (Index c : {Index(0), D / 2, D - 1})
    check_close(dd(Matrix<T>(iattn::materialize(a, c, L))), dd(Matrix<T>(iattn::materialize(b, c, L))), tol);
}
/// A final state against the oracle's: fp64 1e-10 (1 + max), fp32 1e-4 relative.
template <class T>
void check_state(const Matrix<T>& got, const Matrix<T>& want) {
  check_close(dd(got), dd(want), model_tol<T>());
}

template <class T>
mamba_weights<T> act_mamba(std::uint64_t seed, Index expand = 2) {
  return mamba_init<T>({.d_model = 16, .d_state = 8, .expand = expand}, seed);
}
template <class T>
mamba2_weights<T> act_mamba2(std::uint64_t seed, Index expand = 2) {
  auto w = mamba2_init<T>({.d_model = 16, .d_state = 8, .expand = expand, .headdim = 8, .ngroups = 2}, seed);
  init::generator g(seed + 100);  // a norm weight that is not all ones
  w.norm_weight = init::uniform<T>(g, 1, w.config.d_inner(), 0.5, 1.5);
  return w;
}
template <class T>
griffin_weights<T> act_griffin(std::uint64_t seed, Index width = 32) {
  auto w = griffin_init<T>({.width = width, .lru_width = 48, .num_heads = 3}, seed);
  init::generator g(seed + 100);  // recurrentgemma initialises biases to 0; test them nonzero
  w.linear_x_bias = init::normal<T>(g, 1, 48, 0.3);
  w.linear_y_bias = init::normal<T>(g, 1, 48, 0.3);
  w.linear_out_bias = init::normal<T>(g, 1, width, 0.3);
  w.conv_1d_b = init::normal<T>(g, 1, 48, 0.3);
  w.rg_lru_a_gate_b = init::normal<T>(g, 1, 48, 0.3);
  w.rg_lru_input_gate_b = init::normal<T>(g, 1, 48, 0.3);
  return w;
}
template <class T>
hgrn_weights<T> act_hgrn(std::uint64_t seed, Index layer = 0, Index expand_ratio = 2) {
  auto w = hgrn_init<T>({.hidden_size = 16, .expand_ratio = expand_ratio, .layer_idx = layer, .num_layers = 4}, seed);
  init::generator g(seed + 100);
  w.g_norm_weight = init::uniform<T>(g, 1, w.config.input_dim(), 0.5, 1.5);
  return w;
}
template <class T>
hgrn2_weights<T> act_hgrn2(std::uint64_t seed, Index layer = 0) {
  auto w = hgrn2_init<T>({.hidden_size = 32, .expand_ratio = 8, .layer_idx = layer, .num_layers = 4}, seed);
  init::generator g(seed + 100);
  w.g_norm_weight = init::uniform<T>(g, 1, 32, 0.5, 1.5);
  return w;
}
template <class T>
vision_mamba_weights<T> act_vim(std::uint64_t seed) { return vision_mamba_init<T>({.mamba = {.d_model = 16, .d_state = 8}}, seed); }
template <class T>
hyena_weights<T> act_hyena(std::uint64_t seed) { return hyena_init<T>({.d_model = 16, .l_max = 80}, seed); }

/// Griffin documents starting at 0, 2 and L/2.
inline std::vector<Index> three_documents(Index L) {
  std::vector<Index> seg;
  for (Index t = 0; t < L; ++t) seg.push_back(t < 2 ? t : (t < L / 2 ? t - 2 : t - L / 2));
  return seg;
}

}  // namespace

// ---- decompose == attention(activations), attention(acts) == the forward, final_state == the oracle's

TEMPLATE_TEST_CASE("Mamba-1 from activations", "[activations][mamba]", float, double) {
  using T = TestType;
  const auto w = act_mamba<T>(1);
  for (Index L : act_lengths) {
    INFO("L = " << L);
    const auto u = sample_input<T>(L, 16, 100 + L);
    const auto acts = activations(w, u);
    const auto d = attention(acts);
    check_same_decomposition<T>(decompose(w, u), d);
    check_same_decomposition<T>(mamba_decompose(w, u), d);
    Matrix<T> h;
    check_exact<T>(mamba_forward(w, u, &h), d);
    check_state<T>(final_state(acts), h);
    REQUIRE(final_state(acts).rows() == w.config.d_inner());
    REQUIRE(final_state(acts).cols() == w.config.d_state);
    auto inner = acts;  // no out_proj: the output is the inner forward y * SiLU(z)
    inner.out_proj_weight.resize(0, 0);
    check_exact<T>(mamba_inner_forward(w, u), attention(inner));
  }
}

TEMPLATE_TEST_CASE("Mamba-2 from activations", "[activations][mamba2]", float, double) {
  using T = TestType;
  const auto w = act_mamba2<T>(2);
  const auto w_id = [] {  // expand 1 and an identity out_proj: the forward is the inner output
    auto v = act_mamba2<T>(3, 1);
    v.out_proj_weight = Matrix<T>::Identity(16, 16);
    return v;
  }();
  for (Index L : act_lengths) {
    INFO("L = " << L);
    const auto u = sample_input<T>(L, 16, 200 + L);
    const auto acts = activations(w, u);
    const auto d = attention(acts);
    check_same_decomposition<T>(decompose(w, u), d);
    check_same_decomposition<T>(mamba2_decompose(w, u), d);
    Matrix<T> h;
    check_exact<T>(mamba2_forward(w, u, &h), d);
    check_state<T>(final_state(acts), h);
    REQUIRE(final_state(acts).rows() == w.config.nheads() * w.config.headdim);
    auto inner = activations(w_id, u);
    inner.out_proj_weight.resize(0, 0);
    check_exact<T>(mamba2_forward(w_id, u), attention(inner));
    // the x rows of conv1d alone give the same decomposition as the whole (conv_dim, d_conv) weight
    auto xrows = acts;
    xrows.conv1d_weight = Matrix<T>(acts.conv1d_weight.topRows(w.config.d_inner()));
    xrows.conv1d_bias = Matrix<T>(acts.conv1d_bias.leftCols(w.config.d_inner()));
    check_same_decomposition<T>(attention(xrows), d);
  }
}

TEMPLATE_TEST_CASE("Vision Mamba from activations, both scans' final states", "[activations][vim]", float, double) {
  using T = TestType;
  const auto w = act_vim<T>(4);
  for (Index L : act_lengths) {
    INFO("L = " << L);
    const auto u = sample_input<T>(L, 16, 300 + L);
    const auto acts = activations(w, u);
    const auto d = attention(acts);
    check_same_decomposition<T>(decompose(w, u), d);
    check_same_decomposition<T>(vision_mamba_decompose(w, u), d);
    Matrix<T> hf, hb;
    check_exact<T>(vision_mamba_forward(w, u, &hf, &hb), d, /*causal=*/false);
    const auto st = final_state(acts);
    check_state<T>(st.fwd, hf);
    check_state<T>(st.bwd, hb);
    // the backward branch's activations are the reversed sequence's
    check_close(dd(acts.bwd.x), dd(Matrix<T>(acts.fwd.x.colwise().reverse())), 0.0);
    // no out_proj: half the sum of the two inner forwards
    auto inner = acts;
    inner.out_proj_weight.resize(0, 0);
    const Matrix<T> ur = u.colwise().reverse();
    const Matrix<T> y = T(0.5) * (mamba_inner_forward(w.fwd, u) + Matrix<T>(mamba_inner_forward(w.bwd(), ur).colwise().reverse()));
    check_exact<T>(y, attention(inner), /*causal=*/false);
  }
}

TEMPLATE_TEST_CASE("Griffin from activations, with documents", "[activations][griffin]", float, double) {
  using T = TestType;
  const auto w = act_griffin<T>(5);
  const auto w_id = [] {  // width = lru_width and an identity linear_out without bias
    auto v = act_griffin<T>(6, 48);
    v.linear_out_weight = Matrix<T>::Identity(48, 48);
    v.linear_out_bias.setZero();
    return v;
  }();
  for (Index L : act_lengths) {
    INFO("L = " << L);
    const auto u = sample_input<T>(L, 32, 400 + L);
    for (const auto& seg : {single_segment(L), three_documents(L)}) {
      const auto acts = activations(w, u, seg);
      const auto d = attention(acts);
      check_same_decomposition<T>(decompose(w, u, seg), d);
      check_same_decomposition<T>(griffin_decompose(w, u, seg), d);
      Matrix<T> h;
      check_exact<T>(griffin_forward(w, u, seg, &h), d);
      REQUIRE(h.rows() == 1);
      check_state<T>(final_state(acts), h);
      const auto u48 = sample_input<T>(L, 48, 450 + L);
      auto inner = activations(w_id, u48, seg);
      inner.linear_out_weight.resize(0, 0);
      inner.linear_out_bias.resize(0, 0);
      check_exact<T>(griffin_forward(w_id, u48, seg), attention(inner));
    }
  }
}

TEMPLATE_TEST_CASE("HGRN from activations, with and without a lower bound", "[activations][hgrn]", float, double) {
  using T = TestType;
  for (Index layer : {Index(0), Index(2)}) {
    const auto w = act_hgrn<T>(7, layer);
    const auto w_id = [&] {  // expand_ratio 1 and an identity o_proj
      auto v = act_hgrn<T>(8, layer, 1);
      v.o_proj_weight = Matrix<T>::Identity(16, 16);
      return v;
    }();
    for (Index L : act_lengths) {
      INFO("layer " << layer << ", L = " << L);
      const auto u = sample_input<T>(L, 16, 500 + L);
      const auto acts = activations(w, u);
      const auto d = attention(acts);
      check_same_decomposition<T>(decompose(w, u), d);
      check_same_decomposition<T>(hgrn_decompose(w, u), d);
      Matrix<T> h;
      check_exact<T>(hgrn_forward(w, u, &h), d);
      check_state<T>(final_state(acts), h);
      auto inner = activations(w_id, u);
      inner.o_proj_weight.resize(0, 0);
      check_exact<T>(hgrn_forward(w_id, u), attention(inner));
    }
  }
}

TEMPLATE_TEST_CASE("HGRN2 from activations", "[activations][hgrn2]", float, double) {
  using T = TestType;
  for (Index layer : {Index(0), Index(3)}) {
    const auto w = act_hgrn2<T>(9, layer);
    auto w_id = w;
    w_id.o_proj_weight = Matrix<T>::Identity(32, 32);
    for (Index L : act_lengths) {
      INFO("layer " << layer << ", L = " << L);
      const auto u = sample_input<T>(L, 32, 600 + L);
      const auto acts = activations(w, u);
      const auto d = attention(acts);
      check_same_decomposition<T>(decompose(w, u), d);
      check_same_decomposition<T>(hgrn2_decompose(w, u), d);
      Matrix<T> h;
      check_exact<T>(hgrn2_forward(w, u, &h), d);
      REQUIRE(h.rows() == 4 * 8);  // (num_heads * df, di)
      REQUIRE(h.cols() == 8);
      check_state<T>(final_state(acts), h);
      auto inner = acts;
      inner.o_proj_weight.resize(0, 0);
      check_exact<T>(hgrn2_forward(w_id, u), attention(inner));
      // scale 0 is chunk_gla's default df^-1/2, the value activations() sets
      auto dflt = acts;
      dflt.scale = 0;
      check_same_decomposition<T>(attention(dflt), d);
    }
  }
}

TEMPLATE_TEST_CASE("S4D and Hyena from activations", "[activations][s4d][hyena]", float, double) {
  using T = TestType;
  const auto ws = s4d_init<T>({.d_model = 16, .d_state = 16}, 10);
  const auto wh = act_hyena<T>(11);
  auto wh_id = wh;
  wh_id.out_proj_weight = Matrix<T>::Identity(16, 16);
  wh_id.out_proj_bias.setZero();
  for (Index L : act_lengths) {
    INFO("L = " << L);
    const auto u = sample_input<T>(L, 16, 700 + L);
    {
      const auto acts = activations(ws, u);
      REQUIRE(acts.k.rows() == 16);
      REQUIRE(acts.k.cols() == L);
      const auto d = attention(acts);
      check_same_decomposition<T>(decompose(ws, u), d);
      check_same_decomposition<T>(s4d_decompose(ws, u), d);
      check_exact<T>(s4d_forward(ws, u), d);
      // a kernel longer than L (S4DKernel(L') for L' > L) gives the same matrix
      auto longer = acts;
      longer.k = activations(ws, sample_input<T>(L + 9, 16)).k;
      check_same_decomposition<T>(attention(longer), d);
    }
    {
      const auto acts = activations(wh, u);
      const auto d = attention(acts);
      check_same_decomposition<T>(decompose(wh, u), d);
      check_same_decomposition<T>(hyena_decompose(wh, u), d);
      check_exact<T>(hyena_forward(wh, u), d);
      auto inner = activations(wh_id, u);
      inner.out_proj_weight.resize(0, 0);
      inner.out_proj_bias.resize(0, 0);
      check_exact<T>(hyena_forward(wh_id, u), attention(inner));
      // the v rows of the short filter alone, and the whole long filter, give the same decomposition
      auto vrows = acts;
      vrows.short_filter_weight = Matrix<T>(acts.short_filter_weight.bottomRows(16));
      vrows.short_filter_bias = Matrix<T>(acts.short_filter_bias.rightCols(16));
      vrows.k = wh.filter;
      check_same_decomposition<T>(attention(vrows), d);
    }
  }
}

// ---- the paper variants from activations equal the weights versions ----------------------------

TEMPLATE_TEST_CASE("Paper variants from activations equal the weights versions", "[activations][paper]", float, double) {
  using T = TestType;
  for (Index L : act_lengths) {
    INFO("L = " << L);
    {
      const auto w = act_mamba<T>(12);
      const auto u = sample_input<T>(L, 16, 800 + L);
      const auto a = activations(w, u);
      const Index D = w.config.d_inner();
      check_same_operator<T>(s6_attention(a), s6_attention(w, u), D, L);
      check_same_operator<T>(holistic_attention(a), holistic_attention(w, u), D, L);
      check_same_operator<T>(holistic_attention<mamba_ablation{.conv = false}>(a), holistic_attention<mamba_ablation{.conv = false}>(w, u), D, L);
      check_same_operator<T>(holistic_attention<mamba_ablation{.gate = false}>(a), holistic_attention<mamba_ablation{.gate = false}>(w, u), D, L);
      check_same_operator<T>(holistic_attention<mamba_ablation{.activation = false}>(a),
                             holistic_attention<mamba_ablation{.activation = false}>(w, u), D, L);
    }
    {
      const auto w = act_mamba2<T>(13);
      const auto u = sample_input<T>(L, 16, 810 + L);
      check_same_operator<T>(mamba2_paper_attention(activations(w, u)), mamba2_paper_attention(w, u), w.config.d_inner(), L);
    }
    {
      const auto w = act_griffin<T>(14);
      const auto u = sample_input<T>(L, 32, 820 + L);
      const auto a = activations(w, u);
      for (bool normaliser : {true, false})
        check_same_operator<T>(griffin_paper_attention(a, normaliser), griffin_paper_attention(w, u, normaliser), 48, L);
    }
    {
      const auto w = act_hgrn<T>(15, 1);
      const auto u = sample_input<T>(L, 16, 830 + L);
      check_same_operator<T>(hgrn_paper_attention(activations(w, u)), hgrn_paper_attention(w, u), w.config.input_dim(), L);
    }
  }
}

// ---- activations built by hand (a hook's tensors) against dense matrices from the formulas -------

namespace {

template <class T>
Matrix<T> cast(const MatD& m) { return m.template cast<T>(); }
double silu_d(double v) { return v / (1 + std::exp(-v)); }
double sigmoid_d(double v) { return 1 / (1 + std::exp(-v)); }

/// PyTorch's depthwise causal conv matrix of channel c: M[t, s] = w[c, K-1-(t-s)] for 0 <= t-s < K.
MatD dense_torch_conv(const MatD& w, Index c, Index L) {
  const Index K = w.cols();
  MatD M = MatD::Zero(L, L);
  for (Index t = 0; t < L; ++t)
    for (Index s = 0; s <= t; ++s)
      if (t - s < K) M(t, s) = w(c, K - 1 - (t - s));
  return M;
}
/// p = conv(x) + b of channel c, by the sum.
MatD dense_conv_out(const MatD& x, const MatD& w, const MatD& b, Index c) {
  const Index L = x.rows(), K = w.cols();
  MatD p(L, 1);
  for (Index t = 0; t < L; ++t) {
    double acc = b(0, c);
    for (Index k = 0; k < K; ++k)
      if (t - K + 1 + k >= 0) acc += w(c, k) * x(t - K + 1 + k, c);
    p(t, 0) = acc;
  }
  return p;
}

}  // namespace

TEMPLATE_TEST_CASE("Mamba-1 H from hand-built activations equals the formula", "[activations][mamba][hand]", float, double) {
  using T = TestType;
  const Index di = 6, N = 3, K = 4;
  for (Index L : {Index(1), Index(7), Index(40)}) {
    INFO("L = " << L);
    // a hook's tensors: no weights anywhere
    const MatD x = normal<double>(L, di), z = normal<double>(L, di), delta = uniform<double>(L, di, 0.01, 1.0);
    const MatD A = -uniform<double>(di, N, 0.1, 2.0), B = normal<double>(L, N), C = normal<double>(L, N);
    const MatD Dk = normal<double>(1, di), cw = normal<double>(di, K), cb = normal<double>(1, di);
    mamba_activations<T> a;
    a.x = cast<T>(x), a.z = cast<T>(z), a.delta = cast<T>(delta), a.A = cast<T>(A), a.B = cast<T>(B), a.C = cast<T>(C);
    a.D = cast<T>(Dk), a.conv1d_weight = cast<T>(cw), a.conv1d_bias = cast<T>(cb);
    // the formula in double from the values the library sees
    const MatD xs = dd(a.x), zs = dd(a.z), ds = dd(a.delta), As = dd(a.A), Bs = dd(a.B), Cs = dd(a.C), Ds = dd(a.D), ws = dd(a.conv1d_weight),
               bs = dd(a.conv1d_bias);
    const auto d = attention(a);
    REQUIRE(d.out_weight.size() == 0);
    MatD y(L, di), hL(di, N);
    for (Index c = 0; c < di; ++c) {
      MatD S = MatD::Zero(L, L);  // S[t, s] = sum_n C_t exp(sum_{k=s+1..t} delta_k A) B_s
      for (Index t = 0; t < L; ++t)
        for (Index s = 0; s <= t; ++s)
          for (Index n = 0; n < N; ++n) {
            double e = 0;
            for (Index k = s + 1; k <= t; ++k) e += ds(k, c) * As(c, n);
            S(t, s) += Cs(t, n) * std::exp(e) * Bs(s, n);
          }
      const MatD p = dense_conv_out(xs, ws, bs, c);
      MatD G = MatD::Zero(L, L), Dl = MatD::Zero(L, L), Sig = MatD::Zero(L, L);
      for (Index t = 0; t < L; ++t) {
        G(t, t) = silu_d(zs(t, c));
        Dl(t, t) = ds(t, c);
        Sig(t, t) = sigmoid_d(p(t, 0));
      }
      const MatD core = G * (S * Dl + Ds(0, c) * MatD::Identity(L, L));
      const MatD Hc = core * Sig * dense_torch_conv(ws, c, L);
      check_close(dd(Matrix<T>(iattn::materialize(d.H, c, L))), Hc, model_tol<T>());
      check_close(dd(Matrix<T>(iattn::materialize(s6_attention(a), c, L))), MatD(S * Dl), model_tol<T>());
      check_close(dd(Matrix<T>(iattn::materialize(holistic_attention(a), c, L))), MatD(G * S * Dl * Sig * dense_torch_conv(ws, c, L)),
                  model_tol<T>());
      y.col(c) = Hc * xs.col(c) + core * (Sig * MatD::Constant(L, 1, bs(0, c)));
      for (Index n = 0; n < N; ++n) {  // the recurrence h = exp(delta A) h + delta B SiLU(p)
        double h = 0;
        for (Index t = 0; t < L; ++t) h = std::exp(ds(t, c) * As(c, n)) * h + ds(t, c) * Bs(t, n) * silu_d(p(t, 0));
        hL(c, n) = h;
      }
    }
    check_close(dd(d.output()), y, model_tol<T>());
    check_close(dd(final_state(a)), hL, model_tol<T>());
    // S6 alone from stored delta, A, B, C: the other fields may be absent
    mamba_activations<T> only;
    only.delta = a.delta, only.A = a.A, only.B = a.B, only.C = a.C;
    check_same_operator<T>(s6_attention(only), s6_attention(a), di, L);
  }
}

TEMPLATE_TEST_CASE("Mamba-2 H from hand-built activations equals the formula", "[activations][mamba2][hand]", float, double) {
  using T = TestType;
  const Index H = 4, P = 3, G = 2, N = 3, K = 4, di = H * P;
  const double eps = 1e-5;
  for (Index L : {Index(1), Index(7), Index(40)}) {
    INFO("L = " << L);
    mamba2_activations<T> a;
    a.x = cast<T>(normal<double>(L, di)), a.z = cast<T>(normal<double>(L, di)), a.dt = cast<T>(uniform<double>(L, H, 0.01, 1.0));
    a.A = cast<T>(-uniform<double>(1, H, 0.5, 4.0)), a.B = cast<T>(normal<double>(L, G * N)), a.C = cast<T>(normal<double>(L, G * N));
    a.D = cast<T>(normal<double>(1, H)), a.conv1d_weight = cast<T>(normal<double>(di, K)), a.conv1d_bias = cast<T>(normal<double>(1, di));
    a.norm_weight = cast<T>(uniform<double>(1, di, 0.5, 1.5)), a.ngroups = G, a.eps = eps;
    const MatD xs = dd(a.x), zs = dd(a.z), ds = dd(a.dt), As = dd(a.A), Bs = dd(a.B), Cs = dd(a.C), Ds = dd(a.D), ws = dd(a.conv1d_weight),
               bs = dd(a.conv1d_bias), nw = dd(a.norm_weight);
    const auto d = attention(a);
    std::vector<MatD> body(static_cast<std::size_t>(di));
    MatD v(L, di), hL(di, N);
    for (Index ch = 0; ch < di; ++ch) {
      const Index h = ch / P, g = h / (H / G);
      MatD S = MatD::Zero(L, L), Gt = MatD::Zero(L, L), Dl = MatD::Zero(L, L), Sig = MatD::Zero(L, L);
      for (Index t = 0; t < L; ++t)
        for (Index s = 0; s <= t; ++s) {
          double e = 0;
          for (Index k = s + 1; k <= t; ++k) e += ds(k, h) * As(0, h);
          for (Index n = 0; n < N; ++n) S(t, s) += Cs(t, g * N + n) * std::exp(e) * Bs(s, g * N + n);
        }
      const MatD p = dense_conv_out(xs, ws, bs, ch);
      for (Index t = 0; t < L; ++t) {
        Gt(t, t) = silu_d(zs(t, ch));
        Dl(t, t) = ds(t, h);
        Sig(t, t) = sigmoid_d(p(t, 0));
      }
      const MatD pre = Gt * (S * Dl + Ds(0, h) * MatD::Identity(L, L));
      body[std::size_t(ch)] = pre * Sig * dense_torch_conv(ws, ch, L);
      v.col(ch) = body[std::size_t(ch)] * xs.col(ch) + pre * (Sig * MatD::Constant(L, 1, bs(0, ch)));
      for (Index n = 0; n < N; ++n) {
        double st = 0;
        for (Index t = 0; t < L; ++t) st = std::exp(ds(t, h) * As(0, h)) * st + ds(t, h) * silu_d(p(t, 0)) * Bs(t, g * N + n);
        hL(ch, n) = st;
      }
    }
    const Index Dg = di / G;
    MatD y(L, di);
    for (Index ch = 0; ch < di; ++ch) {
      const Index g = ch / Dg;
      MatD Nrm = MatD::Zero(L, L);
      for (Index t = 0; t < L; ++t) Nrm(t, t) = nw(0, ch) / std::sqrt(v.row(t).segment(g * Dg, Dg).squaredNorm() / double(Dg) + eps);
      check_close(dd(Matrix<T>(iattn::materialize(d.H, ch, L))), MatD(Nrm * body[std::size_t(ch)]), model_tol<T>());
      y.col(ch) = Nrm * v.col(ch);
    }
    check_close(dd(d.output()), y, model_tol<T>());
    check_close(dd(final_state(a)), hL, model_tol<T>());
  }
}

TEST_CASE("final_state stays accurate in float over long sequences", "[activations][state]") {
  // Mamba-1 activations by hand at L = 5000 with slow decays (the long-memory case): float against
  // the double recurrence; the chunked log-space sums keep the error at float rounding.
  const Index L = 5000, di = 3, N = 2, K = 2;
  const MatD delta = uniform<double>(L, di, 1e-4, 2e-3), A = -uniform<double>(di, N, 0.1, 1.0);
  const MatD B = normal<double>(L, N), C = normal<double>(L, N), x = normal<double>(L, di);
  mamba_activations<float> a;
  a.x = cast<float>(x), a.z = cast<float>(normal<double>(L, di)), a.delta = cast<float>(delta), a.A = cast<float>(A);
  a.B = cast<float>(B), a.C = cast<float>(C), a.D = cast<float>(MatD::Ones(1, di)), a.conv1d_weight = cast<float>(normal<double>(di, K));
  const MatD xs = dd(a.x), ds = dd(a.delta), As = dd(a.A), Bs = dd(a.B), ws = dd(a.conv1d_weight);
  MatD hL(di, N);
  for (Index c = 0; c < di; ++c) {
    const MatD p = dense_conv_out(xs, ws, MatD::Zero(1, di), c);
    for (Index n = 0; n < N; ++n) {
      double h = 0;
      for (Index t = 0; t < L; ++t) h = std::exp(ds(t, c) * As(c, n)) * h + ds(t, c) * Bs(t, n) * silu_d(p(t, 0));
      hL(c, n) = h;
    }
  }
  check_close(dd(final_state(a)), hL, 1e-4);
}

// ---- errors: a field of the wrong shape is named -------------------------------------------------

TEST_CASE("Activations of the wrong shape throw naming the field", "[activations][errors]") {
  const auto u = sample_input<double>(5, 16);
  {
    auto a = activations(act_mamba<double>(1), u);
    a.B = MatD::Zero(5, 7);
    REQUIRE_THROWS_WITH(attention(a), Contains("mamba_activations: B has shape (5, 7)") && Contains("d_state=8"));
    REQUIRE_THROWS_AS(final_state(a), std::invalid_argument);
    a = activations(act_mamba<double>(1), u);
    a.conv1d_weight = MatD::Zero(4, 32);  // transposed: causal_conv's layout, not the checkpoint's
    REQUIRE_THROWS_WITH(holistic_attention(a), Contains("conv1d_weight has shape (4, 32)") && Contains("(d_inner=32, d_conv)"));
    a = activations(act_mamba<double>(1), u);
    a.A(0, 0) = 0.5;
    REQUIRE_THROWS_WITH(s6_attention(a), Contains("A must be <= 0"));
  }
  {
    auto a = activations(act_mamba2<double>(1), u);
    a.dt = MatD::Zero(5, 5);
    REQUIRE_THROWS_WITH(attention(a), Contains("mamba2_activations: dt has shape (5, 5)") && Contains("nheads dividing d_inner=32"));
    a = activations(act_mamba2<double>(1), u);
    a.norm_weight = MatD::Ones(1, 31);
    REQUIRE_THROWS_WITH(mamba2_paper_attention(a), Contains("norm_weight has shape (1, 31)"));
  }
  {
    auto a = activations(act_vim<double>(1), u);
    a.bwd.D = MatD::Ones(1, 3);
    REQUIRE_THROWS_WITH(attention(a), Contains("vision_mamba_activations.bwd") && Contains("D has shape (1, 3)"));
  }
  {
    auto a = activations(act_griffin<double>(1), sample_input<double>(5, 32));
    a.segment_pos.pop_back();
    REQUIRE_THROWS_WITH(attention(a), Contains("griffin_activations: segment_pos has shape (4, 1)") && Contains("(L=5, 1)"));
    a = activations(act_griffin<double>(1), sample_input<double>(5, 32));
    a.log_a = MatD::Zero(5, 47);
    REQUIRE_THROWS_WITH(final_state(a), Contains("log_a has shape (5, 47)"));
  }
  {
    auto a = activations(act_hgrn<double>(1), u);
    a.g = MatD::Zero(4, 32);
    REQUIRE_THROWS_WITH(hgrn_paper_attention(a), Contains("hgrn_activations: g has shape (4, 32)") && Contains("(L=5, input_dim=32)"));
  }
  {
    auto a = activations(act_hgrn2<double>(1), sample_input<double>(5, 32));
    a.k = MatD::Zero(5, 31);
    REQUIRE_THROWS_WITH(attention(a), Contains("hgrn2_activations: k has shape (5, 31)"));
  }
  {
    auto a = activations(s4d_init<double>({.d_model = 16, .d_state = 8}, 1), u);
    a.k = MatD::Zero(16, 4);
    REQUIRE_THROWS_WITH(attention(a), Contains("s4d_activations: k has shape (16, 4)") && Contains("L' >= L=5"));
  }
  {
    auto a = activations(act_hyena<double>(1), u);
    a.x1 = MatD::Zero(5, 15);
    REQUIRE_THROWS_WITH(attention(a), Contains("hyena_activations: x1 has shape (5, 15)"));
  }
}

// ---- depthwise_taps: PyTorch's (D, 1, K) weight in causal_conv's (K, D) layout --------------------

TEMPLATE_TEST_CASE("depthwise_taps maps a PyTorch depthwise weight to causal_conv's taps", "[activations][conv]", float, double) {
  using T = TestType;
  const Index D = 5, K = 4;
  const Matrix<T> w = cast<T>(normal<double>(D, K));
  const Matrix<T> taps = depthwise_taps(w);
  REQUIRE(taps.rows() == K);
  REQUIRE(taps.cols() == D);
  for (Index c = 0; c < D; ++c)
    for (Index k = 0; k < K; ++k) REQUIRE(taps(k, c) == w(c, k));
  REQUIRE(Matrix<T>(depthwise_taps(Matrix<T>(taps.transpose()))) == taps);  // the round trip
  for (Index L : {Index(1), Index(7), Index(64)}) {  // the same convolution as PyTorch's Conv1d
    const Matrix<T> x = cast<T>(normal<double>(L, D));
    check_close(dd(Matrix<T>(iattn::apply(iattn::causal_conv(taps), x))), dd(nn::causal_conv1d<T>(x, w)), tolerance<T>());
  }
  // Hugging Face's recurrent_gemma conv_1d.weight (lru_width, 1, 4) is recurrentgemma's Conv1D.w
  // [4, lru_width] through depthwise_taps: the decomposition is unchanged
  const auto gw = act_griffin<T>(16);
  const auto u = sample_input<T>(9, 32, 17);
  auto acts = activations(gw, u);
  const Matrix<T> hf = gw.conv_1d_w.transpose();  // what the HF checkpoint stores
  acts.conv_1d_w = depthwise_taps(hf);
  check_same_decomposition<T>(attention(acts), decompose(gw, u));
  REQUIRE_THROWS_WITH(depthwise_taps(Matrix<T>(3, 0)), Contains("depthwise_taps: w has shape (3, 0)"));
}
