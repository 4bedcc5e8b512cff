// iattn/models/mamba2.hpp: the Mamba-2 block (mamba_ssm `Mamba2`, rmsnorm=True,
// norm_before_gate=False, D per head) as implicit attention.
//
// Forward:
//   [z, xBC, dt_in] = in_proj(u);  xBC = SiLU(conv1d(xBC) + conv1d_bias) = [a, B, C]
//   dt = softplus(dt_in + dt_bias) (L, H);  A = -exp(A_log) (H)
//   per head h (channels h*P .. h*P+P-1, B/C group g = h / (H/G)):
//     h_t = exp(dt_t A) h_{t-1} + dt_t a_t B_t^T;   y_t = h_t C_t + D a_t
//   y = RMSNorm_grouped(y * SiLU(z)) * norm_weight (G groups of d_inner/G, eps 1e-5);  out = out_proj(y)
//
// Exact decomposition over d_inner channels, inner input x = xBC's first d_inner columns (pre-conv):
//   H    = N diag(SiLU z) (S(dt A, B, C; heads, groups) diag(dt) + diag(D)) diag(sigmoid p) M
//   beta = N diag(SiLU z) (S diag(dt) + diag(D)) (sigmoid(p) * conv1d_bias)
// with N the GroupNorm bound to the statistics of its actual input (the sum of both terms), so the
// norm is exactly diagonal. B and C come from the conv+SiLU branch and are frozen like dt and z.
// paper_attention gives Zimerman et al.'s eq. 11: D skip and bias term dropped, N bound as above.
//
// From activations (docs/models.md): mamba2_activations holds x, z, dt, A, B, C, D, the x part of
// the conv, the norm and (optionally) out_proj; attention(acts) is the decomposition,
// mamba2_paper_attention(acts) eq. 11, final_state(acts) the ssm_state (nheads*headdim, d_state).
#pragma once

#include "../iattn.hpp"
#include "common.hpp"
#include "recurrent_state.hpp"

#include <cstdint>
#include <string>

namespace iattn::models {

struct mamba2_config {
  Index d_model = 64;
  Index d_state = 64;   ///< N
  Index d_conv = 4;     ///< K
  Index expand = 2;     ///< d_inner = expand * d_model
  Index headdim = 32;   ///< P
  Index ngroups = 1;    ///< G
  double eps = 1e-5;    ///< RMSNormGated eps
  double dt_min = 0;    ///< dt = max(softplus(dt_in + dt_bias), dt_min): transformers' time_step_limit lower
                        ///< bound (NemotronH and Zamba2 clamp at time_step_min); 0 (the default) clamps nothing
  Index d_inner() const { return expand * d_model; }
  Index nheads() const { return d_inner() / headdim; }
  Index conv_dim() const { return d_inner() + 2 * ngroups * d_state; }
  Index d_in_proj() const { return 2 * d_inner() + 2 * ngroups * d_state + nheads(); }
};

/// mamba_ssm `Mamba2` parameters; names follow its state_dict with '.' written '_'.
template <Scalar T>
struct mamba2_weights {
  mamba2_config config;
  Matrix<T> in_proj_weight;   ///< (2*d_inner + 2*G*N + H, d_model)  in_proj.weight
  Matrix<T> conv1d_weight;    ///< (conv_dim, d_conv)   conv1d.weight, PyTorch (conv_dim, 1, d_conv)
  Matrix<T> conv1d_bias;      ///< (1, conv_dim)        conv1d.bias
  Matrix<T> dt_bias;          ///< (1, H)               dt_bias
  Matrix<T> A_log;            ///< (1, H)               A_log
  Matrix<T> D;                ///< (1, H)               D
  Matrix<T> norm_weight;      ///< (1, d_inner)         norm.weight
  Matrix<T> out_proj_weight;  ///< (d_model, d_inner)   out_proj.weight

