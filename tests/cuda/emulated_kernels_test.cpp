// The CUDA backend's kernels on the host emulator (backend/cuda/emulator.hpp), built by the
// ordinary C++ compiler: every case of kernel_cases.hpp against the CPU backend and plain loops, in
// the concurrent schedule (tag [concurrent]: what ThreadSanitizer watches, scripts/test.sh) and in
// the two serial schedules ([serial]: deterministic, they catch a missing barrier by value), then
// the emulator's own checks ([emulator]): the missing-barrier kernel caught, barrier divergence,
// deadlocks, partial-warp shuffles, the shared-memory limit and poison, persistent threads.
// One program in two translation units compiled side by side: this one (the SIMT interface, the
// scans, bands, products, sums, flips, row normalisations and norms; the door's errors; the
// emulator's own checks) and emulated_kernels_part2.cpp (the other nodes, the means, resident
// expressions, 16-bit storage).
#include "emulated_support.hpp"

#include <cmath>
#include <mutex>
#include <set>
#include <thread>
#include <vector>

IATTN_EMULATED_CASE("SIMT interface", cuda_test::simt_cases)
IATTN_EMULATED_CASE("Diagonal apply", cuda_test::diagonal_cases)
IATTN_EMULATED_CASE("CausalConv apply", cuda_test::causal_conv_cases)
IATTN_EMULATED_CASE("LinearRecurrence apply (chunked scan)", cuda_test::linear_recurrence_cases)
IATTN_EMULATED_CASE_BOTH("Semiseparable apply (chunked scan)", cuda_test::semiseparable_apply_cases)
IATTN_EMULATED_CASE("Semiseparable materialize (tiles), row, col", cuda_test::semiseparable_matrix_cases)
IATTN_EMULATED_CASE("Product apply (Mamba-1 chain)", cuda_test::product_cases)
IATTN_EMULATED_CASE_AT("Diagonal and CausalConv materialize, row, col (bands)", cuda_test::band_matrix_cases,
                       cuda_test::serial_matrices)
IATTN_EMULATED_CASE_AT("LinearRecurrence materialize (tiles), row, col", cuda_test::linear_recurrence_matrix_cases,
                       cuda_test::serial_matrices)
IATTN_EMULATED_CASE_AT("Product materialize, row, col", cuda_test::product_matrix_cases, cuda_test::serial_matrices)
IATTN_EMULATED_CASE_AT("Sum and Scaled apply, materialize, row, col", cuda_test::composite_cases,
                       cuda_test::serial_matrices)
IATTN_EMULATED_CASE_AT("Flip apply, materialize, row, col (alone, in sums and full products)", cuda_test::flip_cases,
                       cuda_test::serial_matrices)
IATTN_EMULATED_CASE_AT("RowNormalize apply, materialize, row, col", cuda_test::row_normalize_cases,
                       cuda_test::serial_matrices)
IATTN_EMULATED_CASE_AT("GroupNorm apply, bind, and the bound materialize, row, col", cuda_test::group_norm_cases,
                       cuda_test::serial_matrices)
