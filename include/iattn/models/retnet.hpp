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
//
// From activations (docs/models.md): retnet_activations holds qr, kr, v, g and the per-head log-decays
// (and optionally out_proj_weight); attention(acts) is the decomposition, decompose(w, u) ==
// attention(activations(w, u)), retnet_paper_attention takes acts too, and final_state(acts) is
// torchscale's recurrent incremental_state (prev_key_value, scale).
#pragma once

#include "../iattn.hpp"
#include "common.hpp"
#include "recurrent_state.hpp"

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

/// One forward pass's activations, named as torchscale's `MultiScaleRetention.forward` names them (qr,
/// kr after `theta_shift`, k scaled by key_dim^-1/2 before it), plus the layer's per-head decays
/// (`RetNetRelPos.decay`): everything `attention(acts)` needs. The heads H come from decay (1, H).
/// Built by `activations(w, u)` or by hand.
template <Scalar T>
struct retnet_activations {
  Matrix<T> qr;               ///< (L, E)   rotated queries: the retention's C
  Matrix<T> kr;               ///< (L, E)   rotated, scaled keys: the retention's B
  Matrix<T> v;                ///< (L, V)   values: the inner input x
  Matrix<T> g;                ///< (L, V)   output gate before SiLU
  Matrix<T> decay;            ///< (1, H)   log gamma_h <= 0 (torchscale: log(1 - 2^(-5-h)))
  Matrix<T> out_proj_weight;  ///< (E_out, V) or empty (the decomposition stops before out_proj)
  double layernorm_eps = 1e-6;  ///< the per-head norm's eps
  bool centered = false;        ///< false: RMSNorm; true: LayerNorm (the older torchscale)

  Index length() const { return v.rows(); }
  Index heads() const { return decay.cols(); }
  Index key_dim() const { return qr.cols() / heads(); }
  Index head_dim() const { return v.cols() / heads(); }

  /// Throws std::invalid_argument naming the first field whose shape disagrees (L, V from v; E from
  /// qr; H from decay), or a decay that is positive or NaN.
  void check() const {
    using std::to_string;
    const char* m = "retnet_activations";
    detail::require_shape(decay.rows() == 1 && decay.cols() >= 1, m, "decay", decay.rows(), decay.cols(), "(1, num_heads) with num_heads >= 1");
    const Index L = length(), H = heads(), E = qr.cols(), V = v.cols();
    const std::string div = " divisible by num_heads=" + to_string(H);
    detail::require_shape(V >= 1 && V % H == 0, m, "v", v.rows(), v.cols(), "(L, V) with V" + div);
    detail::require_shape(qr.rows() == L && E >= 1 && E % H == 0, m, "qr", qr.rows(), qr.cols(), "(L=" + to_string(L) + ", E) with E" + div);
    check_field(m, "kr", kr, L, E, "(L=" + to_string(L) + ", E=" + to_string(E) + ")");
    check_field(m, "g", g, L, V, "(L=" + to_string(L) + ", V=" + to_string(V) + ")");
    for (Index h = 0; h < H; ++h)
      if (!(decay(0, h) <= T(0))) detail::fail(m, "decay[" + to_string(h) + "] is " + to_string(double(decay(0, h))) + " but must be <= 0 (log gamma)");
    if (out_proj_weight.size() != 0)
      detail::require_shape(out_proj_weight.cols() == V, m, "out_proj_weight", out_proj_weight.rows(), out_proj_weight.cols(), "(E, V=" + to_string(V) + ") or empty");
  }
};

/// The retention's recurrent state after the last token, as torchscale's `recurrent_forward` keeps it
/// in incremental_state: the value-major, scale-normalised key-value state and the decay-mask sum.
template <Scalar T>
struct retnet_state {
  Matrix<T> prev_key_value;  ///< (H*P, dk): (H, P, dk) flattened, sum_s gamma_h^(L-1-s) v_s[p] kr_s[i] / sqrt(scale_h)
  Matrix<T> scale;           ///< (1, H): sum_{j<L} gamma_h^j (0 for L = 0)
};

