// iattn/cuda.hpp: the CUDA backend, for .cu files (docs/cuda.md).
//
//   apply(cuda{s}, H, X)           Y = H X with X and Y device_matrix<T> (L, D)
//   apply(cuda{s}, H, X)           the same from and to host Eigen matrices (copies in and out)
//   materialize(cuda{s}, H, c)     channel c's (L, L) matrix as a device_matrix<T>
//   row(cuda{s}, H, t, c)          row t of channel c's matrix, (1, L): H^c[t, s] at (0, s)
//   col(cuda{s}, H, s, c)          column s of channel c's matrix, (1, L): H^c[t, s] at (0, t)
//   to_device(m, cuda{s}), to_host(dm)   host <-> device copies (backend/cuda/memory.hpp)
//
// Covered now: apply, materialize, row and col of Diagonal, CausalConv, LinearRecurrence,
// Semiseparable (every form) and Products of them (Mamba-1's chain diag * S * diag * conv). Any
// other node is a compile-time error naming what is covered, never a silent fallback to the CPU.
// Each call copies the expression's coefficients to the device and runs on stream s.
//
// Compiled by nvcc, the kernels run on the GPU; compiled by any other C++20 compiler, on the host
// emulator (backend/cuda/emulator.hpp), where `s` only chooses the emulator's schedule.
#pragma once

#include "backend/cuda/causal_conv.hpp"
#include "backend/cuda/diagonal.hpp"
#include "backend/cuda/evaluator.hpp"
#include "backend/cuda/linear_recurrence.hpp"
#include "backend/cuda/memory.hpp"
#include "backend/cuda/product.hpp"
#include "backend/cuda/semiseparable.hpp"
#include "backend/cuda/tag.hpp"
#include "core/error.hpp"
#include "core/traits.hpp"

#include <string>
#include <type_traits>
#include <vector>

namespace iattn {

/// Y = H X on the device. X is (L, D) on the device; Y is made on on.stream.
template <Operator H, Scalar T>
device_matrix<T> apply(cuda on, const H& h, const device_matrix<T>& X) {
  static_assert(cuda_detail::applies_v<H>,
                "apply(iattn::cuda, H, X): the CUDA backend applies Diagonal, CausalConv, LinearRecurrence, "
                "Semiseparable and Products of these; H contains another node (docs/cuda.md lists what is "
                "covered)");
  static_assert(std::is_same_v<T, typename H::scalar>, "apply(iattn::cuda, H, X): X must have the expression's scalar type");
  detail::check_input(h, X.rows(), X.cols(), "apply(iattn::cuda, H, X)", "X");
  device_matrix<T> Y(X.rows(), X.cols(), on);
  if constexpr (cuda_detail::applies_v<H>) cuda_detail::cuda_eval<H>::apply(h, on, X.data(), Y.data(), X.rows());
  return Y;
}

/// Y = H X from a host matrix to a host matrix: X copied in, Y copied out (waits for on.stream).
template <Operator H, class XD>
Matrix<typename XD::Scalar> apply(cuda on, const H& h, const Eigen::MatrixBase<XD>& X) {
  return to_host(apply(on, h, to_device(X, on)));
}

/// Channel c's (L, L) matrix on the device, zero above the diagonal. An expression that does not
/// fix L takes it last.
template <Operator H>
device_matrix<typename H::scalar> materialize(cuda on, const H& h, Index c, Index L = any) {
  static_assert(cuda_detail::materializes_v<H>,
                "materialize(iattn::cuda, H, c): the CUDA backend materializes Diagonal, CausalConv, "
                "LinearRecurrence, Semiseparable and Products of these; H contains another node (docs/cuda.md "
                "lists what is covered)");
  const char* where = "materialize(iattn::cuda, H, c)";
  detail::check_channel(h, c, where);
  L = detail::resolve_length(h, L, where);
  device_matrix<typename H::scalar> out(L, L, on);
  if constexpr (cuda_detail::materializes_v<H>) cuda_detail::cuda_eval<H>::materialize(h, on, c, out.data(), L);
  return out;
}

namespace cuda_detail {
/// Row k (is_row: (H^c)^T e_k) or column k (H^c e_k) of channel c's matrix, (1, L).
template <class H>
device_matrix<typename H::scalar> row_or_col(const cuda& on, const H& h, Index k, Index c, Index L, bool is_row) {
  using T = typename H::scalar;
  const char* where = is_row ? "row(iattn::cuda, H, t, c)" : "col(iattn::cuda, H, s, c)";
  L = detail::resolve_length(h, L, where);
  if (k < 0 || k >= L)
    detail::fail(where, std::string(is_row ? "t" : "s") + " = " + std::to_string(k) + " is out of range [0, L=" +
                            std::to_string(L) + ")");
  detail::check_channel(h, c, where);
  std::vector<T> unit(static_cast<std::size_t>(L), T(0));
  unit[static_cast<std::size_t>(k)] = T(1);
  const device_buffer<T> e(unit.data(), L, on.stream);
  device_matrix<T> out(1, L, on);
  if constexpr (slices_v<H>) cuda_eval<H>::vector(h, on, c, is_row, e.data(), out.data(), L);
  return out;
}
}  // namespace cuda_detail

/// Row t of channel c's matrix on the device, (1, L): out(0, s) = H^c[t, s] (row(H, t)'s row c on
/// the CPU). O(L N) per factor: one transposed scan of e_t, never the (L, L) matrix.
template <Operator H>
device_matrix<typename H::scalar> row(cuda on, const H& h, Index t, Index c, Index L = any) {
  static_assert(cuda_detail::slices_v<H>,
                "row(iattn::cuda, H, t, c): the CUDA backend takes rows of Diagonal, CausalConv, LinearRecurrence, "
                "Semiseparable and Products of these; H contains another node (docs/cuda.md lists what is covered)");
  return cuda_detail::row_or_col(on, h, t, c, L, true);
}

/// Column s of channel c's matrix on the device, (1, L): out(0, t) = H^c[t, s] (col(H, s)'s row c
/// on the CPU). O(L N) per factor: one scan of e_s, never the (L, L) matrix.
template <Operator H>
device_matrix<typename H::scalar> col(cuda on, const H& h, Index s, Index c, Index L = any) {
  static_assert(cuda_detail::slices_v<H>,
                "col(iattn::cuda, H, s, c): the CUDA backend takes columns of Diagonal, CausalConv, LinearRecurrence, "
                "Semiseparable and Products of these; H contains another node (docs/cuda.md lists what is covered)");
  return cuda_detail::row_or_col(on, h, s, c, L, false);
}

}  // namespace iattn
