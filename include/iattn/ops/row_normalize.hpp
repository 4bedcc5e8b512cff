// iattn/ops/row_normalize.hpp: RowNormalize<A>, diag(1 / (A^c 1)) A^c: every row divided by its sum.
// RWKV's WKV denominator, normalised linear attention. Structure: that of A.
// A row whose sum is 0 divides by 0 (IEEE: inf or nan), as the layer itself would.
#pragma once

#include "../core/traits.hpp"

#include <type_traits>
#include <utility>

namespace iattn {

template <Operator A>
class RowNormalize : public op_base {
 public:
  using scalar = typename A::scalar;

  explicit RowNormalize(A a) : a_(std::move(a)) {}
  Index length() const { return a_.length(); }
  Index channels() const { return a_.channels(); }
  const A& inner() const { return a_; }

 private:
  A a_;
};

template <class A>
inline constexpr bool is_lower_v<RowNormalize<A>> = is_lower_v<A>;
template <class A>
inline constexpr bool is_upper_v<RowNormalize<A>> = is_upper_v<A>;
template <class A>
inline constexpr bool has_group_norm_v<RowNormalize<A>> = has_group_norm_v<A>;

template <Operator A>
RowNormalize<std::remove_cvref_t<A>> row_normalize(A&& a) {
  return RowNormalize<std::remove_cvref_t<A>>(std::forward<A>(a));
}

}  // namespace iattn
