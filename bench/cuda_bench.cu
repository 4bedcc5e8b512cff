// CUDA backend benchmarks (IATTN_ENABLE_CUDA and IATTN_BUILD_BENCHMARKS; scripts/gpu-check.sh runs
// them): the Mamba-1 chain diag(g) S diag(dt) conv(w) applied (S with the factored decay dt (x) A),
// S applied alone and one channel of S materialized, at L in {1024, 4096}, D = 1536, N = 16, float,
// timed with CUDA events (manual time). Each call copies the expression's coefficients to the
// device (docs/cuda.md); the *_resident variants evaluate the expression kept on the device (to_device(H, on)),
// which times the kernels alone. Three baselines run beside them:
//   BM_cuda_copy     a device-to-device copy of the (L, D) input: the memory-bound floor of a pass
//   BM_cuda_fill     cudaMemsetAsync of L^2 floats: the write bandwidth a materialization can reach
//   BM_cuda_upload   the host-to-device copy of the coefficients one apply of the chain uploads
// Counters: items_per_second (L*D*N state updates for S and the chain, L^2 entries for materialize),
// bytes_per_second for the baselines. Mamba-2's apply and the structured means: below.
#include <benchmark/benchmark.h>

#include <iattn/cuda.hpp>

#include <cstdint>
#include <cstdio>
#include <memory>
#include <random>
#include <vector>

