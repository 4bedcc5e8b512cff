// iattn/models/recurrent_state.hpp: the final state of a gated linear recurrence from its
// activations, for the models' `final_state(acts)`.
//
// One scalar state element follows h_t = exp(lambda_t) h_{t-1} + b_t from h_{-1} = 0, lambda_t <= 0
// (lambda = -inf is a reset). After the last token
//   h_{L-1} = sum_s exp(sum_{k=s+1..L-1} lambda_k) b_s,
// evaluated chunk by chunk: inside a chunk the exponents are suffix sums from the chunk's end (each
// <= 0, never a difference of cumulative sums), and the chunks are chained by exp(chunk total).
// No exp argument is positive, and a long fp32 cumulative sum never enters.
#pragma once

#include "../core/config.hpp"

#include <algorithm>
#include <cmath>

namespace iattn::models {

/// h_{L-1} = sum_s exp(sum_{k=s+1..L-1} lambda(k)) b(s) for callables lambda(k) <= 0 and b(s),
/// accumulated in chunks of `chunk` tokens (see the header comment). 0 for L = 0.
template <class T, class Lambda, class Input>
T decayed_sum(Index L, Lambda&& lambda, Input&& b, Index chunk = 64) {
  T h = 0;
  for (Index c0 = 0; c0 < L; c0 += chunk) {
    const Index c1 = std::min(L, c0 + chunk);
    T acc = 0, r = 0;  // r = sum_{k=s+1..c1-1} lambda_k, built from the chunk's end
    for (Index s = c1 - 1; s >= c0; --s) {
      acc += std::exp(r) * b(s);
      r += lambda(s);
    }
    h = std::exp(r) * h + acc;  // r is now the chunk's total log-decay
  }
  return h;
}

/// The matrix state after the last token of S_t = diag(exp g_t) S_{t-1} + k_t v_t^T per head (GLA,
/// RWKV-6), from keys k (L, H*dk), values v (L, H*dv) and log-decays g (L, H*dk) <= 0:
/// (H*dk, dv), head h's block in rows h*dk.. (fla's final_state (H, dk, dv) flattened), each entry a
/// decayed_sum. Zero for L = 0.
template <class M>
Matrix<typename M::Scalar> gated_final_state(const M& k, const M& v, const M& g, Index heads) {
  using T = typename M::Scalar;
  const Index L = k.rows(), dk = k.cols() / heads, dv = v.cols() / heads;
  Matrix<T> S(heads * dk, dv);
  for (Index h = 0; h < heads; ++h)
    for (Index i = 0; i < dk; ++i)
      for (Index j = 0; j < dv; ++j)
        S(h * dk + i, j) = decayed_sum<T>(
            L, [&](Index r) { return g(r, h * dk + i); }, [&](Index s) { return k(s, h * dk + i) * v(s, h * dv + j); });
  return S;
}

}  // namespace iattn::models
