// iattn/models/delta_rule.hpp: what the delta-rule models share (Qwen3-Next, fla's DeltaNet and
// Gated DeltaNet, Kimi Delta Attention): the plain recurrent forward they are checked against, the
// L2 norm of their queries and keys, and the final matrix state from activations.
//
// Per value head h with key head kh(h), state S (dk, dv) in the (key, value) orientation:
//   S_t = A_t S_{t-1} + beta_t k_t v_t^T,   o_t = S_t^T q_t,
//   A_t = exp(g_t) (I - beta_t k_t k_t^T)           gate per head, g (L, H)      (Gated DeltaNet)
//   A_t = I - beta_t k_t k_t^T                      no gate, g empty              (DeltaNet)
//   A_t = (I - beta_t k_t k_t^T) diag(exp(g_t))     gate per key, g (L, H*dk)    (Kimi Delta Attention)
// written as the reference code steps it (transformers' torch_recurrent_gated_delta_rule): decay the
// state, read kv_mem = S^T k, delta = beta (v - kv_mem), S += k delta^T, o = S^T q.
#pragma once

#include "../iattn.hpp"
#include "common.hpp"

#include <cmath>
#include <vector>

namespace iattn::models {

namespace nn {

/// x / sqrt(sum(x^2) + eps) over each of the row's `groups` contiguous groups (fla's and
/// transformers' l2norm: rsqrt of the sum of squares plus eps, eps 1e-6).
template <class T>
Matrix<T> l2norm_groups(const Matrix<T>& X, Index groups, double eps = 1e-6) {
  const Index Dg = X.cols() / groups;
  Matrix<T> Y(X.rows(), X.cols());
  for (Index t = 0; t < X.rows(); ++t)
    for (Index g = 0; g < groups; ++g) {
      T ss = 0;
      for (Index i = 0; i < Dg; ++i) ss += X(t, g * Dg + i) * X(t, g * Dg + i);
      const T r = T(1) / std::sqrt(ss + T(eps));
      for (Index i = 0; i < Dg; ++i) Y(t, g * Dg + i) = X(t, g * Dg + i) * r;
    }
  return Y;
}

/// Repeats each of the `groups` column groups of X `times` times, group-major (torch's
/// repeat_interleave over the head axis): (L, G*d) -> (L, G*times*d), head h of the result is
/// head h / times of X.
template <class T>
Matrix<T> repeat_heads(const Matrix<T>& X, Index groups, Index times) {
  if (times == 1) return X;
  const Index d = X.cols() / groups;
  Matrix<T> Y(X.rows(), X.cols() * times);
  for (Index g = 0; g < groups; ++g)
    for (Index r = 0; r < times; ++r) Y.middleCols((g * times + r) * d, d) = X.middleCols(g * d, d);
  return Y;
}

/// The delta-rule recurrence of the header comment, in plain loops (the models' oracle). q and k are
/// (L, H*dk) per value head (already normalised and scaled as the model does), v (L, H*dv), beta
/// (L, H), g empty, (L, H) or (L, H*dk). final_state, when given, receives S after the last token,
/// (H*dk, dv): head h's (dk, dv) block in rows h*dk.. (the reference's (H, dk, dv) flattened).
template <class T>
Matrix<T> delta_rule_scan(const Matrix<T>& q, const Matrix<T>& k, const Matrix<T>& v, const Matrix<T>& beta,
                          const Matrix<T>& g, Index heads, Matrix<T>* final_state = nullptr) {
  const Index L = q.rows(), dk = q.cols() / heads, dv = v.cols() / heads;
  const bool per_key = g.size() != 0 && g.cols() == heads * dk;
  Matrix<T> o(L, v.cols());
  if (final_state) final_state->resize(heads * dk, dv);
  for (Index h = 0; h < heads; ++h) {
    Matrix<T> S = Matrix<T>::Zero(dk, dv);
    std::vector<T> mem(static_cast<std::size_t>(dv));
    for (Index t = 0; t < L; ++t) {
      if (g.size() != 0)
        for (Index i = 0; i < dk; ++i) S.row(i) *= std::exp(per_key ? g(t, h * dk + i) : g(t, h));
      const T b = beta(t, h);
      for (Index j = 0; j < dv; ++j) {
        T acc = 0;
        for (Index i = 0; i < dk; ++i) acc += S(i, j) * k(t, h * dk + i);
        mem[std::size_t(j)] = b * (v(t, h * dv + j) - acc);
      }
      for (Index i = 0; i < dk; ++i)
        for (Index j = 0; j < dv; ++j) S(i, j) += k(t, h * dk + i) * mem[std::size_t(j)];
      for (Index j = 0; j < dv; ++j) {
        T acc = 0;
        for (Index i = 0; i < dk; ++i) acc += S(i, j) * q(t, h * dk + i);
        o(t, h * dv + j) = acc;
      }
    }
    if (final_state) final_state->middleRows(h * dk, dk) = S;
  }
  return o;
}

/// The diagonal-plus-low-rank recurrence of RWKV-7 (fla's dplr_recurrence) per head, in plain loops:
///   S_t = Diag(exp w_t) S_{t-1} + b_t (a_t^T S_{t-1}) + k_t v_t^T,   o_t = S_t^T q_t,
/// q, k, w, a, b (L, H*dk), v (L, H*dv); the decay and the low-rank term act on the same old state.
/// final_state as in delta_rule_scan.
template <class T>
Matrix<T> dplr_scan(const Matrix<T>& q, const Matrix<T>& k, const Matrix<T>& v, const Matrix<T>& w, const Matrix<T>& a,
                    const Matrix<T>& b, Index heads, Matrix<T>* final_state = nullptr) {
  const Index L = q.rows(), dk = q.cols() / heads, dv = v.cols() / heads;
  Matrix<T> o(L, v.cols());
  if (final_state) final_state->resize(heads * dk, dv);
  for (Index h = 0; h < heads; ++h) {
    Matrix<T> S = Matrix<T>::Zero(dk, dv);
    std::vector<T> aS(static_cast<std::size_t>(dv));
    for (Index t = 0; t < L; ++t) {
      for (Index j = 0; j < dv; ++j) {
        T acc = 0;
        for (Index i = 0; i < dk; ++i) acc += a(t, h * dk + i) * S(i, j);
        aS[std::size_t(j)] = acc;
      }
      for (Index i = 0; i < dk; ++i)
        for (Index j = 0; j < dv; ++j)
          S(i, j) = std::exp(w(t, h * dk + i)) * S(i, j) + b(t, h * dk + i) * aS[std::size_t(j)] + k(t, h * dk + i) * v(t, h * dv + j);
      for (Index j = 0; j < dv; ++j) {
        T acc = 0;
        for (Index i = 0; i < dk; ++i) acc += S(i, j) * q(t, h * dk + i);
        o(t, h * dv + j) = acc;
      }
    }
    if (final_state) final_state->middleRows(h * dk, dk) = S;
  }
  return o;
}

}  // namespace nn

/// The state after the last token of any Transition applied to values v (L, H*P): per head
/// S = sum_s (A_{L-1} ... A_{s+1}) k_s v_s^T (N, P), returned (H*N, P) with head h's block in rows
/// h*N.. (the references' (H, dk, dv) flattened). Computed backwards from the operator's own
/// coefficients with the running product R <- R A_s = R Diag(e^{lambda_s}) + sum_r (R b_{s,r}) a_{s,r}^T
/// (O(N^2 R) per token, never a quotient), so it is a different algorithm from the models' forward
/// scans, which it is tested against. q is not read.
template <class T>
Matrix<T> transition_final_state(const Transition<T>& tr, const Matrix<T>& v) {
  const Index L = tr.length(), H = tr.heads(), N = tr.state(), R = tr.rank(), P = tr.head_dim(), R1 = std::max<Index>(R, 1);
  Matrix<T> S = Matrix<T>::Zero(H * N, P), Rm(N, N), RB(N, R1), At(R1, N);
  Eigen::Matrix<T, Eigen::Dynamic, 1> x(N), Rx(N);
  for (Index h = 0; h < H; ++h) {
    Rm.setIdentity();
    for (Index t = L - 1; t >= 0; --t) {
      for (Index i = 0; i < N; ++i) x(i) = tr.k()(t, h * N + i);
      Rx = Rm * x;
      S.middleRows(h * N, N).noalias() += Rx * v.row(t).segment(h * P, P);
      for (Index r = 0; r < R; ++r)
        for (Index i = 0; i < N; ++i) {
          RB(i, r) = tr.b()(t, (h * R + r) * N + i);
          At(r, i) = tr.a()(t, (h * R + r) * N + i);
        }
      if (R > 0) RB.leftCols(R) = (Rm * RB.leftCols(R)).eval();
      for (Index i = 0; i < N; ++i) Rm.col(i) *= std::exp(tr.log_decay(t, h, i));
      if (R > 0) Rm.noalias() += RB.leftCols(R) * At.topRows(R);
    }
  }
  return S;
}

/// The matrix state after the last token of the delta-rule recurrence (arguments as
/// nn::delta_rule_scan, q not needed), (H*dk, dv): transition_final_state of the model's factory
/// (delta_rule, gated_delta_rule or kimi_delta_rule by the shape of g).
template <class T>
Matrix<T> delta_final_state(const Matrix<T>& k, const Matrix<T>& v, const Matrix<T>& beta, const Matrix<T>& g, Index heads) {
  const transition_options o{.heads = heads, .head_dim = v.cols() / heads, .state = k.cols() / heads};
  if (g.size() == 0) return transition_final_state(delta_rule(ref(k), ref(k), ref(beta), o), v);
  if (g.cols() == heads) return transition_final_state(gated_delta_rule(ref(k), ref(k), ref(beta), ref(g), o), v);
  return transition_final_state(kimi_delta_rule(ref(k), ref(k), ref(beta), ref(g), o), v);
}

/// The state after the last token of nn::dplr_scan (same arguments but q), (H*dk, dv).
template <class T>
Matrix<T> dplr_final_state(const Matrix<T>& k, const Matrix<T>& v, const Matrix<T>& w, const Matrix<T>& a, const Matrix<T>& b,
                           Index heads) {
  return transition_final_state(
      transition(ref(w), ref(a), ref(b), ref(k), ref(k),
                 {.heads = heads, .head_dim = v.cols() / heads, .state = k.cols() / heads, .rank = 1}),
      v);
}

namespace delta_detail {

/// The taps of a layer's value convolution in causal_conv's (K, D) layout: the PyTorch weight
/// (D, K) transposed, or one tap of 1 when the layer has no short convolution (then p = x and the
/// SiLU of the values is diag(sigmoid(x)) x).
template <class T>
Matrix<T> value_taps(const Matrix<T>& conv_weight, Index width) {
  return conv_weight.size() ? depthwise_taps(conv_weight) : Matrix<T>(Matrix<T>::Ones(1, width));
}

/// The exact decomposition every delta-rule layer shares, over its V = nv * dv value channels:
///   H = diag(G) N T diag(sigmoid p) M,   p = M x,   beta = 0,
/// with T the layer's transition (q, k, beta and the gates frozen), M the values' depthwise
/// convolution (taps (K, V)), N the per-head RMS norm (weight (1, dv) shared by the heads, or none)
/// bound to the statistics of its actual input, and G the output gate's values (L, V), already
/// through the layer's activation (SiLU in Qwen3-Next and fla's GatedDeltaNet, sigmoid in Kimi
/// Linear); a layer without an output gate passes it empty and gets diag(1) there, so every
/// configuration of a layer has one expression type.
template <class T, class Tr>
auto decomposition_of(Tr transition, const Matrix<T>& x, const Matrix<T>& taps, const Matrix<T>& gate_values,
                      const Matrix<T>& norm_weight, Index heads, double eps, const Matrix<T>& out_proj) {
  const Index L = x.rows(), V = x.cols();
  const Matrix<T> p = nn::causal_conv1d<T>(x, Matrix<T>(taps.transpose()));
  auto body = std::move(transition) * diagonal(nn::map<T>(p, [](T v) { return nn::sigmoid(v); })) * causal_conv(taps);
  const Matrix<T> o = apply(body, x);  // the norm's actual input
  auto norm = norm_weight.size() ? group_norm(heads, Matrix<T>(norm_weight.replicate(1, heads)), {.eps = eps})
                                 : group_norm<T>(heads, {.eps = eps});
  norm = norm.bound_to(norm.compute(o.data(), L, V));
  Matrix<T> g = gate_values.size() ? gate_values : Matrix<T>(Matrix<T>::Ones(1, V));
  auto H = diagonal(std::move(g)) * std::move(norm) * std::move(body);
  return make_decomposition<T>(x, std::move(H), Matrix<T>(Matrix<T>::Zero(L, V)), out_proj);
}

template <class T>
Matrix<T> silu_of(const Matrix<T>& m) {
  return m.size() ? nn::map<T>(m, [](T v) { return nn::silu(v); }) : Matrix<T>();
}

}  // namespace delta_detail

}  // namespace iattn::models
