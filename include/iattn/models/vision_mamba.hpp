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
//
// From activations (docs/models.md): vision_mamba_activations holds both branches'
// mamba_activations (bwd in reversed token order) and out_proj; attention(acts) is the decomposition,
// final_state(acts) both scans' ssm_state (vision_mamba_state {fwd, bwd}).
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

/// One forward pass's activations: the two branches' Mamba activations (mamba_activations, each
/// without out_proj) and the shared out_proj. As in Vim, the backward branch runs on the reversed
/// tokens, so bwd's token-wise tensors are in reversed order (row 0 is the last token) and
/// bwd.x = J fwd.x. Built by `activations(w, u)` or by hand; `attention(acts)` needs nothing else.
template <Scalar T>
struct vision_mamba_activations {
  mamba_activations<T> fwd;   ///< the forward scan's, in token order
  mamba_activations<T> bwd;   ///< the backward scan's, in reversed token order (its x_proj_b, dt_proj_b, A_b, D_b, conv1d_b)
  Matrix<T> out_proj_weight;  ///< (d_model, d_inner) or empty (the decomposition stops before out_proj)
  bool if_devide_out = true;  ///< Vim's spelling; halves the sum of the two directions

  /// Throws std::invalid_argument naming the branch and the field whose shape disagrees.
  void check() const {
    const auto branch = [](const char* name, const mamba_activations<T>& a) {
      try {
        a.check();
      } catch (const std::invalid_argument& e) {
        throw std::invalid_argument(std::string("vision_mamba_activations.") + name + ": " + e.what());
      }
    };
    branch("fwd", fwd);
    branch("bwd", bwd);
    detail::require_shape(bwd.x.rows() == fwd.x.rows() && bwd.x.cols() == fwd.x.cols(), "vision_mamba_activations", "bwd.x", bwd.x.rows(),
                          bwd.x.cols(), "fwd.x's shape " + detail::shape_string(fwd.x.rows(), fwd.x.cols()));
    if (out_proj_weight.size() != 0)
      detail::require_shape(out_proj_weight.cols() == fwd.d_inner(), "vision_mamba_activations", "out_proj_weight", out_proj_weight.rows(),
                            out_proj_weight.cols(), "(d_model, d_inner=" + std::to_string(fwd.d_inner()) + ") or empty");
  }
};

/// The activations of one forward pass on u (L, d_model): fwd on u, bwd on J u, out_proj included.
template <Scalar T>
vision_mamba_activations<T> activations(const vision_mamba_weights<T>& w, const Matrix<T>& u) {
  w.check();
  vision_mamba_activations<T> a{activations(w.fwd, u), activations(w.bwd(), vim_detail::reversed(u)), w.fwd.out_proj_weight,
                                w.config.if_devide_out};
  a.fwd.out_proj_weight.resize(0, 0);
  a.bwd.out_proj_weight.resize(0, 0);
  return a;
}

/// The block's forward (the oracle): two plain recurrent Mamba scans, one on the reversed tokens.
/// fwd_state / bwd_state, when given, receive each scan's state after its last token (d_inner,
/// d_state): the forward scan's after token L-1, the backward scan's after token 0.
template <Scalar T>
Matrix<T> vision_mamba_forward(const vision_mamba_weights<T>& w, const Matrix<T>& u, Matrix<T>* fwd_state = nullptr,
                               Matrix<T>* bwd_state = nullptr) {
  w.check();
  const T s = w.config.if_devide_out ? T(0.5) : T(1);
  const Matrix<T> y = s * (mamba_inner_forward(w.fwd, u, fwd_state) +
                           vim_detail::reversed(mamba_inner_forward(w.bwd(), vim_detail::reversed(u), bwd_state)));
  return nn::linear<T>(y, w.fwd.out_proj_weight);
}

/// The exact decomposition from activations (see the header comment); x = fwd.x.
template <Scalar T>
auto attention(const vision_mamba_activations<T>& a) {
  a.check();
  const T s = a.if_devide_out ? T(0.5) : T(1);
  auto f = attention(a.fwd);
  auto b = attention(a.bwd);
  Matrix<T> beta = s * (f.beta + vim_detail::reversed(b.beta));
  return make_decomposition<T>(std::move(f.x), s * (std::move(f.H) + flip(std::move(b.H))), std::move(beta), a.out_proj_weight);
}

/// The exact decomposition: vision_mamba_forward(w, u) == d.output().
template <Scalar T>
auto decompose(const vision_mamba_weights<T>& w, const Matrix<T>& u) { return attention(activations(w, u)); }

/// The exact decomposition (the named form of decompose).
template <Scalar T>
auto vision_mamba_decompose(const vision_mamba_weights<T>& w, const Matrix<T>& u) { return decompose(w, u); }

/// Both scans' states after their last tokens, each mamba_ssm's ssm_state (d_inner, d_state).
template <Scalar T>
struct vision_mamba_state {
  Matrix<T> fwd;  ///< the forward scan's, after token L-1
  Matrix<T> bwd;  ///< the backward scan's, after token 0 (its last in reversed order)
};

/// The two directions' final states (see vision_mamba_state), in log space as Mamba's final_state.
template <Scalar T>
vision_mamba_state<T> final_state(const vision_mamba_activations<T>& a) {
  a.check();
  return {final_state(a.fwd), final_state(a.bwd)};
}

}  // namespace iattn::models
