// iattn/models/deltaproduct.hpp: flash-linear-attention's `GatedDeltaProduct` layer (Siems et al.
// 2025, n Householder steps per token) as implicit attention.
//
// Forward, H key heads of dk, HV value heads of dv (value head h reads key head h / (HV/H)), n steps:
//   q = SiLU(q_conv1d(q_proj(u))) (L, H dk);  k = SiLU(k_conv1d(k_proj(u))) (L, n H dk);
//   v = SiLU(v_conv1d(v_proj(u))) (L, n HV dv);  beta = sigmoid(b_proj(u)) (L, n HV) (x 2 with allow_neg_eigval)
//     step j of token t uses k_proj rows j*H*dk + .., v_proj rows j*HV*dv + .., b_proj row j*HV + h
//   g = -exp(A_log) softplus(a_proj(u) + dt_bias) (L, HV)  (use_forget_gate)
//   q = l2norm(q) / sqrt(dk), k = l2norm(k) per head and step
//   per token: S = exp(g_t) S;  for j = 0..n-1: S = S + beta_j k_j (v_j - S^T k_j)^T;  o_t = S^T q_t
//   out = o_proj(RMSNorm_head(o) o_norm_weight [* SiLU(g_proj(u))])
// So S_t = A_t S_{t-1} + sum_j W_{t,j} beta_j k_j v_j^T with A_t = exp(g_t) H_{n-1} ... H_0,
// H_j = I - beta_j k_j k_j^T, and W_{t,j} = H_{n-1} ... H_{j+1} (the steps after j in the same token).
//
// Exact decomposition over n*HV*dv inner channels (one block of HV*dv per step j), inner input
// x = v_proj(u) before its convolution (L, n HV dv): channel (j, c) has the matrix
//   T_j[t, s] = q_t^T A_t ... A_{s+1} W_{s,j} beta_{s,j} k_{s,j}
// so H = diag(G) N T diag(sigmoid p) M with T one Transition over n*HV heads (head (j, h): the
// query q_h, the rank-n transition A_t of head h written as Diag(e^g) + sum_i b_i a_i^T, the write
// W_{s,j} beta_{s,j} k_{s,j}), N the per-head RMS norm bound to the statistics of the summed output
// o = sum_j (T_j ...)(x_j) and repeated over the n blocks (a bound norm is diagonal, so it commutes
// with the sum), G the gate repeated likewise, and the output projection [o_proj ... o_proj]
// (hidden, n HV dv), which sums the n blocks. beta = 0.
#pragma once

#include "../iattn.hpp"
#include "common.hpp"
#include "delta_rule.hpp"

#include <cstdint>
#include <string>

namespace iattn::models {

struct deltaproduct_config {
  Index hidden_size = 32;
  Index head_dim = 8;            ///< dk
  double expand_v = 1;           ///< dv = head_dim * expand_v
  Index num_heads = 2;           ///< H
  Index num_v_heads = 0;         ///< HV; 0 means num_heads
  Index num_householder = 2;     ///< n
  Index conv_size = 4;
  bool use_output_gate = true;
  bool use_short_conv = true;
  bool use_forget_gate = true;
  bool allow_neg_eigval = true;  ///< the layer's default (the model config's is false: pass it)
  double norm_eps = 1e-5;
  double initializer_range = 0.02;
  Index head_v_dim() const { return Index(double(head_dim) * expand_v); }
  Index value_heads() const { return num_v_heads ? num_v_heads : num_heads; }
  Index key_dim() const { return num_heads * head_dim; }
  Index value_dim() const { return value_heads() * head_v_dim(); }
};

/// `GatedDeltaProduct` parameters, state_dict names with '.' written '_'; unused fields empty.
template <Scalar T>
struct deltaproduct_weights {
  deltaproduct_config config;
  Matrix<T> q_proj_weight;     ///< (key_dim, hidden)
  Matrix<T> k_proj_weight;     ///< (n*key_dim, hidden)
  Matrix<T> v_proj_weight;     ///< (n*value_dim, hidden)
  Matrix<T> b_proj_weight;     ///< (n*HV, hidden)
  Matrix<T> a_proj_weight;     ///< (HV, hidden)       use_forget_gate
  Matrix<T> A_log, dt_bias;    ///< (1, HV) each       use_forget_gate
  Matrix<T> q_conv1d_weight;   ///< (key_dim, K)       use_short_conv
  Matrix<T> k_conv1d_weight;   ///< (n*key_dim, K)
  Matrix<T> v_conv1d_weight;   ///< (n*value_dim, K)
  Matrix<T> g_proj_weight;     ///< (value_dim, hidden) use_output_gate
  Matrix<T> o_norm_weight;     ///< (1, dv)
  Matrix<T> o_proj_weight;     ///< (hidden, value_dim)

