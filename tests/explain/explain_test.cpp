// Explainability: the methods against hand-computed 3x3 cases and dense re-implementations, the
// reference code's bugs shown to be caught, the .npy reader/writer against files numpy wrote.
#include "support/model_checks.hpp"

#include <iattn/explain/methods.hpp>
#include <iattn/explain/npy.hpp>
#include <iattn/models/griffin.hpp>
#include <iattn/models/mamba.hpp>
#include <iattn/models/rwkv4.hpp>
#include <iattn/models/stack.hpp>
#include <iattn/models/hgrn.hpp>
#include <iattn/models/vision_mamba.hpp>

#include <cstring>
#include <unistd.h>
#include <filesystem>
#include <fstream>
#include <iterator>

using namespace test;
using namespace iattn::explain;
using Catch::Matchers::Contains;
using iattn::Matrix;
namespace fs = std::filesystem;

namespace {

const std::string data_dir = IATTN_TEST_DATA_DIR;

std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

fs::path scratch_dir() {
  const fs::path p = fs::temp_directory_path() / ("iattn_explain_test_" + std::to_string(::getpid()));
  fs::create_directories(p);
  return p;
}

/// Rollout with plain loops: rho = A~_last ... A~_first, A~ = rownorm(I + A).
MatD dense_rollout(const std::vector<MatD>& layers) {
  const Index L = layers[0].rows();
  MatD rho = MatD::Identity(L, L);
  for (const auto& A : layers) {
    MatD a = A;
    for (Index t = 0; t < L; ++t) {
      a(t, t) += 1;
      double s = 0;
      for (Index j = 0; j < L; ++j) s += a(t, j);
      for (Index j = 0; j < L; ++j) a(t, j) /= s;
    }
    MatD next = MatD::Zero(L, L);
    for (Index i = 0; i < L; ++i)
      for (Index j = 0; j < L; ++j)
        for (Index k = 0; k < L; ++k) next(i, j) += a(i, k) * rho(k, j);
    rho = next;
  }
  return rho;
}

}  // namespace

// ---- methods ----------------------------------------------------------------------------------------

TEST_CASE("minmax_abs and row_softmax", "[explain]") {
  MatD M(2, 2);
  M << -4, 1, 2, 0;
  MatD e(2, 2);
  e << 1, 0.25, 0.5, 0;
  check_close(minmax_abs(M), e, 0);
  check_close(minmax_abs(MatD(MatD::Constant(2, 3, -2.0))), MatD::Zero(2, 3), 0);
  MatD S(1, 3);
  S << 1000, 1001, 999;  // large logits: the row maximum is subtracted
  const MatD p = row_softmax(S);
  const double z = 1 + std::exp(1.0) + std::exp(-1.0);
  MatD ep(1, 3);
  ep << 1 / z, std::exp(1.0) / z, std::exp(-1.0) / z;
  check_close(p, ep, 1e-15);
}

TEST_CASE("rollout by hand (3x3, two layers) and against a dense re-implementation", "[explain][rollout]") {
  MatD A1(3, 3), A2(3, 3);
  A1 << 1, 0, 0, 0.5, 0.5, 0, 0.2, 0.3, 0.5;
  A2 << 1, 0, 0, 1, 1, 0, 0, 0, 2;
  // I + A1 rows normalised: [1 0 0; .5/2 1.5/2 0; .2/2 .3/2 1.5/2]; I + A2: [1 0 0; 1/3 2/3 0; 0 0 1]
  MatD t1(3, 3), t2(3, 3);
  t1 << 1, 0, 0, 0.25, 0.75, 0, 0.1, 0.15, 0.75;
  t2 << 1, 0, 0, 1.0 / 3, 2.0 / 3, 0, 0, 0, 1;
  const MatD rho = rollout(std::vector<MatD>{A1, A2});
  check_close(rho, MatD(t2 * t1), 1e-15);  // later layers on the left
  check_close(query_row(rho, 1), MatD(MatD(t2 * t1).row(1)), 1e-15);
  check_close(rollout(std::vector<MatD>{A1, A2}, {.start_layer = 1}), t2, 1e-15);

  std::vector<MatD> layers;
  for (int l = 0; l < 4; ++l) layers.push_back(uniform<double>(9, 9, 0, 1));
  check_close(rollout(layers), dense_rollout(layers), 1e-13);
  for (const auto& r : {rollout(layers)}) check_close(MatD(r.rowwise().sum()), MatD::Ones(9, 1), 1e-13);
}

