// The models beyond the papers (GLA, HGRN2, RWKV-6, linear and softmax attention, S4D, Hyena,
// Vision Mamba, mLSTM): exact decompositions against their own forwards, structure, shape errors.
#include "support/model_checks.hpp"

#include <iattn/models/gla.hpp>
#include <iattn/models/hgrn2.hpp>
#include <iattn/models/hyena.hpp>
#include <iattn/models/linear_attention.hpp>
#include <iattn/models/mlstm.hpp>
#include <iattn/models/rwkv6.hpp>
#include <iattn/models/s4d.hpp>
#include <iattn/models/transformer.hpp>
#include <iattn/models/vision_mamba.hpp>

using namespace test;
using namespace iattn::models;
using Catch::Matchers::Contains;
using iattn::Matrix;

namespace {

template <class T>
gla_weights<T> small_gla(std::uint64_t seed) {
  auto w = gla_init<T>({.hidden_size = 32, .key_dim = 16, .value_dim = 32, .num_heads = 2, .gate_low_rank_dim = 8}, seed);
  init::generator g(seed + 100);
  w.g_norm_swish_gate_weight = init::uniform<T>(g, 1, 16, 0.5, 1.5);
  return w;
}
template <class T>
hgrn2_weights<T> small_hgrn2(std::uint64_t seed, Index layer = 0) {
  auto w = hgrn2_init<T>({.hidden_size = 32, .expand_ratio = 8, .layer_idx = layer, .num_layers = 4}, seed);
  init::generator g(seed + 100);
  w.g_norm_weight = init::uniform<T>(g, 1, 32, 0.5, 1.5);
  return w;
}
template <class T>
rwkv6_weights<T> small_rwkv6(std::uint64_t seed) {
  auto w = rwkv6_init<T>({.hidden_size = 32, .key_dim = 16, .value_dim = 32, .num_heads = 2, .proj_low_rank_dim = 4,
                          .gate_low_rank_dim = 8, .layer_idx = 1, .num_layers = 3}, seed);
  init::generator g(seed + 100);  // norm affine parameters that are not 1 and 0
  w.g_norm_weight = init::uniform<T>(g, 1, 32, 0.5, 1.5);
  w.g_norm_bias = init::normal<T>(g, 1, 32, 0.3);
  return w;
}

}  // namespace

TEMPLATE_TEST_CASE("GLA equals o_proj(H v)", "[models][gla]", float, double) {
  using T = TestType;
  const auto w = small_gla<T>(41);
  for (Index L : model_lengths) {
    INFO("L = " << L);
    const auto u = sample_input<T>(L, 32, 51 + L);
    check_exact<T>(gla_forward(w, u), gla_decompose(w, u));
  }
}

TEMPLATE_TEST_CASE("HGRN2 equals o_proj(H i)", "[models][hgrn2]", float, double) {
  using T = TestType;
  for (Index layer : {0, 3}) {
    const auto w = small_hgrn2<T>(42, layer);
    for (Index L : model_lengths) {
      INFO("L = " << L << ", layer " << layer);
      const auto u = sample_input<T>(L, 32, 52 + L);
      check_exact<T>(hgrn2_forward(w, u), hgrn2_decompose(w, u));
    }
  }
}

TEMPLATE_TEST_CASE("RWKV-6 time mixing equals o_proj(H v + beta)", "[models][rwkv6]", float, double) {
  using T = TestType;
  const auto w = small_rwkv6<T>(43);
  for (Index L : model_lengths) {
    INFO("L = " << L);
    const auto u = sample_input<T>(L, 32, 53 + L);
    check_exact<T>(rwkv6_forward(w, u), rwkv6_decompose(w, u));
  }
}

TEST_CASE("RWKV-6 WKV matrix by hand (L = 3): strict decay, bonus on the diagonal", "[models][rwkv6]") {
  const auto w = small_rwkv6<double>(44);
  const auto u = sample_input<double>(3, 32, 8);
  const auto s = activations(w, u);
  const auto S = rwkv6_wkv(s);
  const Index dk = 8;
  for (Index c : {Index(0), Index(20)}) {
    const Index h = c / 16;
    MatD expect = MatD::Zero(3, 3);
    for (Index t = 0; t < 3; ++t)
      for (Index j = 0; j <= t; ++j)
        for (Index m = 0; m < dk; ++m) {
          const Index km = h * dk + m;
          double decay = 1;
          for (Index k = j + 1; k < t; ++k) decay *= std::exp(s.w(k, km));
          expect(t, j) += s.r(t, km) * s.k(j, km) * (j == t ? w.bonus(h, m) : decay);
        }
    check_close(MatD(iattn::materialize(S, c)), expect, 1e-13);
  }
}

