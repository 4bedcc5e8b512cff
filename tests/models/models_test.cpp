// Exact decompositions of the model blocks against their own recurrent forwards, the evaluation
// properties on the models' operators, the papers' matrices written out by hand (L = 3), the
// segment-sum closed form of Mamba-2's minimal SSD, and weight shape errors.
#include "support/model_checks.hpp"

#include <iattn/models/griffin.hpp>
#include <iattn/models/mamba.hpp>
#include <iattn/models/mamba2.hpp>
#include <iattn/models/rwkv4.hpp>

using namespace test;
using namespace iattn::models;
using Catch::Matchers::Contains;
using iattn::Matrix;

namespace {

// Realistic small shapes (the inner widths and state sizes of the small checkpoints, scaled down).
template <class T>
mamba_weights<T> small_mamba(std::uint64_t seed) { return mamba_init<T>({.d_model = 32, .d_state = 16}, seed); }
template <class T>
mamba2_weights<T> small_mamba2(std::uint64_t seed) {
  auto w = mamba2_init<T>({.d_model = 32, .d_state = 16, .headdim = 16, .ngroups = 2}, seed);
  init::generator g(seed + 100);  // a norm weight that is not all ones
  w.norm_weight = init::uniform<T>(g, 1, w.config.d_inner(), 0.5, 1.5);
  return w;
}
template <class T>
griffin_weights<T> small_griffin(std::uint64_t seed) {
  auto w = griffin_init<T>({.width = 32, .lru_width = 48, .num_heads = 3}, seed);
  init::generator g(seed + 100);  // recurrentgemma initialises biases to 0; test them nonzero
  w.linear_x_bias = init::normal<T>(g, 1, 48, 0.3);
  w.linear_y_bias = init::normal<T>(g, 1, 48, 0.3);
  w.linear_out_bias = init::normal<T>(g, 1, 32, 0.3);
  w.conv_1d_b = init::normal<T>(g, 1, 48, 0.3);
  w.rg_lru_a_gate_b = init::normal<T>(g, 1, 48, 0.3);
  w.rg_lru_input_gate_b = init::normal<T>(g, 1, 48, 0.3);
  return w;
}
template <class T>
rwkv4_weights<T> small_rwkv4(std::uint64_t seed) { return rwkv4_init<T>({.hidden_size = 32, .attention_hidden_size = 32, .layer_id = 1, .num_hidden_layers = 4}, seed); }

}  // namespace

TEMPLATE_TEST_CASE("Mamba-1 block equals out_proj(H x + beta)", "[models][mamba]", float, double) {
  using T = TestType;
  const auto w = small_mamba<T>(1);
  for (Index L : model_lengths) {
    INFO("L = " << L);
    const auto u = sample_input<T>(L, 32, 11 + L);
    check_exact<T>(mamba_forward(w, u), mamba_decompose(w, u));
  }
}

TEMPLATE_TEST_CASE("Mamba-2 block equals out_proj(H x + beta)", "[models][mamba2]", float, double) {
  using T = TestType;
  const auto w = small_mamba2<T>(2);
  for (Index L : model_lengths) {
    INFO("L = " << L);
    const auto u = sample_input<T>(L, 32, 12 + L);
    check_exact<T>(mamba2_forward(w, u), mamba2_decompose(w, u));
  }
}

TEMPLATE_TEST_CASE("Griffin block equals out_proj(H x + beta)", "[models][griffin]", float, double) {
  using T = TestType;
  const auto w = small_griffin<T>(3);
  for (Index L : model_lengths) {
    INFO("L = " << L);
    const auto u = sample_input<T>(L, 32, 13 + L);
    check_exact<T>(griffin_forward(w, u), griffin_decompose(w, u));
    // documents starting at 0, 2 and L/2: resets in the conv and the RG-LRU
    std::vector<Index> seg;
    for (Index t = 0; t < L; ++t) seg.push_back(t < 2 ? t : (t < L / 2 ? t - 2 : t - L / 2));
    const auto d = griffin_decompose(w, u, seg);
    check_exact<T>(griffin_forward(w, u, seg), d);
    if (L >= 8) {  // nothing crosses a document boundary
      const MatD M = dd(Matrix<T>(iattn::materialize(d.H, 5)));
      REQUIRE(M.block(L / 2, 0, L - L / 2, L / 2).cwiseAbs().maxCoeff() == 0.0);
    }
  }
}

TEMPLATE_TEST_CASE("RWKV-4 time mixing equals output(H v)", "[models][rwkv4]", float, double) {
  using T = TestType;
  const auto w = small_rwkv4<T>(4);
  for (Index L : model_lengths) {
    INFO("L = " << L);
    const auto u = sample_input<T>(L, 32, 14 + L);
    check_exact<T>(rwkv4_forward(w, u), rwkv4_decompose(w, u));
  }
}