TEST_CASE("CUDA backend: errors at the door", "[kernels][errors]") {
  using namespace iattn;
  using cuda_test::Mat;
  const Index L = 9;
  const Mat<float> x = Mat<float>::Ones(L, 3);
  // X's shape is checked before anything runs on the device.
  const auto D = diagonal(Mat<float>::Ones(L, 4));
  CHECK_THROWS_WITH(apply(cuda{}, D, x), Catch::Matchers::Contains("apply(iattn::cuda, H, X): X has shape (9, 3) but expected (L=9, D=4)"));
  // More states per channel than the scan holds: refused, naming N and the limit.
  const Mat<float> lam = Mat<float>::Constant(L, 1, -0.1f), B = Mat<float>::Ones(L, 600);
  const auto S = semiseparable(lam, B, B, {.heads = 1});
  CHECK_THROWS_WITH(apply(cuda{}, S, Mat<float>::Ones(L, 1)),
                    Catch::Matchers::Contains("N = 600 states per channel; the CUDA scan holds at most 512"));
  // ... which materialize handles (any N).
  const Mat<float> m = to_host(materialize(cuda{}, S, 0));
  CHECK(std::abs(m(L - 1, 0) / (600.0f * std::exp(-0.1f * (L - 1))) - 1.0f) < 1e-5f);
  CHECK_THROWS_WITH(materialize(cuda{}, S, 1), Catch::Matchers::Contains("channel c = 1 is out of range [0, 1)"));
  // block: each range checked against [0, L), named.
  CHECK_THROWS_WITH(block(cuda{}, S, 0, {2, 10}, {0, 1}),
                    Catch::Matchers::Contains("block(iattn::cuda, H, c, rows, cols): rows = [2, 10) is not a range inside [0, L=9)"));
  CHECK_THROWS_WITH(block(cuda{}, S, 0, {0, 1}, {3, 2}),
                    Catch::Matchers::Contains("block(iattn::cuda, H, c, rows, cols): cols = [3, 2) is not a range inside [0, L=9)"));
  CHECK(to_host(block(cuda{}, S, 0, {4, 4}, {0, 9})).size() == 0);
  // The complex scan and the delta-rule recurrence: their own limits, named (no fallback).
  const Mat<float> z = Mat<float>::Zero(1, 520), wide = Mat<float>::Ones(L, 520);
  const auto CS = complex_semiseparable(z, z, wide, wide, wide, wide, {.heads = 1});
  CHECK_THROWS_WITH(materialize(cuda{}, CS, 0),
                    Catch::Matchers::Contains("materialize(iattn::cuda, H, c): the ComplexSemiseparable has N = 520 "
                                              "complex states per channel; the CUDA scan holds at most 512"));
  const Mat<float> keys = Mat<float>::Constant(L, 300, 0.05f);
  const auto TR = gated_delta_rule(keys, keys, Mat<float>::Constant(L, 1, 0.5f), Mat<float>::Constant(L, 1, -0.1f),
                                   {.heads = 1});
  CHECK_THROWS_WITH(row(cuda{}, TR, 2, 0),
                    Catch::Matchers::Contains("row(iattn::cuda, H, t, c): the Transition has N = 300 keys per head; "
                                              "the CUDA recurrence holds at most 256"));
  // L = 0: empty results, no launch; no row or column to take.
  const auto S0 = semiseparable(Mat<float>(0, 2), Mat<float>(0, 3), Mat<float>(0, 3), {.heads = 2});
  CHECK(apply(cuda{}, S0, Mat<float>(0, 2)).size() == 0);
  CHECK(to_host(materialize(cuda{}, S0, 1)).size() == 0);
  CHECK_THROWS_WITH(row(cuda{}, S0, 0, 0), Catch::Matchers::Contains("row(iattn::cuda, H, t, c): t = 0 is out of range [0, L=0)"));
  // row / col: the index and the channel, each named with its range.
  const auto R = linear_recurrence(Mat<float>::Constant(L, 4, 0.5f), Mat<float>::Ones(L, 4));
  CHECK_THROWS_WITH(row(cuda{}, R, 9, 0), Catch::Matchers::Contains("row(iattn::cuda, H, t, c): t = 9 is out of range [0, L=9)"));
  CHECK_THROWS_WITH(row(cuda{}, R, -1, 0), Catch::Matchers::Contains("t = -1 is out of range [0, L=9)"));
  CHECK_THROWS_WITH(col(cuda{}, R, 9, 0), Catch::Matchers::Contains("col(iattn::cuda, H, s, c): s = 9 is out of range [0, L=9)"));
  CHECK_THROWS_WITH(row(cuda{}, R, 3, 4), Catch::Matchers::Contains("row(iattn::cuda, H, t, c): channel c = 4 is out of range [0, 4)"));
  CHECK_THROWS_WITH(col(cuda{}, R, 3, -1), Catch::Matchers::Contains("col(iattn::cuda, H, s, c): channel c = -1 is out of range [0, 4)"));
  CHECK_THROWS_WITH(materialize(cuda{}, R * D, 4), Catch::Matchers::Contains("materialize(iattn::cuda, H, c): channel c = 4 is out of range [0, 4)"));
  // A convolution alone does not fix L: it is the last argument, and must agree with the rest.
  const auto K = causal_conv(Mat<float>::Ones(3, 4));
  CHECK_THROWS_WITH(materialize(cuda{}, K, 0), Catch::Matchers::Contains("the expression does not fix the length L; pass it as the last argument"));
  CHECK_THROWS_WITH(col(cuda{}, K, 0, 0), Catch::Matchers::Contains("col(iattn::cuda, H, s, c): the expression does not fix the length L"));
  CHECK_THROWS_WITH(row(cuda{}, R * K, 0, 0, 5), Catch::Matchers::Contains("L is 5 but the expression has length 9"));
  const Mat<float> band = to_host(materialize(cuda{}, K, 1, 5));  // ones on the diagonal and the two below
  CHECK(band.sum() == 12.0f);
  CHECK(to_host(col(cuda{}, K, 4, 3, 5))(0, 4) == 1.0f);
  // GroupNorm: the matrices of an unbound norm need bind; one without a weight must be bound before
  // apply (it does not fix D); bind checks X's shape.
  const auto norm = group_norm(2, Mat<float>::Ones(1, 4));
  CHECK_THROWS_WITH(materialize(cuda{}, norm * R, 0), Catch::Matchers::Contains("unbound GroupNorm"));
  CHECK_THROWS_WITH(row(cuda{}, norm, 0, 0, L), Catch::Matchers::Contains("call bind(iattn::cuda, H, X) or bind(H, X) first"));
  CHECK_THROWS_WITH(apply(cuda{}, group_norm<float>(2) * R, Mat<float>::Ones(L, 4)),
                    Catch::Matchers::Contains("a GroupNorm without a weight and unbound does not fix its channel count"));
  CHECK_THROWS_WITH(bind(cuda{}, norm * R, x), Catch::Matchers::Contains("bind(iattn::cuda, H, X): X has shape (9, 3) but expected (L=9, D=4)"));
  CHECK(to_host(materialize(cuda{}, bind(cuda{}, norm * R, Mat<float>::Ones(L, 4)), 3)).allFinite());
  // 16-bit storage: X's shape checked as for float; a finite value the storage cannot hold is
  // refused before anything is copied, naming the entry; infinities and NaN are kept.
  const device_matrix<bfloat16> x16 = to_device<bfloat16>(x, cuda{});
  CHECK_THROWS_WITH(apply(cuda{}, D, x16), Catch::Matchers::Contains("apply(iattn::cuda, H, X): X has shape (9, 3) but expected (L=9, D=4)"));
  CHECK_THROWS_WITH(bind(cuda{}, norm * R, x16), Catch::Matchers::Contains("bind(iattn::cuda, H, X): X has shape (9, 3) but expected (L=9, D=4)"));
  Mat<float> big = Mat<float>::Ones(2, 3);
  big(1, 2) = 70000.0f;
  const long long copies = cuda_detail::host_to_device_copies().load();
  CHECK_THROWS_WITH(to_device<float16>(big, cuda{}),
                    Catch::Matchers::Contains("to_device<float16>(m, cuda): m of shape (2, 3) has m(1, 2) = 70000, beyond "
                                              "float16's largest finite value (65504)"));
  CHECK(cuda_detail::host_to_device_copies().load() == copies);
  CHECK(to_host(to_device<bfloat16>(big, cuda{}))(1, 2) == 70144.0f);  // bfloat16's nearest
  big(0, 1) = 3.4e38f;
  CHECK_THROWS_WITH(to_device<bfloat16>(big, cuda{}), Catch::Matchers::Contains("has m(0, 1) = 3.4e+38, beyond bfloat16's"));
  Mat<float> special(1, 3);
  special << std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity(),
      std::numeric_limits<float>::quiet_NaN();
  const Mat<float> kept = to_host(to_device<float16>(special, cuda{}));
  CHECK((kept(0, 0) == special(0, 0) && kept(0, 1) == special(0, 1) && std::isnan(kept(0, 2))));
}

