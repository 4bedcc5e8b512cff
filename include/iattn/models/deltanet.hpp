// iattn/models/deltanet.hpp: flash-linear-attention's `DeltaNet` and `GatedDeltaNet` layers
// (fla/layers/delta_net.py, fla/layers/gated_deltanet.py, fla 0.6) as implicit attention.
//
// Forward, H key heads of dk, HV value heads of dv (GatedDeltaNet: HV = num_v_heads, a multiple of
// H, value head h reading key head h / (HV / H); DeltaNet: HV = H):
//   q = SiLU(q_conv1d(q_proj(u))), k = SiLU(k_conv1d(k_proj(u))), v = SiLU(v_conv1d(v_proj(u)))
//     (use_short_conv = false: SiLU of the projections; no conv bias)
//   q = l2norm(q) / sqrt(dk), k = l2norm(k) per head (eps 1e-6 on the sum of squares)
//   beta = sigmoid(b_proj(u)) (x 2 with allow_neg_eigval; DeltaNet with use_beta = false: 1)
//   GatedDeltaNet: g = -exp(A_log) softplus(a_proj(u) + dt_bias), S_t = exp(g_t)(I - beta k k^T) S + beta k v^T
//   DeltaNet:                                                 S_t = (I - beta k k^T) S + beta k v^T
//   o_t = S_t^T q_t;  o = RMSNorm_head(o) o_norm_weight [* SiLU(g_proj(u)) with use_gate];  out = o_proj(o)
//
// Exact decomposition over the HV*dv value channels, inner input x = v_proj(u) (before the
// convolution), beta = 0 (models/delta_rule.hpp): H = [diag(SiLU gate)] N T diag(sigmoid p) M.
// The reference kernels and naive.py compute in float32 whatever the model's dtype (docs/models.md).
#pragma once

#include "../iattn.hpp"
#include "common.hpp"
#include "delta_rule.hpp"

#include <cstdint>
#include <string>

namespace iattn::models {

/// fla `GatedDeltaNet` (gated = true) or `DeltaNet` (gated = false) hyper-parameters. For DeltaNet,
/// num_v_heads must equal num_heads and head_dim * expand_v gives dv, as for GatedDeltaNet.
struct deltanet_config {
  Index hidden_size = 32;
  Index head_dim = 8;           ///< dk
  double expand_v = 2;          ///< dv = head_dim * expand_v
  Index num_heads = 2;          ///< H (key heads)
  Index num_v_heads = 0;        ///< HV; 0 means num_heads
  Index conv_size = 4;
  bool gated = true;            ///< GatedDeltaNet's decay gate (A_log, dt_bias, a_proj)
  bool use_gate = true;         ///< the SiLU output gate g_proj (GatedDeltaNet's default; DeltaNet's is false)
  bool use_beta = true;         ///< b_proj (DeltaNet may drop it: beta = 1)
  bool use_short_conv = true;
  bool allow_neg_eigval = false;  ///< beta = 2 sigmoid(b): eigenvalues of I - beta k k^T in (-1, 1]
  double norm_eps = 1e-5;
  double initializer_range = 0.02;
  Index head_v_dim() const { return Index(double(head_dim) * expand_v); }
  Index value_heads() const { return num_v_heads ? num_v_heads : num_heads; }
  Index key_dim() const { return num_heads * head_dim; }
  Index value_dim() const { return value_heads() * head_v_dim(); }
};

/// The layer's parameters, named as its state_dict ('.' written '_'); fields a configuration does
/// not use are empty.
template <Scalar T>
struct deltanet_weights {
  deltanet_config config;
  Matrix<T> q_proj_weight;     ///< (key_dim, hidden)
  Matrix<T> k_proj_weight;     ///< (key_dim, hidden)
  Matrix<T> v_proj_weight;     ///< (value_dim, hidden)
  Matrix<T> a_proj_weight;     ///< (HV, hidden)            gated only
  Matrix<T> b_proj_weight;     ///< (HV, hidden)            use_beta only
  Matrix<T> A_log;             ///< (1, HV)                 gated only
  Matrix<T> dt_bias;           ///< (1, HV)                 gated only
  Matrix<T> q_conv1d_weight;   ///< (key_dim, conv_size)    use_short_conv only, PyTorch (key_dim, 1, K)
  Matrix<T> k_conv1d_weight;   ///< (key_dim, conv_size)
  Matrix<T> v_conv1d_weight;   ///< (value_dim, conv_size)
  Matrix<T> g_proj_weight;     ///< (value_dim, hidden)     use_gate only
  Matrix<T> o_norm_weight;     ///< (1, dv)
  Matrix<T> o_proj_weight;     ///< (hidden, value_dim)

