// iattn/backend/cuda/causal_conv.hpp: CUDA evaluator of CausalConv: apply (kernels/causal_conv.hpp);
// materialize (the banded Toeplitz matrix) and the vectors of row/col (kernels/band.hpp), O(L K).
#pragma once

#include "../../ops/causal_conv.hpp"
#include "band.hpp"
#include "evaluator.hpp"
#include "kernels/causal_conv.hpp"

namespace iattn::cuda_detail {

template <class T>
struct cuda_eval<CausalConv<T>> : band_node_eval<CausalConv<T>> {
  static constexpr bool applies = true;
  static constexpr bool materializes = true;
  static constexpr bool slices = true;

  static void apply(const CausalConv<T>& n, const cuda& on, const T* x, T* y, Index L) {
    const auto w = upload(n.w(), on.stream);  // (K, D)
    const Index D = n.channels();
    simt::launch("causal_conv_apply", &causal_conv_apply<T>,
                 {{simt::blocks_for(L * D, elementwise_threads)}, {elementwise_threads}, 0}, on.stream,
                 causal_conv_args<T>{w.data(), n.width(), x, y, L, D});
  }
};

}  // namespace iattn::cuda_detail
