// The CUDA backend's kernels on a real GPU: every case of kernel_cases.hpp (the same source the
// emulated test runs on the host) against the CPU backend and plain loops, float and double, on a
// stream of our own. Without a device it says why and exits 0 (the emulated test always runs).
// Built with IATTN_ENABLE_CUDA=ON; scripts/gpu-check.sh builds and runs it where a GPU is present.
#include "kernel_cases.hpp"

#include <cstdio>
#include <string>

namespace {

struct print_check {
  int* failures;
  int* checks;
  void operator()(const std::string& what, double err, double allowed) const {
    ++*checks;
    if (err <= allowed) return;
    ++*failures;
    std::printf("FAIL %s: max abs error %.3g, allowed %.3g\n", what.c_str(), err, allowed);
  }
};

}  // namespace

int main() {
  int devices = 0;
  const cudaError_t e = cudaGetDeviceCount(&devices);
  if (e != cudaSuccess || devices == 0) {
    std::printf("gpu_kernels_test: no CUDA device (%s); the real-GPU tests are skipped. The kernels' logic is "
                "tested on the host emulator (emulated_kernels_test); scripts/gpu-check.sh runs this test where a "
                "GPU is present.\n",
                e != cudaSuccess ? cudaGetErrorString(e) : "cudaGetDeviceCount found 0 devices");
    return 0;
  }
  cudaDeviceProp prop{};
  iattn::simt::check(cudaGetDeviceProperties(&prop, 0), "cudaGetDeviceProperties");
  std::printf("gpu_kernels_test on %s (sm_%d%d)\n", prop.name, prop.major, prop.minor);
  cudaStream_t stream = nullptr;
  iattn::simt::check(cudaStreamCreate(&stream), "cudaStreamCreate");
  int failures = 0, checks = 0;
  try {
    cuda_test::all_cases<float>(iattn::cuda{stream}, print_check{&failures, &checks}, cuda_test::gpu);
    cuda_test::all_cases<double>(iattn::cuda{stream}, print_check{&failures, &checks}, cuda_test::gpu);
    // iattn's pool (memory.hpp) keeps freed memory across a synchronisation, and gives it back
    // when asked: 16 MiB allocated and freed stay reserved after the stream is synchronised;
    // release_device_memory() leaves none (nothing is in use).
    {
      iattn::cuda_detail::device_buffer<float> b(iattn::Index(4) << 20, iattn::simt::stream{stream});
    }
    iattn::simt::check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
    const auto kept = iattn::cuda_pool_reserved_bytes();
    print_check{&failures, &checks}("pool: 16 MiB kept after a synchronisation", kept >= (std::uint64_t(16) << 20) ? 0 : 1, 0);
    iattn::release_device_memory();
    const auto left = iattn::cuda_pool_reserved_bytes();
    print_check{&failures, &checks}("pool: nothing kept after release_device_memory (" + std::to_string(left) + " bytes)",
                                    double(left), 0);
  } catch (const std::exception& ex) {
    std::printf("FAIL: %s\n", ex.what());
    ++failures;
  }
  iattn::simt::check(cudaStreamDestroy(stream), "cudaStreamDestroy");
  std::printf("gpu_kernels_test: %d comparisons, %d failed\n", checks, failures);
  return failures ? 1 : 0;
}
