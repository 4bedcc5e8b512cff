// iattn model benchmarks: apply, materialize (one channel), materialize_mean and row of the exact
// decompositions of Mamba-1 (D = 1536, N = 16), Mamba-2 (H = 24, P = 64, N = 128), Griffin
// (D = 2560) and RWKV-4 (D = 1024) at L in {256, 1024, 4096, 16384}, float, with the machine's peak
// measured in the same run:
//   BM_peak_fma    independent FMA chains in registers on every thread: flops/s
//   BM_peak_store  plain vector stores into a 256 MiB buffer on every thread: bytes/s
// Counters: items_per_second (state updates L*D*N for apply and row, L^2 entries for materialize
// and materialize_mean), bytes_per_second (bytes written), flops (materialize_mean: the useful
// multiply-adds of its channel-state products, 2 * L(L+1)/2 * D * N, as a rate). bench/report.py
// turns the JSON output into the table of docs/performance.md with fractions of the peaks.
//
//   iattn_models_bench --benchmark_out=models.json --benchmark_out_format=json
#include <benchmark/benchmark.h>

#include <iattn/backend/cpu/stream.hpp>
#include <iattn/models/all.hpp>

#include "sample_input.hpp"

#include <algorithm>
#include <cstdint>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#if defined(_OPENMP)
#include <omp.h>
#endif