TEST_CASE("GLA, HGRN2 and RWKV-6 weights with a wrong shape throw, naming the field", "[models][errors]") {
  const auto u = sample_input<double>(5, 32);
  {
    auto w = small_gla<double>(1);
    w.gk_proj_1_bias = MatD::Zero(1, 15);
    REQUIRE_THROWS_WITH(gla_decompose(w, u), Contains("gla: gk_proj_1_bias has shape (1, 15)") && Contains("(1, key_dim=16)"));
  }
  {
    auto w = small_hgrn2<double>(1);
    w.q_proj_weight = MatD::Zero(32, 31);
    REQUIRE_THROWS_WITH(hgrn2_forward(w, u), Contains("hgrn2: q_proj_weight has shape (32, 31)") && Contains("(forget_dim=32, hidden_size=32)"));
  }
  {
    auto w = small_rwkv6<double>(1);
    w.bonus = MatD::Zero(4, 4);
    REQUIRE_THROWS_WITH(rwkv6_decompose(w, u), Contains("rwkv6: bonus has shape (4, 4)") && Contains("(num_heads=2, head_k_dim=8)"));
    REQUIRE_THROWS_WITH(rwkv6_forward(small_rwkv6<double>(1), sample_input<double>(5, 8)), Contains("u has shape (5, 8)"));
  }
}

// ---- linear and softmax attention, S4D, Hyena, Vision Mamba ------------------------------------

TEMPLATE_TEST_CASE("normalised linear attention equals out_projection(H v)", "[models][linear_attention]", float, double) {
  using T = TestType;
  const auto w = linear_attention_init<T>({.d_model = 32, .n_heads = 2, .d_keys = 8, .d_values = 16}, 45);
  for (Index L : model_lengths) {
    INFO("L = " << L);
    const auto u = sample_input<T>(L, 32, 55 + L);
    check_exact<T>(linear_attention_forward(w, u), linear_attention_decompose(w, u));
  }
}

TEST_CASE("linear attention without eps is row_normalize(S): rows sum to 1", "[models][linear_attention]") {
  const auto w = linear_attention_init<double>({.d_model = 32, .n_heads = 2, .d_keys = 8, .d_values = 16, .eps = 0}, 46);
  const auto u = sample_input<double>(20, 32, 3);
  const auto d = linear_attention_decompose(w, u);
  check_exact<double>(linear_attention_forward(w, u), d);
  const MatD M = iattn::materialize(d.H, 17);
  check_close(MatD(M.rowwise().sum()), MatD::Ones(20, 1), 1e-13);
  REQUIRE(M.minCoeff() >= 0.0);  // phi = elu + 1 > 0: a convex combination of the past
}

TEMPLATE_TEST_CASE("causal softmax attention equals out_proj(H v)", "[models][transformer]", float, double) {
  using T = TestType;
  const auto w = transformer_init<T>({.embed_dim = 32, .num_heads = 4}, 47);
  for (Index L : model_lengths) {
    INFO("L = " << L);
    const auto u = sample_input<T>(L, 32, 57 + L);
    check_exact<T>(transformer_forward(w, u), transformer_decompose(w, u));
  }
}

TEMPLATE_TEST_CASE("S4D equals GELU(K * u + D u) through a long convolution", "[models][s4d]", float, double) {
  using T = TestType;
  const auto w = s4d_init<T>({.d_model = 16, .d_state = 16}, 48);
  for (Index L : model_lengths) {
    INFO("L = " << L);
    const auto u = sample_input<T>(L, 16, 58 + L);
    check_exact<T>(s4d_forward(w, u), s4d_decompose(w, u));
  }
}

TEST_CASE("S4D kernel matches the Vandermonde closed form by hand", "[models][s4d]") {
  const auto w = s4d_init<double>({.d_model = 4, .d_state = 8}, 49);
  const Index L = 6;
  const MatD taps = s4d_kernel_taps(w, L);
  for (Index h = 0; h < 4; ++h)
    for (Index l = 0; l < L; ++l) {
      double k = 0;  // 2 Re sum_n C_n (exp(dt A_n) - 1) / A_n exp(dt A_n l), written out in real arithmetic
      const double dt = std::exp(w.kernel_log_dt(0, h));
      for (Index n = 0; n < 4; ++n) {
        const double ar = -std::exp(w.kernel_log_A_real(h, n)), ai = w.kernel_A_imag(h, n);
        const double er = std::exp(dt * ar) * std::cos(dt * ai) - 1, ei = std::exp(dt * ar) * std::sin(dt * ai);
        const double den = ar * ar + ai * ai;  // (er + i ei) / (ar + i ai)
        const double qr = (er * ar + ei * ai) / den, qi = (ei * ar - er * ai) / den;
        const double cr = w.kernel_C_re(h, n) * qr - w.kernel_C_im(h, n) * qi, ci = w.kernel_C_re(h, n) * qi + w.kernel_C_im(h, n) * qr;
        const double pr = std::exp(dt * ar * double(l)) * std::cos(dt * ai * double(l)), pi = std::exp(dt * ar * double(l)) * std::sin(dt * ai * double(l));
        k += 2 * (cr * pr - ci * pi);
      }
      REQUIRE(std::abs(taps(L - 1 - l, h) - k) <= 1e-13 * (1 + std::abs(k)));
    }
}

