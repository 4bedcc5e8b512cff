// iattn/ops/flip.hpp: Flip<A>, the anti-causal mirror J A^c J with J the token-reversal permutation:
//   flip(A)[t, s] = A[L-1-t, L-1-s].
// The coefficients of A stay in A's own token order. Used for bidirectional layers (Vision Mamba's
// backward scan, Hydra): H = H_f + flip(H_b). Structure: lower and upper swap.
#pragma once

#include "../core/traits.hpp"

#include <type_traits>
#include <utility>

namespace iattn {

template <Operator A>
class Flip : public op_base {
 public:
  using scalar = typename A::scalar;

  explicit Flip(A a) : a_(std::move(a)) {}
  Index length() const { return a_.length(); }
  Index channels() const { return a_.channels(); }
  const A& inner() const { return a_; }

 private:
  A a_;
};

template <class A>
inline constexpr bool is_lower_v<Flip<A>> = is_upper_v<A>;
template <class A>
inline constexpr bool is_upper_v<Flip<A>> = is_lower_v<A>;
template <class A>
inline constexpr bool has_group_norm_v<Flip<A>> = has_group_norm_v<A>;

/// J A J. flip(flip(A)) denotes A again (it is evaluated as such, not simplified away).
template <Operator A>
Flip<std::remove_cvref_t<A>> flip(A&& a) {
  return Flip<std::remove_cvref_t<A>>(std::forward<A>(a));
}

}  // namespace iattn
