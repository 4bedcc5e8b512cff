// iattn/ops/wkv.hpp: Wkv(w, k, u), RWKV's normalised WKV matrix, stable for any range of keys:
//   score[t, s] = sum_{r=s+1..t-1} w_r[c] + k_s[c]   (s < t),      score[t, t] = u[c] + k_t[c]
//   H^c[t, s]   = exp(score[t, s] - ell_t),   ell_t = log sum_{s<=t} exp(score[t, s])
// so every row sums to 1. It is the matrix row_normalize(S_strict(lambda = w, B = e^k, C = 1,
// bonus = e^u)) of docs/design.md section 2, evaluated in the log domain with running maxima (Hugging Face's
// rwkv_linear_attention_cpu does the same for apply): no exp argument is positive and nothing
// overflows or underflows to 0/0, whatever the spread of k (keys of +-80 in float included).
//
//   w  (L, D) or (1, D)  log-decays (<= 0 in RWKV; -inf is a reset)
//   k  (L, D)            log-weights of the keys (any finite value)
//   u  (1, D)            the log-bonus of the current token (RWKV's time_first)
// Causal: yes. A row whose scores are all -inf has no normalisation (0/0 = NaN), as the layer itself.
#pragma once

#include "../core/coefficient.hpp"
#include "../core/error.hpp"
#include "../core/traits.hpp"

#include <string>

namespace iattn {

template <Scalar T>
class Wkv : public op_base {
 public:
  using scalar = T;

  Wkv(coefficient<T> w, coefficient<T> k, coefficient<T> u) : w_(std::move(w)), k_(std::move(k)), u_(std::move(u)) {
    using std::to_string;
    // D from the majority of w, k and u (so the one argument that is wrong is named); L from k,
    // or from w when w is per-token and k alone disagrees with it on D.
    const Index D = (w_.cols() == u_.cols()) ? w_.cols() : k_.cols();
    const Index L = k_.rows();
    detail::require_shape(L >= 0 && k_.cols() == D && D >= 1, "wkv", "k", k_.rows(), k_.cols(),
                          "(L, D=" + to_string(D) + ") with D >= 1");
    detail::require_shape(w_.cols() == D && (w_.rows() == L || w_.rows() == 1), "wkv", "w", w_.rows(), w_.cols(),
                          "(L=" + to_string(L) + ", D=" + to_string(D) + ") or (1, D=" + to_string(D) + ")");
    detail::require_shape(u_.rows() == 1 && u_.cols() == D, "wkv", "u", u_.rows(), u_.cols(), "(1, D=" + to_string(D) + ")");
  }

  Index length() const { return k_.rows(); }
  Index channels() const { return k_.cols(); }
  /// True when w is one log-decay per channel, constant over tokens (RWKV-4).
  bool constant_decay() const { return w_.rows() == 1 && k_.rows() != 1; }
  /// w_t[c], whatever the storage.
  IATTN_HOST_DEVICE T decay(Index t, Index c) const { return w_.rows() == 1 ? w_(0, c) : w_(t, c); }
  const coefficient<T>& w() const { return w_; }
  const coefficient<T>& k() const { return k_; }
  const coefficient<T>& u() const { return u_; }

 private:
  coefficient<T> w_, k_, u_;
};

template <class T>
inline constexpr bool is_lower_v<Wkv<T>> = true;

/// RWKV's normalised WKV matrix from log-decays w (L, D) or (1, D), keys k (L, D), log-bonus u (1, D).
template <class WE, class KE, class UE>
Wkv<detail::scalar_of<KE>> wkv(WE&& w, KE&& k, UE&& u) {
  using T = detail::scalar_of<KE>;
  static_assert(std::is_same_v<T, detail::scalar_of<WE>> && std::is_same_v<T, detail::scalar_of<UE>>,
                "wkv: w, k and u must share a scalar type");
  return Wkv<T>(detail::make_coefficient(std::forward<WE>(w)), detail::make_coefficient(std::forward<KE>(k)),
                detail::make_coefficient(std::forward<UE>(u)));
}

}  // namespace iattn
