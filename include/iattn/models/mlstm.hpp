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
//
// From activations (docs/models.md): mlstm_activations holds z, x_mlstm_conv_act, q, k, v, the gate
// pre-activations and the norm/skip parameters (and optionally proj_down_weight); attention(acts) is
// the decomposition, decompose(w, u) == attention(activations(w, u)), final_state(acts) the cell's
// (c_state, n_state, m_state).
#pragma once

#include "../iattn.hpp"
#include "common.hpp"

#include <cstdint>
#include <limits>
#include <string>
#include <vector>

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

/// One forward pass's activations, named as NX-AI's `mLSTMLayer.forward` / `mLSTMCell.forward` name
/// them, plus the layer parameters the decomposition reads: everything `attention(acts)` needs. The
/// cell heads NH come from igate_preact (L, NH); DH = I / NH. Built by `activations(w, u)` or by hand.
template <Scalar T>
struct mlstm_activations {
  Matrix<T> z;                          ///< (L, I)    proj_up's z half: the output gate before SiLU
  Matrix<T> x_mlstm_conv_act;           ///< (L, I)    SiLU(conv1d(x_mlstm)): the skip branch's input
  Matrix<T> q;                          ///< (L, I)    q_proj(x_mlstm_conv_act): the cell's C
  Matrix<T> k;                          ///< (L, I)    k_proj(x_mlstm_conv_act), unscaled (the cell divides by sqrt(DH))
  Matrix<T> v;                          ///< (L, I)    v_proj(x_mlstm): the inner input x
  Matrix<T> igate_preact;               ///< (L, NH)   input gate pre-activation i~
  Matrix<T> fgate_preact;               ///< (L, NH)   forget gate pre-activation f~ (the decay is logsigmoid(f~))
  Matrix<T> mlstm_cell_outnorm_weight;  ///< (1, I) or empty (0): the norm uses 1 + weight
  Matrix<T> learnable_skip;             ///< (1, I) or empty (no skip)
  Matrix<T> proj_down_weight;           ///< (d, I) or empty (the decomposition stops before proj_down)
  double norm_eps = 1e-5;               ///< the cell's MultiHeadLayerNorm eps
  double cell_eps = 1e-6;               ///< the backend's eps

  Index length() const { return v.rows(); }
  Index heads() const { return igate_preact.cols(); }
  Index head_dim() const { return v.cols() / heads(); }

  /// Throws std::invalid_argument naming the first field whose shape disagrees (L, I from v; NH from igate_preact).
  void check() const {
    using std::to_string;
    const char* m = "mlstm_activations";
    const Index L = length(), I = v.cols(), NH = heads();
    detail::require_shape(igate_preact.rows() == L && NH >= 1 && I >= 1 && I % NH == 0, m, "igate_preact", igate_preact.rows(), igate_preact.cols(),
                          "(L=" + to_string(L) + ", NH) with NH >= 1 dividing I=" + to_string(I));
    const std::string LI = "(L=" + to_string(L) + ", I=" + to_string(I) + ")", I1 = "(1, I=" + to_string(I) + ") or empty";
    check_field(m, "fgate_preact", fgate_preact, L, NH, "(L=" + to_string(L) + ", NH=" + to_string(NH) + ")");
    check_field(m, "z", z, L, I, LI);
    check_field(m, "x_mlstm_conv_act", x_mlstm_conv_act, L, I, LI);
    check_field(m, "q", q, L, I, LI);
    check_field(m, "k", k, L, I, LI);
    if (mlstm_cell_outnorm_weight.size() != 0) check_field(m, "mlstm_cell_outnorm_weight", mlstm_cell_outnorm_weight, 1, I, I1);
    if (learnable_skip.size() != 0) check_field(m, "learnable_skip", learnable_skip, 1, I, I1);
    if (proj_down_weight.size() != 0)
      detail::require_shape(proj_down_weight.cols() == I, m, "proj_down_weight", proj_down_weight.rows(), proj_down_weight.cols(), "(d, I=" + to_string(I) + ") or empty");
  }
};

