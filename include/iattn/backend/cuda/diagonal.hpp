// iattn/backend/cuda/diagonal.hpp: CUDA evaluator of Diagonal: apply (kernels/diagonal.hpp);
// materialize and the vectors of row/col as a band of width 1 (kernels/band.hpp).
#pragma once

#include "../../ops/diagonal.hpp"
#include "band.hpp"
#include "evaluator.hpp"
#include "kernels/diagonal.hpp"

namespace iattn::cuda_detail {

template <class T>
struct cuda_eval<Diagonal<T>> : band_node_eval<Diagonal<T>> {
  static constexpr bool applies = true;
  static constexpr bool materializes = true;
  static constexpr bool slices = true;

  static void apply(const Diagonal<T>& n, const cuda& on, const T* x, T* y, Index L) {
    const auto d = upload(n.d(), on.stream);  // (L, D) or (1, D)
    const Index D = n.channels();
    simt::launch("diagonal_apply", &diagonal_apply<T>,
                 {{simt::blocks_for(L * D, elementwise_threads)}, {elementwise_threads}, 0}, on.stream,
                 diagonal_args<T>{d.data(), n.d().rows(), x, y, L, D});
  }
};

}  // namespace iattn::cuda_detail
