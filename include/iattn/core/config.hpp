// iattn/core/config.hpp: basic types shared by every header.
//
// A sequence tensor is a row-major (L, D) Eigen matrix: token-major, channels contiguous.
// The letters (L, D, H, P, G, N, K) are defined once in docs/operators.md.
#pragma once

#include "host_device.hpp"

#include <Eigen/Core>

#include <concepts>
#include <cstddef>
#include <type_traits>

namespace iattn {

using Index = Eigen::Index;

/// Row-major dense matrix, the layout of every sequence tensor and every result.
template <class T>
using Matrix = Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

/// Marks a length or a channel count that an operator does not fix (a constant diagonal,
/// a convolution, the identity): it adapts to the other operands or to the input.
inline constexpr Index any = -1;

/// The scalar types the library evaluates in.
template <class T>
concept Scalar = std::same_as<T, float> || std::same_as<T, double>;

/// A half-open range of tokens [begin, end), used by `block`.
struct range {
  Index begin = 0;
  Index end = 0;
  Index size() const { return end - begin; }
};

}  // namespace iattn
