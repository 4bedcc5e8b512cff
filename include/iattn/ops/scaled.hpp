// iattn/ops/scaled.hpp: Scaled<A>, the matrix s * A^c for a scalar s.   Structure: that of A.
#pragma once

#include "../core/traits.hpp"

#include <type_traits>
#include <utility>

namespace iattn {

template <Operator A>
class Scaled : public op_base {
 public:
  using scalar = typename A::scalar;

  Scaled(double s, A a) : s_(s), a_(std::move(a)) {}
  Index length() const { return a_.length(); }
  Index channels() const { return a_.channels(); }
  double factor() const { return s_; }
  const A& inner() const { return a_; }

 private:
  double s_;
  A a_;
};

template <class A>
inline constexpr bool is_lower_v<Scaled<A>> = is_lower_v<A>;
template <class A>
inline constexpr bool is_upper_v<Scaled<A>> = is_upper_v<A>;
template <class A>
inline constexpr bool has_group_norm_v<Scaled<A>> = has_group_norm_v<A>;
template <class A>
inline constexpr bool is_band_v<Scaled<A>> = is_band_v<A>;

/// s * A and A * s.
template <class S, Operator A>
  requires std::is_arithmetic_v<S>
Scaled<std::remove_cvref_t<A>> operator*(S s, A&& a) {
  return {double(s), std::forward<A>(a)};
}
template <Operator A, class S>
  requires std::is_arithmetic_v<S>
Scaled<std::remove_cvref_t<A>> operator*(A&& a, S s) {
  return {double(s), std::forward<A>(a)};
}

}  // namespace iattn
