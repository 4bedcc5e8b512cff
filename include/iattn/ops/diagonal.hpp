// iattn/ops/diagonal.hpp: Diagonal(d), per channel c the L x L matrix diag(d_0[c], ..., d_{L-1}[c]).
//
//   d  (L, D), or (1, D) for a diagonal constant over tokens.   Causal: yes (diagonal).
// Gates, activations written as x -> (f(x)/x) x, per-channel input scales (Mamba's Delta).
#pragma once

#include "../core/coefficient.hpp"
#include "../core/error.hpp"
#include "../core/traits.hpp"

namespace iattn {

template <Scalar T>
class Diagonal : public op_base {
 public:
  using scalar = T;

  explicit Diagonal(coefficient<T> d) : d_(std::move(d)) {
    detail::require_shape(d_.rows() >= 0 && d_.cols() >= 1, "diagonal", "d", d_.rows(), d_.cols(),
                          "(L, D) or (1, D) with D >= 1");
  }

  /// L, or `any` for a (1, D) diagonal (constant over tokens).
  Index length() const { return d_.rows() == 1 ? any : d_.rows(); }
  Index channels() const { return d_.cols(); }
  bool constant() const { return d_.rows() == 1; }
  /// d_t[c]
  IATTN_HOST_DEVICE T value(Index t, Index c) const { return d_(d_.rows() == 1 ? 0 : t, c); }
  const coefficient<T>& d() const { return d_; }

 private:
  coefficient<T> d_;
};

template <class T>
inline constexpr bool is_lower_v<Diagonal<T>> = true;
template <class T>
inline constexpr bool is_upper_v<Diagonal<T>> = true;

/// diag(d): d is (L, D), or (1, D) for a token-constant diagonal.
template <class E>
Diagonal<detail::scalar_of<E>> diagonal(E&& d) {
  return Diagonal<detail::scalar_of<E>>(detail::make_coefficient(std::forward<E>(d)));
}

}  // namespace iattn
