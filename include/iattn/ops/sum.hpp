// iattn/ops/sum.hpp: Sum<A, B>, per channel A^c + B^c.   Structure: the weaker of the two.
#pragma once

#include "../core/error.hpp"
#include "../core/traits.hpp"

#include <type_traits>
#include <utility>

namespace iattn {

template <Operator A, Operator B>
class Sum : public op_base {
 public:
  using scalar = common_scalar_t<A, B>;

  Sum(A a, B b) : a_(std::move(a)), b_(std::move(b)) {
    length_ = detail::merge_extent(a_.length(), b_.length(), "sum", "the length L");
    channels_ = detail::merge_extent(a_.channels(), b_.channels(), "sum", "the channel count D");
  }
  Index length() const { return length_; }
  Index channels() const { return channels_; }
  const A& left() const { return a_; }
  const B& right() const { return b_; }

 private:
  A a_;
  B b_;
  Index length_, channels_;
};

template <class A, class B>
inline constexpr bool is_lower_v<Sum<A, B>> = is_lower_v<A> && is_lower_v<B>;
template <class A, class B>
inline constexpr bool is_band_v<Sum<A, B>> = is_band_v<A> && is_band_v<B>;
template <class A, class B>
inline constexpr bool is_upper_v<Sum<A, B>> = is_upper_v<A> && is_upper_v<B>;
template <class A, class B>
inline constexpr bool has_group_norm_v<Sum<A, B>> = has_group_norm_v<A> || has_group_norm_v<B>;

/// A + B: per channel, the sum of the matrices.
template <Operator A, Operator B>
Sum<std::remove_cvref_t<A>, std::remove_cvref_t<B>> operator+(A&& a, B&& b) {
  return {std::forward<A>(a), std::forward<B>(b)};
}

}  // namespace iattn
