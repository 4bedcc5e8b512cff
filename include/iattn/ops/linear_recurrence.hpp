// iattn/ops/linear_recurrence.hpp: LinearRecurrence(a, b), the first-order recurrence
// h_t = a_t h_{t-1} + b_t x_t, y_t = h_t, as the matrix
//   H[t, s] = (prod_{k=s+1..t} a_k[c]) * b_s[c]   for s <= t.
//
//   a, b  (L, D).   Causal: yes.
// Decays are multiplied as given (not through logarithms): a may be 0 (a reset) or negative.
// Products are running products from a reference token, never quotients, so a = 0 is exact.
// It is Semiseparable with N = 1 and C = 1 and shares its tile evaluator.
#pragma once

#include "../core/coefficient.hpp"
#include "../core/error.hpp"
#include "../core/traits.hpp"

namespace iattn {

template <Scalar T>
class LinearRecurrence : public op_base {
 public:
  using scalar = T;

  LinearRecurrence(coefficient<T> a, coefficient<T> b) : a_(std::move(a)), b_(std::move(b)) {
    detail::require_shape(a_.rows() >= 0 && a_.cols() >= 1, "linear_recurrence", "a", a_.rows(), a_.cols(),
                          "(L, D) with D >= 1 (L = 0 is an empty sequence)");
    detail::require_shape(b_.rows() == a_.rows() && b_.cols() == a_.cols(), "linear_recurrence", "b",
                          b_.rows(), b_.cols(), "the shape of a, " + detail::shape_string(a_.rows(), a_.cols()));
  }

  Index length() const { return a_.rows(); }
  Index channels() const { return a_.cols(); }
  const coefficient<T>& a() const { return a_; }
  const coefficient<T>& b() const { return b_; }

 private:
  coefficient<T> a_, b_;
};

template <class T>
inline constexpr bool is_lower_v<LinearRecurrence<T>> = true;

/// h_t = a_t h_{t-1} + b_t x_t with a, b (L, D).
template <class A, class B>
LinearRecurrence<detail::scalar_of<A>> linear_recurrence(A&& a, B&& b) {
  using T = detail::scalar_of<A>;
  static_assert(std::is_same_v<T, detail::scalar_of<B>>, "linear_recurrence: a and b must share a scalar type");
  return LinearRecurrence<T>(detail::make_coefficient(std::forward<A>(a)),
                             detail::make_coefficient(std::forward<B>(b)));
}

}  // namespace iattn
