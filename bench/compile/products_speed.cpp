// Speed of the kernels whose matrix products moved from Eigen's GEMM to backend/cpu/gemm.hpp
// (issue 19 part 5): materialize (rank-N tiles, tile products), the chunked (SSD) apply, the head
// mean, nn::linear. Minimum over repetitions of the process CPU time (-DWALL: wall time), so two
// builds (before and after a change) can be compared on a shared machine. Not built by CMake:
//   g++ -std=c++20 -O3 -march=native -fopenmp -DIATTN_USE_XSIMD -I<root>/include -I/usr/include/eigen3 \
//       bench/compile/products_speed.cpp -o products_speed
//   OMP_NUM_THREADS=1 ./products_speed [reps=7] [cases: mat_dense,mat_mamba1,mat_ssd,apply_ssd,mean_ssd,prod,linear]
#include <iattn/iattn.hpp>
#include <iattn/models/common.hpp>
#include <chrono>
#include <ctime>
#ifdef WALL
#define CLK CLOCK_MONOTONIC
#else
#define CLK CLOCK_PROCESS_CPUTIME_ID
#endif
#include <cstdio>
#include <random>
#include <string>
#include <functional>
using namespace iattn;
using Mat = Matrix<float>;
static Mat rnd(Index r, Index c, std::mt19937& g, float lo = -1, float hi = 1) {
  std::uniform_real_distribution<float> u(lo, hi);
  Mat m(r, c);
  for (Index i = 0; i < m.size(); ++i) m.data()[i] = u(g);
  return m;
}
static double best(int reps, const std::function<void()>& f) {
  f();
  double b = 1e30;
  for (int i = 0; i < reps; ++i) {
    timespec a, e;
    clock_gettime(CLK, &a);
    f();
    clock_gettime(CLK, &e);
    b = std::min(b, (e.tv_sec - a.tv_sec) * 1e3 + (e.tv_nsec - a.tv_nsec) * 1e-6);
  }
  return b;
}
int main(int argc, char** argv) {
  const int reps = argc > 1 ? std::atoi(argv[1]) : 7;
  const std::string only = argc > 2 ? argv[2] : "";
  std::mt19937 g(1);
  auto want = [&](const char* n) { return only.empty() || only.find(n) != std::string::npos; };
  float sink = 0;
  for (Index L : {Index(1024), Index(2048)}) {
    // Mamba-1 shape: D = 1536 per-channel heads, N = 16, per-state dense decay
    if (want("mat_dense")) {
      const Index D = 256, N = 16;
      Mat dA = rnd(L, D * N, g, -0.1f, 0.f), B = rnd(L, N, g), C = rnd(L, N, g), out;
      auto S = semiseparable(dA, B, C, {.heads = D});
      std::printf("materialize S dense decay N=16        L=%5ld %8.3f ms\n", long(L), best(reps, [&] { materialize_into(out, S, 7); sink += out(L - 1, 0); }));
    }
    if (want("mat_mamba1")) {
      const Index D = 256, N = 16;
      Mat dt = rnd(L, D, g, 0.001f, 0.1f), A = rnd(D, N, g, -16.f, -1.f), B = rnd(L, N, g), C = rnd(L, N, g), gg = rnd(L, D, g), w = rnd(4, D, g), out;
      auto H = diagonal(gg) * semiseparable(factored_decay(dt, A), B, C, {.heads = D}) * diagonal(dt) * causal_conv(w);
      std::printf("materialize Mamba-1 composite N=16     L=%5ld %8.3f ms\n", long(L), best(reps, [&] { materialize_into(out, H, 7); sink += out(L - 1, 0); }));
      std::printf("materialize_mean Mamba-1 D=256 N=16    L=%5ld %8.3f ms\n", long(L), best(std::max(1, reps / 2), [&] { Mat m = materialize_mean(H); sink += m(L - 1, 0); }));
    }
    // Mamba-2 shape: 16 heads of P = 64, N = 128, scalar decay per head
    Index H = 16, P = 64, N = 128, D = H * P;
    Mat lam = rnd(L, H, g, -0.1f, 0.f), B = rnd(L, N, g), C = rnd(L, N, g), X = rnd(L, D, g), Y, out;
    auto S2 = semiseparable(lam, B, C, {.heads = H, .head_dim = P});
    if (want("mat_ssd")) std::printf("materialize S scalar decay N=128      L=%5ld %8.3f ms\n", long(L), best(reps, [&] { materialize_into(out, S2, 7); sink += out(L - 1, 0); }));
    if (want("apply_ssd")) std::printf("apply S chunked (SSD) D=1024 N=128    L=%5ld %8.3f ms\n", long(L), best(reps, [&] { apply_into(Y, S2, X); sink += Y(L - 1, 0); }));
    if (want("mean_ssd")) std::printf("materialize_mean S heads P=64 N=128   L=%5ld %8.3f ms\n", long(L), best(std::max(1, reps / 2), [&] { Mat m = materialize_mean(S2); sink += m(L - 1, 0); }));
    if (want("prod") && L == 1024) {
      Index D3 = 8, N3 = 16;
      Mat l1 = rnd(L, D3, g, -0.1f, 0.f), B1 = rnd(L, N3, g), C1 = rnd(L, N3, g), l2 = rnd(L, D3, g, -0.1f, 0.f);
      auto P2 = semiseparable(l1, B1, C1, {.heads = D3}) * semiseparable(l2, C1, B1, {.heads = D3});
      std::printf("materialize S*S (tile products)       L=%5ld %8.3f ms\n", long(L), best(reps, [&] { materialize_into(out, P2, 3); sink += out(L - 1, 0); }));
    }
    if (want("linear")) {
      Mat U = rnd(L, 768, g), W = rnd(3072, 768, g), W2 = rnd(768, 1536, g), U2 = rnd(L, 1536, g);
      std::printf("nn::linear (L,768) x (3072,768)^T     L=%5ld %8.3f ms\n", long(L), best(reps, [&] { Mat y = models::nn::linear<float>(U, W); sink += y(0, 0); }));
      std::printf("nn::linear (L,1536) x (768,1536)^T    L=%5ld %8.3f ms\n", long(L), best(reps, [&] { Mat y = models::nn::linear<float>(U2, W2); sink += y(0, 0); }));
      Mat U3 = rnd(L, 64, g), W3 = rnd(256, 64, g);
      std::printf("nn::linear (L,64) x (256,64)^T        L=%5ld %8.3f ms\n", long(L), best(reps, [&] { Mat y = models::nn::linear<float>(U3, W3); sink += y(0, 0); }));
    }
  }
  std::printf("(%g)\n", double(sink));
}