// ---- the papers' matrices, written out by hand for L = 3 ----------------------------------------

TEST_CASE("Mamba-1 paper matrices by hand (L = 3)", "[models][mamba][paper]") {
  const auto w = small_mamba<double>(5);
  const auto u = sample_input<double>(3, 32, 5);
  const auto s = activations(w, u);
  const MatD p = s.conv_out();
  const Index N = w.config.d_state;
  for (Index c : {Index(0), Index(37)}) {
    // Ali et al. eq. 12: alpha[t, s] = C_t (prod_{k=s+1..t} exp(dt_k A)) dt_s B_s
    MatD alpha = MatD::Zero(3, 3);
    for (Index t = 0; t < 3; ++t)
      for (Index q = 0; q <= t; ++q)
        for (Index n = 0; n < N; ++n) {
          double decay = 1;
          for (Index k = q + 1; k <= t; ++k) decay *= std::exp(s.delta(k, c) * s.A(c, n));
          alpha(t, q) += s.C(t, n) * decay * s.delta(q, c) * s.B(q, n);
        }
    check_close(iattn::materialize(s6_attention(w, u), c), alpha, 1e-12);
    // Zimerman et al. eq. 9: diag(SiLU z) alpha diag(sigmoid p) M
    MatD gate = MatD::Zero(3, 3), act = MatD::Zero(3, 3), M = MatD::Zero(3, 3);
    for (Index t = 0; t < 3; ++t) {
      gate(t, t) = nn::silu(s.z(t, c));
      act(t, t) = nn::sigmoid(p(t, c));
      for (Index q = 0; q <= t; ++q)
        if (t - q < w.config.d_conv) M(t, q) = w.conv1d_weight(c, w.config.d_conv - 1 - (t - q));
    }
    check_close(iattn::materialize(holistic_attention(w, u), c), MatD(gate * alpha * act * M), 1e-12);
    // Table 4 ablations drop factors
    check_close(iattn::materialize(holistic_attention<mamba_ablation{.conv = false}>(w, u), c), MatD(gate * alpha * act), 1e-12);
    check_close(iattn::materialize(holistic_attention<mamba_ablation{.gate = false}>(w, u), c), MatD(alpha * act * M), 1e-12);
    check_close(iattn::materialize(holistic_attention<mamba_ablation{.activation = false}>(w, u), c), MatD(gate * alpha * M), 1e-12);
  }
}

TEMPLATE_TEST_CASE("Mamba-2 with a dt floor (NemotronH, Zamba2) equals out_proj(H x + beta)", "[models][mamba2]", float, double) {
  using T = TestType;
  auto w = small_mamba2<T>(12);
  const Mat<T> u = normal<T>(40, w.config.d_model);
  const auto plain = activations(w, u);
  // a floor above the median dt: about half the steps are clamped
  std::vector<T> v(plain.dt.data(), plain.dt.data() + plain.dt.size());
  std::nth_element(v.begin(), v.begin() + Index(v.size() / 2), v.end());
  w.config.dt_min = double(v[v.size() / 2]);
  const auto clamped = activations(w, u);
  CHECK(clamped.dt.minCoeff() >= T(w.config.dt_min));
  CHECK((clamped.dt.array() != plain.dt.array()).count() >= plain.dt.size() / 3);
  check_exact<T>(mamba2_forward(w, u), mamba2_decompose(w, u));
  CHECK((dd(mamba2_forward(w, u)) - dd(mamba2_forward(small_mamba2<T>(12), u))).cwiseAbs().maxCoeff() > 1e-6);
  w.config.dt_min = -1;
  REQUIRE_THROWS_WITH(mamba2_forward(w, u), Catch::Contains("config.dt_min is -1"));
}

