// iattn/ops/softmax_attention.hpp: SoftmaxAttention(Q, K), an explicit Transformer attention matrix
// for side-by-side comparison:
//   H^c[t, s] = exp(scale * q_t[h] . k_s[h] - m_t) / sum_{s'} exp(scale * q_t[h] . k_{s'}[h] - m_t)
// over s <= t (causal) or all s (bidirectional), with the row maximum m_t subtracted.
//
//   Q, K (L, H*dk); channel c belongs to head h = c / P; D = H*P.   Causal: by default.
#pragma once

#include "../core/coefficient.hpp"
#include "../core/error.hpp"
#include "../core/traits.hpp"

#include <cmath>
#include <string>

namespace iattn {

struct softmax_options {
  Index heads = 1;     ///< H
  Index head_dim = 1;  ///< P channels per head (value width), D = H*P
  double scale = 0;    ///< 0: 1/sqrt(dk)
};

/// Tag for the non-causal (bidirectional) form: softmax_attention(Q, K, opts, bidirectional).
struct bidirectional_t {};
inline constexpr bidirectional_t bidirectional{};

template <Scalar T, bool Causal = true>
class SoftmaxAttention : public op_base {
 public:
  using scalar = T;

  SoftmaxAttention(coefficient<T> Q, coefficient<T> K, softmax_options o) : Q_(std::move(Q)), K_(std::move(K)), o_(o) {
    using std::to_string;
    const char* where = "softmax_attention";
    if (o_.heads < 1) detail::fail(where, "options.heads is " + to_string(o_.heads) + " but must be >= 1");
    if (o_.head_dim < 1) detail::fail(where, "options.head_dim is " + to_string(o_.head_dim) + " but must be >= 1");
    detail::require_shape(Q_.rows() >= 0 && Q_.cols() >= o_.heads && Q_.cols() % o_.heads == 0, where, "Q",
                          Q_.rows(), Q_.cols(), "(L, H*dk) with H = " + to_string(o_.heads));
    detail::require_shape(K_.rows() == Q_.rows() && K_.cols() == Q_.cols(), where, "K", K_.rows(), K_.cols(),
                          "the shape of Q, " + detail::shape_string(Q_.rows(), Q_.cols()));
    if (o_.scale == 0) o_.scale = 1.0 / std::sqrt(double(key_dim()));
  }

  Index length() const { return Q_.rows(); }
  Index channels() const { return o_.heads * o_.head_dim; }
  Index heads() const { return o_.heads; }
  Index head_dim() const { return o_.head_dim; }
  Index key_dim() const { return Q_.cols() / o_.heads; }
  T scale() const { return T(o_.scale); }
  const coefficient<T>& Q() const { return Q_; }
  const coefficient<T>& K() const { return K_; }

  /// scale * q_t[h] . k_s[h]
  T score(Index h, Index t, Index s) const {
    const Index dk = key_dim();
    const T* q = Q_.row(t) + h * dk;
    const T* k = K_.row(s) + h * dk;
    T acc = 0;
    for (Index i = 0; i < dk; ++i) acc += q[i] * k[i];
    return acc * scale();
  }

 private:
  coefficient<T> Q_, K_;
  softmax_options o_;
};

template <class T, bool Causal>
inline constexpr bool is_lower_v<SoftmaxAttention<T, Causal>> = Causal;

/// Causal softmax attention with Q, K (L, H*dk).
template <class QE, class KE>
SoftmaxAttention<detail::scalar_of<QE>, true> softmax_attention(QE&& Q, KE&& K, softmax_options o = {}) {
  return {detail::make_coefficient(std::forward<QE>(Q)), detail::make_coefficient(std::forward<KE>(K)), o};
}
/// Bidirectional (non-causal) softmax attention.
template <class QE, class KE>
SoftmaxAttention<detail::scalar_of<QE>, false> softmax_attention(QE&& Q, KE&& K, softmax_options o, bidirectional_t) {
  return {detail::make_coefficient(std::forward<QE>(Q)), detail::make_coefficient(std::forward<KE>(K)), o};
}

}  // namespace iattn