  void check() const {
    const auto& c = config;
    using std::to_string;
    const char* m = "deltaproduct";
    const Index H = c.num_heads, HV = c.value_heads(), dv = c.head_v_dim(), n = c.num_householder;
    if (H < 1 || c.head_dim < 1 || dv < 1 || HV % H != 0 || n < 1)
      detail::fail(m, "num_heads " + to_string(H) + ", num_v_heads " + to_string(HV) + ", head_dim " + to_string(c.head_dim) +
                          ", head_v_dim " + to_string(dv) + ", num_householder " + to_string(n) +
                          ": all >= 1, num_heads dividing num_v_heads");
    const Index K = c.key_dim(), V = c.value_dim(), d = c.hidden_size, Kc = c.conv_size;
    auto need = [&](const char* f, const Matrix<T>& w, bool used, Index r, Index cc) {
      if (used) check_field(m, f, w, r, cc, "(" + to_string(r) + ", " + to_string(cc) + ")");
      else if (w.size() != 0) detail::fail(m, std::string(f) + " is given but this configuration does not use it (expected empty)");
    };
    need("q_proj_weight", q_proj_weight, true, K, d);
    need("k_proj_weight", k_proj_weight, true, n * K, d);
    need("v_proj_weight", v_proj_weight, true, n * V, d);
    need("b_proj_weight", b_proj_weight, true, n * HV, d);
    need("a_proj_weight", a_proj_weight, c.use_forget_gate, HV, d);
    need("A_log", A_log, c.use_forget_gate, 1, HV);
    need("dt_bias", dt_bias, c.use_forget_gate, 1, HV);
    need("q_conv1d_weight", q_conv1d_weight, c.use_short_conv, K, Kc);
    need("k_conv1d_weight", k_conv1d_weight, c.use_short_conv, n * K, Kc);
    need("v_conv1d_weight", v_conv1d_weight, c.use_short_conv, n * V, Kc);
    need("g_proj_weight", g_proj_weight, c.use_output_gate, V, d);
    need("o_norm_weight", o_norm_weight, true, 1, dv);
    need("o_proj_weight", o_proj_weight, true, d, V);
  }
};

/// fla's initialisation, as for GatedDeltaNet (deltanet_init): N(0, initializer_range) weights,
/// A_log = log U(0, 16), dt_bias the inverse softplus of dt in [1e-3, 1e-1], norm weight 1.
template <Scalar T>
deltaproduct_weights<T> deltaproduct_init(const deltaproduct_config& c, std::uint64_t seed = 0) {
  init::generator g(seed);
  deltaproduct_weights<T> w;
  w.config = c;
  const Index d = c.hidden_size, HV = c.value_heads(), K = c.key_dim(), V = c.value_dim(), n = c.num_householder;
  const double sd = c.initializer_range;
  w.q_proj_weight = init::normal<T>(g, K, d, sd);
  w.k_proj_weight = init::normal<T>(g, n * K, d, sd);
  w.v_proj_weight = init::normal<T>(g, n * V, d, sd);
  w.b_proj_weight = init::normal<T>(g, n * HV, d, sd);
  if (c.use_forget_gate) {
    w.a_proj_weight = init::normal<T>(g, HV, d, sd);
    w.A_log = init::uniform<T>(g, 1, HV, 1e-6, 16.0).array().log().matrix();
    w.dt_bias.resize(1, HV);
    const Matrix<T> u01 = init::uniform<T>(g, 1, HV, 0.0, 1.0);
    for (Index h = 0; h < HV; ++h) {
      const double dt = std::max(1e-4, std::exp(double(u01(0, h)) * (std::log(0.1) - std::log(0.001)) + std::log(0.001)));
      w.dt_bias(0, h) = T(nn::inverse_softplus(dt));
    }
  }
  if (c.use_short_conv) {
    w.q_conv1d_weight = init::normal<T>(g, K, c.conv_size, sd);
    w.k_conv1d_weight = init::normal<T>(g, n * K, c.conv_size, sd);
    w.v_conv1d_weight = init::normal<T>(g, n * V, c.conv_size, sd);
  }
  if (c.use_output_gate) w.g_proj_weight = init::normal<T>(g, V, d, sd);
  w.o_norm_weight = Matrix<T>::Ones(1, c.head_v_dim());
  w.o_proj_weight = init::normal<T>(g, d, V, sd);
  return w;
}

/// One forward pass's activations, named as the fla layer names them: q, k, v the projections
/// before their convolutions (v is the decomposition's inner input), beta after sigmoid (step-major
/// columns j*HV + h), g the log-decay or empty, gate = g_proj(u) or empty.
template <Scalar T>
struct deltaproduct_activations {
  Matrix<T> q;               ///< (L, H*dk)
  Matrix<T> k;               ///< (L, n*H*dk)
  Matrix<T> v;               ///< (L, n*HV*dv)
  Matrix<T> beta;            ///< (L, n*HV)
  Matrix<T> g;               ///< (L, HV) or empty
  Matrix<T> gate;            ///< (L, HV*dv) before SiLU, or empty
  Matrix<T> q_conv1d_weight, k_conv1d_weight, v_conv1d_weight;  ///< all three or none
  Matrix<T> o_norm_weight;   ///< (1, dv)
  Matrix<T> o_proj_weight;   ///< (hidden, HV*dv) or empty
  Index num_heads = 2, num_v_heads = 2, num_householder = 2;
  double norm_eps = 1e-5;

