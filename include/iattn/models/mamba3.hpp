// iattn/models/mamba3.hpp: the Mamba-3 SISO block (state-spaces/mamba `Mamba3`, is_mimo=False,
// is_outproj_norm=False) as implicit attention.
//
// Forward (docs/reference-notes/mamba3.md; the kernel is `mamba3_siso_step_ref`):
//   [z, x, B, C, dd_dt, dd_A, trap, angles] = in_proj(u)       (d_inner, d_inner, G*N, G*N, H, H, H, S)
//   DT = softplus(dd_dt + dt_bias),  A = min(-softplus(dd_A), -A_floor),  ADT = A * DT       (L, H)
//   B = RMSNorm(B) * B_norm_weight, C = RMSNorm(C) * C_norm_weight   per group over N, eps 1e-5
//   per head h (channels h*P .. h*P+P-1, group g = h / (H/G)):
//     q_t = C_t[g] + C_bias[h],  k_t = B_t[g] + B_bias[h]                        (N each)
//     phi_t = phi_{t-1} + pi tanh(angles_t) DT_t[h]  (mod 2 pi)                   (S angles)
//     q~_t = rot(q_t, phi_t), k~_t = rot(k_t, phi_t): pairs (2i, 2i+1), i < S, turned by phi_t[i]
//     lam = sigmoid(trap_t[h]), alpha = exp(ADT_t[h]), beta = (1-lam) DT alpha, gamma = lam DT
//     SSM_t = alpha SSM_{t-1} + beta v_{t-1} k~_{t-1}^T + gamma v_t k~_t^T          (P, N), v = x
//     y_t = (SSM_t q~_t + D[h] v_t) * SiLU(z_t);   out = out_proj(y)
//
// Exact decomposition over the d_inner channels, inner input x (no conv), beta = 0:
//   H = diag(SiLU z) (K diag(scale) - diag(shifted_gamma (q.k)) + diag(D)),   per head (P channels
//   share one core), with
//   scale_s = lam_s DT_s + (1 - lam_{s+1}) DT_{s+1}   (DT_L = 0),   shifted_gamma_t = (1 - lam_{t+1}) DT_{t+1}
//   K[t, s] = exp(sum_{r=s+1..t} ADT_r) q~_t . k~_s
//           = Re sum_m C_t[m] exp(sum_{r=s+1..t} (ADT_r + i dphi_r[m])) B_s[m]      (ComplexSemiseparable)
// with N - S complex states per head: for a rotated pair m < S, C = q_{2m} + i q_{2m+1},
// B = k_{2m} - i k_{2m+1} (conjugated), dphi_r[m] = pi tanh(angles_r[m]) DT_r[h]; for an unrotated
// state n = 2S + j, state m = S + j with C = q_n, B = k_n, angle 0. Then the weight of (t, s) is
// exp(sum ADT) (lam_s DT_s + (1 - lam_{s+1}) DT_{s+1}) q~_t.k~_s for s < t and lam_t DT_t q_t.k_t at s = t
// (the unrolled trapezoidal recurrence), which is K diag(scale) with the s = t part of scale that
// belongs to the next token (shifted_gamma) removed; q~_t.k~_t = q_t.k_t (same rotation).
//
// From activations (docs/models.md): mamba3_activations holds x, z, B, C (after the RMSNorm, before the
// bias), DT, ADT, trap, angles (raw), B_bias, C_bias, D and out_proj; attention(acts) is the
// decomposition, mamba3_core(acts) the per-head core K diag(scale) - diag(shifted_gamma q.k),
// final_state(acts) the ssm_state (nheads*headdim, d_state), final_cache(acts) all four states the
// kernel returns (angle, ssm, k, v).
#pragma once

#include "../iattn.hpp"
#include "common.hpp"
#include "recurrent_state.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numbers>
#include <string>
#include <vector>