TEST_CASE("Mamba-Attribution by hand (3x3) and against a dense re-implementation", "[explain][attribution]") {
  MatD A(3, 3), g(3, 2);
  A << 2, -1, 0, 1, 1, -3, 0.5, 0.5, 1;
  g << 0.5, -1, 2, 1, -1, -2;  // per-token max of the positive part: 0.5, 2, 0 -> min-max: 0.25, 1, 0
  const MatD s = gradient_scores(g);
  MatD es(1, 3);
  es << 0.25, 1, 0;
  check_close(s, es, 0);
  // I + relu(A) diag(s) = [1.5 0 0; .25 2 0; .125 .5 1], rows normalised
  MatD e(3, 3);
  e << 1, 0, 0, 0.25 / 2.25, 2 / 2.25, 0, 0.125 / 1.625, 0.5 / 1.625, 1 / 1.625;
  check_close(mamba_attribution(std::vector<MatD>{A}, std::vector<MatD>{s}), e, 1e-15);

  std::vector<MatD> layers, scores, weighted;
  for (int l = 0; l < 3; ++l) {
    layers.push_back(uniform<double>(7, 7, -1, 1));
    scores.push_back(gradient_scores(MatD(uniform<double>(7, 5, -1, 1))));
    MatD w(7, 7);
    for (Index t = 0; t < 7; ++t)
      for (Index j = 0; j < 7; ++j) w(t, j) = std::max(layers.back()(t, j), 0.0) * scores.back()(0, j);
    weighted.push_back(w);
  }
  check_close(mamba_attribution(layers, scores), dense_rollout(weighted), 1e-13);
}

TEST_CASE("frozen_gradient is the exact gradient of the frozen linear map", "[explain][attribution]") {
  using namespace iattn::models;
  const auto w = mamba_init<double>({.d_model = 16, .d_state = 8}, 3);
  const auto u = sample_input<double>(12, 16, 5);
  const auto d = mamba_decompose(w, u);
  init::generator gen(1);
  const MatD target = init::normal<double>(gen, 1, 16, 1.0);
  const Index q = 9;
  const MatD g = frozen_gradient(d, q, target);
  auto J = [&](const MatD& x) { return (target * d.project(MatD(iattn::apply(d.H, x) + d.beta)).row(q).transpose())(0, 0); };
  const double J0 = J(d.x);
  for (auto [s, c] : {std::pair<Index, Index>{3, 5}, {9, 0}, {0, 31}, {11, 7}}) {
    MatD x = d.x;
    x(s, c) += 0.5;  // linear: the difference quotient is exact up to rounding
    const double fd = (J(x) - J0) / 0.5;
    REQUIRE(std::abs(fd - g(s, c)) <= 1e-10 * (1 + std::abs(fd)));
  }
  REQUIRE(g.bottomRows(2).cwiseAbs().maxCoeff() == 0.0);  // causal: later tokens do not reach row q
  REQUIRE_THROWS_WITH(frozen_gradient(d, 12, target), Contains("query is 12"));
  REQUIRE_THROWS_WITH(frozen_gradient(d, 0, MatD(MatD::Zero(1, 15))), Contains("target has shape (1, 15)"));
}