  void check() const {
    const auto& c = config;
    using std::to_string;
    const char* m = c.gated ? "gated_deltanet" : "deltanet";
    const Index H = c.num_heads, HV = c.value_heads(), dv = c.head_v_dim();
    if (H < 1 || c.head_dim < 1 || dv < 1 || HV % H != 0 || (!c.gated && HV != H))
      detail::fail(m, "num_heads " + to_string(H) + ", num_v_heads " + to_string(HV) + ", head_dim " + to_string(c.head_dim) +
                          ", head_v_dim " + to_string(dv) + ": all >= 1, num_heads dividing num_v_heads (equal for DeltaNet)");
    const std::string d = to_string(c.hidden_size), K = to_string(c.key_dim()), V = to_string(c.value_dim()), hv = to_string(HV);
    auto need = [&](const char* f, const Matrix<T>& w, bool used, Index r, Index cc, const std::string& e) {
      if (used) check_field(m, f, w, r, cc, e);
      else if (w.size() != 0) detail::fail(m, std::string(f) + " is given but this configuration does not use it (expected empty)");
    };
    need("q_proj_weight", q_proj_weight, true, c.key_dim(), c.hidden_size, "(key_dim=" + K + ", hidden_size=" + d + ")");
    need("k_proj_weight", k_proj_weight, true, c.key_dim(), c.hidden_size, "(key_dim=" + K + ", hidden_size=" + d + ")");
    need("v_proj_weight", v_proj_weight, true, c.value_dim(), c.hidden_size, "(value_dim=" + V + ", hidden_size=" + d + ")");
    need("a_proj_weight", a_proj_weight, c.gated, HV, c.hidden_size, "(num_v_heads=" + hv + ", hidden_size=" + d + ")");
    need("b_proj_weight", b_proj_weight, c.use_beta, HV, c.hidden_size, "(num_v_heads=" + hv + ", hidden_size=" + d + ")");
    need("A_log", A_log, c.gated, 1, HV, "(1, num_v_heads=" + hv + ")");
    need("dt_bias", dt_bias, c.gated, 1, HV, "(1, num_v_heads=" + hv + ")");
    const std::string ks = to_string(c.conv_size);
    need("q_conv1d_weight", q_conv1d_weight, c.use_short_conv, c.key_dim(), c.conv_size, "(key_dim=" + K + ", conv_size=" + ks + ")");
    need("k_conv1d_weight", k_conv1d_weight, c.use_short_conv, c.key_dim(), c.conv_size, "(key_dim=" + K + ", conv_size=" + ks + ")");
    need("v_conv1d_weight", v_conv1d_weight, c.use_short_conv, c.value_dim(), c.conv_size, "(value_dim=" + V + ", conv_size=" + ks + ")");
    need("g_proj_weight", g_proj_weight, c.use_gate, c.value_dim(), c.hidden_size, "(value_dim=" + V + ", hidden_size=" + d + ")");
    need("o_norm_weight", o_norm_weight, true, 1, dv, "(1, head_v_dim=" + to_string(dv) + ")");
    need("o_proj_weight", o_proj_weight, true, c.hidden_size, c.value_dim(), "(hidden_size=" + d + ", value_dim=" + V + ")");
  }
};

/// fla's model initialisation: Linear and Conv1d weights N(0, initializer_range), A_log = log U(0, 16),
/// dt_bias the inverse softplus of dt = exp(U(log 1e-3, log 1e-1)) (at least 1e-4), norm weight 1.
template <Scalar T>
deltanet_weights<T> deltanet_init(const deltanet_config& c, std::uint64_t seed = 0) {
  init::generator g(seed);
  deltanet_weights<T> w;
  w.config = c;
  const Index d = c.hidden_size, HV = c.value_heads(), K = c.key_dim(), V = c.value_dim();
  const double sd = c.initializer_range;
  w.q_proj_weight = init::normal<T>(g, K, d, sd);
  w.k_proj_weight = init::normal<T>(g, K, d, sd);
  w.v_proj_weight = init::normal<T>(g, V, d, sd);
  if (c.gated) {
    w.a_proj_weight = init::normal<T>(g, HV, d, sd);
    w.A_log = init::uniform<T>(g, 1, HV, 1e-6, 16.0).array().log().matrix();
    w.dt_bias.resize(1, HV);
    const Matrix<T> u01 = init::uniform<T>(g, 1, HV, 0.0, 1.0);
    for (Index h = 0; h < HV; ++h) {
      const double dt = std::max(1e-4, std::exp(double(u01(0, h)) * (std::log(0.1) - std::log(0.001)) + std::log(0.001)));
      w.dt_bias(0, h) = T(nn::inverse_softplus(dt));
    }
  }
  if (c.use_beta) w.b_proj_weight = init::normal<T>(g, HV, d, sd);
  if (c.use_short_conv) {
    w.q_conv1d_weight = init::normal<T>(g, K, c.conv_size, sd);
    w.k_conv1d_weight = init::normal<T>(g, K, c.conv_size, sd);
    w.v_conv1d_weight = init::normal<T>(g, V, c.conv_size, sd);
  }
  if (c.use_gate) w.g_proj_weight = init::normal<T>(g, V, d, sd);
  w.o_norm_weight = Matrix<T>::Ones(1, c.head_v_dim());
  w.o_proj_weight = init::normal<T>(g, d, V, sd);
  return w;
}

/// One forward pass's activations, named as the fla layer's forward names them, plus the parameters
/// the decomposition reads. q, k, v are the projections before the short convolutions (v is the
/// decomposition's inner input); beta and g after their formulas; gate is g_proj(u), which the layer
/// passes to o_norm.
template <Scalar T>
struct deltanet_activations {
  Matrix<T> q;                ///< (L, H*dk)    q_proj(u)
  Matrix<T> k;                ///< (L, H*dk)    k_proj(u)
  Matrix<T> v;                ///< (L, HV*dv)   v_proj(u): the inner input x
  Matrix<T> beta;             ///< (L, HV)      sigmoid(b_proj(u)) (x 2 with allow_neg_eigval), or ones
  Matrix<T> g;                ///< (L, HV)      log-decay <= 0 (GatedDeltaNet), empty (DeltaNet)
  Matrix<T> gate;             ///< (L, HV*dv)   g_proj(u) before SiLU, or empty (no output gate)
  Matrix<T> q_conv1d_weight, k_conv1d_weight, v_conv1d_weight;  ///< (width, K) each, or all empty (no short conv)
  Matrix<T> o_norm_weight;    ///< (1, dv)
  Matrix<T> o_proj_weight;    ///< (hidden, HV*dv) or empty
  Index num_heads = 2, num_v_heads = 2;
  double norm_eps = 1e-5;