namespace iattn::models {

struct mamba3_config {
  Index d_model = 64;
  Index d_state = 32;          ///< N
  Index expand = 2;            ///< d_inner = expand * d_model
  Index headdim = 32;          ///< P
  Index ngroups = 1;           ///< G (num_bc_heads)
  double rope_fraction = 0.5;  ///< 0.5 or 1.0, as the reference asserts
  double dt_min = 1e-3;
  double dt_max = 1e-1;
  double dt_init_floor = 1e-4;
  double A_floor = 1e-4;       ///< A = min(-softplus(dd_A), -A_floor)
  double eps = 1e-5;           ///< B_norm / C_norm eps
  Index d_inner() const { return expand * d_model; }
  Index nheads() const { return headdim > 0 ? d_inner() / headdim : 0; }
  /// S = num_rope_angles: split = int(N * rope_fraction) made even, S = split / 2.
  Index num_rope_angles() const {
    Index split = Index(double(d_state) * rope_fraction);
    if (split % 2 != 0) --split;
    return split / 2;
  }
  Index d_in_proj() const { return 2 * d_inner() + 2 * d_state * ngroups + 3 * nheads() + num_rope_angles(); }
};

/// state-spaces/mamba `Mamba3` (SISO) parameters; names follow its state_dict with '.' written '_'.
template <Scalar T>
struct mamba3_weights {
  mamba3_config config;
  Matrix<T> in_proj_weight;   ///< (2*d_inner + 2*G*N + 3*H + S, d_model)  in_proj.weight
  Matrix<T> dt_bias;          ///< (1, H)               dt_bias
  Matrix<T> B_bias;           ///< (H, N)               B_bias, PyTorch (H, 1, N)
  Matrix<T> C_bias;           ///< (H, N)               C_bias, PyTorch (H, 1, N)
  Matrix<T> B_norm_weight;    ///< (1, N)               B_norm.weight
  Matrix<T> C_norm_weight;    ///< (1, N)               C_norm.weight
  Matrix<T> D;                ///< (1, H)               D
  Matrix<T> out_proj_weight;  ///< (d_model, d_inner)   out_proj.weight

  void check() const {
    const auto& c = config;
    using std::to_string;
    const char* m = "mamba3";
    if (c.headdim < 1 || c.d_inner() % c.headdim != 0)
      detail::fail(m, "headdim " + to_string(c.headdim) + " must divide d_inner = " + to_string(c.d_inner()));
    if (c.ngroups < 1 || c.nheads() % c.ngroups != 0)
      detail::fail(m, "ngroups " + to_string(c.ngroups) + " must divide nheads = " + to_string(c.nheads()));
    if (c.rope_fraction != 0.5 && c.rope_fraction != 1.0)
      detail::fail(m, "rope_fraction is " + std::to_string(c.rope_fraction) + " but must be 0.5 or 1.0");
    if (c.num_rope_angles() < 1)
      detail::fail(m, "d_state " + to_string(c.d_state) + " gives no rope angle (num_rope_angles must be > 0)");
    const Index H = c.nheads(), N = c.d_state, di = c.d_inner();
    const std::string h1 = "(1, nheads=" + to_string(H) + ")", hn = "(nheads=" + to_string(H) + ", d_state=" + to_string(N) + ")",
                      n1 = "(1, d_state=" + to_string(N) + ")";
    check_field(m, "in_proj_weight", in_proj_weight, c.d_in_proj(), c.d_model,
                "(2*d_inner+2*ngroups*d_state+3*nheads+num_rope_angles=" + to_string(c.d_in_proj()) +
                    ", d_model=" + to_string(c.d_model) + ")");
    check_field(m, "dt_bias", dt_bias, 1, H, h1);
    check_field(m, "B_bias", B_bias, H, N, hn);
    check_field(m, "C_bias", C_bias, H, N, hn);
    check_field(m, "B_norm_weight", B_norm_weight, 1, N, n1);
    check_field(m, "C_norm_weight", C_norm_weight, 1, N, n1);
    check_field(m, "D", D, 1, H, h1);
    check_field(m, "out_proj_weight", out_proj_weight, c.d_model, di,
                "(d_model=" + to_string(c.d_model) + ", d_inner=" + to_string(di) + ")");
  }
};

/// The reference initialisation: dt_bias = softplus^-1(dt), dt log-uniform in [dt_min, dt_max]
/// clamped >= dt_init_floor; B_bias = C_bias = 1; norm weights 1; D = 1; PyTorch's Linear default
/// (U(+-fan_in^-1/2)) for in_proj and out_proj. Drawn in the order in_proj, dt, out_proj.
template <Scalar T>
mamba3_weights<T> mamba3_init(const mamba3_config& c, std::uint64_t seed = 0) {
  init::generator g(seed);
  mamba3_weights<T> w;
  w.config = c;
  const Index H = c.nheads(), N = c.d_state;
  w.in_proj_weight = init::torch_default<T>(g, c.d_in_proj(), c.d_model, c.d_model);
  const Matrix<double> r = init::uniform<double>(g, 1, H, 0.0, 1.0);
  w.dt_bias.resize(1, H);
  for (Index h = 0; h < H; ++h) {
    const double dt = std::exp(r(0, h) * (std::log(c.dt_max) - std::log(c.dt_min)) + std::log(c.dt_min));
    w.dt_bias(0, h) = T(nn::inverse_softplus(std::max(dt, c.dt_init_floor)));
  }
  w.B_bias = Matrix<T>::Ones(H, N);
  w.C_bias = Matrix<T>::Ones(H, N);
  w.B_norm_weight = Matrix<T>::Ones(1, N);
  w.C_norm_weight = Matrix<T>::Ones(1, N);
  w.D = Matrix<T>::Ones(1, H);
  w.out_proj_weight = init::torch_default<T>(g, c.d_model, c.d_inner(), c.d_inner());
  return w;
}

/// One forward pass's activations, named as `Mamba3.forward` / `mamba3_siso_combined` name them
/// (token-major: the reference's (B, H, L) tensors DT, ADT, trap are stored (L, H)). Heads
/// H = DT.cols(), headdim P = d_inner / H, d_state N = B.cols() / ngroups, S = angles.cols().
/// Built by `activations(w, u)` or by hand; `attention(acts)` needs nothing else.
template <Scalar T>
struct mamba3_activations {
  Matrix<T> x;                ///< (L, d_inner)          in_proj's x: the inner input (V)
  Matrix<T> z;                ///< (L, d_inner)          the gate, before SiLU (Z)
  Matrix<T> B;                ///< (L, ngroups*d_state)  after B_norm, before B_bias (K)
  Matrix<T> C;                ///< (L, ngroups*d_state)  after C_norm, before C_bias (Q)
  Matrix<T> DT;               ///< (L, nheads)           softplus(dd_dt + dt_bias) >= 0
  Matrix<T> ADT;              ///< (L, nheads)           A * DT <= 0, A = min(-softplus(dd_A), -A_floor)
  Matrix<T> trap;             ///< (L, nheads)           raw, before sigmoid (Trap)
  Matrix<T> angles;           ///< (L, S)                raw in_proj angles, before tanh * pi, shared by the heads
  Matrix<T> B_bias;           ///< (nheads, d_state)     K_bias
  Matrix<T> C_bias;           ///< (nheads, d_state)     Q_bias
  Matrix<T> D;                ///< (1, nheads)
  Matrix<T> out_proj_weight;  ///< (d_model, d_inner) or empty (the decomposition stops before out_proj)
  Index ngroups = 1;          ///< G: B/C groups; head h reads group h / (H/G)

