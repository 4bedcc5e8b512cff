// iattn/backend/cuda/row_normalize.hpp: CUDA evaluator of RowNormalize<A> = diag(1 / r) A with
// r = A 1 (every row divided by its sum), on top of A's evaluator; r is taken as the CPU backend
// takes it, by applying A to ones:
//   apply        r = A 1 and y = A x (both (L, D)), then y / r entry by entry
//   materialize  A^c's (L, L) matrix, r = A^c 1 (one channel's vector path), each row t / r_t
//   vector       forward  y = (A^c x) / r;  transposed (rows)  y = (A^c)^T (x / r)
// so materialize needs A's vector path too (every node the backend covers has one). An unbound
// GroupNorm inside A is bound from x first (on the device, as the CPU's apply does), so that A 1
// and A x see the same statistics.
#pragma once

#include "../../ops/row_normalize.hpp"
#include "band.hpp"
#include "evaluator.hpp"
#include "identity.hpp"
#include "group_norm.hpp"
#include "kernels/row_normalize.hpp"

namespace iattn::cuda_detail {

template <class T>
void fill_device(const cuda& on, T* v, Index n, T value) {
  if (n == 0) return;
  simt::launch("fill_value", &fill_value<T>, elementwise_launch(n), on.stream, v, n, value);
}

/// out = in / r row by row ((rows, cols) values, r of length rows); in place when in == out.
template <class T>
void divide_device_rows(const cuda& on, const T* in, const T* r, T* out, Index rows, Index cols) {
  if (rows == 0 || cols == 0) return;
  simt::launch("divide_rows", &divide_rows<T>, elementwise_launch(rows * cols), on.stream, in, r, out, rows * cols,
               cols);
}

template <class A>
struct cuda_eval<RowNormalize<A>> {
  static constexpr bool applies = applies_v<A>;
  static constexpr bool materializes = materializes_v<A> && slices_v<A>;
  static constexpr bool slices = slices_v<A>;

  template <class T>
  static void apply(const RowNormalize<A>& n, const cuda& on, const T* x, T* y, Index L) {
    if constexpr (has_group_norm_v<A>) {
      apply_inner(device_binder<A>::bind(n.inner(), on, x, L, apply_channels_of(n)), on, x, y, L, apply_channels_of(n));
    } else {
      apply_inner(n.inner(), on, x, y, L, apply_channels_of(n));
    }
  }
  template <class T>
  static void materialize(const RowNormalize<A>& n, const cuda& on, Index c, T* out, Index L) {
    cuda_eval<A>::materialize(n.inner(), on, c, out, L);
    const device_buffer<T> r = row_sums<T>(n, on, c, L);
    divide_device_rows(on, static_cast<const T*>(out), r.data(), out, L, L);
  }
  template <class T>
  static void vector(const RowNormalize<A>& n, const cuda& on, Index c, bool transposed, const T* x, T* y, Index L) {
    const device_buffer<T> r = row_sums<T>(n, on, c, L);
    if (transposed) {  // (diag(1/r) A)^T x = A^T (x / r)
      device_buffer<T> xr(L, on.stream);
      divide_device_rows(on, x, r.data(), xr.data(), L, Index(1));
      cuda_eval<A>::vector(n.inner(), on, c, true, static_cast<const T*>(xr.data()), y, L);
    } else {
      cuda_eval<A>::vector(n.inner(), on, c, false, x, y, L);
      divide_device_rows(on, static_cast<const T*>(y), r.data(), y, L, Index(1));
    }
  }

 private:
  template <class T>
  static void apply_inner(const A& a, const cuda& on, const T* x, T* y, Index L, Index D) {
    const Index m = L * D;
    device_buffer<T> ones(m, on.stream), r(m, on.stream);
    fill_device(on, ones.data(), m, T(1));
    apply_node(a, on, static_cast<const T*>(ones.data()), r.data(), L, D);
    apply_node(a, on, x, y, L, D);
    divide_device_rows(on, static_cast<const T*>(y), static_cast<const T*>(r.data()), y, m, Index(1));
  }
  /// r = A^c 1, length L.
  template <class T>
  static device_buffer<T> row_sums(const RowNormalize<A>& n, const cuda& on, Index c, Index L) {
    device_buffer<T> ones(L, on.stream), r(L, on.stream);
    fill_device(on, ones.data(), L, T(1));
    cuda_eval<A>::vector(n.inner(), on, c, false, static_cast<const T*>(ones.data()), r.data(), L);
    return r;
  }
};

}  // namespace iattn::cuda_detail
