// iattn/backend/cuda/product.hpp: CUDA evaluator of Product: apply runs the right factor into a
// device temporary, then the left one on it (node by node, right to left; each node's own kernels).
// No structured rewrite yet (the CPU folds diagonals into scans): each factor is one more pass.
#pragma once

#include "../../ops/product.hpp"
#include "evaluator.hpp"

namespace iattn::cuda_detail {

template <class A, class B>
struct cuda_eval<Product<A, B>> {
  static constexpr bool applies = applies_v<A> && applies_v<B>;
  static constexpr bool materializes = false;

  template <class T>
  static void apply(const Product<A, B>& n, const cuda& on, const T* x, T* y, Index L) {
    device_buffer<T> tmp(L * n.channels(), on.stream);  // (L, D): B x
    cuda_eval<B>::apply(n.right(), on, x, tmp.data(), L);
    cuda_eval<A>::apply(n.left(), on, tmp.data(), y, L);
  }
};

}  // namespace iattn::cuda_detail
