// iattn/models/rwkv6.hpp: RWKV-6 ("Finch") time mixing in the form of fla's `RWKV6Attention`, as
// implicit attention: data-dependent token shift, data-dependent decay, bonus u, per-head group norm.
//
// Forward, H heads, key width dk = K/H, value width dv = V/H, u_{-1} = 0:
//   delta_t = u_{t-1} - u_t
//   a = tanh(x_proj_0_linear(u + delta * x_proj_0_mu))                         (L, 5R)
//   mu_n[t, :] = sum_r a[t, nR + r] x_proj_2[:, nR + r] + x_bias[n]             n = r, w, k, v, g
//   r = r_proj(u + delta mu_r), k = k_proj(u + delta mu_k), v, g likewise        (L, K) / (L, V)
//   w = -exp(lora_2(tanh(lora_0(u + delta mu_w))) + lora_2_bias)               (L, K), the log-decay
//   o_t = r_t^T (S_{t-1} + diag(bonus) k_t v_t^T),  S_t = diag(exp w_t) S_{t-1} + k_t v_t^T   (per head)
//   out = o_proj(GroupNorm_H(o) * SiLU(g))        (centred, weight and bias, eps)
//
// Exact decomposition over the V value channels, inner input x = v:
//   H    = diag(SiLU g) N S_strict(lambda = w, B = k, C = r, bonus; H heads, dv channels each, H groups)
//   beta = SiLU(g) * (offset(N) + g_norm_bias)
// N is the per-head group norm bound to its actual input; its centring and bias go to beta.
//
// From activations (docs/models.md): rwkv6_activations holds r, w, k, v, g, bonus, the norm's
// parameters (and optionally o_proj_weight, conv_state); attention(acts) is the decomposition,
// decompose(w, u) == attention(activations(w, u)), final_state(acts) fla's recurrent_state and conv_state.
#pragma once

#include "../iattn.hpp"
#include "common.hpp"
#include "recurrent_state.hpp"

#include <cstdint>
#include <string>

namespace iattn::models {

struct rwkv6_config {
  Index hidden_size = 64;
  Index key_dim = 32;             ///< K = expand_k * hidden_size (fla's default expand_k = 0.5)
  Index value_dim = 64;           ///< V = expand_v * hidden_size
  Index num_heads = 4;
  Index proj_low_rank_dim = 32;   ///< R, the data-dependent token shift's rank
  Index gate_low_rank_dim = 64;   ///< the decay LoRA's rank
  double norm_eps = 1e-5;
  Index layer_idx = 0;            ///< for the initialiser's depth-dependent ratios
  Index num_layers = 1;
  Index head_k_dim() const { return key_dim / num_heads; }
  Index head_v_dim() const { return value_dim / num_heads; }
};

/// fla `RWKV6Attention` parameters, '.' written '_' (e.g. w_proj.linear.lora.0.weight ->
/// w_proj_linear_lora_0_weight).
template <Scalar T>
struct rwkv6_weights {
  rwkv6_config config;
  Matrix<T> x_proj_0_mu;                  ///< (1, hidden)
  Matrix<T> x_proj_0_linear_weight;       ///< (5R, hidden)
  Matrix<T> x_proj_2_weight;              ///< (hidden, 5R)
  Matrix<T> x_bias;                       ///< (5, hidden), rows r, w, k, v, g
  Matrix<T> r_proj_linear_weight;         ///< (K, hidden)
  Matrix<T> w_proj_linear_lora_0_weight;  ///< (gate_low_rank_dim, hidden)
  Matrix<T> w_proj_linear_lora_2_weight;  ///< (K, gate_low_rank_dim)
  Matrix<T> w_proj_linear_lora_2_bias;    ///< (1, K)
  Matrix<T> k_proj_linear_weight;         ///< (K, hidden)
  Matrix<T> v_proj_linear_weight;         ///< (V, hidden)
  Matrix<T> g_proj_linear_weight;         ///< (V, hidden)
  Matrix<T> bonus;                        ///< (H, head_k_dim)
  Matrix<T> g_norm_weight;                ///< (1, V)
  Matrix<T> g_norm_bias;                  ///< (1, V)
  Matrix<T> o_proj_weight;                ///< (hidden, V)

