// iattn/models/vision_mamba.hpp: the bidirectional Vision Mamba block (Vim's `Mamba` with
// bimamba_type = "v2") as implicit attention: a forward and a backward selective scan over the same
// tokens, sharing in_proj and out_proj.
//
// Forward, with J the token reversal and y(.) mamba's inner forward (conv, S6, D skip, SiLU(z) gate):
//   out = out_proj(s (y_fwd(u) + J y_bwd(J u))),   s = 1/2 when if_devide_out, else 1
// The backward branch has its own conv1d_b, x_proj_b, dt_proj_b, A_b_log and D_b. A class token,
// when the model uses one, is an ordinary row of u; Vim puts it in the middle (vim_cls_position).
//
// Exact decomposition over d_inner channels, inner input x = in_proj's x part:
//   H    = s (H_fwd + flip(H_bwd)),   beta = s (beta_fwd + J beta_bwd)
// with (H, beta)_fwd and _bwd the exact Mamba decompositions of the two branches (mamba.hpp); the
// backward one is taken on J u, whose inner input is J x. H is not causal: its strictly lower part is
// s H_fwd's, its strictly upper part s flip(H_bwd)'s, its diagonal the sum.
#pragma once

#include "mamba.hpp"

#include <stdexcept>
#include <string>

namespace iattn::models {

struct vision_mamba_config {
  mamba_config mamba;         ///< the sizes, shared by both branches
  bool if_devide_out = true;  ///< Vim's spelling; halves the sum of the two directions
};

/// Vim `Mamba` (v2) parameters: mamba_ssm's forward fields (inherited, same names) and the backward
/// branch's, '.' written '_'.
template <Scalar T>
struct vision_mamba_weights {
  vision_mamba_config config;
  mamba_weights<T> fwd;        ///< in_proj, conv1d, x_proj, dt_proj, A_log, D, out_proj
  Matrix<T> conv1d_b_weight;   ///< (d_inner, d_conv)
  Matrix<T> conv1d_b_bias;     ///< (1, d_inner)
  Matrix<T> x_proj_b_weight;   ///< (dt_rank + 2*d_state, d_inner)
  Matrix<T> dt_proj_b_weight;  ///< (d_inner, dt_rank)
  Matrix<T> dt_proj_b_bias;    ///< (1, d_inner)
  Matrix<T> A_b_log;           ///< (d_inner, d_state)
  Matrix<T> D_b;               ///< (1, d_inner)

  /// The backward branch as a Mamba block: the _b fields with the shared in_proj and out_proj.
  mamba_weights<T> bwd() const {
    mamba_weights<T> b = fwd;
    b.conv1d_weight = conv1d_b_weight;
    b.conv1d_bias = conv1d_b_bias;
    b.x_proj_weight = x_proj_b_weight;
    b.dt_proj_weight = dt_proj_b_weight;
    b.dt_proj_bias = dt_proj_b_bias;
    b.A_log = A_b_log;
    b.D = D_b;
    return b;
  }
  void check() const {
    const auto &a = config.mamba, &b = fwd.config;
    if (a.d_model != b.d_model || a.d_state != b.d_state || a.d_conv != b.d_conv || a.expand != b.expand || a.rank() != b.rank())
      detail::fail("vision_mamba", "config.mamba and fwd.config disagree on the sizes");
    fwd.check();
    try {
      bwd().check();
    } catch (const std::invalid_argument& e) {  // say that it is the backward branch's field
      throw std::invalid_argument(std::string("vision_mamba backward branch (the field's _b twin): ") + e.what());
    }
  }
};

/// Vim's initialisation: both branches as mamba_ssm's (mamba_init), drawn independently.
template <Scalar T>
vision_mamba_weights<T> vision_mamba_init(const vision_mamba_config& c, std::uint64_t seed = 0) {
  vision_mamba_weights<T> w;
  w.config = c;
  w.fwd = mamba_init<T>(c.mamba, seed);
  const auto b = mamba_init<T>(c.mamba, seed + 0x9e3779b97f4a7c15ull);
  w.conv1d_b_weight = b.conv1d_weight;
  w.conv1d_b_bias = b.conv1d_bias;
  w.x_proj_b_weight = b.x_proj_weight;
  w.dt_proj_b_weight = b.dt_proj_weight;
  w.dt_proj_b_bias = b.dt_proj_bias;
  w.A_b_log = b.A_log;
  w.D_b = b.D;
  return w;
}

/// Where Vim's middle class token goes among M patch tokens: index M / 2.
inline Index vim_cls_position(Index num_patches) { return num_patches / 2; }

/// The patch tokens (M, d) with a class token row (1, d) inserted at `position` (0..M).
template <Scalar T>
Matrix<T> insert_token(const Matrix<T>& tokens, const Matrix<T>& token, Index position) {
  detail::require_shape(token.rows() == 1 && token.cols() == tokens.cols(), "insert_token", "token", token.rows(), token.cols(),
                        "(1, " + std::to_string(tokens.cols()) + ")");
  if (position < 0 || position > tokens.rows())
    detail::fail("insert_token", "position " + std::to_string(position) + " must lie in [0, " + std::to_string(tokens.rows()) + "]");
  Matrix<T> out(tokens.rows() + 1, tokens.cols());
  out.topRows(position) = tokens.topRows(position);
  out.row(position) = token;
  out.bottomRows(tokens.rows() - position) = tokens.bottomRows(tokens.rows() - position);
  return out;
}

namespace vim_detail {
template <class T>
Matrix<T> reversed(const Matrix<T>& X) { return X.colwise().reverse(); }
}  // namespace vim_detail

/// The block's forward (the oracle): two plain recurrent Mamba scans, one on the reversed tokens.
template <Scalar T>
Matrix<T> vision_mamba_forward(const vision_mamba_weights<T>& w, const Matrix<T>& u) {
  w.check();
  const T s = w.config.if_devide_out ? T(0.5) : T(1);
  const Matrix<T> y = s * (mamba_inner_forward(w.fwd, u) + vim_detail::reversed(mamba_inner_forward(w.bwd(), vim_detail::reversed(u))));
  return nn::linear<T>(y, w.fwd.out_proj_weight);
}

/// The exact decomposition: vision_mamba_forward(w, u) == d.output() (see the header comment).
template <Scalar T>
auto vision_mamba_decompose(const vision_mamba_weights<T>& w, const Matrix<T>& u) {
  w.check();
  const T s = w.config.if_devide_out ? T(0.5) : T(1);
  auto f = mamba_decompose(w.fwd, u);
  auto b = mamba_decompose(w.bwd(), vim_detail::reversed(u));
  Matrix<T> beta = s * (f.beta + vim_detail::reversed(b.beta));
  return make_decomposition<T>(std::move(f.x), s * (std::move(f.H) + flip(std::move(b.H))), std::move(beta), w.fwd.out_proj_weight);
}

}  // namespace iattn::models
