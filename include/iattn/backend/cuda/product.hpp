// iattn/backend/cuda/product.hpp: CUDA evaluator of Product A * B.
//   apply        a Semiseparable between diagonals (diag(z) S, S diag(d), diag(z) S diag(d), in
//                either association: Mamba-1's and Mamba-2's chains) is one scan with the
//                diagonals folded into its reads and writes (scan_fold); otherwise the right factor
//                into a device temporary, then the left one on it (node by node, right to left;
//                each node's own kernels).
//   materialize  channel c's A^c B^c, (L, L), by the banded rewrites where a factor is a band
//                (Diagonal, CausalConv and products of them; kernels/band.hpp):
//                  B a band:  A's matrix, then multiplied by B on the right, O(L^2 K); Mamba-1's
//                             (... * diag(dt)) * conv(w) fuses diag(dt) conv(w) into one pass,
//                             H[t, s] = sum_lag M[t, s+lag] dt_{s+lag} w[K-1-lag]
//                  A a band:  B's matrix, then multiplied by A on the left
//                  a diagonal multiplies in place; otherwise through one (L, L) temporary
//                  neither:   both matrices, then their lower-triangular product
//                             (kernels/lower_product.hpp, O(L^3 / 6): the general fallback;
//                             the full product, O(L^3), when a factor is flipped)
//   vector       y = A (B x) (forward) or B^T (A^T x) (transposed), O(L N) per factor
#pragma once

#include "../../ops/product.hpp"
#include "band.hpp"
#include "semiseparable.hpp"
#include "evaluator.hpp"
#include "identity.hpp"
#include "kernels/lower_product.hpp"

#include <type_traits>

namespace iattn::cuda_detail {

/// Product<A2, Diagonal<T>> * CausalConv<T>: the diagonal fuses into the convolution's pass.
template <class A, class B>
struct fused_right_band : std::false_type {};
template <class A2, class T>
struct fused_right_band<Product<A2, Diagonal<T>>, CausalConv<T>> : std::true_type {};

/// A Semiseparable with diagonals around it, diag(out) S diag(in), which one scan evaluates
/// (semiseparable.hpp, apply_scaled): core(n), and in(n) / out(n) (null where there is none).
template <class P>
struct scan_fold : std::false_type {};
template <class T>
struct scan_fold<Product<Diagonal<T>, Semiseparable<T>>> : std::true_type {
  template <class N> static const Semiseparable<T>& core(const N& n) { return n.right(); }
  template <class N> static const Diagonal<T>* out(const N& n) { return &n.left(); }
  template <class N> static const Diagonal<T>* in(const N&) { return nullptr; }
};
template <class T>
struct scan_fold<Product<Semiseparable<T>, Diagonal<T>>> : std::true_type {
  template <class N> static const Semiseparable<T>& core(const N& n) { return n.left(); }
  template <class N> static const Diagonal<T>* out(const N&) { return nullptr; }
  template <class N> static const Diagonal<T>* in(const N& n) { return &n.right(); }
};
template <class T>
struct scan_fold<Product<Product<Diagonal<T>, Semiseparable<T>>, Diagonal<T>>> : std::true_type {
  template <class N> static const Semiseparable<T>& core(const N& n) { return n.left().right(); }
  template <class N> static const Diagonal<T>* out(const N& n) { return &n.left().left(); }
  template <class N> static const Diagonal<T>* in(const N& n) { return &n.right(); }
};
template <class T>
struct scan_fold<Product<Diagonal<T>, Product<Semiseparable<T>, Diagonal<T>>>> : std::true_type {
  template <class N> static const Semiseparable<T>& core(const N& n) { return n.right().left(); }
  template <class N> static const Diagonal<T>* out(const N& n) { return &n.left(); }
  template <class N> static const Diagonal<T>* in(const N& n) { return &n.right().right(); }
};

template <class A, class B>
struct cuda_eval<Product<A, B>> {
  static constexpr bool applies = applies_v<A> && applies_v<B>;
  static constexpr bool materializes = materializes_v<A> && materializes_v<B>;
  static constexpr bool slices = slices_v<A> && slices_v<B>;

