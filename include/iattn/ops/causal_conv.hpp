// iattn/ops/causal_conv.hpp: CausalConv(w), per channel the banded lower-triangular Toeplitz
// matrix M[t, s] = w[K-1-(t-s), c] for 0 <= t-s < K.
//
//   w  (K, D), K >= 1.  Short (Mamba's K = 4) or long (S4/Hyena kernels, K up to L).
// Taps follow PyTorch's depthwise Conv1d(padding=K-1)[..., :L]:
//   y_t[c] = sum_{k<K} w[k, c] x_{t-K+1+k}[c].           Causal: yes.
#pragma once

#include "../core/coefficient.hpp"
#include "../core/error.hpp"
#include "../core/traits.hpp"

namespace iattn {

template <Scalar T>
class CausalConv : public op_base {
 public:
  using scalar = T;

  explicit CausalConv(coefficient<T> w) : w_(std::move(w)) {
    detail::require_shape(w_.rows() >= 1 && w_.cols() >= 1, "causal_conv", "w", w_.rows(), w_.cols(),
                          "(K, D) with K >= 1 and D >= 1");
  }

  Index length() const { return any; }
  Index channels() const { return w_.cols(); }
  Index width() const { return w_.rows(); }
  /// Tap for lag t - s = lag (0 <= lag < K): w[K-1-lag, c].
  IATTN_HOST_DEVICE T tap(Index lag, Index c) const { return w_(w_.rows() - 1 - lag, c); }
  const coefficient<T>& w() const { return w_; }

 private:
  coefficient<T> w_;
};

template <class T>
inline constexpr bool is_lower_v<CausalConv<T>> = true;
template <class T>
inline constexpr bool is_causal_conv_v<CausalConv<T>> = true;

/// Depthwise causal convolution with taps w (K, D) in PyTorch's order.
template <class E>
CausalConv<detail::scalar_of<E>> causal_conv(E&& w) {
  return CausalConv<detail::scalar_of<E>>(detail::make_coefficient(std::forward<E>(w)));
}

}  // namespace iattn