namespace {

using iattn::Index;
using Mat = iattn::Matrix<float>;
constexpr Index D = 1536, N = 16, K = 4;

/// (r, c) values drawn from N(0, 1), or uniformly from [lo, hi) when lo < hi.
Mat random_matrix(std::mt19937& rng, Index r, Index c, float lo = 0.f, float hi = 0.f) {
  std::normal_distribution<float> n(0.f, 1.f);
  std::uniform_real_distribution<float> un(lo, hi);
  Mat m(r, c);
  for (Index i = 0; i < m.size(); ++i) m.data()[i] = lo < hi ? un(rng) : n(rng);
  return m;
}

struct data {
  Index L;
  Mat x, g, dt, A, B, C, w;
  explicit data(Index L_) : L(L_) {
    std::mt19937 rng(1);
    x = random_matrix(rng, L, D), g = random_matrix(rng, L, D), B = random_matrix(rng, L, N);
    C = random_matrix(rng, L, N), w = random_matrix(rng, K, D);
    A.resize(D, N);
    for (Index c = 0; c < D; ++c)
      for (Index m = 0; m < N; ++m) A(c, m) = -float(m + 1);
    dt = random_matrix(rng, L, D, 0.001f, 0.1f);
  }
  auto S() const { return iattn::semiseparable(iattn::factored_decay(dt, A), B, C, {.heads = D}); }
  auto mamba1() const { return iattn::diagonal(g) * S() * iattn::diagonal(dt) * iattn::causal_conv(w); }
};

const data& get(Index L) {
  static std::vector<std::unique_ptr<data>> cache;
  for (auto& d : cache)
    if (d->L == L) return *d;
  cache.push_back(std::make_unique<data>(L));
  return *cache.back();
}

/// Times f() on the stream with CUDA events, per iteration.
template <class F>
void timed(benchmark::State& state, cudaStream_t s, F&& f) {
  cudaEvent_t start, stop;
  iattn::simt::check(cudaEventCreate(&start), "cudaEventCreate");
  iattn::simt::check(cudaEventCreate(&stop), "cudaEventCreate");
  f();  // warm-up: allocations, module load
  iattn::simt::check(cudaStreamSynchronize(s), "cudaStreamSynchronize");
  for (auto _ : state) {
    iattn::simt::check(cudaEventRecord(start, s), "cudaEventRecord");
    f();
    iattn::simt::check(cudaEventRecord(stop, s), "cudaEventRecord");
    iattn::simt::check(cudaEventSynchronize(stop), "cudaEventSynchronize");
    float ms = 0;
    iattn::simt::check(cudaEventElapsedTime(&ms, start, stop), "cudaEventElapsedTime");
    state.SetIterationTime(ms / 1e3);
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
}

void BM_cuda_apply_mamba1(benchmark::State& state) {
  const data& d = get(state.range(0));
  const auto H = d.mamba1();
  const iattn::cuda on{};
  const auto xd = iattn::to_device(d.x, on);
  timed(state, on.stream, [&] { benchmark::DoNotOptimize(iattn::apply(on, H, xd).data()); });
  state.SetItemsProcessed(state.iterations() * d.L * D * N);
}
void BM_cuda_apply_S(benchmark::State& state) {
  const data& d = get(state.range(0));
  const auto S = d.S();
  const iattn::cuda on{};
  const auto xd = iattn::to_device(d.x, on);
  timed(state, on.stream, [&] { benchmark::DoNotOptimize(iattn::apply(on, S, xd).data()); });
  state.SetItemsProcessed(state.iterations() * d.L * D * N);
}
void BM_cuda_materialize_S(benchmark::State& state) {
  const data& d = get(state.range(0));
  const auto S = d.S();
  const iattn::cuda on{};
  timed(state, on.stream, [&] { benchmark::DoNotOptimize(iattn::materialize(on, S, 7).data()); });
  state.SetItemsProcessed(state.iterations() * d.L * d.L);
}
// The same calls on the expression kept on the device (to_device(H, on): the untimed warm-up call
// copies the coefficients, no later call does; docs/cuda.md), so the time is the kernels'.
void BM_cuda_apply_S_resident(benchmark::State& state) {
  const data& d = get(state.range(0));
  const iattn::cuda on{};
  const auto S = iattn::to_device(d.S(), on);
  const auto xd = iattn::to_device(d.x, on);
  timed(state, on.stream, [&] { benchmark::DoNotOptimize(iattn::apply(on, S, xd).data()); });
  state.SetItemsProcessed(state.iterations() * d.L * D * N);
}
void BM_cuda_apply_mamba1_resident(benchmark::State& state) {
  const data& d = get(state.range(0));
  const iattn::cuda on{};
  const auto H = iattn::to_device(d.mamba1(), on);
  const auto xd = iattn::to_device(d.x, on);
  timed(state, on.stream, [&] { benchmark::DoNotOptimize(iattn::apply(on, H, xd).data()); });
  state.SetItemsProcessed(state.iterations() * d.L * D * N);
}
/// Channel 7 of H kept on the device (L^2 floats written: bytes_per_second against BM_cuda_copy's).
template <class E>
void materialize_resident(benchmark::State& state, Index L, const E& h) {
  const iattn::cuda on{};
  const auto H = iattn::to_device(h, on);
  timed(state, on.stream, [&] { benchmark::DoNotOptimize(iattn::materialize(on, H, 7).data()); });
  state.SetItemsProcessed(state.iterations() * L * L);
  state.SetBytesProcessed(state.iterations() * L * L * std::int64_t(sizeof(float)));
}
/// One channel of the whole chain.
void BM_cuda_materialize_mamba1_resident(benchmark::State& state) {
  const data& d = get(state.range(0));
  materialize_resident(state, d.L, d.mamba1());
}
void BM_cuda_materialize_S_resident(benchmark::State& state) {
  const data& d = get(state.range(0));
  materialize_resident(state, d.L, d.S());
}
/// Mamba-2's shapes (D = 1536 as 24 heads of P = 64, N = 128, one group, a decay per head and
/// token): its S applied (the chunked matrix products, kernels/ssd_scan.hpp) and the structured
/// channel means of Mamba-1's and Mamba-2's chains (docs/cuda.md, "Structured means"), all kept
/// on the device. items: L D N state updates for apply, L^2 D N / 2 multiply-adds for Mamba-1's
/// mean (its blocked (channel, state) products), L^2 / 2 entries per head for Mamba-2's mean.
constexpr Index heads2 = 24, P2 = D / heads2, N2 = 128;
struct data2 {
  Index L;
  Mat x, g, dt, lam, B, C, w;
  explicit data2(Index L_) : L(L_) {
    std::mt19937 rng(2);
    x = random_matrix(rng, L, D), g = random_matrix(rng, L, D), B = random_matrix(rng, L, N2);
    C = random_matrix(rng, L, N2), w = random_matrix(rng, K, D);
    dt = random_matrix(rng, L, D, 0.001f, 0.1f);
    lam = random_matrix(rng, L, heads2, -0.1f, 0.f);
  }
  auto S() const { return iattn::semiseparable(lam, B, C, {.heads = heads2, .head_dim = P2}); }
  auto mamba2() const { return iattn::diagonal(g) * S() * iattn::diagonal(dt) * iattn::causal_conv(w); }
};
const data2& get2(Index L) {
  static std::vector<std::unique_ptr<data2>> cache;
  for (auto& d : cache)
    if (d->L == L) return *d;
  cache.push_back(std::make_unique<data2>(L));
  return *cache.back();
}
void BM_cuda_apply_mamba2_resident(benchmark::State& state) {
  const data2& d = get2(state.range(0));
  const iattn::cuda on{};
  const auto H = iattn::to_device(d.mamba2(), on);
  const auto xd = iattn::to_device(d.x, on);
  timed(state, on.stream, [&] { benchmark::DoNotOptimize(iattn::apply(on, H, xd).data()); });
  state.SetItemsProcessed(state.iterations() * d.L * D * N2);
}
void BM_cuda_mean_mamba2_resident(benchmark::State& state) {
  const data2& d = get2(state.range(0));
  const iattn::cuda on{};
  const auto H = iattn::to_device(d.mamba2(), on);
  timed(state, on.stream, [&] { benchmark::DoNotOptimize(iattn::materialize_mean(on, H).data()); });
  state.SetItemsProcessed(state.iterations() * heads2 * d.L * d.L / 2);
}
void BM_cuda_mean_mamba1_resident(benchmark::State& state) {
  const data& d = get(state.range(0));
  const iattn::cuda on{};
  const auto H = iattn::to_device(d.mamba1(), on);
  timed(state, on.stream, [&] { benchmark::DoNotOptimize(iattn::materialize_mean(on, H).data()); });
  state.SetItemsProcessed(state.iterations() * d.L * d.L / 2 * D * N);
}
/// The Mamba-1 chain with X and Y in bfloat16 storage (read into float, Y rounded once): against
/// BM_cuda_apply_mamba1_resident, the cost of the 16-bit door.
void BM_cuda_apply_mamba1_bf16_resident(benchmark::State& state) {
  const data& d = get(state.range(0));
  const iattn::cuda on{};
  const auto H = iattn::to_device(d.mamba1(), on);
  const auto xd = iattn::to_device<iattn::bfloat16>(d.x, on);
  timed(state, on.stream, [&] { benchmark::DoNotOptimize(iattn::apply(on, H, xd).data()); });
  state.SetItemsProcessed(state.iterations() * d.L * D * N);
}
/// Gated DeltaNet's shapes (D = 1536 as 12 heads of P = 128 values, N = 128 unit-length keys, a
/// gate and a beta per head and token): apply on the device, the chunked scan (kernels/
/// transition.hpp, chunks of 64) against the sequential recurrence (one chunk) in the same run.
/// items: L D N state updates.
constexpr Index heads3 = 12, N3 = 128;
struct data3 {
  Index L;
  Mat x, q, k, beta, g;
  explicit data3(Index L_) : L(L_) {
    std::mt19937 rng(3);
    x = random_matrix(rng, L, D), q = random_matrix(rng, L, heads3 * N3), k = random_matrix(rng, L, heads3 * N3);
    for (Index t = 0; t < L; ++t)
      for (Index h = 0; h < heads3; ++h) k.row(t).segment(h * N3, N3).normalize();
    beta = random_matrix(rng, L, heads3, 0.f, 1.f);
    g = random_matrix(rng, L, heads3, -0.1f, 0.f);
  }
  auto gdn() const { return iattn::gated_delta_rule(q, k, beta, g, {.heads = heads3, .head_dim = D / heads3}); }
};
void gdn_apply(benchmark::State& state, Index chunk) {
  static std::vector<std::unique_ptr<data3>> cache;
  const Index L = state.range(0);
  if (cache.empty() || cache.back()->L != L) cache.push_back(std::make_unique<data3>(L));
  const data3& d = *cache.back();
  const iattn::cuda on{};
  const auto H = iattn::to_device(d.gdn(), on);
  const auto xd = iattn::to_device(d.x, on);
  const Index saved = iattn::cuda_detail::transition_chunk();
  iattn::cuda_detail::transition_chunk() = chunk;
  timed(state, on.stream, [&] { benchmark::DoNotOptimize(iattn::apply(on, H, xd).data()); });
  iattn::cuda_detail::transition_chunk() = saved;
  state.SetItemsProcessed(state.iterations() * d.L * D * N3);
}
void BM_cuda_apply_gdn_resident(benchmark::State& state) { gdn_apply(state, 64); }
void BM_cuda_apply_gdn_sequential_resident(benchmark::State& state) { gdn_apply(state, state.range(0)); }
void BM_cuda_copy(benchmark::State& state) {
  const data& d = get(state.range(0));
  const iattn::cuda on{};
  const auto xd = iattn::to_device(d.x, on);
  iattn::device_matrix<float> yd(d.L, D, on);
  const std::size_t bytes = sizeof(float) * std::size_t(d.L * D);
  timed(state, on.stream, [&] {
    iattn::simt::check(cudaMemcpyAsync(yd.data(), xd.data(), bytes, cudaMemcpyDeviceToDevice, on.stream), "copy");
  });
  state.SetBytesProcessed(state.iterations() * 2 * std::int64_t(bytes));  // read and write
}
void BM_cuda_fill(benchmark::State& state) {
  const Index L = state.range(0);
  const iattn::cuda on{};
  iattn::device_matrix<float> m(L, L, on);
  const std::size_t bytes = sizeof(float) * std::size_t(L * L);
  timed(state, on.stream, [&] { iattn::simt::check(cudaMemsetAsync(m.data(), 0, bytes, on.stream), "fill"); });
  state.SetItemsProcessed(state.iterations() * L * L);
  state.SetBytesProcessed(state.iterations() * std::int64_t(bytes));
}
void BM_cuda_upload(benchmark::State& state) {
  const data& d = get(state.range(0));
  const iattn::cuda on{};
  // What one apply of the chain copies in: g, dt (twice: S's decay and the diagonal), B, C, A, w.
  const std::size_t n = std::size_t(3 * d.L * D + 2 * d.L * N + D * N + K * D);
  const std::vector<float> host(n, 1.0f);
  iattn::cuda_detail::device_buffer<float> buf(Index(n), on.stream);
  timed(state, on.stream, [&] { buf.upload(host.data()); });
  state.SetBytesProcessed(state.iterations() * std::int64_t(n * sizeof(float)));
}

}  // namespace

BENCHMARK(BM_cuda_apply_mamba1)->Arg(1024)->Arg(4096)->UseManualTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_cuda_apply_S)->Arg(1024)->Arg(4096)->UseManualTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_cuda_materialize_S)->Arg(1024)->Arg(4096)->UseManualTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_cuda_apply_S_resident)->Arg(1024)->Arg(4096)->UseManualTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_cuda_apply_mamba1_resident)->Arg(1024)->Arg(4096)->UseManualTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_cuda_materialize_mamba1_resident)->Arg(1024)->Arg(4096)->UseManualTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_cuda_materialize_S_resident)->Arg(1024)->Arg(4096)->Arg(8192)->UseManualTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_cuda_apply_mamba2_resident)->Arg(1024)->Arg(4096)->UseManualTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_cuda_mean_mamba2_resident)->Arg(1024)->UseManualTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_cuda_mean_mamba1_resident)->Arg(1024)->UseManualTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_cuda_apply_mamba1_bf16_resident)->Arg(1024)->Arg(4096)->UseManualTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_cuda_apply_gdn_resident)->Arg(1024)->Arg(4096)->UseManualTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_cuda_apply_gdn_sequential_resident)->Arg(1024)->Arg(4096)->UseManualTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_cuda_copy)->Arg(1024)->Arg(4096)->UseManualTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_cuda_fill)->Arg(1024)->Arg(4096)->Arg(8192)->UseManualTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_cuda_upload)->Arg(1024)->Arg(4096)->UseManualTime()->Unit(benchmark::kMillisecond);

int main(int argc, char** argv) {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::printf("iattn_cuda_bench: no CUDA device; nothing to measure\n");
    return 0;
  }
  benchmark::Initialize(&argc, argv);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
