// The iattn side of bench/compare_pytorch_gpu.py: the CUDA backend on the inputs the script wrote.
//
//   iattn_cuda_compare DIR REPS WHAT
//
// reads DIR/{x, g, dt, A, B, C, w}.npy (float32: x, g, dt (L, D); A (D, N); B, C (L, N); w (K, D)),
// builds Mamba-1's chain H = diag(g) S diag(dt) conv(w), S[t, s] = sum_n C_t[n] exp(sum_{k=s+1..t}
// dt_k A[n]) B_s[n] per channel (the expression of bench/cuda_bench.cu and examples/13_cuda_mamba1.cu),
// evaluates on the GPU what the comma-separated WHAT names:
//   apply        apply(cuda, H, x)                          -> apply.npy (L, D)
//   materialize  materialize(cuda, H, c), c = D / 2         -> materialize.npy (L, L)
//   row          row(cuda, H, L - 1, c)                     -> row.npy (1, L)
//   mean         materialize_mean(cuda, H, {})              -> mean.npy (L, L)
//   all          materialize_all(cuda, H)                   -> all.npy (3, L, L): channels 0, c, D - 1
// and prints one JSON line with the best-of-REPS time of each (seconds, CUDA events on the stream,
// after one untimed call) and the device: "apply" etc. are whole calls, which copy the expression's
// coefficients from the host (docs/cuda.md); "apply_resident" etc. keep them on the device across the
// calls (to_device(H, on)): the kernels' time.
#include <iattn/cuda.hpp>
#include <iattn/explain/npy.hpp>
#include <iattn/iattn.hpp>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <map>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

namespace {

using iattn::Index;
using Mat = iattn::Matrix<float>;

/// Best-of-reps seconds of f() on the stream, after one untimed call.
template <class F>
double best_seconds(cudaStream_t s, int reps, F&& f) {
  using iattn::simt::check;
  cudaEvent_t start, stop;
  check(cudaEventCreate(&start), "cudaEventCreate");
  check(cudaEventCreate(&stop), "cudaEventCreate");
  f();
  check(cudaStreamSynchronize(s), "cudaStreamSynchronize");
  float best = 1e30f;
  for (int r = 0; r < reps; ++r) {
    check(cudaEventRecord(start, s), "cudaEventRecord");
    f();
    check(cudaEventRecord(stop, s), "cudaEventRecord");
    check(cudaEventSynchronize(stop), "cudaEventSynchronize");
    float ms = 0;
    check(cudaEventElapsedTime(&ms, start, stop), "cudaEventElapsedTime");
    best = std::min(best, ms);
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  return best / 1e3;
}

std::vector<std::string> split(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream in(s);
  for (std::string item; std::getline(in, item, ',');)
    if (!item.empty()) out.push_back(item);
  return out;
}

}  // namespace

int main(int argc, char** argv) try {
  if (argc != 4) {
    std::fprintf(stderr, "usage: iattn_cuda_compare DIR REPS WHAT (WHAT: comma-separated apply,materialize,row,mean,all)\n");
    return 2;
  }
  const std::filesystem::path dir = argv[1];
  const int reps = std::max(1, std::stoi(argv[2]));
  const std::vector<std::string> what = split(argv[3]);
  for (const auto& w : what)
    if (w != "apply" && w != "materialize" && w != "row" && w != "mean" && w != "all")
      throw std::invalid_argument("iattn_cuda_compare: WHAT has '" + w + "'; expected apply, materialize, row, mean or all");
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::fprintf(stderr, "iattn_cuda_compare: no CUDA device\n");
    return 3;
  }
  cudaDeviceProp prop{};
  iattn::simt::check(cudaGetDeviceProperties(&prop, 0), "cudaGetDeviceProperties");

  auto in = [&](const char* name) { return iattn::npy::read_matrix<float>((dir / (std::string(name) + ".npy")).string()); };
  const Mat x = in("x"), g = in("g"), dt = in("dt"), A = in("A"), B = in("B"), C = in("C"), w = in("w");
  const Index L = x.rows(), D = x.cols();
  using namespace iattn;
  const auto S = semiseparable(factored_decay(dt, A), B, C, {.heads = D});
  const auto H = diagonal(g) * S * diagonal(dt) * causal_conv(w);
  const Index c = D / 2;

  cudaStream_t stream;
  simt::check(cudaStreamCreate(&stream), "cudaStreamCreate");
  const cuda on{stream};
  std::map<std::string, double> t;
  auto out = [&](const char* name, const Mat& m) { npy::write((dir / (std::string(name) + ".npy")).string(), m); };
  // Each output twice: whole calls (the coefficients copied from the host every call), then through
  // the expression kept on the device (to_device(H, on): the untimed first call copies the
  // coefficients, no later one does): the kernels' own time.
  for (const auto& item : what)
    for (const bool resident : {false, true}) {
      const auto Hd = to_device(H, on);
      const std::string key = item + (resident ? "_resident" : "");
      // The call on H or on Hd.
      auto eval = [&](auto&& f) { return resident ? f(Hd) : f(H); };
      if (item == "apply") {
        const device_matrix<float> xd = to_device(x, on);
        device_matrix<float> y;
        t[key] = best_seconds(stream, reps, [&] { y = eval([&](const auto& e) { return apply(on, e, xd); }); });
        if (!resident) out("apply", to_host(y));
      } else if (item == "materialize") {
        device_matrix<float> m;
        t[key] = best_seconds(stream, reps, [&] { m = eval([&](const auto& e) { return materialize(on, e, c); }); });
        if (!resident) out("materialize", to_host(m));
      } else if (item == "row") {
        device_matrix<float> r;
        t[key] = best_seconds(stream, reps, [&] { r = eval([&](const auto& e) { return row(on, e, L - 1, c); }); });
        if (!resident) out("row", to_host(r));
      } else if (item == "mean") {
        device_matrix<float> m;
        t[key] = best_seconds(stream, reps, [&] { m = eval([&](const auto& e) { return materialize_mean(on, e, mean_options{}); }); });
        if (!resident) out("mean", to_host(m));
      } else {  // all
        device_matrix<float> m;
        t[key] = best_seconds(stream, reps, [&] { m = eval([&](const auto& e) { return materialize_all(on, e); }); });
        if (resident) continue;
        std::vector<float> host(std::size_t(3 * L * L));
        const Index picks[3] = {0, c, D - 1};
        for (int k = 0; k < 3; ++k)
          simt::check(cudaMemcpyAsync(host.data() + std::size_t(k * L * L), m.data() + std::size_t(picks[k] * L * L),
                                      sizeof(float) * std::size_t(L * L), cudaMemcpyDeviceToHost, stream),
                      "cudaMemcpyAsync");
        simt::check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
        npy::write<float>((dir / "all.npy").string(), host.data(), {3, std::int64_t(L), std::int64_t(L)});
      }
      simt::check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
    }
  simt::check(cudaStreamDestroy(stream), "cudaStreamDestroy");
  std::printf("{\"device\": \"%s\", \"L\": %ld, \"D\": %ld, \"N\": %ld, \"K\": %ld, \"channel\": %ld", prop.name, long(L),
              long(D), long(A.cols()), long(w.rows()), long(c));
  for (const auto& [k, v] : t) std::printf(", \"%s\": %.6g", k.c_str(), v);
  std::printf("}\n");
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "iattn_cuda_compare: %s\n", e.what());
  return 1;
}
