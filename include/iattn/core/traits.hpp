// iattn/core/traits.hpp: what every operator node is, as concepts and constexpr bools.
//
// A node derives from `op_base` and provides
//   using scalar = float | double | void;   (void: works in any scalar, e.g. the identity)
//   Index length() const;                   // L, or `any`
//   Index channels() const;                 // D, or `any`
// Structure is known at compile time and drives the evaluators with `if constexpr`:
//   is_lower_v   every channel's matrix is lower-triangular (causal)
//   is_upper_v   every channel's matrix is upper-triangular (anti-causal, e.g. flip of a causal one)
//   is_diagonal_v  both: a diagonal matrix (row and column scalings fuse into neighbours)
//   has_group_norm_v  contains a GroupNorm, whose statistics depend on the input (see `bind`)
#pragma once

#include "config.hpp"

#include <type_traits>

namespace iattn {

/// Tag base of every operator node.
struct op_base {};

template <class T>
concept Operator = std::is_base_of_v<op_base, std::remove_cvref_t<T>>;

template <class T>
inline constexpr bool is_lower_v = false;
template <class T>
inline constexpr bool is_upper_v = false;
template <class T>
inline constexpr bool is_diagonal_v = is_lower_v<T> && is_upper_v<T>;
template <class T>
inline constexpr bool has_group_norm_v = false;
/// A CausalConv node (products with it take the banded-Toeplitz rewrites).
template <class T>
inline constexpr bool is_causal_conv_v = false;
/// A lower band: nonzero only for 0 <= t - s < width (diagonals, convolutions, and their products,
/// sums and scales; Griffin's masked convolution). Products with one take the banded rewrite.
template <class T>
inline constexpr bool is_band_v = is_diagonal_v<T> || is_causal_conv_v<T>;

namespace detail {
template <class A, class B>
struct common_scalar {
  using type = std::conditional_t<std::is_void_v<A>, B, A>;
  static_assert(std::is_void_v<A> || std::is_void_v<B> || std::is_same_v<A, B>,
                "iattn: operands of one expression must share a scalar type (all float or all "
                "double); convert the coefficients with .template cast<T>()");
};
}  // namespace detail

template <class A, class B>
using common_scalar_t = typename detail::common_scalar<typename std::remove_cvref_t<A>::scalar,
                                                       typename std::remove_cvref_t<B>::scalar>::type;

}  // namespace iattn