TEST_CASE("bidirectional map and the class token's row", "[explain][bidirectional]") {
  using namespace iattn::models;
  const auto w = vision_mamba_init<double>({.mamba = {.d_model = 16, .d_state = 8}}, 4);
  const Index M = 10, pos = vim_cls_position(M), L = M + 1;
  const MatD u = insert_token<double>(sample_input<double>(M, 16, 6), MatD::Constant(1, 16, 0.3), pos);
  const auto d = vision_mamba_decompose(w, u);
  const MatD F = iattn::materialize_mean(mamba_decompose(w.fwd, u).H);
  const MatD B = iattn::materialize_mean(mamba_decompose(w.bwd(), MatD(u.colwise().reverse())).H);
  const MatD bi = bidirectional(F, B);
  for (Index t = 0; t < L; ++t)
    for (Index s = 0; s < L; ++s) REQUIRE(std::abs(bi(t, s) - (F(t, s) + B(L - 1 - t, L - 1 - s))) <= 1e-15);
  check_close(MatD(0.5 * bi), MatD(iattn::materialize_mean(d.H)), 1e-13);

  // The class token's relevance is row `pos` without its own column; the reference code's
  // off-by-one (row pos + 1) and zeroed diagonal would both change the result.
  const MatD rho = rollout(std::vector<MatD>{MatD(0.5 * bi.cwiseAbs())});
  const MatD r = cls_relevance(rho, pos);
  REQUIRE(r.cols() == L - 1);
  REQUIRE(r(0, pos - 1) == rho(pos, pos - 1));
  REQUIRE(r(0, pos) == rho(pos, pos + 1));
  REQUIRE((r - cls_relevance(rho, pos + 1)).cwiseAbs().maxCoeff() > 1e-3);  // off by one: caught
  REQUIRE(query_row(rho, pos)(0, pos) > 0);  // the diagonal is kept (identity added and not zeroed)
  MatD zeroed = 0.5 * bi.cwiseAbs();
  zeroed.diagonal().setZero();
  REQUIRE((rollout(std::vector<MatD>{zeroed}) - rho).cwiseAbs().maxCoeff() > 1e-4);  // zeroed diagonal: caught
}

TEST_CASE("the reference code's bugs would be caught", "[explain][bugs]") {
  using namespace iattn::models;
  SECTION("rollout over broadcast vectors instead of matrices") {
    std::vector<MatD> layers;
    for (int l = 0; l < 3; ++l) layers.push_back(uniform<double>(6, 6, 0, 1));
    const Index q = 4;
    MatD vec = MatD::Ones(1, 6);  // the bug: each layer's query row multiplied elementwise
    for (const auto& A : layers) vec = vec.cwiseProduct(add_identity_normalize_rows(A).row(q));
    const MatD right = rollout(layers).row(q);
    check_close(right, MatD(dense_rollout(layers).row(q)), 1e-13);
    REQUIRE((right - vec).cwiseAbs().maxCoeff() > 1e-2);
  }
  SECTION("sqrt(1 - a^2) forced to 1 in Griffin") {
    const auto w = griffin_init<double>({.width = 16, .lru_width = 16, .num_heads = 2}, 5);
    const auto u = sample_input<double>(20, 16, 7);
    const auto d = griffin_decompose(w, u);
    const MatD block = griffin_forward(w, u);
    REQUIRE((d.output() - block).cwiseAbs().maxCoeff() <= 1e-12);
    const auto forced = make_decomposition<double>(d.x, griffin_paper_attention(w, u, false), d.beta, d.out_weight, d.out_bias);
    REQUIRE((forced.output() - block).cwiseAbs().maxCoeff() > 1e-2);  // the exactness test fails on it
  }
  SECTION("fp16 storage of the matrices") {
    const auto w = mamba_init<double>({.d_model = 16, .d_state = 8}, 6);
    const auto u = sample_input<double>(16, 16, 8);
    const auto d = mamba_decompose(w, u);
    const MatD M = iattn::materialize(d.H, 3);
    MatD half = M;  // round to binary16's 11-bit significand
    for (Index i = 0; i < half.size(); ++i) {
      int e;
      const double f = std::frexp(half.data()[i], &e);
      half.data()[i] = std::ldexp(std::round(f * 2048.0) / 2048.0, e);
    }
    const double exact = (M * d.x.col(3) - MatD(iattn::apply(d.H, d.x)).col(3)).cwiseAbs().maxCoeff();
    const double stored = (half * d.x.col(3) - MatD(iattn::apply(d.H, d.x)).col(3)).cwiseAbs().maxCoeff();
    REQUIRE(exact <= 1e-12);
    REQUIRE(stored > 1e-5);  // the materialize-times-x check (1e-10 in double) catches it
  }
  SECTION("unshifted exponentials in RWKV") {
    auto w = rwkv4_init<float>({.hidden_size = 16, .attention_hidden_size = 16}, 7);
    w.key_weight.setConstant(6.0f);  // keys around 96: beyond exp's float range, spread well below 87
    const Matrix<float> u = (Matrix<float>::Ones(24, 16) + 0.05f * sample_input<float>(24, 16, 9)).eval();
    const auto s = activations(w, u);
    REQUIRE(s.key.maxCoeff() > 89.0f);
    REQUIRE(std::isinf(std::exp(s.key.maxCoeff())));  // e^k unshifted overflows float: the bug gives inf/inf
    const auto d = rwkv4_decompose(w, u);
    REQUIRE(Matrix<float>(iattn::materialize(d.H, 0)).allFinite());
    check_exact<float>(rwkv4_forward(w, u), d);  // shifted by each channel's max: exact
  }
}

