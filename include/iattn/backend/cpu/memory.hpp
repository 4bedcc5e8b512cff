// iattn/backend/cpu/memory.hpp: result allocation.
//
// A fresh (L, L) result is written once, and on a 4 KiB-page system most of the time of writing it
// goes to first-touch page faults: 16384 of them for L = 4096. Results of huge_output_bytes or more
// therefore ask the kernel for transparent huge pages (madvise(MADV_HUGEPAGE)) over their 2 MiB
// aligned interior before anything touches them: 512 times fewer faults. It is a hint: with THP
// disabled ("never"), outside Linux, or where the call fails, nothing changes but the speed.
// Measured on the 2-core VM (THP mode "madvise"): filling a fresh (4096, 4096) float matrix
// 34-71 ms without the hint, 6.5-15 ms with it (docs/performance.md).
#pragma once

#include "../../core/config.hpp"

#include <cstddef>
#include <cstdint>

#if defined(__linux__)
#include <sys/mman.h>
#endif

namespace iattn::cpu_detail {

/// Results at least this large get the huge-page hint (two 2 MiB pages: one always lies inside).
inline constexpr std::size_t huge_output_bytes = std::size_t(4) << 20;

/// Hints transparent huge pages for the 2 MiB pages that lie wholly inside [p, p + bytes).
inline void advise_huge_pages(void* p, std::size_t bytes) {
#if defined(__linux__) && defined(MADV_HUGEPAGE)
  if (bytes < huge_output_bytes) return;
  constexpr std::uintptr_t page = std::uintptr_t(1) << 21;
  const std::uintptr_t begin = (reinterpret_cast<std::uintptr_t>(p) + page - 1) & ~(page - 1);
  const std::uintptr_t end = (reinterpret_cast<std::uintptr_t>(p) + bytes) & ~(page - 1);
  if (end > begin) (void)::madvise(reinterpret_cast<void*>(begin), end - begin, MADV_HUGEPAGE);
#else
  (void)p;
  (void)bytes;
#endif
}

/// An uninitialised (rows, cols) result with the huge-page hint, before its first touch.
template <class T>
Matrix<T> output_matrix(Index rows, Index cols) {
  Matrix<T> m(rows, cols);
  advise_huge_pages(m.data(), std::size_t(m.size()) * sizeof(T));
  return m;
}
/// The same, zero-filled.
template <class T>
Matrix<T> zero_output_matrix(Index rows, Index cols) {
  Matrix<T> m = output_matrix<T>(rows, cols);
  m.setZero();
  return m;
}

}  // namespace iattn::cpu_detail