  Index length() const { return v.rows(); }
  Index head_k_dim() const { return q.cols() / num_heads; }
  Index head_v_dim() const { return v.cols() / num_v_heads; }

  void check() const {
    using std::to_string;
    const char* m = "deltanet_activations";
    if (num_heads < 1 || num_v_heads < 1 || num_v_heads % num_heads != 0)
      detail::fail(m, "num_heads " + to_string(num_heads) + " must be >= 1 and divide num_v_heads = " + to_string(num_v_heads));
    const Index L = length(), K = q.cols(), V = v.cols(), HV = num_v_heads;
    detail::require_shape(K >= 1 && K % num_heads == 0 && q.rows() == L, m, "q", q.rows(), q.cols(),
                          "(L=" + to_string(L) + ", H*dk) with H=" + to_string(num_heads));
    detail::require_shape(V >= 1 && V % HV == 0, m, "v", v.rows(), v.cols(), "(L, HV*dv) with HV=" + to_string(HV));
    const std::string Ls = "(L=" + to_string(L);
    check_field(m, "k", k, L, K, Ls + ", H*dk=" + to_string(K) + ")");
    check_field(m, "beta", beta, L, HV, Ls + ", HV=" + to_string(HV) + ")");
    if (g.size() != 0) check_field(m, "g", g, L, HV, Ls + ", HV=" + to_string(HV) + ") or empty");
    if (gate.size() != 0) check_field(m, "gate", gate, L, V, Ls + ", HV*dv=" + to_string(V) + ") or empty");
    if (v_conv1d_weight.size() != 0) {
      const Index Kc = v_conv1d_weight.cols();
      check_field(m, "q_conv1d_weight", q_conv1d_weight, K, Kc, "(H*dk=" + to_string(K) + ", K=" + to_string(Kc) + ")");
      check_field(m, "k_conv1d_weight", k_conv1d_weight, K, Kc, "(H*dk=" + to_string(K) + ", K=" + to_string(Kc) + ")");
      check_field(m, "v_conv1d_weight", v_conv1d_weight, V, Kc, "(HV*dv=" + to_string(V) + ", K)");
    } else if (q_conv1d_weight.size() != 0 || k_conv1d_weight.size() != 0) {
      detail::fail(m, "q_conv1d_weight and k_conv1d_weight are given but v_conv1d_weight is empty: give all three or none");
    }
    check_field(m, "o_norm_weight", o_norm_weight, 1, head_v_dim(), "(1, head_v_dim=" + to_string(head_v_dim()) + ")");
    if (o_proj_weight.size() != 0)
      detail::require_shape(o_proj_weight.cols() == V, m, "o_proj_weight", o_proj_weight.rows(), o_proj_weight.cols(),
                            "(hidden, HV*dv=" + to_string(V) + ") or empty");
  }

