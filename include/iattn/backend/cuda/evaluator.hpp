// iattn/backend/cuda/evaluator.hpp: the CUDA evaluators' interface. One specialisation of
// cuda_eval per node type the backend covers (diagonal.hpp, causal_conv.hpp, ...):
//   static constexpr bool applies, materializes, slices;   what it implements
//   static void apply(node, on, x, y, L);            y = H x on the device: x, y (L, D) row-major,
//                                                    D = the node's channels; y is not x
//   static void materialize(node, on, c, out, L);    channel c's (L, L) matrix into out, every
//                                                    entry written (zeros above the diagonal)
//   static void vector(node, on, c, transposed, x, y, L)   y = H^c x, or (H^c)^T x when
//                                                    transposed, for vectors x, y of length L on the
//                                                    device (y is not x): what row (H^T e_t) and
//                                                    col (H e_s) run, O(L N) per factor
// Composites and the entry points apply a child through apply_node (identity.hpp), which passes
// the enclosing D to an Identity (it has none of its own). Every launch and copy goes on on.stream. The primary template covers nothing: an expression
// with another node is a compile-time error in apply/materialize/row/col (cuda.hpp), never a
// fallback.
#pragma once

#include "../../core/config.hpp"
#include "memory.hpp"
#include "tag.hpp"

namespace iattn::cuda_detail {

template <class Node>
struct cuda_eval {
  static constexpr bool applies = false;
  static constexpr bool materializes = false;
  static constexpr bool slices = false;
};

template <class Node>
inline constexpr bool applies_v = cuda_eval<Node>::applies;
template <class Node>
inline constexpr bool materializes_v = cuda_eval<Node>::materializes;
template <class Node>
inline constexpr bool slices_v = cuda_eval<Node>::slices;

}  // namespace iattn::cuda_detail
