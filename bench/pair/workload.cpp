// bench/pair/workload.cpp: one side of bench/pair_ab.sh's paired comparison. Compiled twice, each
// time against another copy of the headers and with the library's namespace renamed
// (-Diattn=iattn_a, -DPAIR_RUN=pair_run_a; the other side _b), so that both versions live in one
// process and main.cpp can call them alternately. The layers are the benchmark suite's
// (bench/models_bench.cpp): the same weights, inputs and calls as its rows.
#include <iattn/models/all.hpp>

#include <chrono>
#include <memory>
#include <stdexcept>
#include <string>

#include "../sample_input.hpp"

namespace {
using namespace iattn;
using namespace iattn::models;
using Mat = Matrix<float>;
using clock_type = std::chrono::steady_clock;

// The layer of make(L) is built on a case's first call at L and kept; the call timed is eval(layer).
template <class Make, class Eval>
double timed(Index L, Make make, Eval eval) {
  using Layer = decltype(make(Index(1)));
  static std::unique_ptr<Layer> layer;
  if (!layer || layer->x.rows() != L) layer = std::make_unique<Layer>(make(L));
  const auto t0 = clock_type::now();
  eval(*layer);
  return std::chrono::duration<double, std::milli>(clock_type::now() - t0).count();
}

// A channel mean, checked for a NaN (and kept from being optimised away).
auto mean_of = [](const auto& layer) {
  Mat m = materialize_mean(layer.H);
  if (!(m(m.rows() - 1, 0) == m(m.rows() - 1, 0))) throw std::runtime_error("NaN in the channel mean");
};

// apply into a kept (L, D) result (BM_apply_into), checked for a NaN.
auto apply_of = [](const auto& layer) {
  static Mat y;
  if (y.rows() != layer.x.rows() || y.cols() != layer.x.cols()) y.resize(layer.x.rows(), layer.x.cols());
  apply_into(y, layer.H, layer.x);
  if (!(y(y.rows() - 1, 0) == y(y.rows() - 1, 0))) throw std::runtime_error("NaN in apply");
};

// The models' layers at length n, from the suite's weights.
auto mamba1_layer = [](Index n) {
  static const auto w = mamba_init<float>({.d_model = 768, .d_state = 16}, 1);
  return mamba_decompose(w, sample_input(n, 768));
};
auto mamba2_layer = [](Index n) {
  static const auto w = mamba2_init<float>({.d_model = 768, .d_state = 128, .headdim = 64}, 2);
  return mamba2_decompose(w, sample_input(n, 768));
};

double mamba1_mean(Index L) { return timed(L, mamba1_layer, mean_of); }
double mamba2_mean(Index L) { return timed(L, mamba2_layer, mean_of); }
double mamba1_apply(Index L) { return timed(L, mamba1_layer, apply_of); }
double mamba2_apply(Index L) { return timed(L, mamba2_layer, apply_of); }

auto vim_layer = [](Index n) {
  static const auto w = vision_mamba_init<float>({.mamba = {.d_model = 384, .d_state = 16}}, 6);
  return vision_mamba_decompose(w, sample_input(n, 384));
};
double vim_apply(Index L) { return timed(L, vim_layer, apply_of); }

double vim_all(Index L) {
  static std::unique_ptr<Tensor3<float>> out;  // reused across calls: BM_all_vim_reused
  return timed(L, vim_layer, [](const auto& layer) {
    const Index D = layer.x.cols(), n = layer.x.rows();
    if (!out || out->dims[0] != D || out->dims[1] != n) out = std::make_unique<Tensor3<float>>(D, n, n, 0.f);
    materialize_all_into(*out, layer.H);
  });
}
}  // namespace

/// Milliseconds of one call of the case at length L.
double PAIR_RUN(const char* name, long L) {
  const std::string c = name;
  if (c == "mamba1_mean") return mamba1_mean(L);
  if (c == "mamba2_mean") return mamba2_mean(L);
  if (c == "vim_all") return vim_all(L);
  if (c == "mamba1_apply") return mamba1_apply(L);
  if (c == "mamba2_apply") return mamba2_apply(L);
  if (c == "vim_apply") return vim_apply(L);
  throw std::invalid_argument("unknown case '" + c +
                              "' (expected mamba1_mean, mamba2_mean, vim_all, mamba1_apply, mamba2_apply or vim_apply)");
}
