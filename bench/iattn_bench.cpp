// iattn benchmarks: apply and materialize of every operator and of the Mamba-1 composite
// diag(g) S diag(Delta) diag(u) conv (S with Mamba's factored decay Delta (x) A; also with the dense
// (L, D*N) log-decay), at L in {256, 1024, 4096}, D = 1536, N = 16, float.
// Baselines in the same run:
//   apply:       a dense (L, L) matrix times a vector, per channel (BM_apply_dense_baseline)
//   materialize: storing L^2 floats into a fresh matrix (BM_store_L2), and per-entry loops for the
//                semiseparable part (BM_materialize_naive)
// Counters: items_per_second (state updates L*D*N for S and the composite, L*D for the others,
// L^2 entries for materialize), bytes_per_second for materialize and the store baseline.
#include <benchmark/benchmark.h>

#include <iattn/any_operator.hpp>
#include <iattn/iattn.hpp>

#include <cmath>
#include <map>
#include <memory>
#include <random>

namespace {

using iattn::Index;
using Mat = iattn::Matrix<float>;
constexpr Index D = 1536, N = 16, K = 4;

struct data {
  Index L;
  Mat x, g, dt, u, dA, A, B, C, a, b, w, Dskip;
  explicit data(Index L_) : L(L_) {
    std::mt19937 rng(1);
    std::normal_distribution<float> n(0.f, 1.f);
    std::uniform_real_distribution<float> un(0.f, 1.f);
    auto rnd = [&](Index r, Index c) { Mat m(r, c); for (Index i = 0; i < m.size(); ++i) m.data()[i] = n(rng); return m; };
    x = rnd(L, D); g = rnd(L, D); B = rnd(L, N); C = rnd(L, N); b = rnd(L, D); w = rnd(K, D); Dskip = rnd(1, D);
    dt.resize(L, D); u.resize(L, D); a.resize(L, D); dA.resize(L, D * N); A.resize(D, N);
    for (Index c = 0; c < D; ++c)
      for (Index m = 0; m < N; ++m) A(c, m) = -float(m + 1);  // Mamba's A = -exp(A_log), A_log = log(1..N)
    for (Index t = 0; t < L; ++t)
      for (Index c = 0; c < D; ++c) {
        dt(t, c) = 0.001f + 0.099f * un(rng);
        u(t, c) = un(rng);
        a(t, c) = 0.5f + 0.5f * un(rng);
        for (Index m = 0; m < N; ++m) dA(t, c * N + m) = -dt(t, c) * float(m + 1);
      }
  }
  // S with the dense (L, D*N) log-decay, and with the factored decay dt (x) A that Mamba computes.
  auto S() const { return iattn::semiseparable(dA, B, C, {.heads = D}); }
  auto S_factored() const { return iattn::semiseparable(iattn::factored_decay(dt, A), B, C, {.heads = D}); }
  auto mamba1() const {
    using namespace iattn;
    return diagonal(g) * S_factored() * diagonal(dt) * diagonal(u) * causal_conv(w);
  }
  /// The Mamba-1 composite with its type erased (AnyOperator): whole, and factor by factor, each
  /// factor erased and the products erased again, as the Python package builds it.
  iattn::AnyOperator<float> mamba1_erased() const { return iattn::erase(mamba1()); }
  iattn::AnyOperator<float> mamba1_erased_parts() const {
    using namespace iattn;
    auto e = [](auto&& h) { return erase(std::forward<decltype(h)>(h)); };
    return e(e(e(e(e(diagonal(g)) * e(S_factored())) * e(diagonal(dt))) * e(diagonal(u))) * e(causal_conv(w)));
  }
  auto mamba1_dense_decay() const {
    using namespace iattn;
    return diagonal(g) * S() * diagonal(dt) * diagonal(u) * causal_conv(w);
  }
};

const data& get(Index L) {
  static std::map<Index, std::unique_ptr<data>> cache;
  if (!cache.count(L)) {
    cache.clear();  // keep one length in memory at a time (dA is L*D*N floats)
    cache.emplace(L, std::make_unique<data>(L));
  }
  return *cache.at(L);
}

template <class MakeH>
void run_apply(benchmark::State& st, MakeH&& make, Index per_token_work) {
  const auto& d = get(st.range(0));
  auto H = make(d);
  for (auto _ : st) {
    Mat y = iattn::apply(H, d.x);
    benchmark::DoNotOptimize(y.data());
    benchmark::ClobberMemory();
  }
  st.SetItemsProcessed(st.iterations() * d.L * per_token_work);
}

template <class MakeH>
void run_materialize(benchmark::State& st, MakeH&& make) {
  const auto& d = get(st.range(0));
  auto H = make(d);
  for (auto _ : st) {
    Mat m = iattn::materialize(H, 7, d.L);
    benchmark::DoNotOptimize(m.data());
    benchmark::ClobberMemory();
  }
  st.SetItemsProcessed(st.iterations() * d.L * d.L);
  st.SetBytesProcessed(st.iterations() * d.L * d.L * Index(sizeof(float)));
}

// ---- ownership: building the expression from lvalues (owned copies, the default) or from
// iattn::ref (zero-copy), then one apply, per iteration. The ratio is what the safe default costs
// a caller who rebuilds the expression on every call (issue 19 part 1).
template <bool Ref, bool Dense>
void BM_build_apply_mamba1(benchmark::State& st) {
  using namespace iattn;
  const auto& d = get(st.range(0));
  auto build = [&] {
    if constexpr (Ref) {
      auto S = [&] {
        if constexpr (Dense) return semiseparable(ref(d.dA), ref(d.B), ref(d.C), {.heads = D});
        else return semiseparable(factored_decay(ref(d.dt), ref(d.A)), ref(d.B), ref(d.C), {.heads = D});
      }();
      return diagonal(ref(d.g)) * S * diagonal(ref(d.dt)) * diagonal(ref(d.u)) * causal_conv(ref(d.w));
    } else {
      auto S = [&] {
        if constexpr (Dense) return semiseparable(d.dA, d.B, d.C, {.heads = D});
        else return semiseparable(factored_decay(d.dt, d.A), d.B, d.C, {.heads = D});
      }();
      return diagonal(d.g) * S * diagonal(d.dt) * diagonal(d.u) * causal_conv(d.w);
    }
  };
  for (auto _ : st) {
    auto H = build();
    Mat y = iattn::apply(H, d.x);
    benchmark::DoNotOptimize(y.data());
    benchmark::ClobberMemory();
  }
  st.SetItemsProcessed(st.iterations() * d.L * D * N);
}

// ---- apply ----------------------------------------------------------------------------------------
void BM_apply_diagonal(benchmark::State& st) { run_apply(st, [](const data& d) { return iattn::diagonal(d.g); }, D); }
void BM_apply_causal_conv(benchmark::State& st) { run_apply(st, [](const data& d) { return iattn::causal_conv(d.w); }, D); }
void BM_apply_linear_recurrence(benchmark::State& st) {
  run_apply(st, [](const data& d) { return iattn::linear_recurrence(d.a, d.b); }, D);
}
void BM_apply_semiseparable(benchmark::State& st) { run_apply(st, [](const data& d) { return d.S(); }, D * N); }
void BM_apply_semiseparable_factored(benchmark::State& st) {
  run_apply(st, [](const data& d) { return d.S_factored(); }, D * N);
}
void BM_apply_mamba1(benchmark::State& st) { run_apply(st, [](const data& d) { return d.mamba1(); }, D * N); }
void BM_apply_mamba1_dense_decay(benchmark::State& st) {
  run_apply(st, [](const data& d) { return d.mamba1_dense_decay(); }, D * N);
}

// Dense baseline: one channel's (L, L) matrix times its input column, for 16 channels; items are
// scaled to "per D channels" so items_per_second compares with BM_apply_mamba1 (L*D*N per call).
void BM_apply_dense_baseline(benchmark::State& st) {
  const auto& d = get(st.range(0));
  constexpr Index channels = 16;
  std::vector<Mat> M;
  for (Index c = 0; c < channels; ++c) M.push_back(iattn::materialize(d.mamba1(), c));
  Eigen::VectorXf y(d.L);
  for (auto _ : st)
    for (Index c = 0; c < channels; ++c) {
      y.noalias() = M[std::size_t(c)] * d.x.col(c);
      benchmark::DoNotOptimize(y.data());
    }
  // per iteration: 16 channels of a call that does D channels
  st.SetItemsProcessed(st.iterations() * d.L * N * channels);
}

// ---- materialize ----------------------------------------------------------------------------------
void BM_materialize_diagonal(benchmark::State& st) { run_materialize(st, [](const data& d) { return iattn::diagonal(d.g); }); }
void BM_materialize_causal_conv(benchmark::State& st) { run_materialize(st, [](const data& d) { return iattn::causal_conv(d.w); }); }
void BM_materialize_linear_recurrence(benchmark::State& st) {
  run_materialize(st, [](const data& d) { return iattn::linear_recurrence(d.a, d.b); });
}
void BM_materialize_semiseparable(benchmark::State& st) { run_materialize(st, [](const data& d) { return d.S(); }); }
void BM_materialize_semiseparable_factored(benchmark::State& st) {
  run_materialize(st, [](const data& d) { return d.S_factored(); });
}
void BM_materialize_mamba1(benchmark::State& st) { run_materialize(st, [](const data& d) { return d.mamba1(); }); }

// Baseline: store L^2 floats into a freshly allocated matrix (what materialize must at least do).
// ---- type erasure (any_operator.hpp): the same composite as BM_apply_mamba1 / BM_materialize_mamba1
// and the channel mean, erased whole (one virtual call, then the concrete kernels) and factor by
// factor (run-time structure: the product rewrites stay, the fused streaming pass and the
// (channel, state) GEMM mean do not). Ratios against the concrete rows of the same run.
void BM_apply_mamba1_erased(benchmark::State& st) { run_apply(st, [](const data& d) { return d.mamba1_erased(); }, D * N); }
void BM_apply_mamba1_erased_parts(benchmark::State& st) { run_apply(st, [](const data& d) { return d.mamba1_erased_parts(); }, D * N); }
void BM_materialize_mamba1_erased(benchmark::State& st) { run_materialize(st, [](const data& d) { return d.mamba1_erased(); }); }
void BM_materialize_mamba1_erased_parts(benchmark::State& st) {
  run_materialize(st, [](const data& d) { return d.mamba1_erased_parts(); });
}
template <class MakeH>
void run_mean(benchmark::State& st, MakeH&& make) {
  const auto& d = get(st.range(0));
  auto H = make(d);
  for (auto _ : st) {
    Mat m = iattn::materialize_mean(H);
    benchmark::DoNotOptimize(m.data());
    benchmark::ClobberMemory();
  }
  st.SetItemsProcessed(st.iterations() * d.L * d.L);
}
void BM_mean_mamba1_concrete(benchmark::State& st) { run_mean(st, [](const data& d) { return d.mamba1(); }); }
void BM_mean_mamba1_erased(benchmark::State& st) { run_mean(st, [](const data& d) { return d.mamba1_erased(); }); }
void BM_mean_mamba1_erased_parts(benchmark::State& st) { run_mean(st, [](const data& d) { return d.mamba1_erased_parts(); }); }

void BM_store_L2(benchmark::State& st) {
  const Index L = st.range(0);
  for (auto _ : st) {
    Mat m(L, L);
    m.setConstant(1.f);
    benchmark::DoNotOptimize(m.data());
    benchmark::ClobberMemory();
  }
  st.SetItemsProcessed(st.iterations() * L * L);
  st.SetBytesProcessed(st.iterations() * L * L * Index(sizeof(float)));
}

// Baseline: per-entry loops for channel 7 of S (running decay sum per column, one exp per entry).
void BM_materialize_naive(benchmark::State& st) {
  const auto& d = get(st.range(0));
  const Index L = d.L, c = 7;
  for (auto _ : st) {
    Mat m = Mat::Zero(L, L);
    float acc[N];
    for (Index s = 0; s < L; ++s) {
      for (Index k = 0; k < N; ++k) acc[k] = 0.f;
      for (Index t = s; t < L; ++t) {
        float v = 0;
        for (Index k = 0; k < N; ++k) {
          if (t > s) acc[k] += d.dA(t, c * N + k);
          v += d.C(t, k) * std::exp(acc[k]) * d.B(s, k);
        }
        m(t, s) = v;
      }
    }
    benchmark::DoNotOptimize(m.data());
  }
  st.SetItemsProcessed(st.iterations() * L * L);
}

void lengths(benchmark::internal::Benchmark* b) {
  for (Index L : {256, 1024, 4096}) b->Arg(L);
  b->Unit(benchmark::kMillisecond)->UseRealTime();
}

}  // namespace