/// The cell's stabilised state after the last token, as xLSTM's recurrent step keeps it (c_state,
/// n_state, m_state), from m_{-1} = -inf (the parallel form's stabiliser): c_state e^m_state and
/// n_state e^m_state are the unstabilised sums, independent of where the stabiliser started.
template <Scalar T>
struct mlstm_state {
  Matrix<T> c_state;  ///< (NH*DH, DH): (NH, DH, DH) flattened, sum_s exp(log D[L-1, s] - m) k_s v_s^T / sqrt(DH)
  Matrix<T> n_state;  ///< (NH, DH): (NH, DH, 1) flattened, sum_s exp(log D[L-1, s] - m) k_s / sqrt(DH)
  Matrix<T> m_state;  ///< (1, NH): m = max_s log D[L-1, s] (-inf for L = 0)
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

/// The activations of one forward pass of the layer on u (L, embedding_dim), proj_down_weight included.
template <Scalar T>
mlstm_activations<T> activations(const mlstm_weights<T>& w, const Matrix<T>& u) {
  w.check();
  const auto& c = w.config;
  detail::require_shape(u.cols() == c.embedding_dim, "mlstm", "u", u.rows(), u.cols(), "(L, embedding_dim=" + std::to_string(c.embedding_dim) + ")");
  const Index I = c.inner_dim(), L = u.rows();
  const Matrix<T> up = nn::linear<T>(u, w.proj_up_weight);
  const Matrix<T> xm = up.leftCols(I);
  mlstm_activations<T> s;
  s.z = up.rightCols(I);
  s.x_mlstm_conv_act = nn::map<T>(nn::causal_conv1d<T>(xm, w.conv1d_conv_weight, w.conv1d_conv_bias), [](T v) { return nn::silu(v); });
  s.q = mlstm_detail::headwise(s.x_mlstm_conv_act, w.q_proj_weight);
  s.k = mlstm_detail::headwise(s.x_mlstm_conv_act, w.k_proj_weight);
  s.v = mlstm_detail::headwise(xm, w.v_proj_weight);
  Matrix<T> qkv(L, 3 * I);
  qkv << s.q, s.k, s.v;
  s.igate_preact = nn::linear<T>(qkv, w.mlstm_cell_igate_weight, w.mlstm_cell_igate_bias);
  s.fgate_preact = nn::linear<T>(qkv, w.mlstm_cell_fgate_weight, w.mlstm_cell_fgate_bias);
  s.mlstm_cell_outnorm_weight = w.mlstm_cell_outnorm_weight;
  s.learnable_skip = w.learnable_skip;
  s.proj_down_weight = w.proj_down_weight;
  s.norm_eps = c.norm_eps;
  s.cell_eps = c.cell_eps;
  return s;
}

/// The cell's log forget gates logsigmoid(fgate_preact), (L, NH).
template <Scalar T>
Matrix<T> mlstm_log_fgate(const mlstm_activations<T>& s) { return nn::map<T>(s.fgate_preact, [](T v) { return nn::log_sigmoid(v); }); }

/// The cell's stabiliser m_t = max_{s<=t} log D[t, s], per head (L, NH), by m_t = max(m_{t-1} + log f_t, i_t).
template <Scalar T>
Matrix<T> mlstm_stabiliser(const mlstm_activations<T>& s) {
  const Matrix<T> lf = mlstm_log_fgate(s);
  Matrix<T> m(s.igate_preact.rows(), s.igate_preact.cols());
  for (Index h = 0; h < m.cols(); ++h) {
    T prev = -std::numeric_limits<T>::infinity();
    for (Index t = 0; t < m.rows(); ++t) m(t, h) = prev = std::max(prev + lf(t, h), s.igate_preact(t, h));
  }
  return m;
}

/// The layer's forward (the oracle): the cell by its stabilised recurrence. final_state, when given,
/// receives the cell's (c_state, n_state, m_state) after the last token.
template <Scalar T>
Matrix<T> mlstm_forward(const mlstm_weights<T>& w, const Matrix<T>& u, mlstm_state<T>* final_state = nullptr) {
  const auto s = activations(w, u);
  const auto& c = w.config;
  const Index L = u.rows(), I = c.inner_dim(), NH = c.num_heads, DH = c.head_dim();
  const T inv_sqrt = T(1) / std::sqrt(T(DH));
  Matrix<T> h(L, I);
  if (final_state) {
    final_state->c_state.resize(NH * DH, DH);
    final_state->n_state.resize(NH, DH);
    final_state->m_state.resize(1, NH);
  }
  for (Index hd = 0; hd < NH; ++hd) {
    Matrix<T> C = Matrix<T>::Zero(DH, DH), n = Matrix<T>::Zero(DH, 1);
    T m = -std::numeric_limits<T>::infinity();
    for (Index t = 0; t < L; ++t) {
      const T lf = nn::log_sigmoid(s.fgate_preact(t, hd));
      const T m_new = std::max(lf + m, s.igate_preact(t, hd));
      const T fg = std::exp(lf + m - m_new), ig = std::exp(s.igate_preact(t, hd) - m_new);
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
    if (final_state) {
      final_state->c_state.middleRows(hd * DH, DH) = C;
      final_state->n_state.row(hd) = n.transpose();
      final_state->m_state(0, hd) = m;
    }
  }
  const Matrix<T> norm_w = (w.mlstm_cell_outnorm_weight.array() + T(1)).matrix();
  nn::group_norm_rows<T>(h, NH, c.norm_eps, true, norm_w);
  for (Index t = 0; t < L; ++t)
    for (Index j = 0; j < I; ++j) h(t, j) = (h(t, j) + w.learnable_skip(0, j) * s.x_mlstm_conv_act(t, j)) * nn::silu(s.z(t, j));
  return nn::linear<T>(h, w.proj_down_weight);
}

/// The cell's normalised matrix diag(rho) S: h~ = apply(mlstm_cell_attention(acts), v).
template <Scalar T>
auto mlstm_cell_attention(const mlstm_activations<T>& s) {
  s.check();
  const Index L = s.length(), I = s.v.cols(), NH = s.heads(), DH = s.head_dim();
  const Matrix<T> imax = L > 0 ? Matrix<T>(s.igate_preact.colwise().maxCoeff()) : Matrix<T>(Matrix<T>::Zero(1, NH));
  Matrix<T> B(L, I);
  for (Index t = 0; t < L; ++t)
    for (Index j = 0; j < I; ++j) B(t, j) = s.k(t, j) * std::exp(s.igate_preact(t, j / DH) - imax(0, j / DH)) / std::sqrt(T(DH));
  auto S = semiseparable(mlstm_log_fgate(s), std::move(B), s.q, {.heads = NH, .head_dim = DH, .groups = NH});
  const Matrix<T> r = apply(S, Matrix<T>(Matrix<T>::Ones(L, I)));
  const Matrix<T> m = mlstm_stabiliser(s);
  Matrix<T> rho(L, I);
  for (Index t = 0; t < L; ++t)
    for (Index j = 0; j < I; ++j) {
      const Index h = j / DH;
      const T e = std::exp(imax(0, h) - m(t, h));
      rho(t, j) = e / (std::max(e * std::abs(r(t, j)), std::exp(-m(t, h))) + T(s.cell_eps));
    }
  return diagonal(std::move(rho)) * std::move(S);
}
/// The cell's matrix for the layer on u (L, embedding_dim): mlstm_cell_attention(activations(w, u)).
template <Scalar T>
auto mlstm_cell_attention(const mlstm_weights<T>& w, const Matrix<T>& u) { return mlstm_cell_attention(activations(w, u)); }

/// The exact decomposition from activations (see the header comment); with proj_down_weight empty,
/// output() is the inner output (Norm(h~) + skip * x_mlstm_conv_act) * SiLU(z).
template <Scalar T>
auto attention(const mlstm_activations<T>& s) {
  s.check();
  const Index L = s.length(), I = s.v.cols();
  auto A = mlstm_cell_attention(s);
  const Matrix<T> h = apply(A, s.v);
  const Matrix<T> norm_w = s.mlstm_cell_outnorm_weight.size() ? Matrix<T>((s.mlstm_cell_outnorm_weight.array() + T(1)).matrix())
                                                              : Matrix<T>(Matrix<T>::Ones(1, I));
  const auto n = group_norm(s.heads(), norm_w, {.eps = s.norm_eps, .centered = true});
  const auto nb = n.bound_to(n.compute(h.data(), L, I));
  const Matrix<T> gate = nn::map<T>(s.z, [](T v) { return nn::silu(v); });
  Matrix<T> shift = offset(nb);
  if (s.learnable_skip.size() != 0)
    for (Index t = 0; t < L; ++t)
      for (Index j = 0; j < I; ++j) shift(t, j) += s.learnable_skip(0, j) * s.x_mlstm_conv_act(t, j);
  Matrix<T> beta = gate.cwiseProduct(shift);
  return make_decomposition<T>(s.v, diagonal(gate) * nb * std::move(A), std::move(beta), s.proj_down_weight);
}

/// The exact decomposition: mlstm_forward(w, u) == d.output(), x = v.
template <Scalar T>
auto decompose(const mlstm_weights<T>& w, const Matrix<T>& u) { return attention(activations(w, u)); }

/// The exact decomposition (the named form of decompose).
template <Scalar T>
auto mlstm_decompose(const mlstm_weights<T>& w, const Matrix<T>& u) { return decompose(w, u); }

/// The cell's state after the last token (mlstm_state), in log space: log D[L-1, s] = sum_{r>s}
/// logsigmoid(f~_r) + i~_s by suffix sums (<= 0 increments), m its maximum, weights exp(log D - m) <= 1.
template <Scalar T>
mlstm_state<T> final_state(const mlstm_activations<T>& s) {
  s.check();
  const Index L = s.length(), NH = s.heads(), DH = s.head_dim();
  const Matrix<T> lf = mlstm_log_fgate(s);
  const T inv_sqrt = T(1) / std::sqrt(T(DH));
  mlstm_state<T> st{Matrix<T>::Zero(NH * DH, DH), Matrix<T>::Zero(NH, DH), Matrix<T>::Constant(1, NH, -std::numeric_limits<T>::infinity())};
  std::vector<T> logD(static_cast<std::size_t>(L));
  for (Index h = 0; h < NH; ++h) {
    T F = 0, m = -std::numeric_limits<T>::infinity();
    for (Index r = L - 1; r >= 0; --r) {  // F = sum_{k=r+1..L-1} logsigmoid(f~_k)
      logD[std::size_t(r)] = F + s.igate_preact(r, h);
      m = std::max(m, logD[std::size_t(r)]);
      F += lf(r, h);
    }
    st.m_state(0, h) = m;
    for (Index r = 0; r < L; ++r) {
      const T e = std::exp(logD[std::size_t(r)] - m) * inv_sqrt;
      for (Index i = 0; i < DH; ++i) {
        const T ki = e * s.k(r, h * DH + i);
        st.n_state(h, i) += ki;
        for (Index j = 0; j < DH; ++j) st.c_state(h * DH + i, j) += ki * s.v(r, h * DH + j);
      }
    }
  }
  return st;
}

}  // namespace iattn::models