// ---- the emulator itself -------------------------------------------------------------------------

namespace emulator_test {

using simt::index;

/// Threads 64.. return before the barrier the others wait at.
template <class T>
IATTN_KERNEL void early_return(T* out) {
  const unsigned tid = simt::thread_idx().x;
  if (tid >= 64) return;
  simt::sync_threads();
  out[tid] = T(1);
}
/// Lanes 0..15 shuffle, lanes 16..31 do not.
template <class T>
IATTN_KERNEL void half_warp_shuffle(T* out) {
  const unsigned tid = simt::thread_idx().x;
  if (simt::lane() < 16) out[tid] = simt::shfl_xor(T(tid), 1);
}
/// A whole-warp shuffle in a block of 40 threads: the second warp has lanes 0..7 only.
template <class T>
IATTN_KERNEL void partial_warp_shuffle(T* out) {
  const unsigned tid = simt::thread_idx().x;
  out[tid] = simt::shfl_xor(T(tid), 16);
}
/// 7000 doubles of static shared memory: past CUDA's 48 KiB.
template <class T>
IATTN_KERNEL void too_much_shared(T* out) {
  IATTN_SHARED(T, big, [7000]);
  big[simt::thread_idx().x] = T(1);
  out[simt::thread_idx().x] = big[simt::thread_idx().x];
}
/// Reads shared memory before anything is written in this block (what block 0's thread 0 left
/// there must not show in block 1).
template <class T>
IATTN_KERNEL void read_before_write(T* out) {
  IATTN_SHARED(T, cell, [1]);
  const T before = cell[0];
  simt::sync_threads();
  if (simt::thread_idx().x == 0) cell[0] = T(42);
  simt::sync_threads();
  if (simt::thread_idx().x == 1) {
    out[2 * simt::block_idx().x] = before;
    out[2 * simt::block_idx().x + 1] = cell[0];
  }
}

std::mutex ids_mu;
std::set<std::pair<unsigned, std::thread::id>> ids;  // (thread rank, std::thread) across blocks

IATTN_KERNEL void record_threads() {
  std::lock_guard lk(ids_mu);
  ids.insert({simt::thread_rank(), std::this_thread::get_id()});
}

}  // namespace emulator_test

