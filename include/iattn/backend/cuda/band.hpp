// iattn/backend/cuda/band.hpp: the banded factors' host side (kernels/band.hpp). A Diagonal, a
// CausalConv, or the fused pair diag(d) * conv(w) (Mamba's Delta before its convolution) is one
// band_factor: its coefficients uploaded, one launch per use.
//   device_band<T>(node, c, on)      the factor of channel c on the device
//   band_multiply_into(B, on, c, left, in, out, L)   out = M B (right) or B M (left) for any band
//                                    expression B (products of bands factor by factor, through a
//                                    device temporary); in == out only when B is diagonal
#pragma once

#include "../../core/error.hpp"
#include "../../ops/causal_conv.hpp"
#include "../../ops/diagonal.hpp"
#include "../../ops/group_norm.hpp"
#include "../../ops/product.hpp"
#include "kernels/band.hpp"
#include "kernels/group_norm.hpp"
#include "memory.hpp"

#include <type_traits>

namespace iattn::cuda_detail {

/// Whether Node is one band_factor: Diagonal, CausalConv, Product<Diagonal, CausalConv>, or a
/// GroupNorm (bound: a diagonal).
template <class Node>
inline constexpr bool single_band_v = false;
template <class T>
inline constexpr bool single_band_v<Diagonal<T>> = true;
template <class T>
inline constexpr bool single_band_v<CausalConv<T>> = true;
template <class T>
inline constexpr bool single_band_v<Product<Diagonal<T>, CausalConv<T>>> = true;
template <class T>
inline constexpr bool single_band_v<GroupNorm<T>> = true;

/// Whether Node is a band the banded rewrites take: a single band or a Product of them. (A Scaled
/// or Sum of bands is a band to the CPU's traits, is_band_v, but not here: it is materialized.)
template <class Node>
inline constexpr bool device_band_v = single_band_v<Node>;
template <class A, class B>
inline constexpr bool device_band_v<Product<A, B>> = single_band_v<Product<A, B>> || (device_band_v<A> && device_band_v<B>);

/// A grid-stride launch over n items: blocks of elementwise_threads, or of n rounded up to whole
/// warps when n is smaller (a row's short vectors: no idle warps, and fewer emulated threads).
inline simt::launch_config elementwise_launch(Index n) {
  const unsigned threads = n >= Index(elementwise_threads) ? elementwise_threads
                                                            : unsigned((n + simt::warp_size - 1) / simt::warp_size) * simt::warp_size;
  return {{simt::blocks_for(n, threads)}, {threads > 0 ? threads : simt::warp_size}, 0};
}

/// A band factor's coefficients on the device and the kernels' view of channel c.
template <class T>
struct device_band {
  device_buffer<T> d, w;
  band_factor<T> f{nullptr, 1, nullptr, 1, 1, 0};

  device_band(const Diagonal<T>& n, Index c, const cuda& on) : d(upload(n.d(), on.stream)) {
    f = band_factor<T>{d.data(), n.d().rows(), nullptr, 1, n.channels(), c};
  }
  /// A bound GroupNorm: channel c's diagonal weight[c] / sigma_t[g(c)], (L, 1), computed here.
  device_band(const GroupNorm<T>& n, Index c, const cuda& on) {
    if (!n.bound())
      detail::fail("GroupNorm (iattn::cuda)",
                   "the expression contains an unbound GroupNorm, whose statistics depend on the input; call "
                   "bind(iattn::cuda, H, X) or bind(H, X) first");
    const auto& s = n.stats();
    const Index L = s.inv_sigma.rows();
    if (L == 0) return;
    const device_buffer<T> inv = upload(s.inv_sigma, on.stream);
    if (!n.weight().empty()) w = upload(n.weight(), on.stream);
    d = device_buffer<T>(L, on.stream);
    simt::launch("group_norm_scale", &group_norm_scale<T>, elementwise_launch(L), on.stream, inv.data(),
                 static_cast<const T*>(w.data()), static_cast<const T*>(nullptr), d.data(), L, s.channels, n.groups(), c,
                 Index(1));
    f = band_factor<T>{d.data(), L, nullptr, 1, 1, 0};
  }
  device_band(const CausalConv<T>& n, Index c, const cuda& on) : w(upload(n.w(), on.stream)) {
    f = band_factor<T>{nullptr, 1, w.data(), n.width(), n.channels(), c};
  }
  device_band(const Product<Diagonal<T>, CausalConv<T>>& n, Index c, const cuda& on)
      : d(upload(n.left().d(), on.stream)), w(upload(n.right().w(), on.stream)) {
    f = band_factor<T>{d.data(), n.left().d().rows(), w.data(), n.right().width(), n.channels(), c};
  }
};


/// materialize and the row/col vectors of a single band node (Diagonal, CausalConv): the node's
/// factor of channel c on the device, then one band kernel. Their evaluators derive from it.
template <class Node>
struct band_node_eval {
  using T = typename Node::scalar;
  static void materialize(const Node& n, const cuda& on, Index c, T* out, Index L) {
    const device_band<T> b(n, c, on);
    simt::launch("band_materialize", &band_materialize<T>, elementwise_launch(L * L), on.stream, b.f, out, L);
  }
  static void vector(const Node& n, const cuda& on, Index c, bool transposed, const T* x, T* y, Index L) {
    const device_band<T> b(n, c, on);
    simt::launch("band_vector", &band_vector<T>, elementwise_launch(L), on.stream, b.f, transposed, x, y, L);
  }
};

template <class T>
void launch_band_multiply(const band_factor<T>& f, const cuda& on, bool left, bool lower, const T* in, T* out,
                          Index L) {
  simt::launch("band_multiply", &band_multiply<T>, elementwise_launch(L * L), on.stream, f, left, lower, in, out, L);
}

/// out = M B (left = false) or B M (left = true) for channel c, M = in (L, L); lower: M is
/// lower-triangular (the product is, and M's entries above the diagonal are not read).
template <class Band, class T>
void band_multiply_into(const Band& b, const cuda& on, Index c, bool left, bool lower, const T* in, T* out, Index L) {
  static_assert(device_band_v<Band>, "band_multiply_into: a band expression");
  if constexpr (single_band_v<Band>) {
    const device_band<T> db(b, c, on);
    launch_band_multiply(db.f, on, left, lower, in, out, L);
  } else if constexpr (is_diagonal_v<Band>) {  // Product of diagonals: they commute, every step in place
    band_multiply_into(b.left(), on, c, left, lower, in, out, L);
    band_multiply_into(b.right(), on, c, left, lower, static_cast<const T*>(out), out, L);
  } else {  // Product<B1, B2>: M B1 B2 = (M B1) B2; B1 B2 M = B1 (B2 M)
    device_buffer<T> tmp(L * L, on.stream);
    const T* mid = tmp.data();
    if (left) {
      band_multiply_into(b.right(), on, c, true, lower, in, tmp.data(), L);
      band_multiply_into(b.left(), on, c, true, lower, mid, out, L);
    } else {
      band_multiply_into(b.left(), on, c, false, lower, in, tmp.data(), L);
      band_multiply_into(b.right(), on, c, false, lower, mid, out, L);
    }
  }
}

}  // namespace iattn::cuda_detail
