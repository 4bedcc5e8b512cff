// iattn/core/backend.hpp: backend tags, passed as the first argument of an evaluation
// (`apply(iattn::cpu{}, H, X)`), as Thrust passes execution policies. `cpu` is the default.
#pragma once

namespace iattn {

/// The CPU backend: Eigen, SIMD across channels through xsimd when available, OpenMP across
/// channel slabs and tiles when the consumer compiles with OpenMP (target iattn::openmp).
struct cpu {};

template <class B>
inline constexpr bool is_backend_v = false;
template <>
inline constexpr bool is_backend_v<cpu> = true;

}  // namespace iattn