  template <class T>
  static void apply(const Product<A, B>& n, const cuda& on, const T* x, T* y, Index L) {
    if constexpr (scan_fold<Product<A, B>>::value) {
      using F = scan_fold<Product<A, B>>;
      device_buffer<T> in, out;
      scan_scales<T> scales;
      if (const Diagonal<T>* d = F::in(n)) {
        in = upload(d->d(), on.stream);
        scales.in = in.data();
        scales.in_rows = d->d().rows();
      }
      if (const Diagonal<T>* d = F::out(n)) {
        out = upload(d->d(), on.stream);
        scales.out = out.data();
        scales.out_rows = d->d().rows();
      }
      cuda_eval<Semiseparable<T>>::apply_scaled(F::core(n), on, x, y, L, scales);
      return;
    }
    const Index D = apply_channels_of(n);
    device_buffer<T> tmp(L * D, on.stream);  // (L, D): B x
    apply_node(n.right(), on, x, tmp.data(), L, D);
    apply_node(n.left(), on, static_cast<const T*>(tmp.data()), y, L, D);
  }

  template <class T>
  static void materialize(const Product<A, B>& n, const cuda& on, Index c, T* out, Index L) {
    if (L == 0) return;
    if constexpr (single_band_v<Product<A, B>>) {  // diag(d) conv(w): one band
      const device_band<T> b(n, c, on);
      simt::launch("band_materialize", &band_materialize<T>, elementwise_launch(L * L), on.stream, b.f, out, L);
    } else if constexpr (fused_right_band<A, B>::value) {  // (A2 diag(d)) conv(w) = A2 (diag(d) conv(w))
      using A2 = std::remove_cvref_t<decltype(n.left().left())>;
      device_buffer<T> m(L * L, on.stream);
      cuda_eval<A2>::materialize(n.left().left(), on, c, m.data(), L);
      const device_band<T> b(Product<Diagonal<T>, CausalConv<T>>(n.left().right(), n.right()), c, on);
      launch_band_multiply(b.f, on, false, is_lower_v<A2>, static_cast<const T*>(m.data()), out, L);
    } else if constexpr (device_band_v<B>) {
      multiply_by_band<T, is_diagonal_v<B>, A>(n.left(), n.right(), false, on, c, out, L);
    } else if constexpr (device_band_v<A>) {
      multiply_by_band<T, is_diagonal_v<A>, B>(n.right(), n.left(), true, on, c, out, L);
    } else {
      device_buffer<T> ma(L * L, on.stream), mb(L * L, on.stream);
      cuda_eval<A>::materialize(n.left(), on, c, ma.data(), L);
      cuda_eval<B>::materialize(n.right(), on, c, mb.data(), L);
      const Index tiles = (L + tile_dim - 1) / tile_dim;
      simt::launch("lower_product_tiles", &lower_product_tiles<T>,
                   {{unsigned(tiles), unsigned(tiles)}, {tile_dim, tile_rows}, 0}, on.stream,
                   static_cast<const T*>(ma.data()), static_cast<const T*>(mb.data()), out, L,
                   is_lower_v<A> && is_lower_v<B>);
    }
  }

  template <class T>
  static void vector(const Product<A, B>& n, const cuda& on, Index c, bool transposed, const T* x, T* y, Index L) {
    device_buffer<T> tmp(L, on.stream);
    if (transposed) {  // (A B)^T x = B^T (A^T x)
      cuda_eval<A>::vector(n.left(), on, c, true, x, tmp.data(), L);
      cuda_eval<B>::vector(n.right(), on, c, true, static_cast<const T*>(tmp.data()), y, L);
    } else {
      cuda_eval<B>::vector(n.right(), on, c, false, x, tmp.data(), L);
      cuda_eval<A>::vector(n.left(), on, c, false, static_cast<const T*>(tmp.data()), y, L);
    }
  }

 private:
  /// out = M Band (left = false) or Band M (left = true), M = the core's matrix.
  template <class T, bool InPlace, class Core, class Band>
  static void multiply_by_band(const Core& core, const Band& band, bool left, const cuda& on, Index c, T* out, Index L) {
    if constexpr (InPlace) {
      cuda_eval<Core>::materialize(core, on, c, out, L);
      band_multiply_into(band, on, c, left, is_lower_v<Core>, static_cast<const T*>(out), out, L);
    } else {
      device_buffer<T> m(L * L, on.stream);
      cuda_eval<Core>::materialize(core, on, c, m.data(), L);
      band_multiply_into(band, on, c, left, is_lower_v<Core>, static_cast<const T*>(m.data()), out, L);
    }
  }
};

}  // namespace iattn::cuda_detail