  void check() const {
    const auto& c = config;
    using std::to_string;
    const char* m = "mamba2";
    if (!(c.dt_min >= 0 && std::isfinite(c.dt_min)))
      detail::fail(m, "config.dt_min is " + std::to_string(c.dt_min) + " but must be finite and >= 0 (a lower clamp of dt)");
    if (c.headdim < 1 || c.d_inner() % c.headdim != 0)
      detail::fail(m, "headdim " + to_string(c.headdim) + " must divide d_inner = " + to_string(c.d_inner()));
    if (c.ngroups < 1 || c.nheads() % c.ngroups != 0)
      detail::fail(m, "ngroups " + to_string(c.ngroups) + " must divide nheads = " + to_string(c.nheads()));
    const Index H = c.nheads(), di = c.d_inner(), cd = c.conv_dim();
    const std::string h1 = "(1, nheads=" + to_string(H) + ")";
    check_field(m, "in_proj_weight", in_proj_weight, c.d_in_proj(), c.d_model,
                "(2*d_inner+2*ngroups*d_state+nheads=" + to_string(c.d_in_proj()) + ", d_model=" + to_string(c.d_model) + ")");
    check_field(m, "conv1d_weight", conv1d_weight, cd, c.d_conv, "(conv_dim=" + to_string(cd) + ", d_conv=" + to_string(c.d_conv) + ")");
    check_field(m, "conv1d_bias", conv1d_bias, 1, cd, "(1, conv_dim=" + to_string(cd) + ")");
    check_field(m, "dt_bias", dt_bias, 1, H, h1);
    check_field(m, "A_log", A_log, 1, H, h1);
    check_field(m, "D", D, 1, H, h1);
    check_field(m, "norm_weight", norm_weight, 1, di, "(1, d_inner=" + to_string(di) + ")");
    check_field(m, "out_proj_weight", out_proj_weight, c.d_model, di, "(d_model=" + to_string(c.d_model) + ", d_inner=" + to_string(di) + ")");
  }
};

/// mamba_ssm's initialisation: A = U(1, 16) per head (A_log = log A), D = 1, dt_bias =
/// softplus^-1(dt) with dt log-uniform in [1e-3, 1e-1], norm weight 1, PyTorch defaults elsewhere.
template <Scalar T>
mamba2_weights<T> mamba2_init(const mamba2_config& c, std::uint64_t seed = 0) {
  init::generator g(seed);
  mamba2_weights<T> w;
  w.config = c;
  const Index H = c.nheads();
  w.in_proj_weight = init::torch_default<T>(g, c.d_in_proj(), c.d_model, c.d_model);
  w.conv1d_weight = init::torch_default<T>(g, c.conv_dim(), c.d_conv, c.d_conv);
  w.conv1d_bias = init::torch_default<T>(g, 1, c.conv_dim(), c.d_conv);
  const Matrix<double> u = init::uniform<double>(g, 1, H, std::log(1e-3), std::log(1e-1));
  w.dt_bias.resize(1, H);
  for (Index h = 0; h < H; ++h) w.dt_bias(0, h) = T(nn::inverse_softplus(std::max(std::exp(u(0, h)), 1e-4)));
  w.A_log = init::uniform<double>(g, 1, H, 1.0, 16.0).array().log().matrix().template cast<T>();
  w.D = Matrix<T>::Ones(1, H);
  w.norm_weight = Matrix<T>::Ones(1, c.d_inner());
  w.out_proj_weight = init::torch_default<T>(g, c.d_model, c.d_inner(), c.d_inner());
  return w;
}

/// One forward pass's activations, named as mamba_ssm's `Mamba2.forward` / `mamba_chunk_scan_combined`
/// name them; heads H = dt.cols(), headdim P = d_inner / H, d_state N = B.cols() / ngroups. Built by
/// `activations(w, u)` or by hand; `attention(acts)` needs nothing else.
template <Scalar T>
struct mamba2_activations {
  Matrix<T> x;                ///< (L, d_inner)        xBC's x part before conv1d: the inner input
  Matrix<T> z;                ///< (L, d_inner)        the gate, before SiLU
  Matrix<T> dt;               ///< (L, nheads)         softplus(dt + dt_bias), >= 0
  Matrix<T> A;                ///< (1, nheads)         -exp(A_log), <= 0
  Matrix<T> B;                ///< (L, ngroups*d_state) after conv1d and SiLU
  Matrix<T> C;                ///< (L, ngroups*d_state) after conv1d and SiLU
  Matrix<T> D;                ///< (1, nheads)
  Matrix<T> conv1d_weight;    ///< (d_inner, d_conv) x rows of conv1d.weight, or the whole (conv_dim, d_conv)
  Matrix<T> conv1d_bias;      ///< (1, d_inner) or the whole (1, conv_dim), or empty (no bias)
  Matrix<T> norm_weight;      ///< (1, d_inner)        norm.weight
  Matrix<T> out_proj_weight;  ///< (d_model, d_inner) or empty (the decomposition stops before out_proj)
  Index ngroups = 1;          ///< G: B/C groups and the gated RMSNorm's groups
  double eps = 1e-5;          ///< the RMSNorm's eps