  Index length() const { return x.rows(); }
  Index d_inner() const { return x.cols(); }
  Index nheads() const { return DT.cols(); }
  Index headdim() const { return nheads() > 0 ? d_inner() / nheads() : 0; }
  Index d_state() const { return ngroups > 0 ? B.cols() / ngroups : 0; }
  Index num_rope_angles() const { return angles.cols(); }
  Index group_of(Index h) const { return h / (nheads() / ngroups); }

  /// Throws std::invalid_argument naming the first field whose shape disagrees (L, d_inner from x,
  /// nheads from DT, d_state from B).
  void check() const {
    using std::to_string;
    const char* m = "mamba3_activations";
    const Index L = x.rows(), di = x.cols(), H = DT.cols();
    const std::string LD = "(L=" + to_string(L) + ", d_inner=" + to_string(di) + ")";
    check_field(m, "z", z, L, di, LD);
    detail::require_shape(DT.rows() == L && H >= 1 && di % H == 0, m, "DT", DT.rows(), DT.cols(),
                          "(L=" + to_string(L) + ", nheads) with nheads dividing d_inner=" + to_string(di));
    if (ngroups < 1 || H % ngroups != 0) detail::fail(m, "ngroups " + to_string(ngroups) + " must divide nheads = " + to_string(H));
    const std::string LH = "(L=" + to_string(L) + ", nheads=" + to_string(H) + ")";
    check_field(m, "ADT", ADT, L, H, LH);
    check_field(m, "trap", trap, L, H, LH);
    detail::require_shape(B.rows() == L && B.cols() >= ngroups && B.cols() % ngroups == 0, m, "B", B.rows(), B.cols(),
                          "(L=" + to_string(L) + ", ngroups*d_state) with ngroups=" + to_string(ngroups));
    const Index GN = B.cols(), N = GN / ngroups;
    check_field(m, "C", C, L, GN, "(L=" + to_string(L) + ", ngroups*d_state=" + to_string(GN) + ")");
    detail::require_shape(angles.rows() == L && 2 * angles.cols() <= N, m, "angles", angles.rows(), angles.cols(),
                          "(L=" + to_string(L) + ", S) with 2*S <= d_state=" + to_string(N));
    const std::string HN = "(nheads=" + to_string(H) + ", d_state=" + to_string(N) + ")";
    check_field(m, "B_bias", B_bias, H, N, HN);
    check_field(m, "C_bias", C_bias, H, N, HN);
    check_field(m, "D", D, 1, H, "(1, nheads=" + to_string(H) + ")");
    if (out_proj_weight.size() != 0)
      detail::require_shape(out_proj_weight.cols() == di, m, "out_proj_weight", out_proj_weight.rows(), out_proj_weight.cols(),
                            "(d_model, d_inner=" + to_string(di) + ") or empty");
    if ((ADT.array() > T(0)).any()) detail::fail(m, "ADT must be <= 0 (A <= -A_floor, DT >= 0)");
    if ((DT.array() < T(0)).any()) detail::fail(m, "DT must be >= 0 (softplus output)");
  }

