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
#pragma once

#include "../iattn.hpp"
#include "common.hpp"

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

template <Scalar T>
struct mamba2_activations {
  Matrix<T> x, z, p, a, B, C, dt, A;  // x, z, p, a (L, di); B, C (L, G*N); dt (L, H); A (1, H)
};

template <Scalar T>
mamba2_activations<T> mamba2_project(const mamba2_weights<T>& w, const Matrix<T>& u) {
  w.check();
  const auto& c = w.config;
  detail::require_shape(u.cols() == c.d_model, "mamba2", "u", u.rows(), u.cols(), "(L, d_model=" + std::to_string(c.d_model) + ")");
  const Index di = c.d_inner(), GN = c.ngroups * c.d_state, H = c.nheads();
  mamba2_activations<T> s;
  const Matrix<T> zxbcdt = nn::linear<T>(u, w.in_proj_weight);
  s.z = zxbcdt.leftCols(di);
  const Matrix<T> xBC = zxbcdt.middleCols(di, c.conv_dim());
  s.x = xBC.leftCols(di);
  const Matrix<T> pBC = nn::causal_conv1d<T>(xBC, w.conv1d_weight, w.conv1d_bias);
  s.p = pBC.leftCols(di);
  const Matrix<T> act = nn::map<T>(pBC, [](T v) { return nn::silu(v); });
  s.a = act.leftCols(di);
  s.B = act.middleCols(di, GN);
  s.C = act.rightCols(GN);
  s.dt.resize(u.rows(), H);
  const Matrix<T> dt_in = zxbcdt.rightCols(H);
  for (Index t = 0; t < u.rows(); ++t)
    for (Index h = 0; h < H; ++h) s.dt(t, h) = nn::softplus(dt_in(t, h) + w.dt_bias(0, h));
  s.A = -w.A_log.array().exp().matrix();
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

/// The block's plain recurrent forward (the oracle).
template <Scalar T>
Matrix<T> mamba2_forward(const mamba2_weights<T>& w, const Matrix<T>& u) {
  const auto s = mamba2_project(w, u);
  const auto& c = w.config;
  const Index L = u.rows(), H = c.nheads(), P = c.headdim, N = c.d_state, di = c.d_inner();
  Matrix<T> y(L, di), h = Matrix<T>::Zero(di, N);  // row h*P + p: head h's state row p
  for (Index t = 0; t < L; ++t)
    for (Index hd = 0; hd < H; ++hd) {
      const Index g = hd / (H / c.ngroups);
      const T dA = std::exp(s.dt(t, hd) * s.A(0, hd));
      for (Index p = 0; p < P; ++p) {
        const Index ch = hd * P + p;
        T acc = 0;
        for (Index n = 0; n < N; ++n) {
          h(ch, n) = dA * h(ch, n) + s.dt(t, hd) * s.a(t, ch) * s.B(t, g * N + n);
          acc += h(ch, n) * s.C(t, g * N + n);
        }
        y(t, ch) = (acc + w.D(0, hd) * s.a(t, ch)) * nn::silu(s.z(t, ch));
      }
    }
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
auto core(const mamba2_weights<T>& w, const mamba2_activations<T>& s) {
  const auto& c = w.config;
  Matrix<T> lam = s.dt;
  lam.array().rowwise() *= s.A.row(0).array();
  auto S = semiseparable(std::move(lam), Matrix<T>(s.B), Matrix<T>(s.C),
                         {.heads = c.nheads(), .head_dim = c.headdim, .groups = c.ngroups});
  auto gate = diagonal(nn::map<T>(s.z, [](T v) { return nn::silu(v); }));
  if constexpr (WithD) return gate * (S * diagonal(per_channel(s.dt, c.headdim)) + diagonal(per_channel(w.D, c.headdim)));
  else return gate * S * diagonal(per_channel(s.dt, c.headdim));
}
template <class T, bool WithD>
auto decompose(const mamba2_weights<T>& w, const Matrix<T>& u) {
  const auto s = mamba2_project(w, u);
  const auto& c = w.config;
  const Index di = c.d_inner();
  auto pre = core<T, WithD>(w, s);
  const Matrix<T> sig = nn::map<T>(s.p, [](T v) { return nn::sigmoid(v); });
  auto body = pre * diagonal(Matrix<T>(sig)) * causal_conv(Matrix<T>(w.conv1d_weight.topRows(di).transpose()));
  Matrix<T> bias_in = sig;
  bias_in.array().rowwise() *= w.conv1d_bias.row(0).head(di).array();
  Matrix<T> beta_pre = WithD ? Matrix<T>(apply(pre, bias_in)) : Matrix<T>::Zero(u.rows(), di);
  const Matrix<T> v = apply(body, s.x) + beta_pre;  // the norm's actual input
  auto norm = group_norm(c.ngroups, Matrix<T>(w.norm_weight), {.eps = c.eps});
  norm = norm.bound_to(norm.compute(v.data(), v.rows(), v.cols()));
  Matrix<T> beta = apply(norm, beta_pre);
  return make_decomposition<T>(s.x, norm * body, std::move(beta), w.out_proj_weight);
}
}  // namespace mamba2_detail

/// The exact decomposition: mamba2_forward(w, u) == d.output().
template <Scalar T>
auto mamba2_decompose(const mamba2_weights<T>& w, const Matrix<T>& u) {
  return mamba2_detail::decompose<T, true>(w, u);
}

/// Zimerman et al.'s eq. 11: N diag(SiLU z) S diag(dt) diag(sigmoid p) M, with the D skip and the
/// conv-bias term dropped (beta = 0) and N bound to the statistics of that simplified signal.
template <Scalar T>
auto mamba2_paper_attention(const mamba2_weights<T>& w, const Matrix<T>& u) {
  return mamba2_detail::decompose<T, false>(w, u).H;
}

}  // namespace iattn::models