TEMPLATE_TEST_CASE("Hyena order 2 equals out_proj(H v + beta)", "[models][hyena]", float, double) {
  using T = TestType;
  const auto w = hyena_init<T>({.d_model = 16, .l_max = 300}, 50);
  for (Index L : model_lengths) {
    INFO("L = " << L);
    const auto u = sample_input<T>(L, 16, 60 + L);
    check_exact<T>(hyena_forward(w, u), hyena_decompose(w, u));
  }
}

TEMPLATE_TEST_CASE("Vision Mamba (bidirectional, middle CLS) equals out_proj(H x + beta)", "[models][vim]", float, double) {
  using T = TestType;
  const auto w = vision_mamba_init<T>({.mamba = {.d_model = 16, .d_state = 8}}, 51);
  init::generator g(7);
  const Matrix<T> cls = init::normal<T>(g, 1, 16, 1.0);
  for (Index L : model_lengths) {
    INFO("L = " << L);
    const Matrix<T> u = insert_token<T>(sample_input<T>(L, 16, 61 + L), cls, vim_cls_position(L));
    check_exact<T>(vision_mamba_forward(w, u), vision_mamba_decompose(w, u), /*causal=*/false);
  }
}

TEST_CASE("Vision Mamba's matrix: forward branch below, mirrored backward branch above", "[models][vim]") {
  const auto w = vision_mamba_init<double>({.mamba = {.d_model = 16, .d_state = 8}}, 52);
  const Index M = 14, L = M + 1, pos = vim_cls_position(M);
  REQUIRE(pos == 7);
  const MatD u = insert_token<double>(sample_input<double>(M, 16, 4), MatD::Constant(1, 16, 0.5), pos);
  REQUIRE(u.row(pos).isApprox(MatD::Constant(1, 16, 0.5)));
  const auto d = vision_mamba_decompose(w, u);
  const auto f = mamba_decompose(w.fwd, u);
  const MatD ur = u.colwise().reverse();
  const auto b = mamba_decompose(w.bwd(), ur);
  for (Index c : {Index(0), Index(19)}) {
    const MatD H = iattn::materialize(d.H, c), F = iattn::materialize(f.H, c), B = iattn::materialize(b.H, c);
    MatD JBJ(L, L);  // J B J, written as index arithmetic
    for (Index t = 0; t < L; ++t)
      for (Index s = 0; s < L; ++s) JBJ(t, s) = B(L - 1 - t, L - 1 - s);
    check_close(MatD(H.triangularView<Eigen::StrictlyLower>()), MatD(0.5 * MatD(F.triangularView<Eigen::StrictlyLower>())), 1e-13);
    check_close(MatD(H.triangularView<Eigen::StrictlyUpper>()), MatD(0.5 * MatD(JBJ.triangularView<Eigen::StrictlyUpper>())), 1e-13);
    check_close(MatD(H.diagonal()), MatD(0.5 * (F.diagonal() + JBJ.diagonal())), 1e-13);
    // the class token in the middle is reached from both sides
    REQUIRE(H.row(pos).head(pos).cwiseAbs().maxCoeff() > 0);
    REQUIRE(H.row(pos).tail(L - pos - 1).cwiseAbs().maxCoeff() > 0);
  }
  REQUIRE_THROWS_WITH(insert_token<double>(u, MatD::Zero(1, 15), 0), Contains("token has shape (1, 15)"));
  REQUIRE_THROWS_WITH(insert_token<double>(u, MatD::Zero(1, 16), L + 1), Contains("position 16 must lie in [0, 15]"));
}

TEMPLATE_TEST_CASE("mLSTM layer equals proj_down(H v + beta)", "[models][mlstm]", float, double) {
  using T = TestType;
  auto w = mlstm_init<T>({.embedding_dim = 32}, 53);
  init::generator g(9);
  w.mlstm_cell_outnorm_weight = init::normal<T>(g, 1, 64, 0.2);
  w.learnable_skip = init::uniform<T>(g, 1, 64, 0.5, 1.5);
  for (Index L : model_lengths) {
    INFO("L = " << L);
    const auto u = sample_input<T>(L, 32, 63 + L);
    check_exact<T>(mlstm_forward(w, u), mlstm_decompose(w, u));
  }
}

