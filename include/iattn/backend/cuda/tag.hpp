// iattn/backend/cuda/tag.hpp: the CUDA backend's tag, passed first to an evaluation as Thrust
// passes an execution policy: apply(iattn::cuda{stream}, H, X). Its stream orders every copy and
// kernel of the call; in the emulated build it is a placeholder that carries the emulator's
// schedule (iattn::cuda{{.order = simt::schedule::serial_reverse}}).
#pragma once

#include "../../core/backend.hpp"
#include "launch.hpp"

namespace iattn {

/// The CUDA backend (include <iattn/cuda.hpp>): kernels on `stream`, device buffers in and out.
struct cuda {
  simt::stream stream{};
};

template <>
inline constexpr bool is_backend_v<cuda> = true;

}  // namespace iattn
