// iattn/models/stack.hpp: a small multi-layer model runner, so that rollout and attribution run over
// real stacked layers:
//   h_0 = embedding[tokens] (or given input embeddings)
//   h_{l+1} = h_l + block_l(RMSNorm(h_l) * norm_weight_l)        (pre-norm residual blocks)
//   output = RMSNorm(h_Lambda) * final_norm_weight
// Every layer's exact decomposition is returned, taken on that layer's actual (normalised) input,
// so layer l's block output is layers[l].output().
#pragma once

#include "common.hpp"

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace iattn::models {

/// Pre-norm residual stack of one block type W.
template <Scalar T, class W>
struct stack_weights {
  Matrix<T> embedding;                  ///< (vocab, d_model)
  std::vector<W> blocks;                ///< Lambda blocks
  std::vector<Matrix<T>> norm_weights;  ///< Lambda of (1, d_model), the pre-norms' weights
  Matrix<T> final_norm_weight;          ///< (1, d_model)
  double eps = 1e-5;
  Index d_model() const { return embedding.cols(); }
};

/// Seeded stack: embedding N(0, 1), norm weights 1, block l from make_block(l) (the caller's init,
/// which sees the layer index for depth-dependent initialisers).
template <Scalar T, class MakeBlock>
auto make_stack(Index num_layers, Index vocab, Index d_model, MakeBlock&& make_block, std::uint64_t seed = 0) {
  using W = decltype(make_block(Index(0)));
  stack_weights<T, W> s;
  init::generator g(seed);
  s.embedding = init::normal<T>(g, vocab, d_model, 1.0);
  for (Index l = 0; l < num_layers; ++l) {
    s.blocks.push_back(make_block(l));
    s.norm_weights.push_back(Matrix<T>::Ones(1, d_model));
  }
  s.final_norm_weight = Matrix<T>::Ones(1, d_model);
  return s;
}

namespace stack_detail {
template <class T>
Matrix<T> rms_norm(const Matrix<T>& h, const Matrix<T>& w, double eps) {
  Matrix<T> out = h;
  nn::group_norm_rows<T>(out, 1, eps, false, w);
  return out;
}
}  // namespace stack_detail

/// The embeddings of token ids (each in [0, vocab)).
template <Scalar T, class W>
Matrix<T> embed(const stack_weights<T, W>& s, const std::vector<Index>& tokens) {
  Matrix<T> h(Index(tokens.size()), s.d_model());
  for (std::size_t i = 0; i < tokens.size(); ++i) {
    if (tokens[i] < 0 || tokens[i] >= s.embedding.rows())
      detail::fail("embed", "tokens[" + std::to_string(i) + "] is " + std::to_string(tokens[i]) + " but must lie in [0, vocab=" +
                                std::to_string(s.embedding.rows()) + ")");
    h.row(Index(i)) = s.embedding.row(tokens[i]);
  }
  return h;
}

/// One run of a stack: the output and, per layer, the block's input and its exact decomposition.
template <Scalar T, class Dec>
struct stack_run {
  Matrix<T> output;                  ///< (L, d_model) after the final norm
  std::vector<Matrix<T>> residuals;  ///< h_0 .. h_Lambda
  std::vector<Matrix<T>> inputs;     ///< the normalised block inputs
  std::vector<Dec> layers;           ///< layers[l].output() == block_l(inputs[l])
};

/// Runs the stack on input embeddings h0 (L, d_model). decompose(w, u) is the block's exact
/// decomposition (e.g. the model's <model>_decompose); the residual stream uses its output().
template <Scalar T, class W, class Decompose>
auto run_stack(const stack_weights<T, W>& s, const Matrix<T>& h0, Decompose&& decompose) {
  using Dec = decltype(decompose(s.blocks.front(), h0));
  detail::require_shape(h0.cols() == s.d_model(), "run_stack", "h0", h0.rows(), h0.cols(), "(L, d_model=" + std::to_string(s.d_model()) + ")");
  if (s.blocks.size() != s.norm_weights.size())
    detail::fail("run_stack", "blocks has " + std::to_string(s.blocks.size()) + " entries but norm_weights has " + std::to_string(s.norm_weights.size()));
  stack_run<T, Dec> r;
  Matrix<T> h = h0;
  r.residuals.push_back(h);
  for (std::size_t l = 0; l < s.blocks.size(); ++l) {
    r.inputs.push_back(stack_detail::rms_norm(h, s.norm_weights[l], s.eps));
    r.layers.push_back(decompose(s.blocks[l], r.inputs.back()));
    h += r.layers.back().output();
    r.residuals.push_back(h);
  }
  r.output = stack_detail::rms_norm(h, s.final_norm_weight, s.eps);
  return r;
}

/// The same stack run through each block's plain forward (the oracle of run_stack).
template <Scalar T, class W, class Forward>
Matrix<T> stack_forward(const stack_weights<T, W>& s, const Matrix<T>& h0, Forward&& forward) {
  Matrix<T> h = h0;
  for (std::size_t l = 0; l < s.blocks.size(); ++l) h += forward(s.blocks[l], stack_detail::rms_norm(h, s.norm_weights[l], s.eps));
  return stack_detail::rms_norm(h, s.final_norm_weight, s.eps);
}

}  // namespace iattn::models
