// iattn/backend/cpu/product.hpp: CPU evaluator of Product<A, B> and its structured rewrites.
//
// apply: y = A (B x) on the channel slab, so a whole chain runs right to left while the slab is in
// cache. Tiles take the named rewrites (each tested against materialize(A) * materialize(B)):
//   diag(d) * diag(e) = diag(d e)
//   diag(d) * B       : B's tile with row t scaled by d_t          (diag(d) S(l,B,C) = S(l,B,diag(d) C))
//   A * diag(e)       : A's tile with column s scaled by e_s       (S(l,B,C) diag(e) = S(l,diag(e) B,C))
//   A * M (conv)      : (A M)[t, s] = sum_{lag<K} A[t, s+lag] w[K-1-lag], from A's tile widened by K-1
//                       columns: a semiseparable plus a band, never a dense product
//   M (conv) * B      : (M B)[t, s] = sum_{lag<K} w[K-1-lag] B[t-lag, s], from B's tile raised by K-1 rows
// Otherwise a dense product of A's and B's tiles over the inner range their structure allows
// (O(L^3) for a full materialize; documented in docs/operators.md).
#pragma once

#include "../../ops/diagonal.hpp"
#include "../../ops/product.hpp"
#include "../../ops/scaled.hpp"
#include "../../ops/sum.hpp"
#include "tile.hpp"

#include <algorithm>
#include <type_traits>
#include <vector>

namespace iattn::cpu_detail {

/// y = post * (Node (pre * x)): the node's own folded apply when it has one (the scans), else
/// whole-slab scaling passes around its apply.
template <class Node, class T>
void apply_scaled(const Node& n, const context& cx, Index c0, Index nc, const T* x, T* y, const diag_scales<T>& sc) {
  if constexpr (requires { slab_eval<Node>::apply_scaled(n, cx, c0, nc, x, y, sc); }) {
    slab_eval<Node>::apply_scaled(n, cx, c0, nc, x, y, sc);
  } else {
    if (sc.pre.empty()) {
      slab_eval<Node>::apply(n, cx, c0, nc, x, y);
    } else {
      scratch<T> tmp(cx.L * nc);
      for (Index t = 0; t < cx.L; ++t) scale_row(sc.pre, t, c0, nc, x + t * nc, tmp.data() + t * nc);
      slab_eval<Node>::apply(n, cx, c0, nc, tmp.data(), y);
    }
    if (!sc.post.empty())
      for (Index t = 0; t < cx.L; ++t) scale_row(sc.post, t, c0, nc, y + t * nc, y + t * nc);
  }
}

template <class Node, class T>
inline constexpr bool is_plain_diagonal_v = std::is_same_v<Node, Diagonal<T>>;

template <class A, class B>
struct slab_eval<Product<A, B>> {
  template <class T>
  static void apply(const Product<A, B>& n, const context& cx, Index c0, Index nc, const T* x, T* y) {
    apply_scaled(n, cx, c0, nc, x, y, diag_scales<T>{});
  }
  /// A chain diag * ... * diag runs as one pass of its non-diagonal core: right-hand diagonals join
  /// the core's input scalings, left-hand ones its output scalings (they commute with each other).
  template <class T>
  static void apply_scaled(const Product<A, B>& n, const context& cx, Index c0, Index nc, const T* x, T* y,
                           const diag_scales<T>& sc) {
    if constexpr (is_plain_diagonal_v<B, T>) {
      diag_scales<T> s = sc;
      s.pre.push_back({n.right().d().data(), n.right().d().cols(), n.right().constant()});
      cpu_detail::apply_scaled(n.left(), cx, c0, nc, x, y, s);
    } else if constexpr (is_plain_diagonal_v<A, T>) {
      diag_scales<T> s = sc;
      s.post.push_back({n.left().d().data(), n.left().d().cols(), n.left().constant()});
      cpu_detail::apply_scaled(n.right(), cx, c0, nc, x, y, s);
    } else {
      scratch<T> tmp(cx.L * nc);
      cpu_detail::apply_scaled(n.right(), cx, c0, nc, x, tmp.data(), diag_scales<T>{sc.pre, {}});
      cpu_detail::apply_scaled(n.left(), cx, c0, nc, tmp.data(), y, diag_scales<T>{{}, sc.post});
    }
  }
  template <class T>
  static void apply_t(const Product<A, B>& n, const context& cx, Index c0, Index nc, const T* x, T* y) {
    scratch<T> tmp(cx.L * nc);
    slab_eval<A>::apply_t(n.left(), cx, c0, nc, x, tmp.data());
    slab_eval<B>::apply_t(n.right(), cx, c0, nc, tmp.data(), y);
  }
};

template <class N>
struct is_sum_node : std::false_type {};
template <class A, class B>
struct is_sum_node<Sum<A, B>> : std::true_type {};
template <class N>
struct is_product_node : std::false_type {};
template <class A, class B>
struct is_product_node<Product<A, B>> : std::true_type {};
template <class N>
struct is_scaled_node : std::false_type {};
template <class A>
struct is_scaled_node<Scaled<A>> : std::true_type {};

/// Width of a band node (is_band_v): nonzero only for 0 <= t - s < band_width.
template <class Node>
Index band_width(const Node& n) {
  if constexpr (is_causal_conv_v<Node>) return n.width();
  else if constexpr (is_diagonal_v<Node>) return 1;
  else if constexpr (is_scaled_node<Node>::value) return band_width(n.inner());
  else if constexpr (is_product_node<Node>::value) return band_width(n.left()) + band_width(n.right()) - 1;
  else return std::max(band_width(n.left()), band_width(n.right()));  // Sum
}

template <class A, class B, class T>
struct channel_eval<Product<A, B>, T> {
  channel_eval<A, T> a;
  channel_eval<B, T> b;
  Index L;
  Index band = 0;  // width of B (or of A) when it is a band that is not a plain convolution