BENCHMARK_TEMPLATE(BM_build_apply_mamba1, false, false)->Apply(lengths);  // owned, factored decay
BENCHMARK_TEMPLATE(BM_build_apply_mamba1, true, false)->Apply(lengths);   // ref, factored decay
BENCHMARK_TEMPLATE(BM_build_apply_mamba1, false, true)->Apply(lengths);   // owned, dense (L, D*N) decay
BENCHMARK_TEMPLATE(BM_build_apply_mamba1, true, true)->Apply(lengths);    // ref, dense decay
BENCHMARK(BM_apply_diagonal)->Apply(lengths);
BENCHMARK(BM_apply_causal_conv)->Apply(lengths);
BENCHMARK(BM_apply_linear_recurrence)->Apply(lengths);
BENCHMARK(BM_apply_semiseparable)->Apply(lengths);
BENCHMARK(BM_apply_semiseparable_factored)->Apply(lengths);
BENCHMARK(BM_apply_mamba1)->Apply(lengths);
BENCHMARK(BM_apply_mamba1_dense_decay)->Apply(lengths);
BENCHMARK(BM_apply_dense_baseline)->Apply(lengths);
BENCHMARK(BM_apply_mamba1_erased)->Apply(lengths);
BENCHMARK(BM_apply_mamba1_erased_parts)->Apply(lengths);
BENCHMARK(BM_materialize_mamba1_erased)->Apply(lengths);
BENCHMARK(BM_materialize_mamba1_erased_parts)->Apply(lengths);
BENCHMARK(BM_mean_mamba1_concrete)->Arg(256)->Arg(1024)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_mean_mamba1_erased)->Arg(256)->Arg(1024)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_mean_mamba1_erased_parts)->Arg(256)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_store_L2)->Apply(lengths);
BENCHMARK(BM_materialize_diagonal)->Apply(lengths);
BENCHMARK(BM_materialize_causal_conv)->Apply(lengths);
BENCHMARK(BM_materialize_linear_recurrence)->Apply(lengths);
BENCHMARK(BM_materialize_semiseparable)->Apply(lengths);
BENCHMARK(BM_materialize_semiseparable_factored)->Apply(lengths);
BENCHMARK(BM_materialize_mamba1)->Apply(lengths);
BENCHMARK(BM_materialize_naive)->Apply(lengths);

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  benchmark::AddCustomContext("iattn_simd", iattn::simd::isa_name());
  benchmark::AddCustomContext("iattn_threads", std::to_string(iattn::cpu_detail::max_threads()));
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
}