TEST_CASE("emulator: a missing sync_threads is caught", "[emulator]") {
  // neighbour_sum reads the next thread's shared-memory write. With the barrier it is right under
  // every schedule; without it, each serial schedule runs some reader before its writer, which
  // then reads the poison (NaN): deterministic, in every build. (Under ThreadSanitizer the
  // concurrent schedule reports the race itself: the emulator_race_check test.)
  using simt::index;
  const index n = 600;
  std::vector<float> in(n), out(n), expected(n);
  for (index i = 0; i < n; ++i) in[std::size_t(i)] = float(i % 13);
  for (index i = 0; i < n; ++i) {
    const index r = i / 256 * 256 + (i % 256 + 1) % 256;
    expected[std::size_t(i)] = in[std::size_t(i)] + (r < n ? in[std::size_t(r)] : 0.0f);
  }
  auto wrong = [&] {
    index bad = 0;
    for (index i = 0; i < n; ++i) bad += !(out[std::size_t(i)] == expected[std::size_t(i)]);
    return bad;
  };
  const simt::launch_config cfg{{3}, {256}, 0};
  for (schedule s : {schedule::concurrent, schedule::serial_forward, schedule::serial_reverse}) {
    simt::launch("neighbour_sum", &simt_test::neighbour_sum<true, float>, cfg, {s}, in.data(), out.data(), n);
    CHECK(wrong() == 0);
  }
  simt::launch("broken", &simt_test::neighbour_sum<false, float>, cfg, {schedule::serial_forward}, in.data(), out.data(), n);
  CHECK(wrong() == 255 + 255 + 88);  // every reader but a whole block's last ran before its neighbour wrote
  simt::launch("broken", &simt_test::neighbour_sum<false, float>, cfg, {schedule::serial_reverse}, in.data(), out.data(), n);
  CHECK(wrong() == 2);  // the last thread of each whole block read thread 0's slot first
}