  Index length() const { return q.rows(); }
  Index head_k_dim() const { return q.cols() / num_heads; }
  Index value_dim() const { return v.cols() / num_householder; }
  Index head_v_dim() const { return value_dim() / num_v_heads; }

  void check() const {
    using std::to_string;
    const char* m = "deltaproduct_activations";
    const Index n = num_householder, H = num_heads, HV = num_v_heads;
    if (n < 1 || H < 1 || HV < 1 || HV % H != 0) detail::fail(m, "num_householder, num_heads >= 1 and num_heads dividing num_v_heads");
    const Index L = length(), K = q.cols();
    detail::require_shape(K >= 1 && K % H == 0, m, "q", q.rows(), q.cols(), "(L, H*dk) with H=" + to_string(H));
    detail::require_shape(v.rows() == L && v.cols() >= 1 && v.cols() % (n * HV) == 0, m, "v", v.rows(), v.cols(),
                          "(L=" + to_string(L) + ", n*HV*dv) with n*HV=" + to_string(n * HV));
    const std::string Ls = "(L=" + to_string(L) + ", ";
    check_field(m, "k", k, L, n * K, Ls + "n*H*dk=" + to_string(n * K) + ")");
    check_field(m, "beta", beta, L, n * HV, Ls + "n*HV=" + to_string(n * HV) + ")");
    if (g.size()) check_field(m, "g", g, L, HV, Ls + "HV=" + to_string(HV) + ") or empty");
    if (gate.size()) check_field(m, "gate", gate, L, value_dim(), Ls + "HV*dv=" + to_string(value_dim()) + ") or empty");
    if (v_conv1d_weight.size()) {
      const Index Kc = v_conv1d_weight.cols();
      check_field(m, "q_conv1d_weight", q_conv1d_weight, K, Kc, "(H*dk=" + to_string(K) + ", K=" + to_string(Kc) + ")");
      check_field(m, "k_conv1d_weight", k_conv1d_weight, n * K, Kc, "(n*H*dk=" + to_string(n * K) + ", K=" + to_string(Kc) + ")");
      check_field(m, "v_conv1d_weight", v_conv1d_weight, v.cols(), Kc, "(n*HV*dv=" + to_string(v.cols()) + ", K)");
    }
    check_field(m, "o_norm_weight", o_norm_weight, 1, head_v_dim(), "(1, dv=" + to_string(head_v_dim()) + ")");
    if (o_proj_weight.size())
      detail::require_shape(o_proj_weight.cols() == value_dim(), m, "o_proj_weight", o_proj_weight.rows(), o_proj_weight.cols(),
                            "(hidden, HV*dv=" + to_string(value_dim()) + ") or empty");
  }