TEST_CASE("Mamba-2 paper matrix by hand (L = 3)", "[models][mamba2][paper]") {
  const auto w = small_mamba2<double>(6);
  const auto u = sample_input<double>(3, 32, 6);
  const auto s = activations(w, u);
  const MatD p = s.conv_out();
  const auto& c = w.config;
  const Index N = c.d_state, P = c.headdim, H = c.nheads(), di = c.d_inner();
  // v = diag(SiLU z) alpha diag(sigmoid p) M x per channel, then N = diag(weight / rms(v)) per group
  std::vector<MatD> Hc(static_cast<std::size_t>(di));
  MatD v(3, di);
  for (Index ch = 0; ch < di; ++ch) {
    const Index h = ch / P, g = h / (H / c.ngroups);
    MatD alpha = MatD::Zero(3, 3), gate = MatD::Zero(3, 3), act = MatD::Zero(3, 3), M = MatD::Zero(3, 3);
    for (Index t = 0; t < 3; ++t) {
      gate(t, t) = nn::silu(s.z(t, ch));
      act(t, t) = nn::sigmoid(p(t, ch));
      for (Index q = 0; q <= t; ++q) {
        double decay = 1;
        for (Index k = q + 1; k <= t; ++k) decay *= std::exp(s.dt(k, h) * s.A(0, h));
        for (Index n = 0; n < N; ++n) alpha(t, q) += s.C(t, g * N + n) * decay * s.dt(q, h) * s.B(q, g * N + n);
        if (t - q < c.d_conv) M(t, q) = w.conv1d_weight(ch, c.d_conv - 1 - (t - q));
      }
    }
    Hc[std::size_t(ch)] = gate * alpha * act * M;
    v.col(ch) = Hc[std::size_t(ch)] * s.x.col(ch);
  }
  const auto paper = mamba2_paper_attention(w, u);
  const Index Dg = di / c.ngroups;
  for (Index ch : {Index(0), Index(17), di - 1}) {
    MatD norm = MatD::Zero(3, 3);
    const Index g = ch / Dg;
    for (Index t = 0; t < 3; ++t) norm(t, t) = w.norm_weight(0, ch) / std::sqrt(v.row(t).segment(g * Dg, Dg).squaredNorm() / double(Dg) + c.eps);
    check_close(iattn::materialize(paper, ch), MatD(norm * Hc[std::size_t(ch)]), 1e-12);
  }
}

TEST_CASE("Griffin paper matrix by hand (L = 3), with and without sqrt(1 - a^2)", "[models][griffin][paper]") {
  const auto w = small_griffin<double>(7);
  const auto u = sample_input<double>(3, 32, 7);
  for (bool normaliser : {true, false}) {
    const auto s = activations(w, u);
    MatD a, b;
    s.recurrence(a, b, normaliser);
    for (Index ch : {Index(0), Index(47)}) {
      MatD alpha = MatD::Zero(3, 3), gate = MatD::Zero(3, 3), M = MatD::Zero(3, 3);
      for (Index t = 0; t < 3; ++t) {
        gate(t, t) = s.y(t, ch);
        for (Index q = 0; q <= t; ++q) {
          double prod = 1;
          for (Index k = q + 1; k <= t; ++k) prod *= a(k, ch);
          // eq. 16: (prod a) m_s i_s with b = m i (m = sqrt(1 - a^2), checked below)
          alpha(t, q) = prod * b(q, ch);
          if (t - q < 4) M(t, q) = w.conv_1d_w(3 - (t - q), ch);
        }
      }
      check_close(iattn::materialize(griffin_paper_attention(w, u, normaliser), ch), MatD(gate * alpha * M), 1e-12);
    }
  }
  // m itself: sqrt(1 - a^2) after the first token, 1 without the normaliser
  const auto s = activations(w, u);
  MatD a1, b1, a0, b0;
  s.recurrence(a1, b1, true);
  s.recurrence(a0, b0, false);
  for (Index t = 1; t < 3; ++t) {
    const double a = a1(t, 3);
    REQUIRE(std::abs(b1(t, 3) / b0(t, 3) - std::sqrt(1 - a * a)) < 1e-12);
  }
  REQUIRE(a1(0, 3) == 0.0);
  REQUIRE(b1(0, 3) == b0(0, 3));
}

TEST_CASE("RWKV-4 WKV matrix by hand (L = 3, eq. 20)", "[models][rwkv4][paper]") {
  const auto w = small_rwkv4<double>(8);
  const auto u = sample_input<double>(3, 32, 8);
  const auto s = activations(w, u);
  const auto d = rwkv4_decompose(w, u);
  for (Index c : {Index(0), Index(31)}) {
    const double wd = -std::exp(w.time_decay(0, c)), first = w.time_first(0, c);
    MatD alpha = MatD::Zero(3, 3);
    for (Index t = 0; t < 3; ++t) {
      double den = std::exp(first + s.key(t, c));
      for (Index q = 0; q < t; ++q) den += std::exp(double(t - 1 - q) * wd + s.key(q, c));
      alpha(t, t) = std::exp(first + s.key(t, c)) / den;
      for (Index q = 0; q < t; ++q) alpha(t, q) = std::exp(double(t - 1 - q) * wd + s.key(q, c)) / den;
      alpha.row(t) *= s.receptance(t, c);
    }
    check_close(iattn::materialize(d.H, c), alpha, 1e-12);
  }
}

// ---- an independent closed form: the segment-sum formula of Mamba-2's minimal SSD -----------------

