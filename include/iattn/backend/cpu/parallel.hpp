// iattn/backend/cpu/parallel.hpp: the loop layer. OpenMP when the consumer compiles with it
// (target iattn::openmp); a plain loop otherwise. Bodies must not throw: every check runs before.
#pragma once

#include "../../core/config.hpp"

#include <memory>
#include <type_traits>

#if defined(_OPENMP)
#include <omp.h>
#endif

namespace iattn::cpu_detail {

// The loop layer's functions are not templates, so translation units compiled with and without
// OpenMP would define the same inline functions differently (and the linker keep one of them for
// all): an inline namespace per mode gives the two definitions different names.
#if defined(_OPENMP)
inline namespace loops_openmp {
#else
inline namespace loops_serial {
#endif

/// fn(ctx, i) for i in [0, n), over threads with dynamic scheduling when not nested: the one
/// OpenMP region of the library, shared by every loop (a region per loop body cost each translation
/// unit an outlined function and its OpenMP lowering per call site: issue 19 part 5).
inline void parallel_for_erased(Index n, void (*fn)(void*, Index), void* ctx) {
#if defined(_OPENMP)
  if (n > 1 && !omp_in_parallel()) {
#pragma omp parallel for schedule(dynamic, 1)
    for (Index i = 0; i < n; ++i) fn(ctx, i);
    return;
  }
#endif
  for (Index i = 0; i < n; ++i) fn(ctx, i);
}

/// body(i) for i in [0, n), spread over threads with dynamic scheduling.
template <class Body>
inline void parallel_for(Index n, Body&& body) {
  using B = std::remove_reference_t<Body>;
  parallel_for_erased(n, [](void* ctx, Index i) { (*static_cast<B*>(ctx))(i); }, const_cast<void*>(static_cast<const void*>(std::addressof(body))));
}

/// Index of the calling thread inside parallel_for's team, in [0, max_threads()).
inline int thread_index() {
#if defined(_OPENMP)
  return omp_get_thread_num();
#else
  return 0;
#endif
}
inline int max_threads() {
#if defined(_OPENMP)
  return omp_get_max_threads();
#else
  return 1;
#endif
}

}  // inline namespace loops_openmp / loops_serial

}  // namespace iattn::cpu_detail