TEST_CASE("explain methods reject bad input clearly", "[explain][errors]") {
  const std::vector<MatD> ok = {MatD::Identity(3, 3), MatD::Identity(3, 3)};
  REQUIRE_THROWS_WITH(rollout(std::vector<MatD>{MatD::Identity(3, 3), MatD::Identity(4, 4)}), Contains("layers[1] has shape (4, 4)") && Contains("L = 3"));
  REQUIRE_THROWS_AS(rollout(std::vector<MatD>{MatD::Identity(3, 3), MatD::Identity(4, 4)}), std::invalid_argument);
  REQUIRE_THROWS_WITH(rollout(std::vector<MatD>{}), Contains("layers is empty"));
  REQUIRE_THROWS_WITH(rollout(ok, {.start_layer = 2}), Contains("start_layer is 2"));
  MatD nan = MatD::Identity(3, 3);
  nan(1, 2) = std::nan("");
  REQUIRE_THROWS_AS(rollout(std::vector<MatD>{nan}), std::domain_error);
  REQUIRE_THROWS_WITH(mamba_attribution(ok, std::vector<MatD>{MatD::Ones(1, 3), MatD::Constant(1, 3, std::nan(""))}), Contains("scores[1]") && Contains("NaN"));
  REQUIRE_THROWS_AS(gradient_scores(MatD(MatD::Constant(2, 2, std::nan("")))), std::domain_error);
  REQUIRE_THROWS_WITH(mamba_attribution(ok, std::vector<MatD>{MatD::Ones(1, 3)}), Contains("scores has 1 entries but layers has 2"));
  MatD neg = -MatD::Identity(3, 3);  // I + A has a zero row: cannot be normalised
  REQUIRE_THROWS_WITH(rollout(std::vector<MatD>{neg}), Contains("row 0 of I + A sums to 0"));
  REQUIRE_THROWS_WITH(bidirectional(MatD(MatD::Zero(3, 3)), MatD(MatD::Zero(3, 2))), Contains("backward has shape (3, 2)"));
  REQUIRE_THROWS_WITH(query_row(MatD(MatD::Zero(3, 3)), 3), Contains("query is 3"));
}

// ---- the multi-layer runner ----------------------------------------------------------------------