// Y[t, p] = sum_{s<=t} (C_t . B_s) exp(segsum(dt A)[t, s]) dt_s X[s, p], segsum[t, s] = sum_{k=s+1..t}.
TEST_CASE("Mamba-1 S6 and Mamba-2 match the segment-sum closed form", "[models][ssd]") {
  const Index L = 40;
  {
    const auto w = small_mamba2<double>(9);
    const auto u = sample_input<double>(L, 32, 9);
    const auto s = activations(w, u);
    const MatD a = s.conv_out().unaryExpr([](double v) { return nn::silu(v); });
    const auto& c = w.config;
    const Index H = c.nheads(), P = c.headdim, N = c.d_state;
    auto core = iattn::semiseparable(MatD(s.dt.array().rowwise() * s.A.row(0).array()), s.B, s.C,
                                     {.heads = H, .head_dim = P, .groups = c.ngroups});
    MatD dtx(L, c.d_inner());
    for (Index t = 0; t < L; ++t)
      for (Index ch = 0; ch < c.d_inner(); ++ch) dtx(t, ch) = s.dt(t, ch / P) * a(t, ch);
    const MatD y = iattn::apply(core, dtx);
    for (Index h : {Index(0), H - 1}) {
      const Index g = h / (H / c.ngroups);
      MatD seg = MatD::Zero(L, L);  // segsum, -inf above the diagonal
      for (Index t = 0; t < L; ++t)
        for (Index q = 0; q < L; ++q) {
          if (q > t) { seg(t, q) = -std::numeric_limits<double>::infinity(); continue; }
          for (Index k = q + 1; k <= t; ++k) seg(t, q) += s.dt(k, h) * s.A(0, h);
        }
      const MatD CB = s.C.middleCols(g * N, N) * s.B.middleCols(g * N, N).transpose();
      const MatD Y = (CB.array() * seg.array().exp()).matrix() * dtx.middleCols(h * P, P);
      check_close(y.middleCols(h * P, P), Y, 1e-10);
    }
  }
  {
    const auto w = small_mamba<double>(10);
    const auto u = sample_input<double>(L, 32, 10);
    const auto s = activations(w, u);
    const MatD a = s.conv_out().unaryExpr([](double v) { return nn::silu(v); });
    const MatD y = iattn::apply(s6_attention(w, u), a);
    for (Index c : {Index(0), Index(63)}) {
      MatD Y = MatD::Zero(L, 1);
      for (Index n = 0; n < w.config.d_state; ++n)
        for (Index t = 0; t < L; ++t)
          for (Index q = 0; q <= t; ++q) {
            double seg = 0;
            for (Index k = q + 1; k <= t; ++k) seg += s.delta(k, c) * s.A(c, n);
            Y(t, 0) += s.C(t, n) * s.B(q, n) * std::exp(seg) * s.delta(q, c) * a(q, c);
          }
      check_close(y.col(c), Y, 1e-10);
    }
  }
}

// ---- bad weights -------------------------------------------------------------------------------------

TEST_CASE("model weights with a wrong shape throw, naming the field and the expected shape", "[models][errors]") {
  const auto u = sample_input<double>(5, 32);
  {
    auto w = small_mamba<double>(1);
    w.A_log = MatD::Zero(64, 15);
    REQUIRE_THROWS_WITH(mamba_decompose(w, u), Contains("mamba: A_log has shape (64, 15)") && Contains("d_state=16"));
    REQUIRE_THROWS_AS(mamba_forward(w, u), std::invalid_argument);
  }
  {
    auto w = small_mamba<double>(1);
    REQUIRE_THROWS_WITH(mamba_decompose(w, sample_input<double>(5, 31)), Contains("u has shape (5, 31)") && Contains("d_model=32"));
  }
  {
    auto w = small_mamba2<double>(1);
    w.conv1d_bias = MatD::Zero(1, 3);
    REQUIRE_THROWS_WITH(mamba2_decompose(w, u), Contains("mamba2: conv1d_bias has shape (1, 3)") && Contains("conv_dim="));
  }
  {
    auto w = small_griffin<double>(1);
    w.rg_lru_a_gate_w = MatD::Zero(48, 48);
    REQUIRE_THROWS_WITH(griffin_decompose(w, u), Contains("griffin: rg_lru_a_gate_w has shape (48, 48)") && Contains("block_width=16"));
    REQUIRE_THROWS_WITH(griffin_forward(small_griffin<double>(1), u, {0, 1, 2}), Contains("segment_pos"));
  }
  {
    auto w = small_rwkv4<double>(1);
    w.time_first = MatD::Zero(32, 1);
    REQUIRE_THROWS_WITH(rwkv4_decompose(w, u), Contains("rwkv4: time_first has shape (32, 1)") && Contains("(1, attention_hidden_size=32)"));
  }
}
