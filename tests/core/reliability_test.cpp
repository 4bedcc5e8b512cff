// Reliability: empty sequences through every operator, evaluation and model; the non-finite
// policy (propagate, exactly where the matrix depends on the value); numerical extremes (decays of
// exactly 0 and 1, RWKV keys of +-80 in float). Concurrent evaluation of one shared expression is
// in threads_test.cpp (its own program, so the ThreadSanitizer stage compiles only that).
#include "support/model_checks.hpp"

#include <iattn/models/all.hpp>

using namespace test;
using iattn::Matrix;
using namespace iattn;

TEST_CASE("L = 0: every operator and evaluation gives an empty result", "[reliability][empty]") {
  const Index D = 4;
  const MatD z(0, D), e(0, D), e2(0, 2);
  auto check = [&](const auto& H, const char* name) {
    INFO(name);
    const MatD y = apply(H, z);
    REQUIRE(y.rows() == 0);
    REQUIRE(y.cols() == D);
    REQUIRE(materialize(H, 0, 0).size() == 0);
    REQUIRE(materialize_mean(H, 0).size() == 0);
    REQUIRE_THROWS_WITH(row(H, 0, 0), Catch::Matchers::Contains("out of range"));
  };
  check(diagonal(e), "diagonal");
  check(linear_recurrence(e, e), "linear_recurrence");
  check(semiseparable(e, e2, e2, {.heads = D}), "semiseparable");
  check(semiseparable(factored_decay(e, MatD(MatD::Constant(D, 2, -1.0))), e2, e2, {.heads = D}), "semiseparable (factored)");
  check(semiseparable(e, e2, e2, MatD(MatD::Ones(D, 2)), {.heads = D}), "semiseparable (strict)");
  check(softmax_attention(e, e, {.heads = 1, .head_dim = D}), "softmax_attention");
  check(wkv(MatD(MatD::Zero(1, D)), e, MatD(MatD::Zero(1, D))), "wkv");
  check(causal_conv(MatD(MatD::Ones(3, D))) * diagonal(e), "conv * diagonal");
  check(flip(linear_recurrence(e, e)) + row_normalize(linear_recurrence(e, e)), "flip + row_normalize");
  const auto n = group_norm<double>(2);
  REQUIRE(apply(n * linear_recurrence(e, e), z).rows() == 0);
  REQUIRE(bind(n * linear_recurrence(e, e), z).channels() == D);
}

TEST_CASE("L = 0: every model's forward and decomposition give (0, d_model)", "[reliability][empty][models]") {
  using namespace iattn::models;
  const MatD u(0, 32);
  auto check = [&](const MatD& y, const auto& d, const char* name) {
    INFO(name);
    REQUIRE(y.rows() == 0);
    REQUIRE(y.cols() == 32);
    const MatD o = d.output();
    REQUIRE(o.rows() == 0);
    REQUIRE(o.cols() == 32);
  };
#define IATTN_EMPTY(name, w) check(name##_forward(w, u), name##_decompose(w, u), #name)
  IATTN_EMPTY(mamba, mamba_init<double>({.d_model = 32}));
  IATTN_EMPTY(mamba2, mamba2_init<double>({.d_model = 32, .d_state = 16, .headdim = 16}));
  IATTN_EMPTY(griffin, griffin_init<double>({.width = 32, .lru_width = 32}));
  IATTN_EMPTY(rwkv4, rwkv4_init<double>({.hidden_size = 32, .attention_hidden_size = 32}));
  IATTN_EMPTY(retnet, retnet_init<double>({.embed_dim = 32, .value_dim = 64}));
  IATTN_EMPTY(hgrn, hgrn_init<double>({.hidden_size = 32}));
  IATTN_EMPTY(gla, gla_init<double>({.hidden_size = 32, .key_dim = 16, .value_dim = 32}));
  IATTN_EMPTY(hgrn2, hgrn2_init<double>({.hidden_size = 32, .expand_ratio = 8}));
  IATTN_EMPTY(rwkv6, rwkv6_init<double>({.hidden_size = 32, .key_dim = 16, .value_dim = 32, .num_heads = 2, .proj_low_rank_dim = 4, .gate_low_rank_dim = 8}));
  IATTN_EMPTY(linear_attention, linear_attention_init<double>({.d_model = 32}));
  IATTN_EMPTY(transformer, transformer_init<double>({.embed_dim = 32}));
  IATTN_EMPTY(s4d, s4d_init<double>({.d_model = 32, .d_state = 8}));
  IATTN_EMPTY(hyena, hyena_init<double>({.d_model = 32, .l_max = 8}));
  IATTN_EMPTY(vision_mamba, vision_mamba_init<double>({.mamba = {.d_model = 32}}));
  IATTN_EMPTY(mlstm, mlstm_init<double>({.embedding_dim = 32}));
#undef IATTN_EMPTY
}