TEST_CASE("run_stack: every layer's decomposition is exact and the stack equals its plain forward", "[explain][stack]") {
  using namespace iattn::models;
  const auto s = make_stack<double>(3, 20, 16, [](Index l) { return hgrn_init<double>({.hidden_size = 16, .layer_idx = l, .num_layers = 3}, 40 + std::uint64_t(l)); }, 2);
  const std::vector<Index> tokens = {3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5};
  const MatD h0 = embed(s, tokens);
  REQUIRE(h0.row(1) == s.embedding.row(1));
  const auto run = run_stack(s, h0, [](const auto& w, const MatD& x) { return hgrn_decompose(w, x); });
  REQUIRE(run.layers.size() == 3);
  const MatD oracle = stack_forward(s, h0, [](const auto& w, const MatD& x) { return hgrn_forward(w, x); });
  check_close(run.output, oracle, 1e-12);
  for (std::size_t l = 0; l < 3; ++l) {
    check_close(run.layers[l].output(), MatD(hgrn_forward(s.blocks[l], run.inputs[l])), 1e-12);
    check_close(MatD(run.residuals[l + 1] - run.residuals[l]), run.layers[l].output(), 1e-12);
  }
  // the inputs of later layers differ: the lower bound and the residual stream change them
  REQUIRE((run.inputs[2] - run.inputs[0]).cwiseAbs().maxCoeff() > 1e-3);
  // rollout over the stacked layers runs on their channel means
  std::vector<MatD> maps;
  for (const auto& d : run.layers) maps.push_back(MatD(iattn::materialize_mean(d.H)).cwiseAbs());
  check_close(rollout(maps), dense_rollout(maps), 1e-12);
  REQUIRE_THROWS_WITH(embed(s, {0, 20}), Contains("tokens[1] is 20") && Contains("vocab=20"));
  REQUIRE_THROWS_WITH(run_stack(s, MatD(MatD::Zero(4, 15)), [](const auto& w, const MatD& x) { return hgrn_decompose(w, x); }), Contains("h0 has shape (4, 15)"));
}

// ---- .npy -------------------------------------------------------------------------------------------

TEST_CASE(".npy files numpy wrote read correctly (v1.0, v2.0; float32, float64; 1-3 dimensions)", "[explain][npy]") {
  const auto a = iattn::npy::read(data_dir + "/npy/v1_f4_2x3.npy");
  REQUIRE(a.dtype == "<f4");
  REQUIRE(a.shape == std::vector<std::int64_t>{2, 3});
  const Matrix<float> m = iattn::npy::read_matrix<float>(data_dir + "/npy/v1_f4_2x3.npy");
  Matrix<float> e(2, 3);
  e << -1.0f, 1.0f / 3.0f, 0.0f, 0.5f, 1.0f, 1.5f;
  REQUIRE(m == e);  // bit-exact

  const MatD b = iattn::npy::read_matrix<double>(data_dir + "/npy/v2_f8_3x2.npy");
  REQUIRE(b.rows() == 3);
  REQUIRE(b(0, 0) == M_PI);
  REQUIRE(b(0, 1) == -M_E);
  REQUIRE(b(1, 0) == 1e-300);
  REQUIRE(b(1, 1) == 1e300);
  REQUIRE((b(2, 1) == 0.0 && std::signbit(b(2, 1))));

  const MatD v = iattn::npy::read_matrix<double>(data_dir + "/npy/v1_f8_1d.npy");
  REQUIRE(v.rows() == 1);
  REQUIRE(v.cols() == 5);
  REQUIRE(v(0, 3) == 4.125);
  const auto t = iattn::npy::read(data_dir + "/npy/v1_f4_3d.npy");
  REQUIRE(t.shape == std::vector<std::int64_t>{2, 3, 4});
  REQUIRE(t.data[23] == 23.0);
  REQUIRE_THROWS_WITH(iattn::npy::read_matrix<double>(data_dir + "/npy/v1_f4_3d.npy"), Contains("shape (2, 3, 4) is not a matrix"));
}