  channel_eval(const Product<A, B>& n, const context& cx, Index c) : a(n.left(), cx, c), b(n.right(), cx, c), L(cx.L) {
    if constexpr (is_band_v<B> && !is_diagonal_v<B>) band = band_width(n.right());
    else if constexpr (is_band_v<A> && !is_diagonal_v<A>) band = band_width(n.left());
  }

  T diag(Index t) const
    requires(is_diagonal_v<A> && is_diagonal_v<B>)
  {
    return a.diag(t) * b.diag(t);
  }

  void block(Index i0, Index i1, Index j0, Index j1, tile<T> out) const {
    if constexpr (is_diagonal_v<A> && is_diagonal_v<B>) {
      diagonal_block(*this, i0, i1, j0, j1, out);
    } else if constexpr (is_diagonal_v<A>) {
      b.block(i0, i1, j0, j1, out);
      for (Index i = 0; i < out.rows; ++i) {
        const T d = a.diag(i0 + i);
        for (Index j = 0; j < out.cols; ++j) out(i, j) *= d;
      }
    } else if constexpr (is_diagonal_v<B>) {
      a.block(i0, i1, j0, j1, out);
      std::vector<T> e(static_cast<std::size_t>(out.cols));
      for (Index j = 0; j < out.cols; ++j) e[std::size_t(j)] = b.diag(j0 + j);
      for (Index i = 0; i < out.rows; ++i)
        for (Index j = 0; j < out.cols; ++j) out(i, j) *= e[std::size_t(j)];
    } else if constexpr (is_causal_conv_v<B>) {
      conv_right(i0, i1, j0, j1, out);
    } else if constexpr (is_band_v<B>) {
      band_right(i0, i1, j0, j1, out);
    } else if constexpr (is_causal_conv_v<A>) {
      conv_left(i0, i1, j0, j1, out);
    } else if constexpr (is_band_v<A>) {
      band_left(i0, i1, j0, j1, out);
    } else {
      dense(i0, i1, j0, j1, out);
    }
  }

