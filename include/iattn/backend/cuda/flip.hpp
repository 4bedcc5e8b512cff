// iattn/backend/cuda/flip.hpp: CUDA evaluator of Flip<A> = J A J (J the token reversal), on top
// of A's evaluator and the in-place reversal of kernels/flip.hpp:
//   apply        x reversed into a temporary, A applied from it into y, y reversed in place
//   materialize  A's (L, L) matrix, then both axes reversed in place (the flat array reversed):
//                upper-triangular where A is lower
//   vector       J A^c J x, or J (A^c)^T J x for the transposed vector (rows): as apply
// Products with a Flip factor are not lower-triangular; product.hpp multiplies them in full.
#pragma once

#include "../../ops/flip.hpp"
#include "band.hpp"
#include "evaluator.hpp"
#include "identity.hpp"
#include "kernels/flip.hpp"

namespace iattn::cuda_detail {

/// out = the rows of a (rows, cols) row-major device array in reverse order; in place when in == out.
template <class T>
void reverse_device_rows(const cuda& on, const T* in, T* out, Index rows, Index cols) {
  const Index n = (in == out ? rows / 2 : rows) * cols;
  if (n == 0) return;
  simt::launch("reverse_rows", &reverse_rows<T>, elementwise_launch(n), on.stream, in, out, rows, cols);
}

template <class A>
struct cuda_eval<Flip<A>> {
  static constexpr bool applies = applies_v<A>;
  static constexpr bool materializes = materializes_v<A>;
  static constexpr bool slices = slices_v<A>;

  template <class T>
  static void apply(const Flip<A>& n, const cuda& on, const T* x, T* y, Index L) {
    const Index D = apply_channels_of(n);
    device_buffer<T> xr(L * D, on.stream);
    reverse_device_rows(on, x, xr.data(), L, D);
    apply_node(n.inner(), on, static_cast<const T*>(xr.data()), y, L, D);
    reverse_device_rows(on, static_cast<const T*>(y), y, L, D);
  }
  template <class T>
  static void materialize(const Flip<A>& n, const cuda& on, Index c, T* out, Index L) {
    cuda_eval<A>::materialize(n.inner(), on, c, out, L);
    reverse_device_rows(on, static_cast<const T*>(out), out, L * L, Index(1));
  }
  template <class T>
  static void vector(const Flip<A>& n, const cuda& on, Index c, bool transposed, const T* x, T* y, Index L) {
    device_buffer<T> xr(L, on.stream);
    reverse_device_rows(on, x, xr.data(), L, Index(1));
    cuda_eval<A>::vector(n.inner(), on, c, transposed, static_cast<const T*>(xr.data()), y, L);
    reverse_device_rows(on, static_cast<const T*>(y), y, L, Index(1));
  }
};

}  // namespace iattn::cuda_detail