/// The activations of one forward pass of the layer on u (L, E), out_proj_weight included.
template <Scalar T>
retnet_activations<T> activations(const retnet_weights<T>& w, const Matrix<T>& u) {
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
  s.decay.resize(1, H);
  for (Index h = 0; h < H; ++h) s.decay(0, h) = T(retnet_log_decay(h));
  s.out_proj_weight = w.out_proj_weight;
  s.layernorm_eps = c.layernorm_eps;
  s.centered = c.centered;
  return s;
}

/// The block's forward (the oracle): the parallel form's normalisations, evaluated by the recurrence
/// S_t = gamma S_{t-1} + kr_t v_t^T, z_t = gamma z_t-1 + kr_t, m_t = gamma m_{t-1} + 1. final_state,
/// when given, receives (S^T / sqrt(m), m) after the last token in torchscale's layout.
template <Scalar T>
Matrix<T> retnet_forward(const retnet_weights<T>& w, const Matrix<T>& u, retnet_state<T>* final_state = nullptr) {
  const auto s = activations(w, u);
  const auto& c = w.config;
  const Index L = u.rows(), H = c.num_heads, dk = c.key_dim(), P = c.head_dim();
  Matrix<T> y(L, c.value_dim);
  if (final_state) {
    final_state->prev_key_value.resize(H * P, dk);
    final_state->scale.resize(1, H);
  }
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
    if (final_state) {
      final_state->scale(0, h) = m;
      final_state->prev_key_value.middleRows(h * P, P) = m > T(0) ? Matrix<T>(state.transpose() / std::sqrt(m)) : Matrix<T>(state.transpose());
    }
  }
  nn::group_norm_rows<T>(y, H, c.layernorm_eps, c.centered);  // the per-head norm
  for (Index t = 0; t < L; ++t)
    for (Index j = 0; j < c.value_dim; ++j) y(t, j) *= nn::silu(s.g(t, j));
  return nn::linear<T>(y, w.out_proj_weight);
}

namespace retnet_detail {
/// sum_{j<n} gamma^j for log gamma = lg <= 0: n for lg = 0, else expm1(n lg) / expm1(lg).
inline double mask_sum(Index n, double lg) { return lg == 0 ? double(n) : std::expm1(double(n) * lg) / std::expm1(lg); }
/// The raw retention matrix sum_m qr_t[m] kr_s[m] gamma_h^(t-s) per head (no normalisation).
template <class T>
auto retention(const retnet_activations<T>& s) {
  const Index L = s.length(), H = s.heads();
  Matrix<T> lam(L, H);
  for (Index h = 0; h < H; ++h) lam.col(h).setConstant(s.decay(0, h));
  return semiseparable(std::move(lam), s.kr, s.qr, {.heads = H, .head_dim = s.head_dim(), .groups = H});
}
/// rho (L, V): 1 / (sqrt(m_t) max(|r_t / sqrt(m_t)|, 1)) per head, repeated over its P channels.
template <class T, class S>
Matrix<T> row_scales(const S& R, const retnet_activations<T>& s) {
  const Index L = s.length(), V = s.v.cols(), P = s.head_dim();
  const Matrix<T> r = apply(R, Matrix<T>(Matrix<T>::Ones(L, V)));  // score row sums
  Matrix<T> rho(L, V);
  for (Index h = 0; h < s.heads(); ++h) {
    const double lg = double(s.decay(0, h));
    for (Index t = 0; t < L; ++t) {
      const T sq = T(std::sqrt(mask_sum(t + 1, lg)));  // sum_{j<=t} gamma^j
      const T v = T(1) / (sq * std::max(std::abs(r(t, h * P) / sq), T(1)));
      rho.row(t).segment(h * P, P).setConstant(v);
    }
  }
  return rho;
}
}  // namespace retnet_detail

