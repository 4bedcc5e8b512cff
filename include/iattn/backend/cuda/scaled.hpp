// iattn/backend/cuda/scaled.hpp: CUDA evaluators of Scaled s * A and Sum A + B, each on top of its
// operands' evaluators and one elementwise pass (kernels/mean.hpp's mean_accumulate, which computes
// acc = scale * m, or acc + scale * m):
//   Scaled  apply, materialize, vector: A's, then every value times s in place
//   Sum     apply, materialize, vector: A's into the output, B's into a temporary, added
// A Scaled or Sum of bands is not a band to the product's banded rewrites (band.hpp takes Diagonal,
// CausalConv and their products): a product with one materializes it and multiplies in tiles.
#pragma once

#include "../../ops/scaled.hpp"
#include "../../ops/sum.hpp"
#include "band.hpp"
#include "evaluator.hpp"
#include "identity.hpp"
#include "kernels/mean.hpp"

namespace iattn::cuda_detail {

/// v = scale * v (in place) or v += scale * w, n values on the device.
template <class T>
void scale_values(const cuda& on, T* v, const T* w, Index n, T scale) {
  if (n == 0) return;
  const bool in_place = w == nullptr;
  simt::launch("mean_accumulate", &mean_accumulate<T>, elementwise_launch(n), on.stream, v,
               in_place ? static_cast<const T*>(v) : w, n, scale, false, in_place);
}

template <class A>
struct cuda_eval<Scaled<A>> {
  static constexpr bool applies = applies_v<A>;
  static constexpr bool materializes = materializes_v<A>;
  static constexpr bool slices = slices_v<A>;

  template <class T>
  static void apply(const Scaled<A>& n, const cuda& on, const T* x, T* y, Index L) {
    const Index D = apply_channels_of(n);
    apply_node(n.inner(), on, x, y, L, D);
    scale_values<T>(on, y, nullptr, L * D, T(n.factor()));
  }
  template <class T>
  static void materialize(const Scaled<A>& n, const cuda& on, Index c, T* out, Index L) {
    cuda_eval<A>::materialize(n.inner(), on, c, out, L);
    scale_values<T>(on, out, nullptr, L * L, T(n.factor()));
  }
  template <class T>
  static void vector(const Scaled<A>& n, const cuda& on, Index c, bool transposed, const T* x, T* y, Index L) {
    cuda_eval<A>::vector(n.inner(), on, c, transposed, x, y, L);
    scale_values<T>(on, y, nullptr, L, T(n.factor()));
  }
};

template <class A, class B>
struct cuda_eval<Sum<A, B>> {
  static constexpr bool applies = applies_v<A> && applies_v<B>;
  static constexpr bool materializes = materializes_v<A> && materializes_v<B>;
  static constexpr bool slices = slices_v<A> && slices_v<B>;

  template <class T>
  static void apply(const Sum<A, B>& n, const cuda& on, const T* x, T* y, Index L) {
    const Index D = apply_channels_of(n);
    device_buffer<T> tmp(L * D, on.stream);
    apply_node(n.left(), on, x, y, L, D);
    apply_node(n.right(), on, x, tmp.data(), L, D);
    scale_values<T>(on, y, tmp.data(), L * D, T(1));
  }
  template <class T>
  static void materialize(const Sum<A, B>& n, const cuda& on, Index c, T* out, Index L) {
    device_buffer<T> tmp(L * L, on.stream);
    cuda_eval<A>::materialize(n.left(), on, c, out, L);
    cuda_eval<B>::materialize(n.right(), on, c, tmp.data(), L);
    scale_values<T>(on, out, tmp.data(), L * L, T(1));
  }
  template <class T>
  static void vector(const Sum<A, B>& n, const cuda& on, Index c, bool transposed, const T* x, T* y, Index L) {
    device_buffer<T> tmp(L, on.stream);
    cuda_eval<A>::vector(n.left(), on, c, transposed, x, y, L);
    cuda_eval<B>::vector(n.right(), on, c, transposed, x, tmp.data(), L);
    scale_values<T>(on, y, tmp.data(), L, T(1));
  }
};

}  // namespace iattn::cuda_detail
