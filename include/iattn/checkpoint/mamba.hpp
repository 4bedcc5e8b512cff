// iattn/checkpoint/mamba.hpp: Mamba mixers' weights from a Hugging Face checkpoint.
//
//   mamba_layers(f)                 the layer indices i of "backbone.layers.<i>.mixer.A_log" in f
//                                   (MambaForCausalLM and Mamba2ForCausalLM alike)
//   mamba_weights_from<T>(f, i)     layer i's MambaMixer parameters as mamba_weights<T>
//   mamba2_weights_from<T>(f, i, n_groups, eps)
//                                   layer i's Mamba2Mixer parameters as mamba2_weights<T>; n_groups
//                                   and eps (config.json's "n_groups", "layer_norm_epsilon") are
//                                   not determined by the shapes
//   mamba_lm_from<T>(f, eps), mamba2_lm_from<T>(f, n_groups, eps), lm_run(lm, ids)
//                                   the whole MambaForCausalLM / Mamba2ForCausalLM: embedding, per
//                                   layer RMSNorm, mixer and residual, final norm, lm_head (tied to
//                                   the embedding when the checkpoint has no lm_head.weight); the
//                                   run returns every layer's mixer input (what the decompositions
//                                   take) and the logits
//
// Hugging Face's MambaForCausalLM (transformers model types `mamba` and `falcon_mamba`) names a
// mixer's parameters as mamba_ssm's `Mamba` does, under "backbone.layers.<i>.mixer.": in_proj,
// conv1d, x_proj, dt_proj, A_log, D, out_proj. The config is read off the shapes (d_inner and
// d_state from A_log, d_model from in_proj, d_conv from conv1d, dt_rank from dt_proj), each
// tensor keeps its own index order (conv1d.weight (d_inner, 1, d_conv) becomes (d_inner, d_conv)),
// and a missing tensor or a shape that disagrees with the others throws, naming the tensor.
// Projection biases (`use_bias=True`) are refused: mamba_weights has none, and dropping them would
// change the output silently. Falcon-Mamba's extra RMS norms of B, C and Δ are not modelled
// either: its checkpoints load, but its mixer computes more than mamba_weights describes.
#pragma once

#include "../models/mamba.hpp"
#include "../models/mamba2.hpp"
#include "safetensors.hpp"

#include <cmath>
#include <type_traits>
#include <string>
#include <vector>