TEST_CASE("emulator: undefined behaviour of a GPU is reported", "[emulator]") {
  std::vector<double> out(64);
  for (schedule s : {schedule::concurrent, schedule::serial_forward, schedule::serial_reverse}) {
    INFO("schedule " << int(s));
    CHECK_THROWS_WITH(simt::launch("early_return", &emulator_test::early_return<double>, {{2}, {128}, 0}, {s}, out.data()),
                      Catch::Matchers::Contains("emulated kernel early_return: 64 thread(s) wait at sync_threads "
                                                "while 64 finished the kernel"));
    CHECK_THROWS_WITH(simt::launch("half_warp_shuffle", &emulator_test::half_warp_shuffle<double>, {{1}, {64}, 0}, {s},
                                   out.data()),
                      Catch::Matchers::Contains("deadlock"));
    CHECK_THROWS_WITH(simt::launch("partial_warp_shuffle", &emulator_test::partial_warp_shuffle<double>, {{1}, {40}, 0},
                                   {s}, out.data()),
                      Catch::Matchers::Contains("of warp 1, which has 8 lanes"));
    CHECK_THROWS_WITH(simt::launch("too_much_shared", &emulator_test::too_much_shared<double>, {{1}, {32}, 0}, {s},
                                   out.data()),
                      Catch::Matchers::Contains("exceeds CUDA's 48 KiB"));
  }
  CHECK_THROWS_AS(simt::launch("too_many_threads", &emulator_test::early_return<double>, {{1}, {2048}, 0}, {}, out.data()),
                  std::invalid_argument);
  CHECK_THROWS_AS(simt::launch("grid_y", &emulator_test::early_return<double>, {{1, 70000}, {32}, 0}, {}, out.data()),
                  std::invalid_argument);
}

TEST_CASE("emulator: shared memory is poisoned before every block", "[emulator]") {
  std::vector<double> out(6);
  simt::launch("read_before_write", &emulator_test::read_before_write<double>, {{3}, {64}, 0}, {}, out.data());
  for (int b = 0; b < 3; ++b) {
    CHECK(std::isnan(out[std::size_t(2 * b)]));  // not block b-1's 42
    CHECK(out[std::size_t(2 * b + 1)] == 42.0);
  }
}

TEST_CASE("emulator: one set of block-size threads walks all blocks", "[emulator]") {
  emulator_test::ids.clear();
  simt::launch("record_threads", &emulator_test::record_threads, {{5, 2}, {8, 4}, 0}, {});
  // 32 (rank, thread) pairs over 10 blocks: each rank ran on one std::thread for every block.
  std::set<unsigned> ranks;
  std::set<std::thread::id> threads;
  for (const auto& [rank, id] : emulator_test::ids) {
    ranks.insert(rank);
    threads.insert(id);
  }
  CHECK(emulator_test::ids.size() == 32);
  CHECK(ranks.size() == 32);
  CHECK(threads.size() == 32);
}

TEST_CASE("emulator: launches from several host threads at once", "[emulator][concurrent]") {
  // Each host thread applies its own Semiseparable through the backend; the launches share the
  // thread pool (each takes its own threads) and nothing else.
  using namespace iattn;
  using cuda_test::Mat;
  constexpr int host_threads = 3;
  std::vector<Mat<double>> got(host_threads), expected(host_threads);
  std::vector<std::thread> pool;
  for (int i = 0; i < host_threads; ++i) {
    const auto S = cuda_test::make_semiseparable<double>(cuda_test::ss_configs[std::size_t(i)], 70 + i);
    const Mat<double> x = cuda_test::uniform<double>(S.length(), S.channels(), -1, 1);
    expected[std::size_t(i)] = apply(S, x);
    pool.emplace_back([&got, S, x, i] { got[std::size_t(i)] = apply(cuda{}, S, x); });
  }
  for (std::thread& t : pool) t.join();
  for (int i = 0; i < host_threads; ++i)
    cuda_test::compare(catch_check{}, "host thread " + std::to_string(i), got[std::size_t(i)],
                       expected[std::size_t(i)], 1e-10);
}