TEST_CASE("non-finite coefficients propagate exactly where the matrix depends on them", "[reliability][nonfinite]") {
  const Index L = 40, D = 3, N = 4;
  MatD lam = uniform<double>(L, D * N, -1, 0), B = normal<double>(L, N), C = normal<double>(L, N);
  const MatD x = normal<double>(L, D);
  const Index s0 = 17;
  B(s0, 2) = std::nan("");
  const auto S = semiseparable(lam, B, C, {.heads = D});
  for (Index c = 0; c < D; ++c) {
    const MatD M = materialize(S, c);
    for (Index t = 0; t < L; ++t)
      for (Index s = 0; s < L; ++s) {
        const bool depends = s == s0 && t >= s0;
        INFO("t = " << t << ", s = " << s);
        REQUIRE(std::isfinite(M(t, s)) == !depends);
      }
  }
  const MatD y = apply(S, x);  // every output from s0 on sees the NaN through the state; none before
  REQUIRE(y.topRows(s0).allFinite());
  for (Index t = s0; t < L; ++t) REQUIRE(std::isnan(y(t, 0)));
  // an infinite input value: the same columns, through apply's linearity
  MatD xi = x;
  xi(5, 1) = std::numeric_limits<double>::infinity();
  const MatD yi = apply(linear_recurrence(MatD(uniform<double>(L, D, 0.1, 0.9)), MatD(uniform<double>(L, D, 0.5, 1.0))), xi);
  REQUIRE(yi.topRows(5).allFinite());
  REQUIRE(yi.col(0).allFinite());
  REQUIRE(std::isinf(yi(5, 1)));
  // lambda = -inf is a value, not an error: a reset with exact zeros across it
  lam.row(25).setConstant(-std::numeric_limits<double>::infinity());
  const MatD Mr = materialize(semiseparable(lam, MatD(normal<double>(L, N)), MatD(normal<double>(L, N)), {.heads = D}), 1);
  REQUIRE(Mr.block(25, 0, L - 25, 25).cwiseAbs().maxCoeff() == 0.0);
  REQUIRE(Mr.allFinite());
}

TEST_CASE("decays of exactly 1 give exact running sums; exactly 0 give exact zeros", "[reliability][extremes]") {
  const Index L = 2000, D = 5;
  const Mat<float> ones = Mat<float>::Ones(L, D);
  // lambda = 0, B = C = 1: H is the lower-triangular matrix of ones; apply(1) counts exactly in float
  const auto S = semiseparable(Mat<float>(Mat<float>::Zero(L, D)), Mat<float>(Mat<float>::Ones(L, 1)), Mat<float>(Mat<float>::Ones(L, 1)), {.heads = D});
  const Mat<float> y = apply(S, ones);
  for (Index t = 0; t < L; ++t) REQUIRE(y(t, 2) == float(t + 1));
  const auto R = linear_recurrence(ones, ones);  // a = 1
  REQUIRE(Mat<float>(apply(R, ones))(L - 1, 4) == float(L));
  const Mat<float> M = materialize(S, 0);
  REQUIRE(M.triangularView<Eigen::Lower>().toDenseMatrix().minCoeff() == 0.0f);
  REQUIRE(M(L - 1, 0) == 1.0f);
  // a = 0 everywhere: H = diag(b) exactly
  const Mat<float> b = uniform<float>(L, D, 1, 2);
  const Mat<float> M0 = materialize(linear_recurrence(Mat<float>(Mat<float>::Zero(L, D)), b), 3);
  REQUIRE(Mat<float>(M0 - Mat<float>(b.col(3).asDiagonal())).cwiseAbs().maxCoeff() == 0.0f);
}

TEST_CASE("RWKV-4 with keys of +-80 in float is exact against its double forward", "[reliability][extremes][models]") {
  using namespace iattn::models;
  auto w = rwkv4_init<double>({.hidden_size = 16, .attention_hidden_size = 16}, 3);
  w.key_weight *= 40.0;  // keys spread over about +-80
  const MatD u = sample_input<double>(200, 16, 4);
  const auto s = activations(w, u);
  REQUIRE(s.key.maxCoeff() > 60);
  REQUIRE(s.key.minCoeff() < -60);
  rwkv4_weights<float> wf;  // the same weights in float
  wf.config = w.config;
  wf.time_decay = w.time_decay.cast<float>(), wf.time_first = w.time_first.cast<float>();
  wf.time_mix_key = w.time_mix_key.cast<float>(), wf.time_mix_value = w.time_mix_value.cast<float>();
  wf.time_mix_receptance = w.time_mix_receptance.cast<float>(), wf.key_weight = w.key_weight.cast<float>();
  wf.value_weight = w.value_weight.cast<float>(), wf.receptance_weight = w.receptance_weight.cast<float>();
  wf.output_weight = w.output_weight.cast<float>();
  const Mat<float> uf = u.cast<float>();
  const MatD ref = rwkv4_forward(w, u);
  const auto d = rwkv4_decompose(wf, uf);
  const MatD out = d.output().cast<double>();
  REQUIRE(out.allFinite());
  REQUIRE((out - ref).cwiseAbs().maxCoeff() <= 1e-3 * (1 + ref.cwiseAbs().maxCoeff()));
  check_exact<float>(rwkv4_forward(wf, uf), d);
}
