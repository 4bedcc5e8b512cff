// iattn/models/mlstm.hpp: the xLSTM mLSTM layer (NX-AI's `mLSTMLayer` with its `mLSTMCell`,
// parallel_stabilized_simple backend) as implicit attention.
//
// Forward, inner width I, NH cell heads of width DH = I/NH, blocks of 4 for the q/k/v projections:
//   [xm, z] = proj_up(u);  a = SiLU(conv1d(xm) + conv1d_bias)             (depthwise causal, width 4)
//   q = q_proj(a), k = k_proj(a), v = v_proj(xm)                         (block-diagonal, 4x4 blocks)
//   i~, f~ = igate([q, k, v]), fgate([q, k, v])                          (one value per head and token)
//   log D[t, s] = sum_{r=s+1..t} logsigmoid(f~_r) + i~_s (s <= t),  m_t = max_s log D[t, s]
//   C[t, s] = (q_t . k_s / sqrt(DH)) exp(log D[t, s] - m_t);  n_t = max(|sum_s C[t, s]|, exp(-m_t))
//   h~_t = sum_s C[t, s] v_s / (n_t + 1e-6);  h = (GroupNorm_NH(h~) + learnable_skip * a) * SiLU(z)
//   out = proj_down(h)
// The oracle evaluates the cell by its recurrent form with the running stabiliser m_t (m_{-1} = -inf),
// which is the parallel form's row maximum exactly.
//
// Exact decomposition over the I channels, inner input x = v:
//   H    = diag(SiLU z) N diag(rho) S(lambda = logsigmoid f~, B = k exp(i~ - i~max) / sqrt(DH), C = q)
//   beta = SiLU(z) * (offset(N) + learnable_skip * a)
// with rho_t = e_t / (max(e_t |r_t|, exp(-m_t)) + 1e-6), e_t = exp(i~max - m_t), r_t the row sums of S
// (from S itself), i~max each head's largest input gate (the shift keeps every B exponent <= 0).
// v mixes the channels of xm in blocks, so the per-channel operator acts on v; the skip branch reads
// a = SiLU(conv(xm)) and is carried exactly in beta. In float, input gates more than ~87 below their
// head's maximum underflow (as RWKV-4's keys do).
#pragma once

#include "../iattn.hpp"
#include "common.hpp"

#include <cstdint>
#include <limits>
#include <string>

namespace iattn::models {

struct mlstm_config {
  Index embedding_dim = 32;
  double proj_factor = 2.0;
  Index round_proj_up_to_multiple_of = 64;
  Index num_heads = 4;            ///< NH, the cell's heads
  Index qkv_proj_blocksize = 4;
  Index conv1d_kernel_size = 4;
  double norm_eps = 1e-5;         ///< the cell's MultiHeadLayerNorm
  double cell_eps = 1e-6;         ///< the backend's eps
  /// I: proj_factor * embedding_dim rounded up to a multiple of round_proj_up_to_multiple_of.
  Index inner_dim() const {
    const auto m = round_proj_up_to_multiple_of;
    const auto raw = static_cast<Index>(std::ceil(proj_factor * double(embedding_dim)));
    return m > 0 ? (raw + m - 1) / m * m : raw;
  }
  Index head_dim() const { return inner_dim() / num_heads; }
  Index proj_blocks() const { return inner_dim() / qkv_proj_blocksize; }
};

/// NX-AI `mLSTMLayer` parameters (bias = False, the default), '.' written '_'. The headwise q/k/v
/// weights (blocks, 4, 4) are stored flattened as (I, 4): row b*4 + o, column d holds w[b, o, d].
template <Scalar T>
struct mlstm_weights {
  mlstm_config config;
  Matrix<T> proj_up_weight;                ///< (2I, d)
  Matrix<T> conv1d_conv_weight;            ///< (I, K)   PyTorch (I, 1, K)
  Matrix<T> conv1d_conv_bias;              ///< (1, I)
  Matrix<T> q_proj_weight;                 ///< (I, blocksize)
  Matrix<T> k_proj_weight;                 ///< (I, blocksize)
  Matrix<T> v_proj_weight;                 ///< (I, blocksize)
  Matrix<T> mlstm_cell_igate_weight;       ///< (NH, 3I)
  Matrix<T> mlstm_cell_igate_bias;         ///< (1, NH)
  Matrix<T> mlstm_cell_fgate_weight;       ///< (NH, 3I)
  Matrix<T> mlstm_cell_fgate_bias;         ///< (1, NH)
  Matrix<T> mlstm_cell_outnorm_weight;     ///< (1, I), used as 1 + weight (residual_weight)
  Matrix<T> learnable_skip;                ///< (1, I)
  Matrix<T> proj_down_weight;              ///< (d, I)