namespace {

using iattn::Index;
using Mat = iattn::Matrix<float>;
using namespace iattn::models;

// ---- peak probes --------------------------------------------------------------------------------
constexpr int lanes = iattn::simd::width<float>;
using batch = iattn::simd::pack<float, lanes>;

/// p[i] = i for i < n, in vector stores on every ISA: the store probes' pattern. The counter is
/// 32-bit on purpose: a 64-bit one (Index) converted to float compiles to one scalar conversion
/// and one scalar store per entry without AVX-512DQ (GCC 12, AVX2), which made the probes 2-3.5x
/// slower than the memory on AVX2 machines until session 32 (docs/performance.md).
void write_floats(float* p, Index n) {
  const auto m = static_cast<std::int32_t>(n);
  for (std::int32_t i = 0; i < m; ++i) p[i] = static_cast<float>(i);
}

void BM_peak_fma(benchmark::State& st) {
  constexpr int chains = 12;  // FMA latency x issue width on current x86 cores
  constexpr Index steps = 1 << 20;
  int threads = 1;
  for (auto _ : st) {
    float sink = 0;
#pragma omp parallel reduction(+ : sink)
    {
#if defined(_OPENMP)
#pragma omp single
      threads = omp_get_num_threads();
#endif
      batch acc[chains];
      for (int k = 0; k < chains; ++k) acc[k] = batch::broadcast(float(k) * 1e-3f);
      const batch a = batch::broadcast(0.999999f), b = batch::broadcast(1e-7f);
      for (Index i = 0; i < steps; ++i)
        for (int k = 0; k < chains; ++k) acc[k] = fma(acc[k], a, b);
      for (int k = 1; k < chains; ++k) acc[0] = acc[0] + acc[k];
      sink += reduce_add(acc[0]);
    }
    benchmark::DoNotOptimize(sink);
  }
  const double flops = 2.0 * double(chains) * double(steps) * double(lanes) * threads;
  st.counters["flops"] = benchmark::Counter(flops * double(st.iterations()), benchmark::Counter::kIsRate);
  st.counters["threads"] = threads;
}

void BM_peak_store(benchmark::State& st) {
  const Index n = Index(64) << 20;  // 256 MiB of floats
  std::unique_ptr<float[]> buf(new float[std::size_t(n)]);
  iattn::cpu_detail::parallel_for(16, [&](Index p) { std::fill(buf.get() + p * (n / 16), buf.get() + (p + 1) * (n / 16), 0.f); });
  for (auto _ : st) {
    iattn::cpu_detail::parallel_for(16, [&](Index p) {
      float* q = buf.get() + p * (n / 16);
      write_floats(q, n / 16);
    });
    benchmark::DoNotOptimize(buf.get());
    benchmark::ClobberMemory();
  }
  st.SetBytesProcessed(st.iterations() * n * Index(sizeof(float)));
}

// ---- models ------------------------------------------------------------------------------------
// sample_input (sample_input.hpp): the layers' input.

// One decomposition kept in memory at a time (at L = 16384 the inputs are hundreds of MiB).
template <class Dec>
const Dec& cached(const std::string& key, Index L, auto&& make) {
  static std::map<std::pair<std::string, Index>, std::shared_ptr<void>> cache;
  const auto k = std::make_pair(key, L);
  if (!cache.count(k)) {
    cache.clear();
    cache.emplace(k, std::make_shared<Dec>(make(L)));
  }
  return *static_cast<const Dec*>(cache.at(k).get());
}

struct mamba1 {
  static constexpr const char* name = "mamba1";
  static constexpr Index N = 16;
  static auto make(Index L) {
    static const auto w = mamba_init<float>({.d_model = 768, .d_state = 16}, 1);
    return mamba_decompose(w, sample_input(L, 768));
  }
};
struct mamba2 {
  static constexpr const char* name = "mamba2";
  static constexpr Index N = 128;
  static auto make(Index L) {
    static const auto w = mamba2_init<float>({.d_model = 768, .d_state = 128, .headdim = 64}, 2);
    return mamba2_decompose(w, sample_input(L, 768));
  }
};
struct griffin {
  static constexpr const char* name = "griffin";
  static constexpr Index N = 1;
  static auto make(Index L) {
    static const auto w = griffin_init<float>({.width = 2560, .lru_width = 2560, .num_heads = 10}, 3);
    return griffin_decompose(w, sample_input(L, 2560));
  }
};
struct rwkv4 {
  static constexpr const char* name = "rwkv4";
  static constexpr Index N = 1;
  static auto make(Index L) {
    static const auto w = rwkv4_init<float>({.hidden_size = 1024, .attention_hidden_size = 1024}, 4);
    return rwkv4_decompose(w, sample_input(L, 1024));
  }
};

// The delta-rule family (issue 20): Qwen3-Next's Gated DeltaNet at its head shape (dk = dv = 128;
// 2 key heads, 4 value heads: D = 512) and RWKV-7 time mixing (C = 512, head_dim 64). Their N is
// the key width; apply's items are L * D * N state updates as for the other models.
struct qwen3_next_gdn {
  static constexpr const char* name = "qwen3_next";
  static constexpr Index N = 128;
  static auto make(Index L) {
    static const auto w = qwen3_next_init<float>({.hidden_size = 512, .linear_num_value_heads = 4, .linear_num_key_heads = 2,
                                                  .linear_key_head_dim = 128, .linear_value_head_dim = 128},
                                                 5);
    return qwen3_next_decompose(w, sample_input(L, 512));
  }
};
// Causal softmax attention, GPT-2 small's shape (768 wide, 12 heads of 64): the comparison layer.
// N is the key width.
struct transformer {
  static constexpr const char* name = "transformer";
  static constexpr Index N = 64;
  static constexpr double triangles = 0;  // its mean is one matrix per head: no (channel, state) count
  static auto make(Index L) {
    static const auto w = transformer_init<float>({.embed_dim = 768, .num_heads = 12}, 11);
    return transformer_decompose(w, sample_input(L, 768));
  }
};
// Vision-Mamba-small's layer (384 wide, both directions): its channel mean splits at the flip.
struct vision_mamba_small {
  static constexpr const char* name = "vision_mamba";
  static constexpr Index N = 16;
  static constexpr double triangles = 2;  // both directions
  static auto make(Index L) {
    static const auto w = vision_mamba_init<float>({.mamba = {.d_model = 384, .d_state = 16}}, 6);
    return vision_mamba_decompose(w, sample_input(L, 384));
  }
};
// The LRU (Orvieto et al.) at the survey's width: time-invariant, so its channel mean is Toeplitz
// (backend/cpu/toeplitz_mean.hpp). 4N + H = 1152 inner channels.
struct lru_layer {
  static constexpr const char* name = "lru";
  static constexpr Index N = 1;
  static auto make(Index L) {
    static const auto w = lru_init<float>({.d_model = 1024, .d_hidden = 32, .r_min = 0.5, .r_max = 0.99, .max_phase = 0.314}, 2200);
    return lru_decompose(w, sample_input(L, 1024));
  }
};
// The Hyena operator (order 2) at the survey's width: a long convolution between two gates, its
// mean entry by entry over the channels (toeplitz_mean.hpp).
struct hyena_layer {
  static constexpr const char* name = "hyena";
  static constexpr Index N = 1;
  static auto make(Index L) {
    static const auto w = hyena_init<float>({.d_model = 1024, .l_max = 4096}, 5);
    return hyena_decompose(w, sample_input(L, 1024));
  }
};
struct rwkv7_tmix {
  static constexpr const char* name = "rwkv7";
  static constexpr Index N = 64;
  static auto make(Index L) {
    static const auto w = [] {
      auto w = rwkv7_init<float>({.hidden_size = 512, .head_dim = 64, .decay_low_rank_dim = 32, .a_low_rank_dim = 32,
                                  .v_low_rank_dim = 32, .gate_low_rank_dim = 64},
                                 6);
      iattn::models::init::generator g(60);
      w.o_proj_weight = iattn::models::init::normal<float>(g, 512, 512, 0.05);
      return w;
    }();
    return rwkv7_decompose(w, sample_input(L, 512));
  }
};

template <class Model>
const auto& decomposition(Index L) {
  using Dec = decltype(Model::make(Index(1)));
  return cached<Dec>(Model::name, L, [](Index n) { return Model::make(n); });
}

template <class Model>
void BM_apply(benchmark::State& st) {
  const auto& d = decomposition<Model>(st.range(0));
  const Index L = d.x.rows(), D = d.x.cols();
  for (auto _ : st) {
    Mat y = iattn::apply(d.H, d.x);
    benchmark::DoNotOptimize(y.data());
  }
  st.SetItemsProcessed(st.iterations() * L * D * Model::N);
  st.SetBytesProcessed(st.iterations() * L * D * Index(sizeof(float)));
}

template <class Model>
void BM_materialize(benchmark::State& st) {
  const auto& d = decomposition<Model>(st.range(0));
  const Index L = d.x.rows();
  for (auto _ : st) {
    Mat m = iattn::materialize(d.H, 7);
    benchmark::DoNotOptimize(m.data());
  }
  st.SetItemsProcessed(st.iterations() * L * L);
  st.SetBytesProcessed(st.iterations() * L * L * Index(sizeof(float)));
}

// The write-into forms (issue 22): the same evaluations into one output kept across iterations,
// beside store probes of the same bytes into fresh and into reused memory (BM_store_rows). A
// fresh (L, D) or (L, L) result pays the first write to every page (about 12 us per 4 KiB page on
// these VMs); the *_into forms pay it once.
template <class Model>
void BM_apply_into(benchmark::State& st) {
  const auto& d = decomposition<Model>(st.range(0));
  const Index L = d.x.rows(), D = d.x.cols();
  Mat y;
  for (auto _ : st) {
    iattn::apply_into(y, d.H, d.x);
    benchmark::DoNotOptimize(y.data());
  }
  st.SetItemsProcessed(st.iterations() * L * D * Model::N);
  st.SetBytesProcessed(st.iterations() * L * D * Index(sizeof(float)));
}
template <class Model>
void BM_row_into(benchmark::State& st) {
  const auto& d = decomposition<Model>(st.range(0));
  const Index L = d.x.rows(), D = d.x.cols();
  Mat r;
  for (auto _ : st) {
    iattn::row_into(r, d.H, L - 1);
    benchmark::DoNotOptimize(r.data());
  }
  st.SetItemsProcessed(st.iterations() * L * D * Model::N);
  st.SetBytesProcessed(st.iterations() * L * D * Index(sizeof(float)));
}
// The same two calls with the last-level cache emptied before every call (64 MiB written outside
// the timing, twice the 32 MiB L3 of the VMs measured): at L = 1024 Griffin's operands nearly fit
// in L3 and the warm loops above read them from there, so only these are comparable across L.
void evict_caches() {
  static std::vector<float> junk(std::size_t(16) << 20);
  iattn::cpu_detail::parallel_for(16, [&](Index p) {
    const std::size_t n = junk.size() / 16;
    std::fill(junk.begin() + std::ptrdiff_t(std::size_t(p) * n), junk.begin() + std::ptrdiff_t(std::size_t(p + 1) * n), float(p));
  });
  benchmark::DoNotOptimize(junk.data());
  benchmark::ClobberMemory();
}
/// The timed loop of a cold benchmark: call() after evict_caches(), outside the timing; items and
/// bytes as the warm forms count them.
template <class Model>
void cold_loop(benchmark::State& st, Index L, Index D, auto&& call) {
  for (auto _ : st) {
    st.PauseTiming();
    evict_caches();
    st.ResumeTiming();
    benchmark::DoNotOptimize(call());
  }
  st.SetItemsProcessed(st.iterations() * L * D * Model::N);
  st.SetBytesProcessed(st.iterations() * L * D * Index(sizeof(float)));
}
template <class Model>
void BM_apply_into_cold(benchmark::State& st) {
  const auto& d = decomposition<Model>(st.range(0));
  Mat y = iattn::apply(d.H, d.x);
  cold_loop<Model>(st, d.x.rows(), d.x.cols(), [&] {
    iattn::apply_into(y, d.H, d.x);
    return y.data();
  });
}
template <class Model>
void BM_row_into_cold(benchmark::State& st) {
  const auto& d = decomposition<Model>(st.range(0));
  const Index L = d.x.rows();
  Mat r = iattn::row(d.H, L - 1);
  cold_loop<Model>(st, L, d.x.cols(), [&] {
    iattn::row_into(r, d.H, L - 1);
    return r.data();
  });
}
template <class Model>
void BM_materialize_into(benchmark::State& st) {
  const auto& d = decomposition<Model>(st.range(0));
  const Index L = d.x.rows();
  Mat m;
  for (auto _ : st) {
    iattn::materialize_into(m, d.H, 7);
    benchmark::DoNotOptimize(m.data());
  }
  st.SetItemsProcessed(st.iterations() * L * L);
  st.SetBytesProcessed(st.iterations() * L * L * Index(sizeof(float)));
}
/// rows x cols floats written by every thread's share of the rows, into a fresh allocation per
/// iteration (Fresh) or into one kept across iterations: the floor of a result of that size.
template <bool Fresh>
void BM_store_rows(benchmark::State& st) {
  const Index rows = st.range(0), cols = st.range(1), n = rows * cols;
  Mat kept = Mat::Zero(Fresh ? 0 : rows, Fresh ? 0 : cols);
  for (auto _ : st) {
    Mat fresh(Fresh ? rows : 0, Fresh ? cols : 0);
    float* q = Fresh ? fresh.data() : kept.data();
    iattn::cpu_detail::parallel_for(rows, [&](Index t) {
      float* p = q + t * cols;
      write_floats(p, cols);
    });
    benchmark::DoNotOptimize(q);
    benchmark::ClobberMemory();
  }
  st.SetBytesProcessed(st.iterations() * n * Index(sizeof(float)));
}

template <class Model>
void BM_materialize_mean(benchmark::State& st) {
  const auto& d = decomposition<Model>(st.range(0));
  const Index L = d.x.rows(), D = d.x.cols();
  for (auto _ : st) {
    Mat m = iattn::materialize_mean(d.H);
    benchmark::DoNotOptimize(m.data());
  }
  st.SetItemsProcessed(st.iterations() * L * L);
  st.SetBytesProcessed(st.iterations() * L * L * Index(sizeof(float)));
  // the (channel, state) products' multiply-adds over the lower triangle, times the triangles a
  // model fills (Model::triangles: 2 for a flipped sum); no figure for a model without such a count
  double triangles = 1;
  if constexpr (requires { Model::triangles; }) triangles = Model::triangles;
  const double flops = triangles * 2.0 * double(L) * double(L + 1) / 2.0 * double(D) * double(Model::N);
  if (triangles > 0) st.counters["flops"] = benchmark::Counter(flops * double(st.iterations()), benchmark::Counter::kIsRate);
}

template <class Model>
void BM_row(benchmark::State& st) {
  const auto& d = decomposition<Model>(st.range(0));
  const Index L = d.x.rows(), D = d.x.cols();
  for (auto _ : st) {
    Mat r = iattn::row(d.H, L - 1);
    benchmark::DoNotOptimize(r.data());
  }
  st.SetItemsProcessed(st.iterations() * L * D * Model::N);
  st.SetBytesProcessed(st.iterations() * L * D * Index(sizeof(float)));
}

// The delta-rule models' apply as a fraction of the FMA peak: the recurrence's multiply-adds per
// token and head are (2R + 2) N P (R = 1: read a^T S, scale and update S, write k v^T, read S^T q),
// counted as flops = 2 * 4 * L * D * N; their channel mean's floor is one core per head, 2 L(L+1)/2 H N.
template <class Model>
void BM_delta_apply(benchmark::State& st) {
  const auto& d = decomposition<Model>(st.range(0));
  const Index L = d.x.rows(), D = d.x.cols();
  for (auto _ : st) {
    Mat y = iattn::apply(d.H, d.x);
    benchmark::DoNotOptimize(y.data());
  }
  st.SetItemsProcessed(st.iterations() * L * D * Model::N);
  st.counters["flops"] = benchmark::Counter(8.0 * double(L) * double(D) * double(Model::N) * double(st.iterations()), benchmark::Counter::kIsRate);
}
template <class Model>
void BM_delta_mean(benchmark::State& st) {
  const auto& d = decomposition<Model>(st.range(0));
  const Index L = d.x.rows(), H = d.x.cols() / Model::N;
  for (auto _ : st) {
    Mat m = iattn::materialize_mean(d.H);
    benchmark::DoNotOptimize(m.data());
  }
  st.SetItemsProcessed(st.iterations() * L * L);
  st.counters["flops"] = benchmark::Counter(double(L) * double(L + 1) * double(H) * double(Model::N) * double(st.iterations()),
                                            benchmark::Counter::kIsRate);
}

// ---- structured channel means and materialize_all (issue 19 part 3, docs/performance.md) --------
// Mamba-2 at the shape (H = 24, P = 64, N = 128): the mean through head_mean.hpp (the
// automatic choice), through the per-channel (channel, state) GEMMs it replaced (forced), the
// mean of |H^c|, and the floor it is held to: every head's core materialized (one channel per
// head) plus one rank-P product G_h V_h^T (L x P x L) per head, on Mamba-2-shaped coefficients.
template <iattn::cpu_detail::mean_path Path, bool Abs>
void BM_mean_mamba2_path(benchmark::State& st) {
  const auto& d = decomposition<mamba2>(st.range(0));
  const Index L = d.x.rows(), D = d.x.cols();
  for (auto _ : st) {
    Mat m = iattn::cpu_detail::materialize_mean<float>(d.H, iattn::cpu_detail::context{L, D}, {0, D, Abs}, Path);
    benchmark::DoNotOptimize(m.data());
  }
  st.SetItemsProcessed(st.iterations() * L * L);
}
// RWKV-4's mean on the path it replaces (issue 22): every channel's tiles, exps of scores (the
// baseline of BM_materialize_mean<rwkv4>, which takes wkv_mean.hpp's blocked products).
void BM_mean_rwkv4_tiles(benchmark::State& st) {
  const auto& d = decomposition<rwkv4>(st.range(0));
  const Index L = d.x.rows(), D = d.x.cols();
  for (auto _ : st) {
    Mat m = iattn::cpu_detail::materialize_mean_tiles<float>(d.H, iattn::cpu_detail::context{L, D}, {0, D, false});
    benchmark::DoNotOptimize(m.data());
  }
  st.SetItemsProcessed(st.iterations() * L * L);
}
// The LRU's and the Hyena's means (toeplitz_mean.hpp, the default path) against the per-channel
// tile path they replaced.
template <class Model, bool Tiles>
void BM_mean_toeplitz(benchmark::State& st) {
  const auto& d = decomposition<Model>(st.range(0));
  const Index L = d.x.rows(), D = d.x.cols();
  for (auto _ : st) {
    Mat m = Tiles ? iattn::cpu_detail::materialize_mean_tiles<float>(d.H, iattn::cpu_detail::context{L, D}, {0, D, false})
                  : iattn::materialize_mean(d.H);
    benchmark::DoNotOptimize(m.data());
  }
  st.SetItemsProcessed(st.iterations() * L * L);
}
void BM_mean_mamba2_cores_products(benchmark::State& st) {
  const Index L = st.range(0), H = 24, P = 64, N = 128;
  std::mt19937 rng(5);
  std::normal_distribution<float> nd(0.f, 1.f);
  auto random = [&](Index r, Index c) {
    Mat m(r, c);
    for (Index i = 0; i < m.size(); ++i) m.data()[i] = nd(rng);
    return m;
  };
  Mat lam = -random(L, H).cwiseAbs() * 0.1f;
  const Mat B = random(L, N), C = random(L, N), G = random(L, H * P), V = random(L, H * P);
  const auto S = iattn::semiseparable(lam, B, C, {.heads = H, .head_dim = P});
  // In parallel over heads (as head_mean.hpp), each thread its own accumulator: one core (the
  // library's tiles) and one Eigen GEMM per head, then the accumulators summed.
  const int nt = iattn::cpu_detail::max_threads();
  std::vector<Mat> acc(std::size_t(nt), Mat(L, L)), prod(std::size_t(nt), Mat(L, L));
  for (auto _ : st) {
    for (auto& a : acc) a.setZero();
    iattn::cpu_detail::parallel_for(H, [&](Index h) {
      const auto k = std::size_t(iattn::cpu_detail::thread_index());
      const Mat core = iattn::cpu_detail::materialize<float>(S, iattn::cpu_detail::context{L, H * P}, h * P);
      prod[k].noalias() = G.middleCols(h * P, P) * V.middleCols(h * P, P).transpose();
      acc[k] += core.cwiseProduct(prod[k]);
    });
    for (int k = 1; k < nt; ++k) acc[0] += acc[std::size_t(k)];
    benchmark::DoNotOptimize(acc[0].data());
  }
  st.SetItemsProcessed(st.iterations() * L * L);
}

// Vision-Mamba-small-like layer (d_model 384: D = 768, N = 16) at L = 197: every channel's matrix
// (D, L, L) into fresh memory (materialize_all) and into reused memory (materialize_all_into), the
// old per-channel loop of materialize(H, c) copied into the tensor, and the store floor: the same
// bytes written into fresh or reused memory. The VM's first touch of fresh pages is slow.
const auto& vim_small(Index L) {
  static const auto w = vision_mamba_init<float>({.mamba = {.d_model = 384, .d_state = 16}}, 6);
  using Dec = decltype(vision_mamba_decompose(w, sample_input(1, 384)));
  return cached<Dec>("vim_small", L, [](Index n) { return vision_mamba_decompose(w, sample_input(n, 384)); });
}
void BM_all_vim_fresh(benchmark::State& st) {
  const auto& d = vim_small(st.range(0));
  const Index L = d.x.rows(), D = d.x.cols();
  for (auto _ : st) {
    iattn::Tensor3<float> all = iattn::materialize_all(d.H);
    benchmark::DoNotOptimize(all.data());
  }
  st.SetBytesProcessed(st.iterations() * D * L * L * Index(sizeof(float)));
}
void BM_all_vim_reused(benchmark::State& st) {
  const auto& d = vim_small(st.range(0));
  const Index L = d.x.rows(), D = d.x.cols();
  iattn::Tensor3<float> all(D, L, L, 0.f);
  for (auto _ : st) {
    iattn::materialize_all_into(all, d.H);
    benchmark::DoNotOptimize(all.data());
    benchmark::ClobberMemory();
  }
  st.SetBytesProcessed(st.iterations() * D * L * L * Index(sizeof(float)));
}
void BM_all_vim_per_channel(benchmark::State& st) {
  const auto& d = vim_small(st.range(0));
  const Index L = d.x.rows(), D = d.x.cols();
  iattn::Tensor3<float> all(D, L, L, 0.f);
  for (auto _ : st) {
    for (Index c = 0; c < D; ++c) all.slice(c) = iattn::materialize(d.H, c);
    benchmark::DoNotOptimize(all.data());
    benchmark::ClobberMemory();
  }
  st.SetBytesProcessed(st.iterations() * D * L * L * Index(sizeof(float)));
}
template <bool Fresh>
void BM_store_vim(benchmark::State& st) {
  const Index L = st.range(0), n = 768 * L * L;
  std::unique_ptr<float[]> kept(new float[std::size_t(n)]);
  std::fill(kept.get(), kept.get() + n, 0.f);
  for (auto _ : st) {
    std::unique_ptr<float[]> fresh(Fresh ? new float[std::size_t(n)] : nullptr);
    float* q = Fresh ? fresh.get() : kept.get();
    iattn::cpu_detail::parallel_for(768, [&](Index c) {
      float* p = q + c * L * L;
      write_floats(p, L * L);
    });
    benchmark::DoNotOptimize(q);
    benchmark::ClobberMemory();
  }
  st.SetBytesProcessed(st.iterations() * n * Index(sizeof(float)));
}
/// The same bytes into reused memory with streaming stores (stream.hpp's stream_copy of one
/// channel's (L, L) from the cache), as materialize_all_into writes a result of 16 MiB or more:
/// the floor its copy-out competes with where streaming beats plain stores.
void BM_store_vim_stream(benchmark::State& st) {
  const Index L = st.range(0), n = 768 * L * L;
  std::unique_ptr<float[]> kept(new float[std::size_t(n)]);
  std::fill(kept.get(), kept.get() + n, 0.f);
  std::vector<float> src(std::size_t(L * L));
  write_floats(src.data(), L * L);
  for (auto _ : st) {
    iattn::cpu_detail::parallel_for(768, [&](Index c) {
      iattn::cpu_detail::stream_copy(kept.get() + c * L * L, src.data(), L * L);
      iattn::cpu_detail::stream_fence();
    });
    benchmark::DoNotOptimize(kept.get());
    benchmark::ClobberMemory();
  }
  st.SetBytesProcessed(st.iterations() * n * Index(sizeof(float)));
}
/// The floor of every channel's matrix with the suite's own kernels at their best: per channel, the
/// multiply-adds of its products (L^2 N, N = 16, both directions) as FMA chains in registers at the
/// FMA probe's rate, interleaved with the streaming copy-out of its (L, L) in 16-row panels as
/// materialize_all_into does it. Nothing of the set-up, the diagonal blocks or the column operands:
/// what the products and the copy-out alone cost in this pattern, the floor the row's 2x target is
/// measured against (docs/performance.md, session 38).
void BM_floor_vim(benchmark::State& st) {
  const Index L = st.range(0), n = 768 * L * L, N = 16, rows = 16;
  std::unique_ptr<float[]> kept(new float[std::size_t(n)]);
  std::fill(kept.get(), kept.get() + n, 0.f);
  std::vector<float> src(std::size_t(L * L));
  write_floats(src.data(), L * L);
  constexpr int chains = 12;
  const Index panels = (L + rows - 1) / rows, steps = (L * L * N / lanes + chains * panels - 1) / (chains * panels);
  for (auto _ : st) {
    iattn::cpu_detail::parallel_for(768, [&](Index c) {
      batch acc[chains];
      for (int k = 0; k < chains; ++k) acc[k] = batch::broadcast(float(k) * 1e-3f);
      const batch a = batch::broadcast(0.999999f), b = batch::broadcast(1e-7f);
      for (Index p = 0; p < panels; ++p) {
        for (Index i = 0; i < steps; ++i)
          for (int k = 0; k < chains; ++k) acc[k] = fma(acc[k], a, b);
        const Index r0 = p * rows * L, r1 = std::min(L, (p + 1) * rows) * L;
        iattn::cpu_detail::stream_copy(kept.get() + c * L * L + r0, src.data() + r0, r1 - r0);
      }
      iattn::cpu_detail::stream_fence();
      for (int k = 1; k < chains; ++k) acc[0] = acc[0] + acc[k];
      benchmark::DoNotOptimize(acc[0]);
    });
    benchmark::DoNotOptimize(kept.get());
    benchmark::ClobberMemory();
  }
  st.SetBytesProcessed(st.iterations() * n * Index(sizeof(float)));
  st.counters["flops"] = benchmark::Counter(2.0 * double(steps * chains * panels) * lanes * 768 * double(st.iterations()),
                                            benchmark::Counter::kIsRate);
}

/// The rest of every channel's matrix beside BM_floor_vim's products and copy-out, in the layout
/// that makes it cheapest of those measured (docs/performance.md, session 41): `lanes` channels a
/// pack, tokens and states as indices, so that nothing is transposed or gathered. Per channel pack
/// and direction (both of Vision-Mamba-small's: N = 16, a 4-tap convolution): the factors
/// 2^(dt a) (one exponential per channel, state and token), U = post C, the injection Z by Horner
/// over the convolution's taps, the K - 1 = 3 band diagonals, the row operands referred forward to
/// their 16-token block's first token and the column operands backward to its last, the blocks'
/// decays, and the 16 x 16 diagonal blocks by running products (the state rows in a ring of 32
/// tokens, the column operands kept for the whole length as the products would need them). The
/// inputs are random and in range, so the arithmetic is the real one; its results are not checked
/// here (a standalone copy checked the diagonal blocks against plain double loops: 3e-7). It is
/// the lowest cost found for this work, not a proven bound. With BM_floor_vim and
/// BM_store_vim<false> from the same run it shows how much of the row's budget (twice the store)
/// the work's arithmetic leaves: the two floors one after the other, or overlapped at best.
void BM_floor_vim_rest(benchmark::State& st) {
  constexpr Index N = 16, K = 4, blk = 16, ring = 32, D = 768;
  static_assert(D % lanes == 0 && (ring & (ring - 1)) == 0 && ring >= blk + K - 1, "ring of whole blocks and lags");
  const Index L = st.range(0);
  std::mt19937 rng(41);
  std::uniform_real_distribution<float> unit(0.01f, 1.f);
  std::vector<float> dt(std::size_t(L * D)), post(dt.size()), pre(dt.size()), rate(std::size_t(N * D)), B(std::size_t(L * N)),
      C(B.size()), taps(std::size_t(K * D));
  for (auto* v : {&dt, &post, &pre, &B, &C, &taps})
    for (auto& x : *v) x = unit(rng);
  for (auto& x : rate) x = -4.f * 1.44269504f * unit(rng);  // A log2(e): the factors are 2^(dt rate)
  auto row = [](std::vector<float>& v, Index t) { return v.data() + t * N * lanes; };
  auto slot = [](Index t) { return t & (ring - 1); };  // t >= 0
  for (auto _ : st) {
    iattn::cpu_detail::parallel_for(2 * D / lanes, [&](Index job) {
      thread_local std::vector<float> F, Bp, Z, U, Ct, Bt, A, tile, decay;
      for (auto* v : {&F, &Bp, &Z, &U, &Ct}) v->resize(std::size_t(ring * N * lanes));
      Bt.resize(std::size_t(L * N * lanes)), A.resize(std::size_t(blk * N * lanes)), tile.resize(std::size_t(blk * blk * lanes));
      decay.resize(std::size_t(((L + blk - 1) / blk) * N * lanes));
      const Index c0 = job % (D / lanes) * lanes;  // job / (D / lanes): the direction (same work)
      for (Index i = (ring - (K - 1)) * N * lanes; i < ring * N * lanes; ++i) F[std::size_t(i)] = 1.f, Bp[std::size_t(i)] = 0.f;
      const batch k0 = batch::load(&taps[std::size_t(c0)]), k1 = batch::load(&taps[std::size_t(D + c0)]),
                  k2 = batch::load(&taps[std::size_t(2 * D + c0)]), k3 = batch::load(&taps[std::size_t(3 * D + c0)]);
      batch run[N], band[K - 1];
      for (Index b0 = 0; b0 < L; b0 += blk) {
        const Index b1 = std::min(L, b0 + blk);
        for (Index u = b0; u < b1; ++u) {
          const Index at = u * D + c0;
          const batch d = batch::load(&dt[std::size_t(at)]), p = batch::load(&post[std::size_t(at)]), q = batch::load(&pre[std::size_t(at)]);
          float *f0 = row(F, slot(u)), *f1 = row(F, slot(u + ring - 1)), *f2 = row(F, slot(u + ring - 2));
          float *p0 = row(Bp, slot(u)), *p1 = row(Bp, slot(u + ring - 1)), *p2 = row(Bp, slot(u + ring - 2)),
                *p3 = row(Bp, slot(u + ring - 3));
          for (Index m = 0; m < N; ++m) exp2(d * batch::load(&rate[std::size_t(m * D + c0)])).store(f0 + m * lanes);
          for (auto& x : band) x = batch::broadcast(0.f);
          for (Index m = 0; m < N; ++m) {
            const Index o = m * lanes;
            const batch fv = batch::load(f0 + o), bv = q * batch::broadcast(B[std::size_t(u * N + m)]);
            const batch uv = p * batch::broadcast(C[std::size_t(u * N + m)]);
            const batch g1 = batch::load(f1 + o), b1v = batch::load(p1 + o), b2v = batch::load(p2 + o);
            bv.store(p0 + o);
            uv.store(row(U, slot(u)) + o);
            batch z = k0 * batch::load(p3 + o);
            z = fma(z, batch::load(f2 + o), k1 * b2v);
            z = fma(z, g1, k2 * b1v);
            fma(z, fv, k3 * bv).store(row(Z, slot(u)) + o);
            batch e = uv;
            band[0] = fma(e, bv, band[0]);
            e = e * fv;
            band[1] = fma(e, b1v, band[1]);
            band[2] = fma(e * g1, b2v, band[2]);
            run[m] = u == b0 ? batch::broadcast(1.f) : run[m] * fv;
            (uv * run[m]).store(row(Ct, slot(u)) + o);
          }
          benchmark::DoNotOptimize(band);
        }
        for (auto& x : run) x = batch::broadcast(1.f);
        for (Index s = b1 - 1; s >= b0; --s)
          for (Index m = 0; m < N; ++m) {
            const Index o = m * lanes;
            (batch::load(row(Z, slot(s)) + o) * run[m]).store(row(Bt, s) + o);
            run[m] = run[m] * batch::load(row(F, slot(s)) + o);
          }
        for (Index m = 0; m < N; ++m) run[m].store(decay.data() + (b0 / blk * N + m) * lanes);
        // The diagonal block: tile[k][s] = sum_m U[u] E(s+1 .. u) Z[s], A[s] the running products.
        for (Index u = b0; u < b1; ++u) {
          const Index k = u - b0;
          const float *fu = row(F, slot(u)), *uu = row(U, slot(u));
          std::copy(row(Z, slot(u)), row(Z, slot(u)) + N * lanes, A.data() + k * N * lanes);
          // Four columns at a time (four independent sums), then the rest one by one; column k is
          // the one injected at this row (no factor yet).
          Index s = 0;
          for (; s + 4 <= k + 1; s += 4) {
            batch acc[4] = {batch::broadcast(0.f), batch::broadcast(0.f), batch::broadcast(0.f), batch::broadcast(0.f)};
            for (Index m = 0; m < N; ++m) {
              const batch fm = batch::load(fu + m * lanes), um = batch::load(uu + m * lanes);
              for (Index i = 0; i < 4; ++i) {
                float* a = A.data() + ((s + i) * N + m) * lanes;
                batch v = batch::load(a);
                if (s + i < k) {
                  v = v * fm;
                  v.store(a);
                }
                acc[i] = fma(um, v, acc[i]);
              }
            }
            for (Index i = 0; i < 4; ++i) acc[i].store(tile.data() + (k * blk + s + i) * lanes);
          }
          for (; s <= k; ++s) {
            batch acc = batch::broadcast(0.f);
            for (Index m = 0; m < N; ++m) {
              float* a = A.data() + (s * N + m) * lanes;
              batch v = batch::load(a);
              if (s < k) {
                v = v * batch::load(fu + m * lanes);
                v.store(a);
              }
              acc = fma(batch::load(uu + m * lanes), v, acc);
            }
            acc.store(tile.data() + (k * blk + s) * lanes);
          }
        }
        benchmark::DoNotOptimize(tile.data());
      }
      benchmark::DoNotOptimize(Bt.data());
    });
    benchmark::ClobberMemory();
  }
}

void lengths(benchmark::internal::Benchmark* b) {
  for (Index L : {256, 1024, 4096, 16384}) b->Arg(L);
  b->Unit(benchmark::kMillisecond)->UseRealTime();
}
// materialize_mean is O(L^2 D N): at L = 16384 one call takes minutes (Mamba-2: ~7), so the suite
// stops at 4096 (run --benchmark_filter=... with a custom Arg for more). RWKV-4's Wkv takes
// wkv_mean.hpp's blocked products (BM_mean_rwkv4_tiles: the per-channel tile path it replaced).
void mean_lengths(benchmark::internal::Benchmark* b) {
  for (Index L : {256, 1024, 4096}) b->Arg(L);
  b->Unit(benchmark::kMillisecond)->UseRealTime()->Iterations(1);
}

}  // namespace