  /// q = C[group] + C_bias[h] per head (L, nheads*d_state), before the rotation.
  Matrix<T> q() const { return biased(C, C_bias); }
  /// k = B[group] + B_bias[h] per head (L, nheads*d_state), before the rotation.
  Matrix<T> k() const { return biased(B, B_bias); }
  /// lam = sigmoid(trap) (L, nheads).
  Matrix<T> lam() const { return nn::map<T>(trap, [](T v) { return nn::sigmoid(v); }); }
  /// The per-token angle increments pi tanh(angles_t[i]) DT_t[h] (L, nheads*S).
  Matrix<T> angle_increments() const {
    const Index L = length(), H = nheads(), S = num_rope_angles();
    Matrix<T> d(L, H * S);
    for (Index t = 0; t < L; ++t)
      for (Index h = 0; h < H; ++h)
        for (Index i = 0; i < S; ++i) d(t, h * S + i) = T(std::numbers::pi) * std::tanh(angles(t, i)) * DT(t, h);
    return d;
  }
  /// The accumulated angle phi_t (L, nheads*S), reduced to [0, 2 pi) as the reference's Angle_State,
  /// summed in double.
  Matrix<T> angle_state() const {
    const Matrix<T> d = angle_increments();
    Matrix<T> phi(d.rows(), d.cols());
    const double two_pi = 2 * std::numbers::pi;
    for (Index j = 0; j < d.cols(); ++j) {
      double acc = 0;
      for (Index t = 0; t < d.rows(); ++t) {
        acc += double(d(t, j));
        acc -= two_pi * std::floor(acc / two_pi);
        phi(t, j) = T(acc);
      }
    }
    return phi;
  }
  /// q~ = rotated(q()) or k~ = rotated(k()) (L, nheads*d_state): pairs (2i, 2i+1), i < S, turned by angle_state().
  Matrix<T> rotated(const Matrix<T>& qk) const {
    const Matrix<T> phi = angle_state();
    const Index L = length(), H = nheads(), N = d_state(), S = num_rope_angles();
    Matrix<T> r = qk;
    for (Index t = 0; t < L; ++t)
      for (Index h = 0; h < H; ++h)
        for (Index i = 0; i < S; ++i) {
          const double a = double(phi(t, h * S + i)), c = std::cos(a), s = std::sin(a);
          const double x0 = double(qk(t, h * N + 2 * i)), x1 = double(qk(t, h * N + 2 * i + 1));
          r(t, h * N + 2 * i) = T(x0 * c - x1 * s);
          r(t, h * N + 2 * i + 1) = T(x0 * s + x1 * c);
        }
    return r;
  }
  /// scale_s = lam_s DT_s + (1 - lam_{s+1}) DT_{s+1}, DT_L = 0 (L, nheads).
  Matrix<T> scale() const {
    const Matrix<T> l = lam(), sg = shifted_gamma();
    Matrix<T> s = l.cwiseProduct(DT);
    return s + sg;
  }
  /// shifted_gamma_t = (1 - lam_{t+1}) DT_{t+1}, 0 at t = L-1 (L, nheads).
  Matrix<T> shifted_gamma() const {
    const Matrix<T> l = lam();
    const Index L = length(), H = nheads();
    Matrix<T> g = Matrix<T>::Zero(L, H);
    for (Index t = 0; t + 1 < L; ++t)
      for (Index h = 0; h < H; ++h) g(t, h) = (T(1) - l(t + 1, h)) * DT(t + 1, h);
    return g;
  }