  Index length() const { return x.rows(); }
  Index d_inner() const { return x.cols(); }
  Index nheads() const { return dt.cols(); }
  Index headdim() const { return nheads() > 0 ? d_inner() / nheads() : 0; }
  Index d_state() const { return ngroups > 0 ? B.cols() / ngroups : 0; }

  /// Throws std::invalid_argument naming the first field whose shape disagrees (L, d_inner from x).
  void check() const {
    using std::to_string;
    const char* m = "mamba2_activations";
    const Index L = x.rows(), di = x.cols(), H = dt.cols();
    const std::string LD = "(L=" + to_string(L) + ", d_inner=" + to_string(di) + ")", D1 = "(1, d_inner=" + to_string(di) + ")";
    check_field(m, "z", z, L, di, LD);
    detail::require_shape(dt.rows() == L && H >= 1 && di % H == 0, m, "dt", dt.rows(), dt.cols(),
                          "(L=" + to_string(L) + ", nheads) with nheads dividing d_inner=" + to_string(di));
    if (ngroups < 1 || H % ngroups != 0) detail::fail(m, "ngroups " + to_string(ngroups) + " must divide nheads = " + to_string(H));
    const std::string H1 = "(1, nheads=" + to_string(H) + ")";
    check_field(m, "A", A, 1, H, H1);
    detail::require_shape(B.rows() == L && B.cols() >= ngroups && B.cols() % ngroups == 0, m, "B", B.rows(), B.cols(),
                          "(L=" + to_string(L) + ", ngroups*d_state) with ngroups=" + to_string(ngroups));
    const Index GN = B.cols();
    check_field(m, "C", C, L, GN, "(L=" + to_string(L) + ", ngroups*d_state=" + to_string(GN) + ")");
    check_field(m, "D", D, 1, H, H1);
    const Index cd = di + 2 * GN;
    detail::require_shape((conv1d_weight.rows() == di || conv1d_weight.rows() == cd) && conv1d_weight.cols() >= 1, m, "conv1d_weight",
                          conv1d_weight.rows(), conv1d_weight.cols(),
                          "(d_inner=" + to_string(di) + " or conv_dim=" + to_string(cd) + ", d_conv)");
    if (conv1d_bias.size() != 0)
      detail::require_shape(conv1d_bias.rows() == 1 && (conv1d_bias.cols() == di || conv1d_bias.cols() == cd), m, "conv1d_bias",
                            conv1d_bias.rows(), conv1d_bias.cols(), D1 + ", (1, conv_dim=" + to_string(cd) + ") or empty");
    check_field(m, "norm_weight", norm_weight, 1, di, D1);
    if (di % ngroups != 0) detail::fail(m, "ngroups " + to_string(ngroups) + " must divide d_inner = " + to_string(di));
    if (out_proj_weight.size() != 0)
      detail::require_shape(out_proj_weight.cols() == di, m, "out_proj_weight", out_proj_weight.rows(), out_proj_weight.cols(),
                            "(d_model, d_inner=" + to_string(di) + ") or empty");
    if ((A.array() > T(0)).any()) detail::fail(m, "A must be <= 0 (A = -exp(A_log))");
    if ((dt.array() < T(0)).any()) detail::fail(m, "dt must be >= 0 (softplus output)");
  }
  /// p = conv1d(x) + conv1d_bias over the x channels (L, d_inner): a = SiLU(p) is the scan's input.
  Matrix<T> conv_out() const {
    const Index di = d_inner();
    return nn::causal_conv1d<T>(x, Matrix<T>(conv1d_weight.topRows(di)),
                                conv1d_bias.size() ? Matrix<T>(conv1d_bias.leftCols(di)) : Matrix<T>());
  }
};

/// The activations of one forward pass on u (L, d_model), the whole conv weight and out_proj included.
template <Scalar T>
mamba2_activations<T> activations(const mamba2_weights<T>& w, const Matrix<T>& u) {
  w.check();
  const auto& c = w.config;
  detail::require_shape(u.cols() == c.d_model, "mamba2", "u", u.rows(), u.cols(), "(L, d_model=" + std::to_string(c.d_model) + ")");
  const Index di = c.d_inner(), GN = c.ngroups * c.d_state, H = c.nheads();
  mamba2_activations<T> s;
  const Matrix<T> zxbcdt = nn::linear<T>(u, w.in_proj_weight);
  s.z = zxbcdt.leftCols(di);
  const Matrix<T> xBC = zxbcdt.middleCols(di, c.conv_dim());
  s.x = xBC.leftCols(di);
  const Matrix<T> act = nn::map<T>(nn::causal_conv1d<T>(xBC, w.conv1d_weight, w.conv1d_bias), [](T v) { return nn::silu(v); });
  s.B = act.middleCols(di, GN);
  s.C = act.rightCols(GN);
  s.dt.resize(u.rows(), H);
  const Matrix<T> dt_in = zxbcdt.rightCols(H);
  for (Index t = 0; t < u.rows(); ++t)
    for (Index h = 0; h < H; ++h) s.dt(t, h) = std::max(nn::softplus(dt_in(t, h) + w.dt_bias(0, h)), T(w.config.dt_min));
  s.A = -w.A_log.array().exp().matrix();
  s.D = w.D;
  s.conv1d_weight = w.conv1d_weight;
  s.conv1d_bias = w.conv1d_bias;
  s.norm_weight = w.norm_weight;
  s.out_proj_weight = w.out_proj_weight;
  s.ngroups = c.ngroups;
  s.eps = c.eps;
  return s;
}

/// The gated grouped RMS norm of mamba_ssm's RMSNormGated (norm_before_gate=False) on v = y * SiLU(z).
template <Scalar T>
Matrix<T> mamba2_gated_norm(const mamba2_weights<T>& w, const Matrix<T>& v) {
  const Index L = v.rows(), di = v.cols(), G = w.config.ngroups, Dg = di / G;
  Matrix<T> out(L, di);
  for (Index t = 0; t < L; ++t)
    for (Index g = 0; g < G; ++g) {
      T ss = 0;
      for (Index i = 0; i < Dg; ++i) ss += v(t, g * Dg + i) * v(t, g * Dg + i);
      const T r = T(1) / std::sqrt(ss / T(Dg) + T(w.config.eps));
      for (Index i = 0; i < Dg; ++i) out(t, g * Dg + i) = v(t, g * Dg + i) * r * w.norm_weight(0, g * Dg + i);
    }
  return out;
}

/// The block's plain recurrent forward (the oracle). final_state, when given, receives the scan
/// state after the last token (nheads*headdim, d_state), row h*headdim + p.
template <Scalar T>
Matrix<T> mamba2_forward(const mamba2_weights<T>& w, const Matrix<T>& u, Matrix<T>* final_state = nullptr) {
  w.check();
  const auto& c = w.config;
  detail::require_shape(u.cols() == c.d_model, "mamba2", "u", u.rows(), u.cols(), "(L, d_model=" + std::to_string(c.d_model) + ")");
  const Index L = u.rows(), H = c.nheads(), P = c.headdim, N = c.d_state, di = c.d_inner(), GN = c.ngroups * N;
  const Matrix<T> zxbcdt = nn::linear<T>(u, w.in_proj_weight);
  const Matrix<T> act = nn::map<T>(nn::causal_conv1d<T>(Matrix<T>(zxbcdt.middleCols(di, c.conv_dim())), w.conv1d_weight, w.conv1d_bias),
                                   [](T v) { return nn::silu(v); });
  Matrix<T> y(L, di), h = Matrix<T>::Zero(di, N);  // row h*P + p: head h's state row p
  for (Index t = 0; t < L; ++t)
    for (Index hd = 0; hd < H; ++hd) {
      const Index g = hd / (H / c.ngroups);
      const T dt = std::max(nn::softplus(zxbcdt(t, 2 * di + 2 * GN + hd) + w.dt_bias(0, hd)), T(c.dt_min));
      const T dA = std::exp(-dt * std::exp(w.A_log(0, hd)));
      for (Index p = 0; p < P; ++p) {
        const Index ch = hd * P + p;
        T acc = 0;
        for (Index n = 0; n < N; ++n) {
          h(ch, n) = dA * h(ch, n) + dt * act(t, ch) * act(t, di + g * N + n);
          acc += h(ch, n) * act(t, di + GN + g * N + n);
        }
        y(t, ch) = (acc + w.D(0, hd) * act(t, ch)) * nn::silu(zxbcdt(t, ch));
      }
    }
  if (final_state) *final_state = h;
  return nn::linear<T>(mamba2_gated_norm(w, y), w.out_proj_weight);
}

namespace mamba2_detail {
/// Per-head quantities broadcast to the head's P channels.
template <class T>
Matrix<T> per_channel(const Matrix<T>& m, Index P) {
  Matrix<T> out(m.rows(), m.cols() * P);
  for (Index t = 0; t < m.rows(); ++t)
    for (Index h = 0; h < m.cols(); ++h) out.row(t).segment(h * P, P).setConstant(m(t, h));
  return out;
}
template <class T, bool WithD>
auto core(const mamba2_activations<T>& s) {
  const Index P = s.headdim();
  Matrix<T> lam = s.dt;
  lam.array().rowwise() *= s.A.row(0).array();
  auto S = semiseparable(std::move(lam), s.B, s.C, {.heads = s.nheads(), .head_dim = P, .groups = s.ngroups});
  auto gate = diagonal(nn::map<T>(s.z, [](T v) { return nn::silu(v); }));
  if constexpr (WithD) return gate * (S * diagonal(per_channel(s.dt, P)) + diagonal(per_channel(s.D, P)));
  else return gate * S * diagonal(per_channel(s.dt, P));
}
template <class T, bool WithD>
auto decompose(const mamba2_activations<T>& s) {
  s.check();
  const Index di = s.d_inner(), L = s.length();
  auto pre = core<T, WithD>(s);
  const Matrix<T> sig = nn::map<T>(s.conv_out(), [](T v) { return nn::sigmoid(v); });
  auto body = pre * diagonal(sig) * causal_conv(depthwise_taps(s.conv1d_weight.topRows(di)));
  Matrix<T> beta_pre = Matrix<T>::Zero(L, di);
  if (WithD && s.conv1d_bias.size() != 0) {
    Matrix<T> bias_in = sig;
    bias_in.array().rowwise() *= s.conv1d_bias.row(0).head(di).array();
    beta_pre = apply(pre, bias_in);
  }
  const Matrix<T> v = apply(body, s.x) + beta_pre;  // the norm's actual input
  auto norm = group_norm(s.ngroups, s.norm_weight, {.eps = s.eps});
  norm = norm.bound_to(norm.compute(v.data(), v.rows(), v.cols()));
  Matrix<T> beta = apply(norm, beta_pre);
  return make_decomposition<T>(s.x, norm * body, std::move(beta), s.out_proj_weight);
}
}  // namespace mamba2_detail

/// The exact decomposition from activations; out_proj_weight empty gives the normed inner output.
template <Scalar T>
auto attention(const mamba2_activations<T>& a) { return mamba2_detail::decompose<T, true>(a); }

/// The exact decomposition: mamba2_forward(w, u) == d.output().
template <Scalar T>
auto decompose(const mamba2_weights<T>& w, const Matrix<T>& u) { return attention(activations(w, u)); }

/// The exact decomposition (the named form of decompose).
template <Scalar T>
auto mamba2_decompose(const mamba2_weights<T>& w, const Matrix<T>& u) { return decompose(w, u); }

/// Zimerman et al.'s eq. 11: N diag(SiLU z) S diag(dt) diag(sigmoid p) M, with the D skip and the
/// conv-bias term dropped (beta = 0) and N bound to the statistics of that simplified signal.
template <Scalar T>
auto mamba2_paper_attention(const mamba2_activations<T>& a) { return mamba2_detail::decompose<T, false>(a).H; }
template <Scalar T>
auto mamba2_paper_attention(const mamba2_weights<T>& w, const Matrix<T>& u) { return mamba2_paper_attention(activations(w, u)); }

/// The scan state after the last token, mamba_ssm's ssm_state (nheads, headdim, d_state) flattened
/// to (nheads*headdim, d_state), row h*headdim + p:
///   h[hP+p, n] = sum_s exp(sum_{k>s} dt_k[h] A[h]) dt_s[h] a_s[hP+p] B_s[g(h), n],  a = SiLU(p),
/// in log space (recurrent_state.hpp). The D skip is not part of the state.
template <Scalar T>
Matrix<T> final_state(const mamba2_activations<T>& a) {
  a.check();
  const Matrix<T> act = nn::map<T>(a.conv_out(), [](T v) { return nn::silu(v); });
  const Index L = a.length(), H = a.nheads(), P = a.headdim(), N = a.d_state();
  Matrix<T> h(a.d_inner(), N);
  for (Index hd = 0; hd < H; ++hd) {
    const Index g = hd / (H / a.ngroups);
    for (Index p = 0; p < P; ++p)
      for (Index n = 0; n < N; ++n)
        h(hd * P + p, n) = decayed_sum<T>(
            L, [&](Index k) { return a.dt(k, hd) * a.A(0, hd); },
            [&](Index s) { return a.dt(s, hd) * act(s, hd * P + p) * a.B(s, g * N + n); });
  }
  return h;
}

}  // namespace iattn::models