BENCHMARK(BM_peak_fma)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_peak_store)->UseRealTime()->Unit(benchmark::kMillisecond);
#define IATTN_MODEL_BENCH(M)                                          \
  BENCHMARK_TEMPLATE(BM_apply, M)->Apply(lengths);                    \
  BENCHMARK_TEMPLATE(BM_row, M)->Apply(lengths);                      \
  BENCHMARK_TEMPLATE(BM_materialize, M)->Apply(lengths);
IATTN_MODEL_BENCH(mamba1)
IATTN_MODEL_BENCH(mamba2)
IATTN_MODEL_BENCH(griffin)
IATTN_MODEL_BENCH(rwkv4)
BENCHMARK_TEMPLATE(BM_apply_into, mamba1)->Apply(lengths);
BENCHMARK_TEMPLATE(BM_apply_into, griffin)->Apply(lengths);
BENCHMARK_TEMPLATE(BM_apply_into, vision_mamba_small)->Apply(lengths);
BENCHMARK_TEMPLATE(BM_row_into, griffin)->Apply(lengths);
BENCHMARK_TEMPLATE(BM_apply_into_cold, griffin)->Apply(lengths);
BENCHMARK_TEMPLATE(BM_row_into_cold, griffin)->Apply(lengths);
BENCHMARK_TEMPLATE(BM_materialize_into, mamba1)->Apply(lengths);
// Store probes of the same shapes: (L, D) for Mamba-1 (D = 1536) and Griffin (D = 2560), (L, L).
void store_shapes(benchmark::internal::Benchmark* b) {
  for (Index L : {1024, 4096, 16384})
    for (Index cols : {Index(1536), Index(2560), L})
      if (cols < 16384) b->Args({L, cols});
  b->Unit(benchmark::kMillisecond)->UseRealTime();
}
BENCHMARK_TEMPLATE(BM_store_rows, true)->Apply(store_shapes);
BENCHMARK_TEMPLATE(BM_store_rows, false)->Apply(store_shapes);
void delta_lengths(benchmark::internal::Benchmark* b) {
  for (Index L : {1024, 4096}) b->Arg(L);
  b->Unit(benchmark::kMillisecond)->UseRealTime();
}
// The delta-rule rows (issue 20): apply, one channel's matrix into a fresh result and into one
// kept across iterations (beside BM_store_rows' (L, L) probes), and the channel mean, L = 1024, 4096.
void delta_mean_lengths(benchmark::internal::Benchmark* b) {
  for (Index L : {1024, 4096}) b->Arg(L);
  b->Unit(benchmark::kMillisecond)->UseRealTime()->Iterations(1);
}
BENCHMARK_TEMPLATE(BM_delta_apply, qwen3_next_gdn)->Apply(delta_lengths);
BENCHMARK_TEMPLATE(BM_materialize, qwen3_next_gdn)->Apply(delta_lengths);
BENCHMARK_TEMPLATE(BM_materialize_into, qwen3_next_gdn)->Apply(delta_lengths);
BENCHMARK_TEMPLATE(BM_delta_mean, qwen3_next_gdn)->Apply(delta_mean_lengths);
BENCHMARK_TEMPLATE(BM_delta_apply, rwkv7_tmix)->Apply(delta_lengths);
BENCHMARK_TEMPLATE(BM_materialize, rwkv7_tmix)->Apply(delta_lengths);
BENCHMARK_TEMPLATE(BM_materialize_into, rwkv7_tmix)->Apply(delta_lengths);
BENCHMARK_TEMPLATE(BM_delta_mean, rwkv7_tmix)->Apply(delta_mean_lengths);
BENCHMARK_TEMPLATE(BM_materialize_mean, mamba1)->Apply(mean_lengths);
BENCHMARK_TEMPLATE(BM_materialize_mean, mamba2)->Apply(mean_lengths);
BENCHMARK_TEMPLATE(BM_materialize_mean, griffin)->Apply(mean_lengths);
BENCHMARK_TEMPLATE(BM_materialize_mean, rwkv4)->Apply(mean_lengths);
// softmax attention: apply row by row, one head's matrix, the channel mean by heads
BENCHMARK_TEMPLATE(BM_apply, transformer)->Apply(delta_lengths);
BENCHMARK_TEMPLATE(BM_materialize, transformer)->Apply(delta_lengths);
BENCHMARK_TEMPLATE(BM_materialize_mean, transformer)->Apply(mean_lengths);
BENCHMARK_TEMPLATE(BM_materialize_mean, vision_mamba_small)->Apply(mean_lengths);
// S4D's long-convolution kernel (1024 channels of 32 complex modes), what its decomposition builds
void BM_s4d_kernel(benchmark::State& st) {
  static const auto w = s4d_init<float>({.d_model = 1024, .d_state = 64}, 12);
  for (auto _ : st) {
    Mat k = s4d_kernel_taps(w, st.range(0));
    benchmark::DoNotOptimize(k.data());
  }
  st.SetItemsProcessed(st.iterations() * st.range(0) * 1024 * 32);
}
BENCHMARK(BM_s4d_kernel)->Arg(1024)->Arg(4096)->Unit(benchmark::kMillisecond)->UseRealTime();
using iattn::cpu_detail::mean_path;
BENCHMARK_TEMPLATE(BM_mean_mamba2_path, mean_path::automatic, false)->Arg(1024)->Unit(benchmark::kMillisecond)->UseRealTime()->Iterations(1);
BENCHMARK_TEMPLATE(BM_mean_mamba2_path, mean_path::channels, false)->Arg(1024)->Unit(benchmark::kMillisecond)->UseRealTime()->Iterations(1);
BENCHMARK_TEMPLATE(BM_mean_mamba2_path, mean_path::automatic, true)->Arg(1024)->Unit(benchmark::kMillisecond)->UseRealTime()->Iterations(1);
BENCHMARK(BM_mean_rwkv4_tiles)->Arg(1024)->Unit(benchmark::kMillisecond)->UseRealTime()->Iterations(1);
BENCHMARK_TEMPLATE(BM_mean_toeplitz, lru_layer, false)->Arg(1024)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK_TEMPLATE(BM_mean_toeplitz, lru_layer, true)->Arg(1024)->Unit(benchmark::kMillisecond)->UseRealTime()->Iterations(1);
BENCHMARK_TEMPLATE(BM_mean_toeplitz, hyena_layer, false)->Arg(1024)->Unit(benchmark::kMillisecond)->UseRealTime()->Iterations(1);
BENCHMARK_TEMPLATE(BM_mean_toeplitz, hyena_layer, true)->Arg(1024)->Unit(benchmark::kMillisecond)->UseRealTime()->Iterations(1);
BENCHMARK(BM_mean_mamba2_cores_products)->Arg(1024)->Unit(benchmark::kMillisecond)->UseRealTime()->Iterations(1);
BENCHMARK(BM_all_vim_fresh)->Arg(197)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_all_vim_reused)->Arg(197)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_all_vim_per_channel)->Arg(197)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK_TEMPLATE(BM_store_vim, true)->Arg(197)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK_TEMPLATE(BM_store_vim, false)->Arg(197)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_store_vim_stream)->Arg(197)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_floor_vim)->Arg(197)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_floor_vim_rest)->Arg(197)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK_MAIN();