namespace iattn::checkpoint {

/// The indices i for which f has "backbone.layers.<i>.mixer.A_log", ascending.
inline std::vector<Index> mamba_layers(const safetensors::file& f) {
  const auto found = f.indices("backbone.layers.", ".mixer.A_log");
  return {found.begin(), found.end()};
}

namespace detail {
/// Throws when the mixer under prefix p has in_proj or out_proj biases (use_bias=True): the
/// weights struct `target` has none, and dropping them would change the output silently.
inline void refuse_projection_biases(const safetensors::file& f, const std::string& p, const char* target) {
  for (const char* bias : {"in_proj.bias", "out_proj.bias"})
    if (f.contains(p + bias))
      safetensors::detail::fail(f.label(), "tensor '" + p + bias + "': projection biases (use_bias=True) are not modelled by " + target);
}
}  // namespace detail

/// Layer `layer`'s mixer weights (prefix "backbone.layers.<layer>.mixer.").
template <Scalar T>
models::mamba_weights<T> mamba_weights_from(const safetensors::file& f, Index layer) {
  const std::string p = "backbone.layers." + std::to_string(layer) + ".mixer.";
  detail::refuse_projection_biases(f, p, "mamba_weights");
  const auto& A = f.info(p + "A_log");
  f.require_rank(p + "A_log", 2, "(d_inner, d_state)");
  const std::int64_t di = A.shape[0], N = A.shape[1];
  const auto& in = f.info(p + "in_proj.weight");
  f.require_rank(p + "in_proj.weight", 2, "(2*d_inner, d_model)");
  const std::int64_t dm = in.shape[1];
  const auto& conv = f.info(p + "conv1d.weight");
  f.require_rank(p + "conv1d.weight", 3, "(d_inner, 1, d_conv)");
  const std::int64_t K = conv.shape[2];
  const auto& dt = f.info(p + "dt_proj.weight");
  f.require_rank(p + "dt_proj.weight", 2, "(d_inner, dt_rank)");
  const std::int64_t R = dt.shape[1];
  if (dm <= 0 || di % dm != 0)
    safetensors::detail::fail(f.label(), "tensor '" + p + "in_proj.weight' has shape " + safetensors::detail::shape_string(in.shape) +
                                             ": d_inner = " + std::to_string(di) + " (from A_log) is not a multiple of d_model");
  f.require_shape(p + "in_proj.weight", {2 * di, dm});
  f.require_shape(p + "conv1d.weight", {di, 1, K});
  f.require_shape(p + "conv1d.bias", {di});
  f.require_shape(p + "x_proj.weight", {R + 2 * N, di});
  f.require_shape(p + "dt_proj.weight", {di, R});
  f.require_shape(p + "dt_proj.bias", {di});
  f.require_shape(p + "D", {di});
  f.require_shape(p + "out_proj.weight", {dm, di});
  models::mamba_weights<T> w;
  w.config = {.d_model = Index(dm), .d_state = Index(N), .d_conv = Index(K), .expand = Index(di / dm), .dt_rank = Index(R)};
  w.in_proj_weight = f.matrix<T>(p + "in_proj.weight");
  w.conv1d_weight = f.matrix<T>(p + "conv1d.weight", Index(di), Index(K));
  w.conv1d_bias = f.matrix<T>(p + "conv1d.bias");
  w.x_proj_weight = f.matrix<T>(p + "x_proj.weight");
  w.dt_proj_weight = f.matrix<T>(p + "dt_proj.weight");
  w.dt_proj_bias = f.matrix<T>(p + "dt_proj.bias");
  w.A_log = f.matrix<T>(p + "A_log");
  w.D = f.matrix<T>(p + "D");
  w.out_proj_weight = f.matrix<T>(p + "out_proj.weight");
  w.check();
  return w;
}

namespace detail {
/// The embedding rows of token ids (L, d_model); an id outside [0, vocab) throws naming its position.
template <class T>
Matrix<T> embed(const Matrix<T>& embeddings, const std::vector<Index>& ids, const char* where) {
  const Index L = Index(ids.size()), V = embeddings.rows();
  Matrix<T> x(L, embeddings.cols());
  for (Index t = 0; t < L; ++t) {
    const Index id = ids[std::size_t(t)];
    if (id < 0 || id >= V)
      iattn::detail::fail(where, "token id " + std::to_string(id) + " at position " + std::to_string(t) +
                                     " is outside the vocabulary [0, " + std::to_string(V) + ")");
    x.row(t) = embeddings.row(id);
  }
  return x;
}
}  // namespace detail

/// A MambaForCausalLM or Mamba2ForCausalLM read from its checkpoint: W is the mixer's weights type.
template <class W>
struct ssm_lm {
  using scalar = typename decltype(W{}.in_proj_weight)::Scalar;
  Matrix<scalar> embeddings;      ///< (vocab, d_model)  backbone.embeddings.weight
  std::vector<W> layers;          ///< backbone.layers.<i>.mixer.*
  std::vector<Matrix<scalar>> norms;  ///< (1, d_model) each  backbone.layers.<i>.norm.weight
  Matrix<scalar> norm_f;          ///< (1, d_model)  backbone.norm_f.weight
  Matrix<scalar> lm_head;         ///< (vocab, d_model)  lm_head.weight, or the embeddings
  double eps = 1e-5;              ///< config.json's layer_norm_epsilon
};
template <Scalar T>
using mamba_lm = ssm_lm<models::mamba_weights<T>>;
template <Scalar T>
using mamba2_lm = ssm_lm<models::mamba2_weights<T>>;

/// What one forward pass of an ssm_lm computed.
template <Scalar T>
struct lm_trace {
  std::vector<Matrix<T>> mixer_inputs;  ///< per layer, (L, d_model): the normed input of its mixer
  Matrix<T> hidden;                     ///< (L, d_model) after norm_f
  Matrix<T> logits;                     ///< (L, vocab)
};

namespace detail {
/// The embedding, norms and head around the layers read by `layer_from(i)`.
template <class W, class F>
ssm_lm<W> ssm_lm_from(const safetensors::file& f, double eps, F&& layer_from) {
  using T = typename ssm_lm<W>::scalar;
  ssm_lm<W> lm;
  lm.eps = eps;
  f.require_rank("backbone.embeddings.weight", 2, "(vocab_size, hidden_size)");
  lm.embeddings = f.matrix<T>("backbone.embeddings.weight");
  const Index dm = lm.embeddings.cols();
  const std::vector<Index> ids = mamba_layers(f);
  for (std::size_t i = 0; i < ids.size(); ++i) {
    if (ids[i] != Index(i)) f.info("backbone.layers." + std::to_string(i) + ".mixer.A_log");  // throws: a gap
    lm.layers.push_back(layer_from(Index(i)));
    if (lm.layers.back().config.d_model != dm)
      safetensors::detail::fail(f.label(), "tensor 'backbone.layers." + std::to_string(i) + ".mixer.in_proj.weight': d_model " +
                                               std::to_string(lm.layers.back().config.d_model) + " differs from the embeddings' " + std::to_string(dm));
    const std::string norm = "backbone.layers." + std::to_string(i) + ".norm.weight";
    f.require_shape(norm, {dm});
    lm.norms.push_back(f.matrix<T>(norm));
  }
  f.require_shape("backbone.norm_f.weight", {dm});
  lm.norm_f = f.matrix<T>("backbone.norm_f.weight");
  if (f.contains("lm_head.weight")) {
    f.require_shape("lm_head.weight", {lm.embeddings.rows(), dm});
    lm.lm_head = f.matrix<T>("lm_head.weight");
  } else {
    lm.lm_head = lm.embeddings;  // tie_word_embeddings
  }
  return lm;
}

/// x / sqrt(mean(x^2) + eps) * weight, per row (MambaRMSNorm).
template <class T>
Matrix<T> rms_norm_rows(const Matrix<T>& x, const Matrix<T>& weight, double eps) {
  Matrix<T> y(x.rows(), x.cols());
  for (Index t = 0; t < x.rows(); ++t) {
    const double ms = x.row(t).template cast<double>().squaredNorm() / double(std::max<Index>(x.cols(), 1));
    const T s = T(1.0 / std::sqrt(ms + eps));
    y.row(t) = (x.row(t).array() * s * weight.row(0).array()).matrix();
  }
  return y;
}
}  // namespace detail

/// Every layer of a MambaForCausalLM checkpoint (layers 0 .. n-1, none missing).
template <Scalar T>
mamba_lm<T> mamba_lm_from(const safetensors::file& f, double eps = 1e-5) {
  return detail::ssm_lm_from<models::mamba_weights<T>>(f, eps, [&](Index i) { return mamba_weights_from<T>(f, i); });
}

/// The forward pass on token ids: embedding, then per layer x += mixer(RMSNorm(x)), norm_f, lm_head.
template <class W>
lm_trace<typename ssm_lm<W>::scalar> lm_run(const ssm_lm<W>& lm, const std::vector<Index>& ids) {
  using T = typename ssm_lm<W>::scalar;
  Matrix<T> x = detail::embed(lm.embeddings, ids, "lm_run");
  lm_trace<T> tr;
  for (std::size_t i = 0; i < lm.layers.size(); ++i) {
    tr.mixer_inputs.push_back(detail::rms_norm_rows(x, lm.norms[i], lm.eps));
    if constexpr (std::is_same_v<W, models::mamba_weights<T>>) x += models::mamba_forward(lm.layers[i], tr.mixer_inputs.back());
    else x += models::mamba2_forward(lm.layers[i], tr.mixer_inputs.back());
  }
  tr.hidden = detail::rms_norm_rows(x, lm.norm_f, lm.eps);
  tr.logits = models::nn::linear<T>(tr.hidden, lm.lm_head);
  return tr;
}

/// Layer `layer`'s Mamba2Mixer weights (prefix "backbone.layers.<layer>.mixer."). The shapes give
/// nheads (A_log), d_inner (norm.weight), d_model (in_proj), conv_dim and d_conv (conv1d); with
/// n_groups they give d_state = (conv_dim − d_inner) / (2 n_groups) and head_dim = d_inner / nheads.
template <Scalar T>
models::mamba2_weights<T> mamba2_weights_from(const safetensors::file& f, Index layer, Index n_groups, double eps = 1e-5) {
  const std::string p = "backbone.layers." + std::to_string(layer) + ".mixer.";
  detail::refuse_projection_biases(f, p, "mamba2_weights");
  f.require_rank(p + "A_log", 1, "(nheads,)");
  f.require_rank(p + "norm.weight", 1, "(d_inner,)");
  f.require_rank(p + "in_proj.weight", 2, "(2*d_inner + 2*n_groups*d_state + nheads, d_model)");
  f.require_rank(p + "conv1d.weight", 3, "(conv_dim, 1, d_conv)");
  const std::int64_t H = f.info(p + "A_log").shape[0], di = f.info(p + "norm.weight").shape[0];
  const std::int64_t dm = f.info(p + "in_proj.weight").shape[1];
  const std::int64_t cd = f.info(p + "conv1d.weight").shape[0], K = f.info(p + "conv1d.weight").shape[2];
  auto bad = [&](const std::string& tensor, const std::string& what) { safetensors::detail::fail(f.label(), "tensor '" + p + tensor + "': " + what); };
  if (n_groups < 1) bad("conv1d.weight", "n_groups must be >= 1, got " + std::to_string(n_groups));
  if (H < 1 || di % H != 0) bad("norm.weight", "d_inner = " + std::to_string(di) + " is not a multiple of nheads = " + std::to_string(H) + " (from A_log)");
  if (dm < 1 || di % dm != 0) bad("in_proj.weight", "d_inner = " + std::to_string(di) + " is not a multiple of d_model = " + std::to_string(dm));
  if (cd <= di || (cd - di) % (2 * n_groups) != 0)
    bad("conv1d.weight", "conv_dim = " + std::to_string(cd) + " is not d_inner + 2*n_groups*d_state for d_inner = " + std::to_string(di) +
                             ", n_groups = " + std::to_string(n_groups));
  const std::int64_t N = (cd - di) / (2 * n_groups);
  f.require_shape(p + "in_proj.weight", {di + cd + H, dm});
  f.require_shape(p + "conv1d.weight", {cd, 1, K});
  f.require_shape(p + "conv1d.bias", {cd});
  f.require_shape(p + "dt_bias", {H});
  f.require_shape(p + "D", {H});
  f.require_shape(p + "out_proj.weight", {dm, di});
  models::mamba2_weights<T> w;
  w.config = {.d_model = Index(dm), .d_state = Index(N), .d_conv = Index(K), .expand = Index(di / dm),
              .headdim = Index(di / H), .ngroups = n_groups, .eps = eps};
  w.in_proj_weight = f.matrix<T>(p + "in_proj.weight");
  w.conv1d_weight = f.matrix<T>(p + "conv1d.weight", Index(cd), Index(K));
  w.conv1d_bias = f.matrix<T>(p + "conv1d.bias");
  w.dt_bias = f.matrix<T>(p + "dt_bias");
  w.A_log = f.matrix<T>(p + "A_log");
  w.D = f.matrix<T>(p + "D");
  w.norm_weight = f.matrix<T>(p + "norm.weight");
  w.out_proj_weight = f.matrix<T>(p + "out_proj.weight");
  w.check();
  return w;
}

/// Every layer of a Mamba2ForCausalLM checkpoint; n_groups and eps from its config.json.
template <Scalar T>
mamba2_lm<T> mamba2_lm_from(const safetensors::file& f, Index n_groups, double eps = 1e-5) {
  return detail::ssm_lm_from<models::mamba2_weights<T>>(f, eps, [&](Index i) { return mamba2_weights_from<T>(f, i, n_groups, eps); });
}

}  // namespace iattn::checkpoint
