// iattn/backend/cuda/launch.hpp: launching a SIMT kernel, the one place that differs between the
// two executions:
//   nvcc:      kernel<<<grid, block, shared_bytes, stream>>>(args...), then cudaGetLastError()
//   emulated:  emu::run: the grid on the host, under the stream's schedule, before returning
// A launch with an empty grid (L = 0) does nothing. Errors throw std::runtime_error naming the
// kernel; a shape CUDA rejects throws std::invalid_argument before anything runs.
#pragma once

#include "simt.hpp"

#include <stdexcept>
#include <string>
#include <utility>

namespace iattn::simt {

#if defined(__CUDACC__)
/// A CUDA stream (cudaStream_t; nullptr is the legacy default stream).
using stream = cudaStream_t;

/// Throws std::runtime_error("<what>: <error name>: <description>") unless e is cudaSuccess.
inline void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess)
    throw std::runtime_error(std::string(what) + ": " + cudaGetErrorName(e) + ": " + cudaGetErrorString(e));
}
#else
/// The emulated build's stream: a placeholder carrying the emulator's schedule.
using stream = emulated_stream;
#endif

/// Blocks of `threads` threads for n independent items (one per thread, grid-stride loops past
/// `max_blocks` blocks).
inline unsigned blocks_for(long long n, unsigned threads, unsigned max_blocks = 16384) {
  const long long b = (n + threads - 1) / threads;
  return static_cast<unsigned>(b < max_blocks ? b : max_blocks);
}

/// Runs `kernel(args...)` over cfg's grid on stream s (see the header comment).
template <class... P, class... A>
void launch(const char* name, void (*kernel)(P...), const launch_config& cfg, stream s, A&&... args) {
  if (cfg.grid.count() == 0) return;
#if defined(__CUDACC__)
  const dim3 grid(cfg.grid.x, cfg.grid.y, cfg.grid.z), block(cfg.block.x, cfg.block.y, cfg.block.z);
  kernel<<<grid, block, cfg.shared_bytes, s>>>(std::forward<A>(args)...);
  check(cudaGetLastError(), name);
#else
  emu::run(name, cfg, s.order, [&] { kernel(args...); });
#endif
}

}  // namespace iattn::simt