 private:
  // (A M)[t, s] = sum_{lag < K} A[t, s+lag] tap(lag)
  void conv_right(Index i0, Index i1, Index j0, Index j1, tile<T> out) const {
    Index hi = std::min(L, j1 + b.width() - 1);
    if constexpr (is_lower_v<A>) hi = std::min(hi, i1);
    out.set_zero();
    if (hi <= j0) return;
    tile_buffer<T> wide(i1 - i0, hi - j0);
    a.block(i0, i1, j0, hi, wide.view);
    for (Index i = 0; i < out.rows; ++i) {
      const T* src = wide.view.row(i);
      T* dst = out.row(i);
      for (Index lag = 0; lag < b.width(); ++lag) {
        const T w = b.tap(lag);
        const Index jmax = std::min(out.cols, hi - j0 - lag);
        for (Index j = 0; j < jmax; ++j) dst[j] += w * src[j + lag];
      }
    }
  }
  // (M B)[t, s] = sum_{lag < K} tap(lag) B[t-lag, s]
  void conv_left(Index i0, Index i1, Index j0, Index j1, tile<T> out) const {
    Index lo = std::max<Index>(0, i0 - a.width() + 1);
    if constexpr (is_lower_v<B>) lo = std::max(lo, std::min(j0, i1));
    out.set_zero();
    if (lo >= i1) return;
    tile_buffer<T> tall(i1 - lo, j1 - j0);
    b.block(lo, i1, j0, j1, tall.view);
    for (Index i = 0; i < out.rows; ++i) {
      const Index t = i0 + i;
      T* dst = out.row(i);
      for (Index lag = 0; lag < a.width() && t - lag >= lo; ++lag) {
        const T w = a.tap(lag);
        const T* src = tall.view.row(t - lag - lo);
        for (Index j = 0; j < out.cols; ++j) dst[j] += w * src[j];
      }
    }
  }
  // B a band of width W: (A B)[t, s] = sum_{lag < W} A[t, s+lag] B[s+lag, s], from A's tile widened
  // by W-1 columns and B's band entries (Griffin's masked convolution).
  void band_right(Index i0, Index i1, Index j0, Index j1, tile<T> out) const {
    Index hi = std::min(L, j1 + band - 1);
    if constexpr (is_lower_v<A>) hi = std::min(hi, i1);
    out.set_zero();
    if (hi <= j0) return;
    tile_buffer<T> wide(i1 - i0, hi - j0), tall(hi - j0, j1 - j0);
    a.block(i0, i1, j0, hi, wide.view);
    b.block(j0, hi, j0, j1, tall.view);
    for (Index i = 0; i < out.rows; ++i) {
      const T* src = wide.view.row(i);
      T* dst = out.row(i);
      for (Index j = 0; j < out.cols; ++j)
        for (Index k = j; k < std::min(j + band, hi - j0); ++k) dst[j] += src[k] * tall.view(k, j);
    }
  }
  // A a band of width W: (A B)[t, s] = sum_{lag < W} A[t, t-lag] B[t-lag, s].
  void band_left(Index i0, Index i1, Index j0, Index j1, tile<T> out) const {
    Index lo = std::max<Index>(0, i0 - band + 1);
    if constexpr (is_lower_v<B>) lo = std::max(lo, std::min(j0, i1));
    out.set_zero();
    if (lo >= i1) return;
    tile_buffer<T> wide(i1 - i0, i1 - lo), tall(i1 - lo, j1 - j0);
    a.block(i0, i1, lo, i1, wide.view);
    b.block(lo, i1, j0, j1, tall.view);
    for (Index i = 0; i < out.rows; ++i) {
      const Index t = i0 + i;
      T* dst = out.row(i);
      for (Index k = std::max(lo, t - band + 1); k <= t; ++k) {
        const T w = wide.view(i, k - lo);
        const T* src = tall.view.row(k - lo);
        for (Index j = 0; j < out.cols; ++j) dst[j] += w * src[j];
      }
    }
  }
  // sum over the inner tokens k that the structure of A and B leaves nonzero.
  void dense(Index i0, Index i1, Index j0, Index j1, tile<T> out) const {
    Index lo = 0, hi = L;
    if constexpr (is_lower_v<A>) hi = std::min(hi, i1);
    if constexpr (is_upper_v<A>) lo = std::max(lo, i0);
    if constexpr (is_lower_v<B>) lo = std::max(lo, j0);
    if constexpr (is_upper_v<B>) hi = std::min(hi, j1);
    out.set_zero();
    auto dst = out.map();
    for (Index k0 = lo; k0 < hi; k0 += 4 * tile_size) {
      const Index k1 = std::min(hi, k0 + 4 * tile_size);
      tile_buffer<T> ta(i1 - i0, k1 - k0), tb(k1 - k0, j1 - j0);
      a.block(i0, i1, k0, k1, ta.view);
      b.block(k0, k1, j0, j1, tb.view);
      dst.noalias() += ta.view.map() * tb.view.map();
    }
  }
};

}  // namespace iattn::cpu_detail