  void check() const {
    const auto& c = config;
    using std::to_string;
    const char* m = "mlstm";
    const Index I = c.inner_dim(), d = c.embedding_dim, NH = c.num_heads, bs = c.qkv_proj_blocksize;
    if (NH < 1 || I % NH != 0 || bs < 1 || I % bs != 0)
      detail::fail(m, "num_heads " + to_string(NH) + " and qkv_proj_blocksize " + to_string(bs) + " must divide the inner dim " + to_string(I));
    const std::string sI = to_string(I), sd = to_string(d), i1 = "(1, inner=" + sI + ")", ib = "(inner=" + sI + ", qkv_proj_blocksize=" + to_string(bs) + ")";
    check_field(m, "proj_up_weight", proj_up_weight, 2 * I, d, "(2*inner=" + to_string(2 * I) + ", embedding_dim=" + sd + ")");
    check_field(m, "conv1d_conv_weight", conv1d_conv_weight, I, c.conv1d_kernel_size, "(inner=" + sI + ", conv1d_kernel_size=" + to_string(c.conv1d_kernel_size) + ")");
    check_field(m, "conv1d_conv_bias", conv1d_conv_bias, 1, I, i1);
    check_field(m, "q_proj_weight", q_proj_weight, I, bs, ib);
    check_field(m, "k_proj_weight", k_proj_weight, I, bs, ib);
    check_field(m, "v_proj_weight", v_proj_weight, I, bs, ib);
    const std::string g3 = "(num_heads=" + to_string(NH) + ", 3*inner=" + to_string(3 * I) + ")", h1 = "(1, num_heads=" + to_string(NH) + ")";
    check_field(m, "mlstm_cell_igate_weight", mlstm_cell_igate_weight, NH, 3 * I, g3);
    check_field(m, "mlstm_cell_igate_bias", mlstm_cell_igate_bias, 1, NH, h1);
    check_field(m, "mlstm_cell_fgate_weight", mlstm_cell_fgate_weight, NH, 3 * I, g3);
    check_field(m, "mlstm_cell_fgate_bias", mlstm_cell_fgate_bias, 1, NH, h1);
    check_field(m, "mlstm_cell_outnorm_weight", mlstm_cell_outnorm_weight, 1, I, i1);
    check_field(m, "learnable_skip", learnable_skip, 1, I, i1);
    check_field(m, "proj_down_weight", proj_down_weight, d, I, "(embedding_dim=" + sd + ", inner=" + sI + ")");
  }
};

/// xLSTM's initialisation: small_init N(0, sqrt(2/(5d))) for proj_up and q/k/v, wang_init
/// N(0, 2/sqrt(d)) for proj_down, forget-gate bias linspace(3, 6), input-gate bias N(0, 0.1), norm
/// weight 0 (effective 1), skip 1, PyTorch's default conv init. The reference zeroes the gate weights,
/// which makes both gates data-independent at step 0; we draw them from small_init instead so that
/// the data dependence is there to test (docs/decisions.md).
template <Scalar T>
mlstm_weights<T> mlstm_init(const mlstm_config& c, std::uint64_t seed = 0) {
  init::generator g(seed);
  mlstm_weights<T> w;
  w.config = c;
  const Index I = c.inner_dim(), d = c.embedding_dim, NH = c.num_heads, bs = c.qkv_proj_blocksize, K = c.conv1d_kernel_size;
  const double small = std::sqrt(2.0 / (5.0 * double(d)));
  w.proj_up_weight = init::normal<T>(g, 2 * I, d, small);
  w.conv1d_conv_weight = init::torch_default<T>(g, I, K, K);
  w.conv1d_conv_bias = init::torch_default<T>(g, 1, I, K);
  w.q_proj_weight = init::normal<T>(g, I, bs, small);
  w.k_proj_weight = init::normal<T>(g, I, bs, small);
  w.v_proj_weight = init::normal<T>(g, I, bs, small);
  w.mlstm_cell_igate_weight = init::normal<T>(g, NH, 3 * I, small);
  w.mlstm_cell_igate_bias = init::normal<T>(g, 1, NH, 0.1);
  w.mlstm_cell_fgate_weight = init::normal<T>(g, NH, 3 * I, small);
  w.mlstm_cell_fgate_bias.resize(1, NH);
  for (Index h = 0; h < NH; ++h) w.mlstm_cell_fgate_bias(0, h) = T(NH > 1 ? 3.0 + 3.0 * double(h) / double(NH - 1) : 3.0);
  w.mlstm_cell_outnorm_weight = Matrix<T>::Zero(1, I);
  w.learnable_skip = Matrix<T>::Ones(1, I);
  w.proj_down_weight = init::normal<T>(g, d, I, 2.0 / std::sqrt(double(d)));
  return w;
}

template <Scalar T>
struct mlstm_activations {
  Matrix<T> z, a, q, k, v;    // (L, I): z before SiLU, a = SiLU(conv), q, k (unscaled), v
  Matrix<T> igate, log_fgate;  // (L, NH): i~ and logsigmoid(f~)
};

namespace mlstm_detail {
/// LinearHeadwiseExpand: y[b*bs + o] = sum_d w[b*bs + o, d] x[b*bs + d].
template <class T>
Matrix<T> headwise(const Matrix<T>& X, const Matrix<T>& W) {
  const Index bs = W.cols();
  Matrix<T> Y = Matrix<T>::Zero(X.rows(), X.cols());
  for (Index t = 0; t < X.rows(); ++t)
    for (Index r = 0; r < X.cols(); ++r) {
      const Index b = r / bs;
      for (Index dd = 0; dd < bs; ++dd) Y(t, r) += W(r, dd) * X(t, b * bs + dd);
    }
  return Y;
}
}  // namespace mlstm_detail

template <Scalar T>
mlstm_activations<T> mlstm_project(const mlstm_weights<T>& w, const Matrix<T>& u) {
  w.check();
  const auto& c = w.config;
  detail::require_shape(u.cols() == c.embedding_dim, "mlstm", "u", u.rows(), u.cols(), "(L, embedding_dim=" + std::to_string(c.embedding_dim) + ")");
  const Index I = c.inner_dim(), L = u.rows();
  const Matrix<T> up = nn::linear<T>(u, w.proj_up_weight);
  const Matrix<T> xm = up.leftCols(I);
  mlstm_activations<T> s;
  s.z = up.rightCols(I);
  s.a = nn::map<T>(nn::causal_conv1d<T>(xm, w.conv1d_conv_weight, w.conv1d_conv_bias), [](T v) { return nn::silu(v); });
  s.q = mlstm_detail::headwise(s.a, w.q_proj_weight);
  s.k = mlstm_detail::headwise(s.a, w.k_proj_weight);
  s.v = mlstm_detail::headwise(xm, w.v_proj_weight);
  Matrix<T> qkv(L, 3 * I);
  qkv << s.q, s.k, s.v;
  s.igate = nn::linear<T>(qkv, w.mlstm_cell_igate_weight, w.mlstm_cell_igate_bias);
  s.log_fgate = nn::map<T>(nn::linear<T>(qkv, w.mlstm_cell_fgate_weight, w.mlstm_cell_fgate_bias), [](T v) { return nn::log_sigmoid(v); });
  return s;
}

/// The cell's stabiliser m_t = max_{s<=t} log D[t, s], per head (L, NH), by m_t = max(m_{t-1} + log f_t, i_t).
template <Scalar T>
Matrix<T> mlstm_stabiliser(const mlstm_activations<T>& s) {
  Matrix<T> m(s.igate.rows(), s.igate.cols());
  for (Index h = 0; h < m.cols(); ++h) {
    T prev = -std::numeric_limits<T>::infinity();
    for (Index t = 0; t < m.rows(); ++t) m(t, h) = prev = std::max(prev + s.log_fgate(t, h), s.igate(t, h));
  }
  return m;
}

/// The layer's forward (the oracle): the cell by its stabilised recurrence.
template <Scalar T>
Matrix<T> mlstm_forward(const mlstm_weights<T>& w, const Matrix<T>& u) {
  const auto s = mlstm_project(w, u);
  const auto& c = w.config;
  const Index L = u.rows(), I = c.inner_dim(), NH = c.num_heads, DH = c.head_dim();
  const T inv_sqrt = T(1) / std::sqrt(T(DH));
  Matrix<T> h(L, I);
  for (Index hd = 0; hd < NH; ++hd) {
    Matrix<T> C = Matrix<T>::Zero(DH, DH), n = Matrix<T>::Zero(DH, 1);
    T m = -std::numeric_limits<T>::infinity();
    for (Index t = 0; t < L; ++t) {
      const T m_new = std::max(s.log_fgate(t, hd) + m, s.igate(t, hd));
      const T fg = std::exp(s.log_fgate(t, hd) + m - m_new), ig = std::exp(s.igate(t, hd) - m_new);
      for (Index i = 0; i < DH; ++i) {
        const T ki = s.k(t, hd * DH + i) * inv_sqrt;
        n(i, 0) = fg * n(i, 0) + ig * ki;
        for (Index j = 0; j < DH; ++j) C(i, j) = fg * C(i, j) + ig * ki * s.v(t, hd * DH + j);
      }
      m = m_new;
      T qn = 0;
      for (Index i = 0; i < DH; ++i) qn += s.q(t, hd * DH + i) * n(i, 0);
      const T den = std::max(std::abs(qn), std::exp(-m)) + T(c.cell_eps);
      for (Index j = 0; j < DH; ++j) {
        T num = 0;
        for (Index i = 0; i < DH; ++i) num += s.q(t, hd * DH + i) * C(i, j);
        h(t, hd * DH + j) = num / den;
      }
    }
  }
  const Matrix<T> norm_w = (w.mlstm_cell_outnorm_weight.array() + T(1)).matrix();
  nn::group_norm_rows<T>(h, NH, c.norm_eps, true, norm_w);
  for (Index t = 0; t < L; ++t)
    for (Index j = 0; j < I; ++j) h(t, j) = (h(t, j) + w.learnable_skip(0, j) * s.a(t, j)) * nn::silu(s.z(t, j));
  return nn::linear<T>(h, w.proj_down_weight);
}

/// The cell's normalised matrix diag(rho) S: h~ = apply(mlstm_cell_attention(...), v).
template <Scalar T>
auto mlstm_cell_attention(const mlstm_activations<T>& s, const mlstm_config& c) {
  const Index L = s.q.rows(), I = c.inner_dim(), NH = c.num_heads, DH = c.head_dim();
  const Matrix<T> imax = L > 0 ? Matrix<T>(s.igate.colwise().maxCoeff()) : Matrix<T>(Matrix<T>::Zero(1, NH));
  Matrix<T> B(L, I);
  for (Index t = 0; t < L; ++t)
    for (Index j = 0; j < I; ++j) B(t, j) = s.k(t, j) * std::exp(s.igate(t, j / DH) - imax(0, j / DH)) / std::sqrt(T(DH));
  auto S = semiseparable(Matrix<T>(s.log_fgate), std::move(B), Matrix<T>(s.q), {.heads = NH, .head_dim = DH, .groups = NH});
  const Matrix<T> r = apply(S, Matrix<T>(Matrix<T>::Ones(L, I)));
  const Matrix<T> m = mlstm_stabiliser(s);
  Matrix<T> rho(L, I);
  for (Index t = 0; t < L; ++t)
    for (Index j = 0; j < I; ++j) {
      const Index h = j / DH;
      const T e = std::exp(imax(0, h) - m(t, h));
      rho(t, j) = e / (std::max(e * std::abs(r(t, j)), std::exp(-m(t, h))) + T(c.cell_eps));
    }
  return diagonal(std::move(rho)) * std::move(S);
}

/// The exact decomposition: mlstm_forward(w, u) == d.output(), x = v.
template <Scalar T>
auto mlstm_decompose(const mlstm_weights<T>& w, const Matrix<T>& u) {
  const auto s = mlstm_project(w, u);
  const auto& c = w.config;
  const Index L = u.rows(), I = c.inner_dim();
  auto A = mlstm_cell_attention(s, c);
  const Matrix<T> h = apply(A, s.v);
  const auto n = group_norm(c.num_heads, Matrix<T>((w.mlstm_cell_outnorm_weight.array() + T(1)).matrix()), {.eps = c.norm_eps, .centered = true});
  const auto nb = n.bound_to(n.compute(h.data(), L, I));
  const Matrix<T> gate = nn::map<T>(s.z, [](T v) { return nn::silu(v); });
  Matrix<T> shift = offset(nb);
  for (Index t = 0; t < L; ++t)
    for (Index j = 0; j < I; ++j) shift(t, j) += w.learnable_skip(0, j) * s.a(t, j);
  Matrix<T> beta = gate.cwiseProduct(shift);
  return make_decomposition<T>(s.v, diagonal(Matrix<T>(gate)) * nb * std::move(A), std::move(beta), w.proj_down_weight);
}

}  // namespace iattn::models
