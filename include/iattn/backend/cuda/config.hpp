// iattn/backend/cuda/config.hpp: the types the CUDA backend's headers share, free of Eigen and of
// the CUDA runtime: indices, launch shapes, and the emulated build's stream.
//
//   simt::dims             grid and block extents (CUDA's dim3), x fastest
//   simt::launch_config    grid, block and dynamic shared bytes of one launch
//   simt::schedule         how the emulator interleaves a block's threads (emulator.hpp)
//   simt::emulated_stream  the emulated build's stream: carries the schedule (kernels run at launch)
#pragma once

#include "../../core/host_device.hpp"

#include <cstddef>

namespace iattn::simt {

/// Element offsets and extents in kernels: 64-bit (the same type as iattn::Index).
using index = std::ptrdiff_t;

/// Threads of a warp: the unit of shuffles, and of the emulator's warp barriers.
inline constexpr unsigned warp_size = 32;

/// Grid or block extents; x varies fastest.
struct dims {
  unsigned x = 1, y = 1, z = 1;
  IATTN_HOST_DEVICE constexpr unsigned long long count() const {
    return static_cast<unsigned long long>(x) * y * z;
  }
};

struct launch_config {
  dims grid;
  dims block;
  std::size_t shared_bytes = 0;  ///< dynamic shared memory per block
};

/// How the emulator runs a block's threads between barriers (docs/cuda.md):
///   concurrent       every thread on its own std::thread, synchronised only at barriers (the
///                    schedule ThreadSanitizer watches);
///   serial_forward   one thread at a time, in thread order, each until its next barrier;
///   serial_reverse   the same in reverse order.
/// The serial schedules are deterministic: a kernel that reads another thread's shared-memory
/// write without a barrier between them reads the poisoned (NaN) or stale value in one of them.
enum class schedule { concurrent, serial_forward, serial_reverse };

/// The stream of the emulated build: a placeholder with the schedule to run kernels under.
/// Launches run to completion before they return, so every stream is already synchronised.
struct emulated_stream {
  schedule order = schedule::concurrent;
};

}  // namespace iattn::simt
