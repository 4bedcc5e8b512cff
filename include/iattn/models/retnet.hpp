// iattn/models/retnet.hpp: RetNet multi-scale retention (torchscale `MultiScaleRetention` with
// `RetNetRelPos`, parallel form) as implicit attention.
//
// Forward, heads h = 0..H-1 with key width dk = E/H and value width P = V/H:
//   q = q_proj(u), k = k_proj(u) / sqrt(dk), v = v_proj(u), g = g_proj(u)
//   qr, kr = theta_shift(q), theta_shift(k): pairs (2i, 2i+1) rotated by t * angle_i,
//            angle_i = 10000^(-i/(dk/2 - 1)) (xPos without its scale, as torchscale's RetNet)
//   gamma_h = 1 - 2^(-5-h)
//   R[t, s] = (qr_t . kr_s) gamma_h^(t-s) / sqrt(sum_{s'<=t} gamma_h^(t-s'))        (s <= t)
//   o_t    = sum_s R[t, s] v_s / max(|sum_s R[t, s]|, 1)                            (per head)
//   y      = RMSNorm_head(o) (eps, no weight; LayerNorm when centered)
//   out    = out_proj(SiLU(g) * y)
//
// Exact decomposition over the V value channels, inner input x = v:
//   H    = diag(SiLU g) N diag(rho) S(lambda = log gamma_h, B = kr, C = qr; H heads, P channels each)
//   beta = diag(SiLU g) offset(N)     (zero for the RMS norm)
// rho_t[h] = 1 / (sqrt(m_t) max(|r_t|, 1)) carries both retention normalisations: m_t the decay-mask
// row sum in closed form, r_t the row sum of the scores, taken from S itself (apply on ones). N is
// the per-head norm bound to its actual input. The rotation is inside B and C, so S stays real.
// paper_attention is Zimerman et al.'s eq. 24, G R with every per-head statistic folded into the
// one diagonal G; for the RMS norm it is the same matrix as H.
#pragma once

#include "../iattn.hpp"
#include "common.hpp"

#include <cstdint>
#include <string>

namespace iattn::models {

struct retnet_config {
  Index embed_dim = 64;   ///< E = d_model
  Index value_dim = 128;  ///< V (torchscale's decoder_value_embed_dim, typically 2 E)
  Index num_heads = 4;    ///< H; dk = E/H must be even (rotation pairs)
  double layernorm_eps = 1e-6;
  bool centered = false;  ///< false: RMSNorm (torchscale since 2023-10); true: the older LayerNorm
  Index key_dim() const { return embed_dim / num_heads; }
  Index head_dim() const { return value_dim / num_heads; }
};

/// torchscale `MultiScaleRetention` parameters (all projections bias-free, the norm weight-free).
template <Scalar T>
struct retnet_weights {
  retnet_config config;
  Matrix<T> q_proj_weight;    ///< (E, E)
  Matrix<T> k_proj_weight;    ///< (E, E)
  Matrix<T> v_proj_weight;    ///< (V, E)
  Matrix<T> g_proj_weight;    ///< (V, E)
  Matrix<T> out_proj_weight;  ///< (E, V)