/// The exact decomposition from activations (see the header comment); with out_proj_weight empty,
/// output() is the inner output SiLU(g) * Norm(R v).
template <Scalar T>
auto attention(const retnet_activations<T>& s) {
  using namespace retnet_detail;
  s.check();
  const Index L = s.length(), V = s.v.cols();
  const auto S = retention(s);
  auto R = diagonal(row_scales<T>(S, s)) * S;  // nodes are held by value, sharing S's owned coefficients
  const Matrix<T> normed_in = apply(R, s.v);
  const auto n = group_norm<T>(s.heads(), {.eps = s.layernorm_eps, .centered = s.centered});
  const auto nb = n.bound_to(n.compute(normed_in.data(), L, V));
  const Matrix<T> gate = nn::map<T>(s.g, [](T v) { return nn::silu(v); });
  Matrix<T> beta = gate.cwiseProduct(offset(nb));
  return make_decomposition<T>(s.v, diagonal(gate) * nb * std::move(R), std::move(beta), s.out_proj_weight);
}

/// The exact decomposition: retnet_forward(w, u) == d.output(), x = v.
template <Scalar T>
auto decompose(const retnet_weights<T>& w, const Matrix<T>& u) { return attention(activations(w, u)); }

/// The exact decomposition (the named form of decompose).
template <Scalar T>
auto retnet_decompose(const retnet_weights<T>& w, const Matrix<T>& u) { return decompose(w, u); }

/// Zimerman et al.'s eq. 24, G R: the raw retention matrix R = (qr kr^T) .* gamma^(t-s) with the
/// gate, both retention normalisations and the norm's 1/sigma folded into the diagonal G.
template <Scalar T>
auto retnet_paper_attention(const retnet_activations<T>& s) {
  using namespace retnet_detail;
  s.check();
  const Index L = s.length(), V = s.v.cols(), P = s.head_dim();
  const auto R = retention(s);
  Matrix<T> G = row_scales<T>(R, s);
  const Matrix<T> normed_in = apply(diagonal(G) * R, s.v);
  const auto n = group_norm<T>(s.heads(), {.eps = s.layernorm_eps, .centered = s.centered});
  const auto st = n.compute(normed_in.data(), L, V);
  for (Index t = 0; t < L; ++t)
    for (Index j = 0; j < V; ++j) G(t, j) *= st.inv_sigma(t, j / P) * nn::silu(s.g(t, j));
  return diagonal(std::move(G)) * R;
}
/// Eq. 24 for the layer on u (L, E): retnet_paper_attention(activations(w, u)).
template <Scalar T>
auto retnet_paper_attention(const retnet_weights<T>& w, const Matrix<T>& u) { return retnet_paper_attention(activations(w, u)); }

/// The recurrent state after the last token (retnet_state, torchscale's layout), in log space:
/// decayed sums of kr_s v_s^T with the constant log-decay (recurrent_state.hpp), then / sqrt(scale).
template <Scalar T>
retnet_state<T> final_state(const retnet_activations<T>& s) {
  s.check();
  const Index L = s.length(), H = s.heads(), dk = s.key_dim(), P = s.head_dim();
  retnet_state<T> st;
  st.prev_key_value.resize(H * P, dk);
  st.scale.resize(1, H);
  for (Index h = 0; h < H; ++h) {
    const T lg = s.decay(0, h);
    const T m = decayed_sum<T>(L, [&](Index) { return lg; }, [](Index) { return T(1); });
    const T inv = m > T(0) ? T(1) / std::sqrt(m) : T(1);
    st.scale(0, h) = m;
    for (Index p = 0; p < P; ++p)
      for (Index i = 0; i < dk; ++i)
        st.prev_key_value(h * P + p, i) =
            inv * decayed_sum<T>(L, [&](Index) { return lg; }, [&](Index r) { return s.v(r, h * P + p) * s.kr(r, h * dk + i); });
  }
  return st;
}

}  // namespace iattn::models