  void check() const {
    const auto& c = config;
    using std::to_string;
    const char* m = "rwkv6";
    if (c.num_heads < 1 || c.key_dim % c.num_heads != 0 || c.value_dim % c.num_heads != 0)
      detail::fail(m, "num_heads " + to_string(c.num_heads) + " must divide key_dim = " + to_string(c.key_dim) +
                          " and value_dim = " + to_string(c.value_dim));
    const Index d = c.hidden_size, K = c.key_dim, V = c.value_dim, R5 = 5 * c.proj_low_rank_dim, Rg = c.gate_low_rank_dim;
    const std::string sd = to_string(d), sK = to_string(K), sV = to_string(V);
    const std::string Kd = "(key_dim=" + sK + ", hidden_size=" + sd + ")", Vd = "(value_dim=" + sV + ", hidden_size=" + sd + ")";
    check_field(m, "x_proj_0_mu", x_proj_0_mu, 1, d, "(1, hidden_size=" + sd + ")");
    check_field(m, "x_proj_0_linear_weight", x_proj_0_linear_weight, R5, d, "(5*proj_low_rank_dim=" + to_string(R5) + ", hidden_size=" + sd + ")");
    check_field(m, "x_proj_2_weight", x_proj_2_weight, d, R5, "(hidden_size=" + sd + ", 5*proj_low_rank_dim=" + to_string(R5) + ")");
    check_field(m, "x_bias", x_bias, 5, d, "(5, hidden_size=" + sd + ")");
    check_field(m, "r_proj_linear_weight", r_proj_linear_weight, K, d, Kd);
    check_field(m, "w_proj_linear_lora_0_weight", w_proj_linear_lora_0_weight, Rg, d, "(gate_low_rank_dim=" + to_string(Rg) + ", hidden_size=" + sd + ")");
    check_field(m, "w_proj_linear_lora_2_weight", w_proj_linear_lora_2_weight, K, Rg, "(key_dim=" + sK + ", gate_low_rank_dim=" + to_string(Rg) + ")");
    check_field(m, "w_proj_linear_lora_2_bias", w_proj_linear_lora_2_bias, 1, K, "(1, key_dim=" + sK + ")");
    check_field(m, "k_proj_linear_weight", k_proj_linear_weight, K, d, Kd);
    check_field(m, "v_proj_linear_weight", v_proj_linear_weight, V, d, Vd);
    check_field(m, "g_proj_linear_weight", g_proj_linear_weight, V, d, Vd);
    check_field(m, "bonus", bonus, c.num_heads, c.head_k_dim(), "(num_heads=" + to_string(c.num_heads) + ", head_k_dim=" + to_string(c.head_k_dim()) + ")");
    check_field(m, "g_norm_weight", g_norm_weight, 1, V, "(1, value_dim=" + sV + ")");
    check_field(m, "g_norm_bias", g_norm_bias, 1, V, "(1, value_dim=" + sV + ")");
    check_field(m, "o_proj_weight", o_proj_weight, d, V, "(hidden_size=" + sd + ", value_dim=" + sV + ")");
  }
};

/// Initialisation: fla's xavier_uniform (gain 2^-2.5) for the projections; the time parameters from
/// the official RWKV-6 (BlinkDL's RWKV-LM): token-shift ratios 1 - (i/d)^(ratio), decay speeds
/// -6 + 5 (n/(K-1))^(0.7 + 1.3 r01), bonus r01 (1 - n/(K-1)) + 0.1 ((n+1) % 3 - 1). The references
/// zero the two LoRA down-projections, which makes shift and decay data-independent at step 0; we
/// draw them from U(+-0.1) instead so that the data dependence the decomposition must carry is
/// there to test (docs/decisions.md).
template <Scalar T>
rwkv6_weights<T> rwkv6_init(const rwkv6_config& c, std::uint64_t seed = 0) {
  init::generator g(seed);
  rwkv6_weights<T> w;
  w.config = c;
  const Index d = c.hidden_size, K = c.key_dim, V = c.value_dim, R5 = 5 * c.proj_low_rank_dim, Rg = c.gate_low_rank_dim;
  const double r01 = c.num_layers > 1 ? double(c.layer_idx) / double(c.num_layers - 1) : 0.0;
  const double r10 = 1.0 - double(c.layer_idx) / double(c.num_layers);
  const double gain = std::pow(2.0, -2.5);
  w.x_proj_0_mu.resize(1, d);
  w.x_bias.resize(5, d);
  for (Index i = 0; i < d; ++i) {
    const double f = double(i) / double(d);
    w.x_proj_0_mu(0, i) = T(1 - std::pow(f, r10));
    w.x_bias(0, i) = T(1 - std::pow(f, 0.5 * r10));        // r
    w.x_bias(1, i) = T(1 - std::pow(f, r10));              // w
    w.x_bias(2, i) = T(1 - std::pow(f, r10));              // k
    w.x_bias(3, i) = T(1 - (std::pow(f, r10) + 0.3 * r01));  // v
    w.x_bias(4, i) = T(1 - std::pow(f, 0.5 * r10));        // g
  }
  w.x_proj_0_linear_weight = init::uniform<T>(g, R5, d, -0.1, 0.1);
  w.x_proj_2_weight = init::uniform<T>(g, d, R5, -0.01, 0.01);
  w.r_proj_linear_weight = init::xavier_uniform<T>(g, K, d, gain);
  w.w_proj_linear_lora_0_weight = init::uniform<T>(g, Rg, d, -0.1, 0.1);
  w.w_proj_linear_lora_2_weight = init::uniform<T>(g, K, Rg, -0.01, 0.01);
  w.w_proj_linear_lora_2_bias.resize(1, K);
  w.bonus.resize(c.num_heads, c.head_k_dim());
  for (Index n = 0; n < K; ++n) {
    const double f = K > 1 ? double(n) / double(K - 1) : 0.0;
    w.w_proj_linear_lora_2_bias(0, n) = T(-6 + 5 * std::pow(f, 0.7 + 1.3 * r01));
    w.bonus(n / c.head_k_dim(), n % c.head_k_dim()) = T(r01 * (1 - f) + 0.1 * double((n + 1) % 3 - 1));
  }
  w.k_proj_linear_weight = init::xavier_uniform<T>(g, K, d, gain);
  w.v_proj_linear_weight = init::xavier_uniform<T>(g, V, d, gain);
  w.g_proj_linear_weight = init::xavier_uniform<T>(g, V, d, gain);
  w.g_norm_weight = Matrix<T>::Ones(1, V);
  w.g_norm_bias = Matrix<T>::Zero(1, V);
  w.o_proj_weight = init::xavier_uniform<T>(g, d, V, gain);
  return w;
}

/// One forward pass's activations, named as fla's `RWKV6Attention.forward` names them (r, w, k, v, g
/// after the data-dependent token shift; w after `w = -torch.exp(w)`), plus the layer parameters the
/// decomposition reads: everything `attention(acts)` needs. The heads H and key width dk come from
/// bonus (H, dk); the value width dv = V / H. Built by `activations(w, u)` or by hand.
template <Scalar T>
struct rwkv6_activations {
  Matrix<T> r;              ///< (L, K)       receptance r_proj(...): the WKV's C
  Matrix<T> w;              ///< (L, K)       log-decay -exp(w_proj(...)), <= 0 (-inf a reset)
  Matrix<T> k;              ///< (L, K)       keys: the WKV's B
  Matrix<T> v;              ///< (L, V)       values: the inner input x
  Matrix<T> g;              ///< (L, V)       output gate before SiLU
  Matrix<T> bonus;          ///< (H, dk)      fla's u = self.bonus, the current token's weight
  Matrix<T> g_norm_weight;  ///< (1, V) or empty (1)
  Matrix<T> g_norm_bias;    ///< (1, V) or empty (0)
  Matrix<T> o_proj_weight;  ///< (hidden, V) or empty (the decomposition stops before o_proj)
  Matrix<T> conv_state;     ///< (1, hidden) or empty: hidden_states[-1] (zeros for L = 0); only final_state reads it
  double norm_eps = 1e-5;   ///< g_norm's eps