 private:
  Matrix<T> biased(const Matrix<T>& X, const Matrix<T>& bias) const {
    const Index L = length(), H = nheads(), N = d_state();
    Matrix<T> out(L, H * N);
    for (Index h = 0; h < H; ++h) {
      const Index g = group_of(h);
      for (Index t = 0; t < L; ++t)
        for (Index n = 0; n < N; ++n) out(t, h * N + n) = X(t, g * N + n) + bias(h, n);
    }
    return out;
  }
};

namespace mamba3_detail {
/// RMSNorm over each of the `groups` contiguous blocks of N in every row, times weight (1, N):
/// mamba_ssm's RMSNormGated(N) without z, x rsqrt(mean(x^2) + eps) w.
template <class T>
Matrix<T> rms_norm_groups(Matrix<T> X, Index groups, const Matrix<T>& weight, double eps) {
  const Index N = weight.cols();
  for (Index t = 0; t < X.rows(); ++t)
    for (Index g = 0; g < groups; ++g) {
      T ss = 0;
      for (Index n = 0; n < N; ++n) ss += X(t, g * N + n) * X(t, g * N + n);
      const T r = T(1) / std::sqrt(ss / T(N) + T(eps));
      for (Index n = 0; n < N; ++n) X(t, g * N + n) = X(t, g * N + n) * r * weight(0, n);
    }
  return X;
}
/// in_proj's column offsets in the order [z, x, B, C, dd_dt, dd_A, trap, angles].
struct layout {
  Index z, x, B, C, dt, A, trap, angles;
  explicit layout(const mamba3_config& c) {
    const Index di = c.d_inner(), GN = c.ngroups * c.d_state, H = c.nheads();
    z = 0, x = di, B = 2 * di, C = B + GN, dt = C + GN, A = dt + H, trap = A + H, angles = trap + H;
  }
};
/// Per-head quantities (L, H) broadcast to the head's P channels (L, H*P).
template <class T>
Matrix<T> per_channel(const Matrix<T>& m, Index P) {
  Matrix<T> out(m.rows(), m.cols() * P);
  for (Index t = 0; t < m.rows(); ++t)
    for (Index h = 0; h < m.cols(); ++h) out.row(t).segment(h * P, P).setConstant(m(t, h));
  return out;
}
template <class T>
void check_input(const mamba3_weights<T>& w, const Matrix<T>& u) {
  w.check();
  detail::require_shape(u.cols() == w.config.d_model, "mamba3", "u", u.rows(), u.cols(),
                        "(L, d_model=" + std::to_string(w.config.d_model) + ")");
}
}  // namespace mamba3_detail

/// The activations of one forward pass on u (L, d_model), out_proj included.
template <Scalar T>
mamba3_activations<T> activations(const mamba3_weights<T>& w, const Matrix<T>& u) {
  mamba3_detail::check_input(w, u);
  const auto& c = w.config;
  const mamba3_detail::layout o(c);
  const Index L = u.rows(), di = c.d_inner(), GN = c.ngroups * c.d_state, H = c.nheads(), S = c.num_rope_angles();
  const Matrix<T> proj = nn::linear<T>(u, w.in_proj_weight);
  // (a block of an empty matrix would offset its null data pointer: slice L = 0 by hand)
  auto slice = [&](Index c0, Index n) { return L == 0 ? Matrix<T>(0, n) : Matrix<T>(proj.middleCols(c0, n)); };
  mamba3_activations<T> a;
  a.z = slice(o.z, di);
  a.x = slice(o.x, di);
  a.B = mamba3_detail::rms_norm_groups<T>(slice(o.B, GN), c.ngroups, w.B_norm_weight, c.eps);
  a.C = mamba3_detail::rms_norm_groups<T>(slice(o.C, GN), c.ngroups, w.C_norm_weight, c.eps);
  a.DT.resize(L, H);
  a.ADT.resize(L, H);
  for (Index t = 0; t < L; ++t)
    for (Index h = 0; h < H; ++h) {
      a.DT(t, h) = nn::softplus(proj(t, o.dt + h) + w.dt_bias(0, h));
      const T A = std::min(-nn::softplus(proj(t, o.A + h)), T(-c.A_floor));
      a.ADT(t, h) = A * a.DT(t, h);
    }
  a.trap = slice(o.trap, H);
  a.angles = slice(o.angles, S);
  a.B_bias = w.B_bias;
  a.C_bias = w.C_bias;
  a.D = w.D;
  a.out_proj_weight = w.out_proj_weight;
  a.ngroups = c.ngroups;
  return a;
}

/// All four states the kernel returns after the last token (mamba3_siso_combined's final states /
/// the inference cache), batch dimension dropped.
template <Scalar T>
struct mamba3_cache {
  Matrix<T> angle_state;  ///< (nheads, S)                   accumulated angle, in [0, 2 pi)
  Matrix<T> ssm_state;    ///< (nheads*headdim, d_state)     SSM_State (H, P, N) flattened, row h*P + p
  Matrix<T> k_state;      ///< (nheads, d_state)             the last token's rotated k (bias included)
  Matrix<T> v_state;      ///< (nheads, headdim)             the last token's x
};

/// The block's plain recurrent forward (the oracle), the kernel's step reference token by token.
/// final_state, when given, receives the SSM state after the last token (nheads*headdim, d_state),
/// row h*headdim + p (the reference's (H, P, N), V-first); cache, when given, all four states.
template <Scalar T>
Matrix<T> mamba3_forward(const mamba3_weights<T>& w, const Matrix<T>& u, Matrix<T>* final_state = nullptr,
                         mamba3_cache<T>* cache = nullptr) {
  mamba3_detail::check_input(w, u);
  const auto& c = w.config;
  const mamba3_detail::layout o(c);
  const Index L = u.rows(), H = c.nheads(), P = c.headdim, N = c.d_state, di = c.d_inner(), GN = c.ngroups * N;
  const Index S = c.num_rope_angles(), G = c.ngroups;
  const T pi = T(std::numbers::pi), two_pi = T(2 * std::numbers::pi);
  const Matrix<T> proj = nn::linear<T>(u, w.in_proj_weight);
  Matrix<T> y(L, di);
  Matrix<T> angle = Matrix<T>::Zero(H, S), ssm = Matrix<T>::Zero(H * P, N), kst = Matrix<T>::Zero(H, N),
            vst = Matrix<T>::Zero(H, P);
  std::vector<T> Bn(static_cast<std::size_t>(GN)), Cn(static_cast<std::size_t>(GN)), q(static_cast<std::size_t>(N)),
      k(static_cast<std::size_t>(N));
  for (Index t = 0; t < L; ++t) {
    for (Index g = 0; g < G; ++g) {  // B_norm, C_norm
      T sb = 0, sc = 0;
      for (Index n = 0; n < N; ++n) {
        sb += proj(t, o.B + g * N + n) * proj(t, o.B + g * N + n);
        sc += proj(t, o.C + g * N + n) * proj(t, o.C + g * N + n);
      }
      const T rb = T(1) / std::sqrt(sb / T(N) + T(c.eps)), rc = T(1) / std::sqrt(sc / T(N) + T(c.eps));
      for (Index n = 0; n < N; ++n) {
        Bn[std::size_t(g * N + n)] = proj(t, o.B + g * N + n) * rb * w.B_norm_weight(0, n);
        Cn[std::size_t(g * N + n)] = proj(t, o.C + g * N + n) * rc * w.C_norm_weight(0, n);
      }
    }
    for (Index h = 0; h < H; ++h) {
      const Index g = h / (H / G);
      const T dt = nn::softplus(proj(t, o.dt + h) + w.dt_bias(0, h));
      const T A = std::min(-nn::softplus(proj(t, o.A + h)), T(-c.A_floor));
      const T adt = A * dt;
      for (Index n = 0; n < N; ++n) {
        q[std::size_t(n)] = Cn[std::size_t(g * N + n)] + w.C_bias(h, n);
        k[std::size_t(n)] = Bn[std::size_t(g * N + n)] + w.B_bias(h, n);
      }
      for (Index i = 0; i < S; ++i) {  // Angle_State = (Angle_State + pi tanh(angle) dt) mod 2 pi; rotate q, k
        T& a = angle(h, i);
        a += pi * std::tanh(proj(t, o.angles + i)) * dt;
        a -= two_pi * std::floor(a / two_pi);
        const T cs = std::cos(a), sn = std::sin(a);
        const T q0 = q[std::size_t(2 * i)], q1 = q[std::size_t(2 * i + 1)], k0 = k[std::size_t(2 * i)], k1 = k[std::size_t(2 * i + 1)];
        q[std::size_t(2 * i)] = q0 * cs - q1 * sn;
        q[std::size_t(2 * i + 1)] = q0 * sn + q1 * cs;
        k[std::size_t(2 * i)] = k0 * cs - k1 * sn;
        k[std::size_t(2 * i + 1)] = k0 * sn + k1 * cs;
      }
      const T lam = nn::sigmoid(proj(t, o.trap + h)), alpha = std::exp(adt);
      const T beta = (T(1) - lam) * dt * alpha, gamma = lam * dt;
      for (Index p = 0; p < P; ++p) {
        const Index ch = h * P + p;
        const T v = proj(t, o.x + ch);
        T acc = 0;
        for (Index n = 0; n < N; ++n) {
          T& s = ssm(ch, n);
          s = alpha * s + beta * vst(h, p) * kst(h, n) + gamma * v * k[std::size_t(n)];
          acc += s * q[std::size_t(n)];
        }
        y(t, ch) = (acc + w.D(0, h) * v) * nn::silu(proj(t, o.z + ch));
      }
      for (Index n = 0; n < N; ++n) kst(h, n) = k[std::size_t(n)];
      for (Index p = 0; p < P; ++p) vst(h, p) = proj(t, o.x + h * P + p);
    }
  }
  if (final_state) *final_state = ssm;
  if (cache) *cache = {angle, ssm, kst, vst};
  return nn::linear<T>(y, w.out_proj_weight);
}

/// The complex semiseparable operator K over the d_inner channels (H heads of P channels, each head
/// its own B/C, N - S complex states per head): K[t, s] = exp(sum_{r=s+1..t} ADT_r) q~_t . k~_s for
/// s <= t. State m < S is the rotated pair (2m, 2m+1) with C = q_{2m} + i q_{2m+1},
/// B = k_{2m} - i k_{2m+1} and angle increment pi tanh(angles[m]) DT; state S + j is the unrotated
/// dimension 2S + j with angle 0. The decay ADT is broadcast to every state of the head.
template <Scalar T>
ComplexSemiseparable<T> mamba3_rotated_kernel(const mamba3_activations<T>& a) {
  a.check();
  const Index L = a.length(), H = a.nheads(), N = a.d_state(), S = a.num_rope_angles(), M = N - S;
  const Matrix<T> q = a.q(), k = a.k(), dphi = a.angle_increments();
  Matrix<T> rho(L, H * M), theta = Matrix<T>::Zero(L, H * M), Bre(L, H * M), Bim = Matrix<T>::Zero(L, H * M),
                           Cre(L, H * M), Cim = Matrix<T>::Zero(L, H * M);
  for (Index t = 0; t < L; ++t)
    for (Index h = 0; h < H; ++h) {
      for (Index m = 0; m < M; ++m) rho(t, h * M + m) = a.ADT(t, h);
      for (Index m = 0; m < S; ++m) {
        const Index j = h * M + m;
        theta(t, j) = dphi(t, h * S + m);
        Cre(t, j) = q(t, h * N + 2 * m);
        Cim(t, j) = q(t, h * N + 2 * m + 1);
        Bre(t, j) = k(t, h * N + 2 * m);
        Bim(t, j) = -k(t, h * N + 2 * m + 1);
      }
      for (Index m = S; m < M; ++m) {
        const Index j = h * M + m, n = m + S;
        Cre(t, j) = q(t, h * N + n);
        Bre(t, j) = k(t, h * N + n);
      }
    }
  return complex_semiseparable(std::move(rho), std::move(theta), std::move(Bre), std::move(Bim), std::move(Cre),
                               std::move(Cim), {.heads = H, .head_dim = a.headdim(), .groups = H, .state = M});
}

/// The per-head core (shared by the head's P channels), the SSM's token mixing without the D skip
/// and the gate: K diag(scale) - diag(shifted_gamma (q.k)), i.e. per head
///   core[t, s] = exp(sum_{r=s+1..t} ADT_r) (lam_s DT_s + (1 - lam_{s+1}) DT_{s+1}) q~_t . k~_s   (s < t)
///   core[t, t] = lam_t DT_t q_t . k_t.
template <Scalar T>
auto mamba3_core(const mamba3_activations<T>& a) {
  auto K = mamba3_rotated_kernel(a);
  const Index L = a.length(), H = a.nheads(), N = a.d_state(), P = a.headdim();
  const Matrix<T> q = a.q(), k = a.k(), sg = a.shifted_gamma();
  Matrix<T> corr(L, H);
  for (Index t = 0; t < L; ++t)
    for (Index h = 0; h < H; ++h) {
      T qk = 0;
      for (Index n = 0; n < N; ++n) qk += q(t, h * N + n) * k(t, h * N + n);
      corr(t, h) = -sg(t, h) * qk;
    }
  return std::move(K) * diagonal(mamba3_detail::per_channel(a.scale(), P)) + diagonal(mamba3_detail::per_channel(corr, P));
}

/// The exact decomposition from activations: H = diag(SiLU z) (core + diag(D)), x = acts.x, beta = 0;
/// out_proj_weight empty gives the inner output y (before out_proj).
template <Scalar T>
auto attention(const mamba3_activations<T>& a) {
  auto core = mamba3_core(a);  // checks a
  auto gate = diagonal(nn::map<T>(a.z, [](T v) { return nn::silu(v); }));
  auto Hop = std::move(gate) * (std::move(core) + diagonal(mamba3_detail::per_channel(a.D, a.headdim())));
  return make_decomposition<T>(a.x, std::move(Hop), Matrix<T>(Matrix<T>::Zero(a.length(), a.d_inner())), a.out_proj_weight);
}

/// The exact decomposition: mamba3_forward(w, u) == d.output().
template <Scalar T>
auto decompose(const mamba3_weights<T>& w, const Matrix<T>& u) { return attention(activations(w, u)); }

/// The exact decomposition (the named form of decompose).
template <Scalar T>
auto mamba3_decompose(const mamba3_weights<T>& w, const Matrix<T>& u) { return decompose(w, u); }

/// The SSM state after the last token, the kernel's SSM_State (nheads, headdim, d_state) flattened to
/// (nheads*headdim, d_state), row h*headdim + p:
///   SSM[hP+p, n] = sum_s exp(sum_{r=s+1..L-1} ADT_r[h]) scale_s[h] x_s[hP+p] k~_s[h, n]
/// (scale_{L-1} = lam DT: the last token's (1 - lam) half is added by the next step), in log space
/// (recurrent_state.hpp). The D skip is not part of the state.
template <Scalar T>
Matrix<T> final_state(const mamba3_activations<T>& a) {
  a.check();
  const Index L = a.length(), H = a.nheads(), P = a.headdim(), N = a.d_state();
  const Matrix<T> kr = a.rotated(a.k()), sc = a.scale();
  Matrix<T> ssm(H * P, N);
  for (Index h = 0; h < H; ++h)
    for (Index p = 0; p < P; ++p)
      for (Index n = 0; n < N; ++n)
        ssm(h * P + p, n) = decayed_sum<T>(
            L, [&](Index r) { return a.ADT(r, h); }, [&](Index s) { return sc(s, h) * a.x(s, h * P + p) * kr(s, h * N + n); });
  return ssm;
}

/// All four final states (mamba3_cache): the accumulated angle mod 2 pi (nheads, S), the SSM state
/// (final_state), the last token's rotated k (bias included) and its x. Zero states for L = 0.
template <Scalar T>
mamba3_cache<T> final_cache(const mamba3_activations<T>& a) {
  a.check();
  const Index L = a.length(), H = a.nheads(), P = a.headdim(), N = a.d_state(), S = a.num_rope_angles();
  mamba3_cache<T> c{Matrix<T>::Zero(H, S), final_state(a), Matrix<T>::Zero(H, N), Matrix<T>::Zero(H, P)};
  if (L == 0) return c;
  const Matrix<T> phi = a.angle_state(), kr = a.rotated(a.k());
  for (Index h = 0; h < H; ++h) {
    for (Index i = 0; i < S; ++i) c.angle_state(h, i) = phi(L - 1, h * S + i);
    for (Index n = 0; n < N; ++n) c.k_state(h, n) = kr(L - 1, h * N + n);
    for (Index p = 0; p < P; ++p) c.v_state(h, p) = a.x(L - 1, h * P + p);
  }
  return c;
}

}  // namespace iattn::models
