// iattn/backend/cuda/evaluator.hpp: the CUDA evaluators' interface. One specialisation of
// cuda_eval per node type the backend covers (diagonal.hpp, causal_conv.hpp, ...):
//   static constexpr bool applies, materializes;     what it implements
//   static void apply(node, on, x, y, L);            y = H x on the device: x, y (L, D) row-major,
//                                                    D = the node's channels; y is not x
//   static void materialize(node, on, c, out, L);    channel c's (L, L) matrix into out
// Every launch and copy goes on on.stream. The primary template covers nothing: an expression
// with another node is a compile-time error in apply/materialize (cuda.hpp), never a fallback.
#pragma once

#include "../../core/config.hpp"
#include "memory.hpp"
#include "tag.hpp"

namespace iattn::cuda_detail {

template <class Node>
struct cuda_eval {
  static constexpr bool applies = false;
  static constexpr bool materializes = false;
};

template <class Node>
inline constexpr bool applies_v = cuda_eval<Node>::applies;
template <class Node>
inline constexpr bool materializes_v = cuda_eval<Node>::materializes;

}  // namespace iattn::cuda_detail