  void check() const {
    const auto& c = config;
    using std::to_string;
    const char* m = "retnet";
    if (c.num_heads < 1 || c.embed_dim % c.num_heads != 0 || c.value_dim % c.num_heads != 0 || c.key_dim() % 2 != 0)
      detail::fail(m, "num_heads " + to_string(c.num_heads) + " must divide embed_dim = " + to_string(c.embed_dim) +
                          " (into an even key width) and value_dim = " + to_string(c.value_dim));
    const std::string E = to_string(c.embed_dim), V = to_string(c.value_dim);
    check_field(m, "q_proj_weight", q_proj_weight, c.embed_dim, c.embed_dim, "(embed_dim=" + E + ", embed_dim=" + E + ")");
    check_field(m, "k_proj_weight", k_proj_weight, c.embed_dim, c.embed_dim, "(embed_dim=" + E + ", embed_dim=" + E + ")");
    check_field(m, "v_proj_weight", v_proj_weight, c.value_dim, c.embed_dim, "(value_dim=" + V + ", embed_dim=" + E + ")");
    check_field(m, "g_proj_weight", g_proj_weight, c.value_dim, c.embed_dim, "(value_dim=" + V + ", embed_dim=" + E + ")");
    check_field(m, "out_proj_weight", out_proj_weight, c.embed_dim, c.value_dim, "(embed_dim=" + E + ", value_dim=" + V + ")");
  }
};

/// torchscale's initialisation: xavier_uniform with gain 2^-2.5 for q, k, v, g; gain 1 for out_proj.
template <Scalar T>
retnet_weights<T> retnet_init(const retnet_config& c, std::uint64_t seed = 0) {
  init::generator g(seed);
  retnet_weights<T> w;
  w.config = c;
  const double gain = std::pow(2.0, -2.5);
  w.q_proj_weight = init::xavier_uniform<T>(g, c.embed_dim, c.embed_dim, gain);
  w.k_proj_weight = init::xavier_uniform<T>(g, c.embed_dim, c.embed_dim, gain);
  w.v_proj_weight = init::xavier_uniform<T>(g, c.value_dim, c.embed_dim, gain);
  w.g_proj_weight = init::xavier_uniform<T>(g, c.value_dim, c.embed_dim, gain);
  w.out_proj_weight = init::xavier_uniform<T>(g, c.embed_dim, c.value_dim, 1.0);
  return w;
}

/// log gamma_h = log(1 - 2^(-5-h)).
inline double retnet_log_decay(Index h) { return std::log1p(-std::exp2(-5.0 - double(h))); }

template <Scalar T>
struct retnet_activations {
  Matrix<T> qr, kr, v, g;  // (L, E) rotated and scaled; (L, V); (L, V) before SiLU
};

template <Scalar T>
retnet_activations<T> retnet_project(const retnet_weights<T>& w, const Matrix<T>& u) {
  w.check();
  const auto& c = w.config;
  detail::require_shape(u.cols() == c.embed_dim, "retnet", "u", u.rows(), u.cols(), "(L, embed_dim=" + std::to_string(c.embed_dim) + ")");
  const Index L = u.rows(), H = c.num_heads, dk = c.key_dim(), half = dk / 2;
  retnet_activations<T> s;
  const Matrix<T> q = nn::linear<T>(u, w.q_proj_weight);
  const Matrix<T> k = nn::linear<T>(u, w.k_proj_weight) / std::sqrt(T(dk));
  s.v = nn::linear<T>(u, w.v_proj_weight);
  s.g = nn::linear<T>(u, w.g_proj_weight);
  s.qr.resize(L, c.embed_dim);
  s.kr.resize(L, c.embed_dim);
  for (Index i = 0; i < half; ++i) {
    const double angle = std::pow(10000.0, -(half > 1 ? double(i) / double(half - 1) : 0.0));
    for (Index t = 0; t < L; ++t) {
      const T cs = T(std::cos(double(t) * angle)), sn = T(std::sin(double(t) * angle));
      for (Index h = 0; h < H; ++h) {
        const Index a = h * dk + 2 * i, b = a + 1;
        s.qr(t, a) = q(t, a) * cs - q(t, b) * sn;
        s.qr(t, b) = q(t, b) * cs + q(t, a) * sn;
        s.kr(t, a) = k(t, a) * cs - k(t, b) * sn;
        s.kr(t, b) = k(t, b) * cs + k(t, a) * sn;
      }
    }
  }
  return s;
}

/// The block's forward (the oracle): the parallel form's normalisations, evaluated by the recurrence
/// S_t = gamma S_{t-1} + kr_t v_t^T, z_t = gamma z_t-1 + kr_t, m_t = gamma m_{t-1} + 1.
template <Scalar T>
Matrix<T> retnet_forward(const retnet_weights<T>& w, const Matrix<T>& u) {
  const auto s = retnet_project(w, u);
  const auto& c = w.config;
  const Index L = u.rows(), H = c.num_heads, dk = c.key_dim(), P = c.head_dim();
  Matrix<T> y(L, c.value_dim);
  for (Index h = 0; h < H; ++h) {
    const T gamma = T(1) - T(std::exp2(-5.0 - double(h)));
    Matrix<T> state = Matrix<T>::Zero(dk, P);
    Matrix<T> z = Matrix<T>::Zero(1, dk);
    T m = 0;
    for (Index t = 0; t < L; ++t) {
      state *= gamma;
      z *= gamma;
      m = gamma * m + T(1);
      for (Index i = 0; i < dk; ++i) {
        z(0, i) += s.kr(t, h * dk + i);
        for (Index p = 0; p < P; ++p) state(i, p) += s.kr(t, h * dk + i) * s.v(t, h * P + p);
      }
      T rowsum = 0;
      for (Index i = 0; i < dk; ++i) rowsum += s.qr(t, h * dk + i) * z(0, i);
      const T sq = std::sqrt(m);
      const T scale = T(1) / (sq * std::max(std::abs(rowsum / sq), T(1)));
      for (Index p = 0; p < P; ++p) {
        T acc = 0;
        for (Index i = 0; i < dk; ++i) acc += s.qr(t, h * dk + i) * state(i, p);
        y(t, h * P + p) = acc * scale;
      }
    }
  }
  nn::group_norm_rows<T>(y, H, c.layernorm_eps, c.centered);  // the per-head norm
  for (Index t = 0; t < L; ++t)
    for (Index j = 0; j < c.value_dim; ++j) y(t, j) *= nn::silu(s.g(t, j));
  return nn::linear<T>(y, w.out_proj_weight);
}

namespace retnet_detail {
/// The raw retention matrix sum_m qr_t[m] kr_s[m] gamma_h^(t-s) per head (no normalisation).
template <class T>
auto retention(const retnet_activations<T>& s, const retnet_config& c, Index L) {
  Matrix<T> lam(L, c.num_heads);
  for (Index h = 0; h < c.num_heads; ++h) lam.col(h).setConstant(T(retnet_log_decay(h)));
  return semiseparable(std::move(lam), Matrix<T>(s.kr), Matrix<T>(s.qr),
                       {.heads = c.num_heads, .head_dim = c.head_dim(), .groups = c.num_heads});
}
/// rho (L, V): 1 / (sqrt(m_t) max(|r_t / sqrt(m_t)|, 1)) per head, repeated over its P channels.
template <class T, class S>
Matrix<T> row_scales(const S& R, const retnet_config& c, Index L) {
  const Matrix<T> r = apply(R, Matrix<T>(Matrix<T>::Ones(L, c.value_dim)));  // score row sums
  Matrix<T> rho(L, c.value_dim);
  for (Index h = 0; h < c.num_heads; ++h) {
    const double lg = retnet_log_decay(h);
    for (Index t = 0; t < L; ++t) {
      const T sq = T(std::sqrt(std::expm1(double(t + 1) * lg) / std::expm1(lg)));  // sum_{j<=t} gamma^j
      const T v = T(1) / (sq * std::max(std::abs(r(t, h * c.head_dim()) / sq), T(1)));
      rho.row(t).segment(h * c.head_dim(), c.head_dim()).setConstant(v);
    }
  }
  return rho;
}
}  // namespace retnet_detail

/// The exact decomposition: retnet_forward(w, u) == d.output(), x = v.
template <Scalar T>
auto retnet_decompose(const retnet_weights<T>& w, const Matrix<T>& u) {
  using namespace retnet_detail;
  const auto s = retnet_project(w, u);
  const auto& c = w.config;
  const Index L = u.rows();
  const auto S = retention(s, c, L);
  auto R = diagonal(row_scales<T>(S, c, L)) * S;  // nodes are held by value, sharing S's owned coefficients
  const Matrix<T> normed_in = apply(R, s.v);
  const auto n = group_norm<T>(c.num_heads, {.eps = c.layernorm_eps, .centered = c.centered});
  const auto nb = n.bound_to(n.compute(normed_in.data(), L, c.value_dim));
  const Matrix<T> gate = nn::map<T>(s.g, [](T v) { return nn::silu(v); });
  Matrix<T> beta = gate.cwiseProduct(offset(nb));
  return make_decomposition<T>(s.v, diagonal(Matrix<T>(gate)) * nb * std::move(R), std::move(beta), w.out_proj_weight);
}

/// Zimerman et al.'s eq. 24, G R: the raw retention matrix R = (qr kr^T) .* gamma^(t-s) with the
/// gate, both retention normalisations and the norm's 1/sigma folded into the diagonal G.
template <Scalar T>
auto retnet_paper_attention(const retnet_weights<T>& w, const Matrix<T>& u) {
  using namespace retnet_detail;
  const auto s = retnet_project(w, u);
  const auto& c = w.config;
  const Index L = u.rows();
  const auto R = retention(s, c, L);
  Matrix<T> G = row_scales<T>(R, c, L);
  const Matrix<T> normed_in = apply(diagonal(Matrix<T>(G)) * R, s.v);
  const auto n = group_norm<T>(c.num_heads, {.eps = c.layernorm_eps, .centered = c.centered});
  const auto st = n.compute(normed_in.data(), L, c.value_dim);
  for (Index t = 0; t < L; ++t)
    for (Index j = 0; j < c.value_dim; ++j) G(t, j) *= st.inv_sigma(t, j / c.head_dim()) * nn::silu(s.g(t, j));
  return diagonal(std::move(G)) * R;
}

}  // namespace iattn::models