  Index length() const { return v.rows(); }
  Index heads() const { return bonus.rows(); }

  /// Throws std::invalid_argument naming the first field whose shape disagrees (L, V from v; H, dk from bonus).
  void check() const {
    using std::to_string;
    const char* m = "rwkv6_activations";
    const Index L = length(), V = v.cols(), H = bonus.rows(), K = H * bonus.cols();
    detail::require_shape(H >= 1 && bonus.cols() >= 1, m, "bonus", bonus.rows(), bonus.cols(), "(num_heads, head_k_dim), both >= 1");
    detail::require_shape(V >= 1 && V % H == 0, m, "v", v.rows(), v.cols(), "(L, V) with V divisible by num_heads=" + to_string(H));
    const std::string LK = "(L=" + to_string(L) + ", K=num_heads*head_k_dim=" + to_string(K) + ")";
    const std::string LV = "(L=" + to_string(L) + ", V=" + to_string(V) + ")", V1 = "(1, V=" + to_string(V) + ") or empty";
    check_field(m, "r", r, L, K, LK);
    check_field(m, "w", w, L, K, LK);
    check_field(m, "k", k, L, K, LK);
    check_field(m, "g", g, L, V, LV);
    if (g_norm_weight.size() != 0) check_field(m, "g_norm_weight", g_norm_weight, 1, V, V1);
    if (g_norm_bias.size() != 0) check_field(m, "g_norm_bias", g_norm_bias, 1, V, V1);
    if (o_proj_weight.size() != 0)
      detail::require_shape(o_proj_weight.cols() == V, m, "o_proj_weight", o_proj_weight.rows(), o_proj_weight.cols(), "(hidden, V=" + to_string(V) + ") or empty");
    if (conv_state.size() != 0)
      detail::require_shape(conv_state.rows() == 1, m, "conv_state", conv_state.rows(), conv_state.cols(), "(1, hidden) or empty");
  }
};

/// The layer's state after the last token, as fla's cache keeps it for RWKV6Attention.
template <Scalar T>
struct rwkv6_state {
  Matrix<T> recurrent_state;  ///< (H*dk, dv): fla's (H, dk, dv) flattened, S[i, j] = sum_s exp(sum_{k>s} w_k[i]) k_s[i] v_s[j]
  Matrix<T> conv_state;       ///< (1, hidden): the token-shift input hidden_states[-1]
};

/// The activations of one forward pass of the layer on u (L, hidden), o_proj_weight included.
template <Scalar T>
rwkv6_activations<T> activations(const rwkv6_weights<T>& wt, const Matrix<T>& u) {
  wt.check();
  const auto& c = wt.config;
  detail::require_shape(u.cols() == c.hidden_size, "rwkv6", "u", u.rows(), u.cols(), "(L, hidden_size=" + std::to_string(c.hidden_size) + ")");
  const Index L = u.rows(), d = c.hidden_size, R = c.proj_low_rank_dim;
  Matrix<T> delta(L, d);
  for (Index t = 0; t < L; ++t) delta.row(t) = (t > 0 ? Matrix<T>(u.row(t - 1)) : Matrix<T>::Zero(1, d)) - u.row(t);
  auto lerp = [&](const Matrix<T>& mu) {  // u + delta * mu, mu (1, d) or (L, d)
    Matrix<T> m(L, d);
    for (Index t = 0; t < L; ++t)
      for (Index i = 0; i < d; ++i) m(t, i) = u(t, i) + delta(t, i) * (mu.rows() == 1 ? mu(0, i) : mu(t, i));
    return m;
  };
  const Matrix<T> a = nn::map<T>(nn::linear<T>(lerp(wt.x_proj_0_mu), wt.x_proj_0_linear_weight), [](T v) { return std::tanh(v); });
  Matrix<T> mix[5];
  for (Index n = 0; n < 5; ++n) {
    // a[:, nR:(n+1)R] W2[:, nR:(n+1)R]^T + bias_n, on the library's product kernel (gemm.hpp)
    mix[n].resize(L, d);
    cpu_detail::gemm_scratch<T> gs;
    cpu_detail::gemm<T>(gs, L, d, R, T(1), a.data() + n * R, a.cols(), wt.x_proj_2_weight.data() + n * R,
                        wt.x_proj_2_weight.cols(), false, mix[n].data(), d, false, true);
    mix[n].rowwise() += wt.x_bias.row(n);
  }
  rwkv6_activations<T> s;
  s.r = nn::linear<T>(lerp(mix[0]), wt.r_proj_linear_weight);
  const Matrix<T> lw = nn::map<T>(nn::linear<T>(lerp(mix[1]), wt.w_proj_linear_lora_0_weight), [](T v) { return std::tanh(v); });
  s.w = nn::map<T>(nn::linear<T>(lw, wt.w_proj_linear_lora_2_weight, wt.w_proj_linear_lora_2_bias), [](T v) { return -std::exp(v); });
  s.k = nn::linear<T>(lerp(mix[2]), wt.k_proj_linear_weight);
  s.v = nn::linear<T>(lerp(mix[3]), wt.v_proj_linear_weight);
  s.g = nn::linear<T>(lerp(mix[4]), wt.g_proj_linear_weight);
  s.bonus = wt.bonus;
  s.g_norm_weight = wt.g_norm_weight;
  s.g_norm_bias = wt.g_norm_bias;
  s.o_proj_weight = wt.o_proj_weight;
  s.conv_state = L > 0 ? Matrix<T>(u.row(L - 1)) : Matrix<T>(Matrix<T>::Zero(1, d));
  s.norm_eps = c.norm_eps;
  return s;
}

/// The layer's forward (the oracle). final_state, when given, receives the state after the last token.
template <Scalar T>
Matrix<T> rwkv6_forward(const rwkv6_weights<T>& wt, const Matrix<T>& u, rwkv6_state<T>* final_state = nullptr) {
  const auto s = activations(wt, u);
  Matrix<T> o = nn::gated_state_scan<T>(s.r, s.k, s.v, s.w, wt.config.num_heads, wt.bonus, final_state ? &final_state->recurrent_state : nullptr);
  if (final_state) final_state->conv_state = s.conv_state;
  nn::group_norm_rows<T>(o, wt.config.num_heads, wt.config.norm_eps, true, wt.g_norm_weight, wt.g_norm_bias);
  o.array() *= nn::map<T>(s.g, [](T v) { return nn::silu(v); }).array();
  return nn::linear<T>(o, wt.o_proj_weight);
}

/// The WKV matrix S_strict(w, k, r, bonus), before the norm and the gate.
template <Scalar T>
auto rwkv6_wkv(const rwkv6_activations<T>& s) {
  s.check();
  const Index H = s.heads();
  return semiseparable(s.w, s.k, s.r, s.bonus, {.heads = H, .head_dim = s.v.cols() / H, .groups = H});
}
/// The WKV matrix of the layer on u (L, hidden): rwkv6_wkv(activations(w, u)).
template <Scalar T>
auto rwkv6_wkv(const rwkv6_weights<T>& wt, const Matrix<T>& u) { return rwkv6_wkv(activations(wt, u)); }

/// The exact decomposition from activations (see the header comment); with o_proj_weight empty,
/// output() is the inner output GroupNorm(o) * SiLU(g).
template <Scalar T>
auto attention(const rwkv6_activations<T>& s) {
  s.check();
  const Index L = s.length(), V = s.v.cols(), H = s.heads();
  auto S = rwkv6_wkv(s);
  const Matrix<T> o = apply(S, s.v);
  const group_norm_options opts{.eps = s.norm_eps, .centered = true};
  const auto n = s.g_norm_weight.size() ? group_norm(H, s.g_norm_weight, opts) : group_norm<T>(H, opts);
  const auto nb = n.bound_to(n.compute(o.data(), L, V));
  const Matrix<T> gate = nn::map<T>(s.g, [](T v) { return nn::silu(v); });
  Matrix<T> shift = offset(nb);
  if (s.g_norm_bias.size() != 0) shift.rowwise() += s.g_norm_bias.row(0);
  Matrix<T> beta = gate.cwiseProduct(shift);
  return make_decomposition<T>(s.v, diagonal(gate) * nb * std::move(S), std::move(beta), s.o_proj_weight);
}

/// The exact decomposition: rwkv6_forward(w, u) == d.output(), x = v.
template <Scalar T>
auto decompose(const rwkv6_weights<T>& wt, const Matrix<T>& u) { return attention(activations(wt, u)); }

/// The exact decomposition (the named form of decompose).
template <Scalar T>
auto rwkv6_decompose(const rwkv6_weights<T>& wt, const Matrix<T>& u) { return decompose(wt, u); }

/// The state after the last token (rwkv6_state): the matrix state from the log-decays in log space
/// (exp of non-positive suffix sums, recurrent_state.hpp); the bonus is not part of the state.
template <Scalar T>
rwkv6_state<T> final_state(const rwkv6_activations<T>& s) {
  s.check();
  return {gated_final_state(s.k, s.v, s.w, s.heads()), s.conv_state};
}

}  // namespace iattn::models