  /// The recurrence's inputs per value head: q (normalised, scaled) (L, HV*dk); k_j (normalised)
  /// (L, n*HV*dk), step-major; values SiLU(conv(v)) (L, n*HV*dv).
  void qkv(Matrix<T>& qo, Matrix<T>& ko, Matrix<T>& vo) const {
    auto branch = [&](const Matrix<T>& x, const Matrix<T>& w) {
      return nn::map<T>(w.size() ? nn::causal_conv1d<T>(x, w) : x, [](T a) { return nn::silu(a); });
    };
    const Index n = num_householder, H = num_heads, r = num_v_heads / num_heads, dk = head_k_dim(), K = q.cols();
    qo = nn::repeat_heads<T>(Matrix<T>(nn::l2norm_groups<T>(branch(q, q_conv1d_weight), H) / std::sqrt(T(dk))), H, r);
    const Matrix<T> kall = nn::l2norm_groups<T>(branch(k, k_conv1d_weight), n * H);
    ko.resize(length(), n * num_v_heads * dk);
    for (Index j = 0; j < n; ++j)
      ko.middleCols(j * num_v_heads * dk, num_v_heads * dk) = nn::repeat_heads<T>(Matrix<T>(kall.middleCols(j * K, K)), H, r);
    vo = branch(v, v_conv1d_weight);
  }
};

/// The activations of one forward pass on u (L, hidden), o_proj included.
template <Scalar T>
deltaproduct_activations<T> activations(const deltaproduct_weights<T>& w, const Matrix<T>& u) {
  w.check();
  const auto& c = w.config;
  detail::require_shape(u.cols() == c.hidden_size, "deltaproduct", "u", u.rows(), u.cols(),
                        "(L, hidden_size=" + std::to_string(c.hidden_size) + ")");
  const Index L = u.rows(), HV = c.value_heads();
  deltaproduct_activations<T> s;
  s.q = nn::linear<T>(u, w.q_proj_weight);
  s.k = nn::linear<T>(u, w.k_proj_weight);
  s.v = nn::linear<T>(u, w.v_proj_weight);
  s.beta = nn::map<T>(nn::linear<T>(u, w.b_proj_weight), [](T b) { return nn::sigmoid(b); });
  if (c.allow_neg_eigval) s.beta *= T(2);
  if (c.use_forget_gate) {
    const Matrix<T> a = nn::linear<T>(u, w.a_proj_weight);
    s.g.resize(L, HV);
    for (Index t = 0; t < L; ++t)
      for (Index h = 0; h < HV; ++h) s.g(t, h) = -std::exp(w.A_log(0, h)) * nn::softplus(a(t, h) + w.dt_bias(0, h));
  }
  if (c.use_output_gate) s.gate = nn::linear<T>(u, w.g_proj_weight);
  s.q_conv1d_weight = w.q_conv1d_weight;
  s.k_conv1d_weight = w.k_conv1d_weight;
  s.v_conv1d_weight = w.v_conv1d_weight;
  s.o_norm_weight = w.o_norm_weight;
  s.o_proj_weight = w.o_proj_weight;
  s.num_heads = c.num_heads;
  s.num_v_heads = HV;
  s.num_householder = c.num_householder;
  s.norm_eps = c.norm_eps;
  return s;
}

namespace nn {
/// The Householder-product recurrence of the header comment in plain loops (the oracle): q (L, HV*dk),
/// k (L, n*HV*dk) and v (L, n*HV*dv) step-major, beta (L, n*HV), g (L, HV) or empty. final_state,
/// when given, receives S after the last token, (HV*dk, dv).
template <class T>
Matrix<T> delta_product_scan(const Matrix<T>& q, const Matrix<T>& k, const Matrix<T>& v, const Matrix<T>& beta, const Matrix<T>& g,
                             Index heads, Index n, Matrix<T>* final_state = nullptr) {
  const Index L = q.rows(), dk = q.cols() / heads, dv = v.cols() / (n * heads), Kw = heads * dk, Vw = heads * dv;
  Matrix<T> o(L, Vw);
  if (final_state) final_state->resize(heads * dk, dv);
  for (Index h = 0; h < heads; ++h) {
    Matrix<T> S = Matrix<T>::Zero(dk, dv);
    std::vector<T> delta(static_cast<std::size_t>(dv));
    for (Index t = 0; t < L; ++t) {
      if (g.size()) S *= std::exp(g(t, h));
      for (Index j = 0; j < n; ++j) {
        const T b = beta(t, j * heads + h);
        for (Index c = 0; c < dv; ++c) {
          T acc = 0;
          for (Index i = 0; i < dk; ++i) acc += S(i, c) * k(t, j * Kw + h * dk + i);
          delta[std::size_t(c)] = b * (v(t, j * Vw + h * dv + c) - acc);
        }
        for (Index i = 0; i < dk; ++i)
          for (Index c = 0; c < dv; ++c) S(i, c) += k(t, j * Kw + h * dk + i) * delta[std::size_t(c)];
      }
      for (Index c = 0; c < dv; ++c) {
        T acc = 0;
        for (Index i = 0; i < dk; ++i) acc += S(i, c) * q(t, h * dk + i);
        o(t, h * dv + c) = acc;
      }
    }
    if (final_state) final_state->middleRows(h * dk, dk) = S;
  }
  return o;
}
}  // namespace nn

/// The layer's plain recurrent forward (the oracle); final_state: (HV*dk, dv), fla's (HV, dk, dv) flattened.
template <Scalar T>
Matrix<T> deltaproduct_forward(const deltaproduct_weights<T>& w, const Matrix<T>& u, Matrix<T>* final_state = nullptr) {
  const auto s = activations(w, u);
  Matrix<T> q, k, v;
  s.qkv(q, k, v);
  Matrix<T> o = nn::delta_product_scan<T>(q, k, v, s.beta, s.g, s.num_v_heads, s.num_householder, final_state);
  nn::group_norm_rows<T>(o, s.num_v_heads, s.norm_eps, false, Matrix<T>(s.o_norm_weight.replicate(1, s.num_v_heads)));
  if (s.gate.size()) o.array() *= nn::map<T>(s.gate, [](T x) { return nn::silu(x); }).array();
  return nn::linear<T>(o, w.o_proj_weight);
}

/// The transition over the n*HV heads (j, h) of the header comment: one Transition whose heads share
/// q and the rank-n transition of their value head h and differ in the write W_{s,j} beta_{s,j} k_{s,j}.
template <Scalar T>
Transition<T> deltaproduct_transition(const deltaproduct_activations<T>& s) {
  s.check();
  Matrix<T> q, k, v;
  s.qkv(q, k, v);
  const Index L = s.length(), n = s.num_householder, HV = s.num_v_heads, dk = s.head_k_dim(), NH = n * HV;
  Matrix<T> Q(L, NH * dk), Kw(L, NH * dk), lam(L, NH), A(L, NH * n * dk), B(L, NH * n * dk);
  Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic> W(dk, n), kk(dk, n);  // WY vectors w_i, keys k_i of one head
  Eigen::Matrix<T, Eigen::Dynamic, 1> x(dk);
  for (Index t = 0; t < L; ++t)
    for (Index h = 0; h < HV; ++h) {
      const T b0 = s.g.size() ? std::exp(s.g(t, h)) : T(1);
      for (Index j = 0; j < n; ++j)
        for (Index i = 0; i < dk; ++i) kk(i, j) = k(t, (j * HV + h) * dk + i);
      // H_{n-1} ... H_0 = I + sum_i w_i k_i^T: w_j = -beta_j k_j, earlier w_i <- w_i - beta_j (k_j . w_i) k_j
      for (Index j = 0; j < n; ++j) {
        const T bj = s.beta(t, j * HV + h);
        for (Index i = 0; i < j; ++i) W.col(i) -= bj * kk.col(j).dot(W.col(i)) * kk.col(j);
        W.col(j) = -bj * kk.col(j);
      }
      for (Index j = 0; j < n; ++j) {
        const Index head = j * HV + h;
        lam(t, head) = s.g.size() ? s.g(t, h) : T(0);
        for (Index i = 0; i < dk; ++i) Q(t, head * dk + i) = q(t, h * dk + i);
        for (Index r = 0; r < n; ++r)
          for (Index i = 0; i < dk; ++i) {
            A(t, (head * n + r) * dk + i) = kk(i, r);
            B(t, (head * n + r) * dk + i) = b0 * W(i, r);
          }
        // the write of step j: H_{n-1} ... H_{j+1} beta_j k_j
        x = s.beta(t, j * HV + h) * kk.col(j);
        for (Index i = j + 1; i < n; ++i) x -= s.beta(t, i * HV + h) * kk.col(i).dot(x) * kk.col(i);
        for (Index i = 0; i < dk; ++i) Kw(t, head * dk + i) = x(i);
      }
    }
  return transition(std::move(lam), std::move(A), std::move(B), std::move(Q), std::move(Kw),
                    transition_options{.heads = NH, .head_dim = s.head_v_dim(), .state = dk, .rank = n});
}

/// The exact decomposition from activations (see the header comment): x = v (L, n*HV*dv), the output
/// projection [o_proj ... o_proj]; with o_proj_weight empty, output() is (L, n*HV*dv), whose n blocks
/// sum to the normed, gated inner output.
template <Scalar T>
auto attention(const deltaproduct_activations<T>& s) {
  s.check();
  const Index L = s.length(), n = s.num_householder, HV = s.num_v_heads, V = s.value_dim(), NV = n * V;
  const Matrix<T> taps = delta_detail::value_taps(s.v_conv1d_weight, NV);
  const Matrix<T> p = nn::causal_conv1d<T>(s.v, Matrix<T>(taps.transpose()));
  auto body = deltaproduct_transition(s) * diagonal(nn::map<T>(p, [](T v) { return nn::sigmoid(v); })) * causal_conv(taps);
  const Matrix<T> blocks = apply(body, s.v);
  Matrix<T> o = Matrix<T>::Zero(L, V);
  for (Index j = 0; j < n; ++j) o += blocks.middleCols(j * V, V);  // the norm's actual input
  const auto base = group_norm<T>(HV, {.eps = s.norm_eps});
  const auto st = base.compute(o.data(), L, V);
  typename GroupNorm<T>::statistics rep;
  rep.channels = NV;
  rep.inv_sigma = st.inv_sigma.replicate(1, n);
  rep.mean = st.mean.replicate(1, n);
  auto norm = group_norm(n * HV, Matrix<T>(s.o_norm_weight.replicate(1, n * HV)), {.eps = s.norm_eps}).bound_to(std::move(rep));
  Matrix<T> gv = s.gate.size() ? Matrix<T>(nn::map<T>(s.gate, [](T v) { return nn::silu(v); }).replicate(1, n))
                               : Matrix<T>(Matrix<T>::Ones(1, NV));
  auto H = diagonal(std::move(gv)) * std::move(norm) * std::move(body);
  Matrix<T> out = s.o_proj_weight.size() ? Matrix<T>(s.o_proj_weight.replicate(1, n)) : Matrix<T>();
  return make_decomposition<T>(s.v, std::move(H), Matrix<T>(Matrix<T>::Zero(L, NV)), std::move(out));
}

/// The exact decomposition: deltaproduct_forward(w, u) == d.output(), x = v_proj(u).
template <Scalar T>
auto decompose(const deltaproduct_weights<T>& w, const Matrix<T>& u) { return attention(activations(w, u)); }

/// The exact decomposition (the named form of decompose).
template <Scalar T>
auto deltaproduct_decompose(const deltaproduct_weights<T>& w, const Matrix<T>& u) { return decompose(w, u); }

/// The recurrent state after the last token (HV*dk, dv), fla's (HV, dk, dv) flattened: the n step
/// blocks' states of the decomposition's own transition (transition_final_state, backwards, not the
/// forward scan), added up.
template <Scalar T>
Matrix<T> final_state(const deltaproduct_activations<T>& s) {
  Matrix<T> q, k, v;
  s.qkv(q, k, v);
  const Matrix<T> blocks = transition_final_state(deltaproduct_transition(s), v);  // (n*HV*dk, dv)
  const Index rows = s.num_v_heads * s.head_k_dim();
  Matrix<T> S = Matrix<T>::Zero(rows, s.head_v_dim());
  for (Index j = 0; j < s.num_householder; ++j) S += blocks.middleRows(j * rows, rows);
  return S;
}

}  // namespace iattn::models