TEST_CASE(".npy writes what numpy writes, byte for byte, and round-trips bit-exactly", "[explain][npy]") {
  const fs::path dir = scratch_dir();
  Matrix<float> e(2, 3);
  e << -1.0f, 1.0f / 3.0f, 0.0f, 0.5f, 1.0f, 1.5f;
  iattn::npy::write((dir / "a.npy").string(), e);
  REQUIRE(slurp((dir / "a.npy").string()) == slurp(data_dir + "/npy/v1_f4_2x3.npy"));

  MatD r = uniform<double>(37, 19, -1e3, 1e3);
  r(0, 0) = std::numeric_limits<double>::quiet_NaN();
  r(1, 1) = -std::numeric_limits<double>::infinity();
  r(2, 2) = 4.9e-324;  // denormal
  iattn::npy::write((dir / "r.npy").string(), r);
  const MatD back = iattn::npy::read_matrix<double>((dir / "r.npy").string());
  REQUIRE(std::memcmp(back.data(), r.data(), sizeof(double) * std::size_t(r.size())) == 0);
  const Matrix<float> rf = r.cast<float>();
  iattn::npy::write((dir / "rf.npy").string(), rf);
  const Matrix<float> backf = iattn::npy::read_matrix<float>((dir / "rf.npy").string());
  REQUIRE(std::memcmp(backf.data(), rf.data(), sizeof(float) * std::size_t(rf.size())) == 0);

  const std::vector<float> tensor(2 * 3 * 4 * 5, 0.25f);
  iattn::npy::write<float>((dir / "t.npy").string(), tensor.data(), {2, 3, 4, 5});
  const auto t = iattn::npy::read((dir / "t.npy").string());
  REQUIRE(t.shape == std::vector<std::int64_t>{2, 3, 4, 5});
  REQUIRE(t.data[119] == 0.25);
  REQUIRE(slurp((dir / "t.npy").string()).size() % 64 == (120 * 4) % 64);  // data starts on a 64-byte boundary
  fs::remove_all(dir);
}

TEST_CASE(".npy rejects what it cannot read and never leaves a partial file", "[explain][npy][errors]") {
  using iattn::npy::read;
  REQUIRE_THROWS_WITH(read(data_dir + "/npy/fortran.npy"), Contains("fortran.npy") && Contains("Fortran-order arrays are not supported"));
  REQUIRE_THROWS_WITH(read(data_dir + "/npy/int32.npy"), Contains("dtype '<i4' is not supported"));
  REQUIRE_THROWS_WITH(read(data_dir + "/npy/big_endian.npy"), Contains("dtype '>f8' is not supported"));
  REQUIRE_THROWS_WITH(read(data_dir + "/npy/missing.npy"), Contains("cannot open for reading"));
  const fs::path dir = scratch_dir();
  {
    std::string bytes = slurp(data_dir + "/npy/v2_f8_3x2.npy");
    std::ofstream(dir / "short.npy", std::ios::binary) << bytes.substr(0, bytes.size() - 5);
    REQUIRE_THROWS_WITH(read((dir / "short.npy").string()), Contains("truncated data: shape (3, 2) needs more float64 values than the 5 present"));
    std::ofstream(dir / "text.npy") << "hello";
    REQUIRE_THROWS_WITH(read((dir / "text.npy").string()), Contains("bad magic"));
  }
  const MatD m = MatD::Ones(2, 2);
  REQUIRE_THROWS_WITH(iattn::npy::write((dir / "no_such_dir" / "m.npy").string(), m), Contains("cannot open for writing"));
  REQUIRE_FALSE(fs::exists(dir / "no_such_dir"));
  fs::create_directory(dir / "taken.npy");  // the target is a directory: the rename fails
  REQUIRE_THROWS_AS(iattn::npy::write((dir / "taken.npy").string(), m), std::invalid_argument);
  REQUIRE_FALSE(fs::exists(dir / "taken.npy.tmp-iattn"));
  REQUIRE(fs::is_directory(dir / "taken.npy"));
  fs::remove_all(dir);
}