  /// The recurrence's q (normalised, scaled) and k (normalised) per value head, (L, HV*dk), and its
  /// values SiLU(conv(v)) (L, HV*dv).
  void qkv(Matrix<T>& qo, Matrix<T>& ko, Matrix<T>& vo) const {
    auto branch = [&](const Matrix<T>& x, const Matrix<T>& w) {
      return nn::map<T>(w.size() ? nn::causal_conv1d<T>(x, w) : x, [](T a) { return nn::silu(a); });
    };
    const Index r = num_v_heads / num_heads;
    qo = nn::repeat_heads<T>(Matrix<T>(nn::l2norm_groups<T>(branch(q, q_conv1d_weight), num_heads) / std::sqrt(T(head_k_dim()))),
                             num_heads, r);
    ko = nn::repeat_heads<T>(nn::l2norm_groups<T>(branch(k, k_conv1d_weight), num_heads), num_heads, r);
    vo = branch(v, v_conv1d_weight);
  }
};

/// The activations of one forward pass on u (L, hidden), o_proj included.
template <Scalar T>
deltanet_activations<T> activations(const deltanet_weights<T>& w, const Matrix<T>& u) {
  w.check();
  const auto& c = w.config;
  detail::require_shape(u.cols() == c.hidden_size, c.gated ? "gated_deltanet" : "deltanet", "u", u.rows(), u.cols(),
                        "(L, hidden_size=" + std::to_string(c.hidden_size) + ")");
  const Index L = u.rows(), HV = c.value_heads();
  deltanet_activations<T> s;
  s.q = nn::linear<T>(u, w.q_proj_weight);
  s.k = nn::linear<T>(u, w.k_proj_weight);
  s.v = nn::linear<T>(u, w.v_proj_weight);
  if (c.use_beta) {
    s.beta = nn::map<T>(nn::linear<T>(u, w.b_proj_weight), [](T b) { return nn::sigmoid(b); });
    if (c.allow_neg_eigval) s.beta *= T(2);
  } else {
    s.beta = Matrix<T>::Constant(L, HV, c.allow_neg_eigval ? T(2) : T(1));
  }
  if (c.gated) {
    const Matrix<T> a = nn::linear<T>(u, w.a_proj_weight);
    s.g.resize(L, HV);
    for (Index t = 0; t < L; ++t)
      for (Index h = 0; h < HV; ++h) s.g(t, h) = -std::exp(w.A_log(0, h)) * nn::softplus(a(t, h) + w.dt_bias(0, h));
  }
  if (c.use_gate) s.gate = nn::linear<T>(u, w.g_proj_weight);
  s.q_conv1d_weight = w.q_conv1d_weight;
  s.k_conv1d_weight = w.k_conv1d_weight;
  s.v_conv1d_weight = w.v_conv1d_weight;
  s.o_norm_weight = w.o_norm_weight;
  s.o_proj_weight = w.o_proj_weight;
  s.num_heads = c.num_heads;
  s.num_v_heads = HV;
  s.norm_eps = c.norm_eps;
  return s;
}

/// The layer's plain recurrent forward (the oracle). final_state, when given, receives the state
/// after the last token (HV*dk, dv) in the (key, value) orientation: fla's recurrent state
/// (HV, dk, dv) flattened (GatedDeltaNet's cache with state_v_first holds its transpose).
template <Scalar T>
Matrix<T> deltanet_forward(const deltanet_weights<T>& w, const Matrix<T>& u, Matrix<T>* final_state = nullptr) {
  const auto s = activations(w, u);
  Matrix<T> q, k, v;
  s.qkv(q, k, v);
  Matrix<T> o = nn::delta_rule_scan<T>(q, k, v, s.beta, s.g, s.num_v_heads, final_state);
  nn::group_norm_rows<T>(o, s.num_v_heads, s.norm_eps, false, Matrix<T>(s.o_norm_weight.replicate(1, s.num_v_heads)));
  if (s.gate.size() != 0) o.array() *= nn::map<T>(s.gate, [](T x) { return nn::silu(x); }).array();
  return nn::linear<T>(o, w.o_proj_weight);
}

/// The head's transition T (no convolution, norm or gate): the gated delta rule when g is given,
/// the plain delta rule otherwise, over the HV value heads with the normalised, scaled q and k.
template <Scalar T>
Transition<T> deltanet_transition(const deltanet_activations<T>& s) {
  s.check();
  Matrix<T> q, k, v;
  s.qkv(q, k, v);
  const transition_options o{.heads = s.num_v_heads, .head_dim = s.head_v_dim(), .state = s.head_k_dim()};
  if (s.g.size() != 0) return gated_delta_rule(std::move(q), std::move(k), s.beta, s.g, o);
  return delta_rule(std::move(q), std::move(k), s.beta, o);
}

/// The exact decomposition from activations (see the header comment); with o_proj_weight empty,
/// output() is the normed (and gated) inner output.
template <Scalar T>
auto attention(const deltanet_activations<T>& s) {
  s.check();
  return delta_detail::decomposition_of<T>(deltanet_transition(s), s.v, delta_detail::value_taps(s.v_conv1d_weight, s.v.cols()),
                                           delta_detail::silu_of(s.gate), s.o_norm_weight, s.num_v_heads, s.norm_eps, s.o_proj_weight);
}

/// The exact decomposition: deltanet_forward(w, u) == d.output(), x = v_proj(u).
template <Scalar T>
auto decompose(const deltanet_weights<T>& w, const Matrix<T>& u) { return attention(activations(w, u)); }

/// The exact decomposition (the named form of decompose).
template <Scalar T>
auto deltanet_decompose(const deltanet_weights<T>& w, const Matrix<T>& u) { return decompose(w, u); }

/// The recurrent state after the last token, (HV*dk, dv), from the backward running product.
template <Scalar T>
Matrix<T> final_state(const deltanet_activations<T>& s) {
  s.check();
  Matrix<T> q, k, v;
  s.qkv(q, k, v);
  return delta_final_state<T>(k, v, s.beta, s.g, s.num_v_heads);
}

}  // namespace iattn::models
