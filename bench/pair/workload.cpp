// bench/pair/workload.cpp: one side of bench/pair_ab.sh's paired comparison. Compiled twice, each
// time against another copy of the headers and with the library's namespace renamed
// (-Diattn=iattn_a, -DPAIR_RUN=pair_run_a; the other side _b), so that both versions live in one
// process and main.cpp can call them alternately. The layers are the benchmark suite's
// (bench/models_bench.cpp): the same weights, inputs and calls as its rows.
#include <iattn/models/all.hpp>

#include <chrono>
#include <cstring>
#include <memory>
#include <random>
#include <stdexcept>
#include <string>

namespace {
using namespace iattn;
using namespace iattn::models;
using Mat = Matrix<float>;

Mat sample_input(Index L, Index d_model) {
  std::mt19937 rng(7);
  std::normal_distribution<float> nd(0.f, 1.f);
  Mat u(L, d_model);
  for (Index i = 0; i < u.size(); ++i) u.data()[i] = nd(rng);
  return u;
}

using clock_type = std::chrono::steady_clock;
double ms_since(clock_type::time_point t0) {
  return std::chrono::duration<double, std::milli>(clock_type::now() - t0).count();
}

// Each case's layer is built on its first call and kept (the timed call is the evaluation only).
double mamba1_mean(Index L) {
  static const auto w = mamba_init<float>({.d_model = 768, .d_state = 16}, 1);
  static std::unique_ptr<decltype(mamba_decompose(w, sample_input(1, 768)))> d;
  if (!d || d->x.rows() != L) d = std::make_unique<decltype(mamba_decompose(w, sample_input(1, 768)))>(mamba_decompose(w, sample_input(L, 768)));
  const auto t0 = clock_type::now();
  Mat m = materialize_mean(d->H);
  const double ms = ms_since(t0);
  if (!(m(L - 1, 0) == m(L - 1, 0))) throw std::runtime_error("mamba1_mean: NaN in the result");
  return ms;
}

double mamba2_mean(Index L) {
  static const auto w = mamba2_init<float>({.d_model = 768, .d_state = 128, .headdim = 64}, 2);
  static std::unique_ptr<decltype(mamba2_decompose(w, sample_input(1, 768)))> d;
  if (!d || d->x.rows() != L) d = std::make_unique<decltype(mamba2_decompose(w, sample_input(1, 768)))>(mamba2_decompose(w, sample_input(L, 768)));
  const auto t0 = clock_type::now();
  Mat m = materialize_mean(d->H);
  const double ms = ms_since(t0);
  if (!(m(L - 1, 0) == m(L - 1, 0))) throw std::runtime_error("mamba2_mean: NaN in the result");
  return ms;
}

double vim_all(Index L) {
  static const auto w = vision_mamba_init<float>({.mamba = {.d_model = 384, .d_state = 16}}, 6);
  static std::unique_ptr<decltype(vision_mamba_decompose(w, sample_input(1, 384)))> d;
  static std::unique_ptr<Tensor3<float>> out;
  if (!d || d->x.rows() != L) {
    d = std::make_unique<decltype(vision_mamba_decompose(w, sample_input(1, 384)))>(vision_mamba_decompose(w, sample_input(L, 384)));
    out = std::make_unique<Tensor3<float>>(d->x.cols(), L, L, 0.f);  // reused: BM_all_vim_reused
  }
  const auto t0 = clock_type::now();
  materialize_all_into(*out, d->H);
  return ms_since(t0);
}
}  // namespace

/// Milliseconds of one call of the case at length L.
double PAIR_RUN(const char* name, long L) {
  const std::string c = name;
  if (c == "mamba1_mean") return mamba1_mean(L);
  if (c == "mamba2_mean") return mamba2_mean(L);
  if (c == "vim_all") return vim_all(L);
  throw std::invalid_argument("unknown case '" + c + "' (expected mamba1_mean, mamba2_mean or vim_all)");
}