TEST_CASE("mLSTM cell matrix equals the parallel stabilised form by hand (L = 3)", "[models][mlstm]") {
  auto w = mlstm_init<double>({.embedding_dim = 32}, 54);
  init::generator g(10);  // input gates spread out, so the row maxima differ from the diagonal
  w.mlstm_cell_igate_weight = init::normal<double>(g, 4, 192, 0.3);
  const auto u = sample_input<double>(3, 32, 11);
  const auto s = activations(w, u);
  const auto A = mlstm_cell_attention(s);
  const Index DH = 16;
  for (Index c : {Index(0), Index(40)}) {
    const Index h = c / DH;
    // log D[t, s] = sum_{r=s+1..t} logsigmoid(f_r) + i_s; C = qk/sqrt(DH) exp(log D - rowmax); C / (max(|C 1|, exp(-rowmax)) + eps)
    MatD C = MatD::Zero(3, 3);
    for (Index t = 0; t < 3; ++t) {
      double mx = -1e300;
      std::vector<double> logD(3, -1e300);
      for (Index j = 0; j <= t; ++j) {
        double F = 0;
        for (Index r = j + 1; r <= t; ++r) F += nn::log_sigmoid(s.fgate_preact(r, h));
        logD[std::size_t(j)] = F + s.igate_preact(j, h);
        mx = std::max(mx, logD[std::size_t(j)]);
      }
      for (Index j = 0; j <= t; ++j)
        C(t, j) = s.q.row(t).segment(h * DH, DH).dot(s.k.row(j).segment(h * DH, DH)) / 4.0 * std::exp(logD[std::size_t(j)] - mx);
      C.row(t) /= std::max(std::abs(C.row(t).sum()), std::exp(-mx)) + 1e-6;
    }
    check_close(MatD(iattn::materialize(A, c, 3)), C, 1e-13);
  }
}

TEST_CASE("beyond-the-papers weights with a wrong shape throw, naming the field", "[models][errors]") {
  {
    auto w = linear_attention_init<double>({.d_model = 32}, 1);
    w.key_projection_bias = MatD::Zero(1, 3);
    REQUIRE_THROWS_WITH(linear_attention_decompose(w, sample_input<double>(5, 32)), Contains("linear_attention: key_projection_bias has shape (1, 3)"));
  }
  {
    auto w = transformer_init<double>({.embed_dim = 32, .num_heads = 4}, 1);
    w.in_proj_weight = MatD::Zero(32, 32);
    REQUIRE_THROWS_WITH(transformer_forward(w, sample_input<double>(5, 32)), Contains("transformer: in_proj_weight has shape (32, 32)") && Contains("3*embed_dim=96"));
  }
  {
    auto w = s4d_init<double>({.d_model = 8, .d_state = 8}, 1);
    w.kernel_A_imag = MatD::Zero(8, 3);
    REQUIRE_THROWS_WITH(s4d_decompose(w, sample_input<double>(5, 8)), Contains("s4d: kernel_A_imag has shape (8, 3)") && Contains("d_state/2=4"));
  }
  {
    auto w = hyena_init<double>({.d_model = 8, .l_max = 16}, 1);
    REQUIRE_THROWS_WITH(hyena_decompose(w, sample_input<double>(17, 8)), Contains("u has shape (17, 8)") && Contains("L <= l_max=16"));
    w.filter_bias = MatD::Zero(8, 1);
    REQUIRE_THROWS_WITH(hyena_forward(w, sample_input<double>(5, 8)), Contains("hyena: filter_bias has shape (8, 1)"));
  }
  {
    auto w = mlstm_init<double>({.embedding_dim = 32}, 1);
    w.v_proj_weight = MatD::Zero(64, 3);
    REQUIRE_THROWS_WITH(mlstm_decompose(w, sample_input<double>(5, 32)), Contains("mlstm: v_proj_weight has shape (64, 3)") && Contains("qkv_proj_blocksize=4"));
  }
  {
    auto w = vision_mamba_init<double>({.mamba = {.d_model = 16, .d_state = 8}}, 1);
    w.A_b_log = MatD::Zero(32, 7);
    REQUIRE_THROWS_WITH(vision_mamba_decompose(w, sample_input<double>(5, 16)), Contains("backward branch") && Contains("A_log has shape (32, 7)"));
  }
}
