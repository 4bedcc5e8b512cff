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
#include "../../ops/group_norm.hpp"
#include "../../ops/linear_recurrence.hpp"
#include "../../ops/product.hpp"
#include "../../ops/scaled.hpp"
#include "../../ops/semiseparable.hpp"
#include "../../ops/sum.hpp"
#include "diagonal.hpp"  // bound_scale
#include "gemm.hpp"
#include "tile.hpp"

#include <algorithm>
#include <type_traits>
#include <vector>

namespace iattn::cpu_detail {

/// y = post * (Node (pre * conv x)): the node's own streaming apply when it has one (the scans),
/// else whole-slab passes around its apply. The fallback takes slab rows only (ldx = ldy = 0):
/// apply_slabs hands over the caller's matrices only where streams_rows says every row stays in a
/// streaming node.
template <class Node, class T>
void apply_scaled(const Node& n, const context& cx, Index c0, Index nc, const T* x, T* y, const row_ops<T>& sc) {
  if constexpr (requires { slab_eval<Node>::apply_scaled(n, cx, c0, nc, x, y, sc); }) {
    slab_eval<Node>::apply_scaled(n, cx, c0, nc, x, y, sc);
  } else {
    if (!sc.shapes_input()) {
      slab_eval<Node>::apply(n, cx, c0, nc, x, y);
    } else {
      scratch<T> tmp(cx.L * nc);
      for (Index t = 0; t < cx.L; ++t) {
        T* row = tmp.data() + t * nc;
        const T* in = input_row(&sc, t, c0, nc, x, row);
        if (in != row) std::copy(in, in + nc, row);
      }
      slab_eval<Node>::apply(n, cx, c0, nc, tmp.data(), y);
    }
    if (!sc.post.empty())
      for (Index t = 0; t < cx.L; ++t) scale_row(sc.post, t, c0, nc, y + t * nc, y + t * nc);
  }
}

/// The nodes a chain folds into a scan's row scalings (row_ops::pre, post): a Diagonal, and a bound
/// GroupNorm, whose diagonal bound_to formed as an (L, D) matrix.
template <class Node, class T>
inline constexpr bool is_plain_diagonal_v = std::is_same_v<Node, Diagonal<T>> || std::is_same_v<Node, GroupNorm<T>>;

/// Such a node's coefficient as the scans read it.
template <class T>
diag_ref<T> diag_ref_of(const Diagonal<T>& n, const context&) {
  return {n.d().data(), n.d().cols(), n.constant()};
}
template <class T>
diag_ref<T> diag_ref_of(const GroupNorm<T>& n, const context& cx) {
  return {bound_scale(n, cx).data(), cx.D, false};
}

/// A product of such nodes only (diag(g) * norm, RWKV-7's and the delta rules' gate and norm): its
/// factors commute, so a chain folds all of them into the same row scalings as one.
template <class Node, class T>
struct diag_chain : std::bool_constant<is_plain_diagonal_v<Node, T>> {};
template <class A, class B, class T>
struct diag_chain<Product<A, B>, T> : std::bool_constant<diag_chain<A, T>::value && diag_chain<B, T>::value> {};
template <class Node, class T>
inline constexpr bool is_diag_chain_v = diag_chain<Node, T>::value;

/// Appends the coefficients of a diagonal chain's factors to fs.
template <class T, class Node>
void push_diags(const Node& n, const context& cx, std::vector<diag_ref<T>>& fs) {
  if constexpr (is_plain_diagonal_v<Node, T>) {
    fs.push_back(diag_ref_of(n, cx));
  } else {
    push_diags<T>(n.left(), cx, fs);
    push_diags<T>(n.right(), cx, fs);
  }
}

/// A sum of scaled convolutions, sum_k diag(s_k) conv_k (Griffin's document-masked convolution: one
/// lag per term): the first factor of a chain forms it per token (row_ops::conv_sum).
template <class Node, class T>
struct conv_sum : std::false_type {};
template <class T>
struct conv_sum<Product<Diagonal<T>, CausalConv<T>>, T> : std::true_type {};
template <class A, class B, class T>
struct conv_sum<Sum<A, B>, T> : std::bool_constant<conv_sum<A, T>::value && conv_sum<B, T>::value> {};
template <class Node, class T>
inline constexpr bool is_conv_sum_v = conv_sum<Node, T>::value;

/// Appends the terms of a sum of scaled convolutions, left to right, each with the range of lags
/// whose taps are nonzero on some channel (of all D: the result never depends on the slab).
template <class T, class Node>
void push_conv_terms(const Node& n, const context& cx, std::vector<conv_term<T>>& terms) {
  if constexpr (std::is_same_v<Node, Product<Diagonal<T>, CausalConv<T>>>) {
    const CausalConv<T>& conv = n.right();
    Index lo = conv.width(), hi = 0;
    for (Index lag = 0; lag < conv.width(); ++lag)
      for (Index c = 0; c < cx.D; ++c)
        if (conv.tap(lag, c) != T(0)) {
          lo = std::min(lo, lag), hi = lag + 1;
          break;
        }
    terms.push_back({diag_ref_of(n.left(), cx), &conv, lo, hi});
  } else {
    push_conv_terms<T>(n.left(), cx, terms);
    push_conv_terms<T>(n.right(), cx, terms);
  }
}

template <class A, class B>
struct slab_eval<Product<A, B>> {
  template <class T>
  static void apply(const Product<A, B>& n, const context& cx, Index c0, Index nc, const T* x, T* y) {
    apply_scaled(n, cx, c0, nc, x, y, row_ops<T>{});
  }
  /// A chain diag * ... * diag * conv runs as one pass of its non-diagonal core: right-hand
  /// diagonals join the core's input scalings, left-hand ones its output scalings (they commute with
  /// each other), and a convolution that is the first factor applied to x is formed per token
  /// inside the core's pass (row_ops::conv).
  template <class T>
  static void apply_scaled(const Product<A, B>& n, const context& cx, Index c0, Index nc, const T* x, T* y,
                           const row_ops<T>& sc) {
    if constexpr (is_diag_chain_v<B, T>) {
      row_ops<T> s = sc;
      push_diags<T>(n.right(), cx, s.pre);
      cpu_detail::apply_scaled(n.left(), cx, c0, nc, x, y, s);
    } else if constexpr (is_diag_chain_v<A, T>) {
      row_ops<T> s = sc;
      push_diags<T>(n.left(), cx, s.post);
      cpu_detail::apply_scaled(n.right(), cx, c0, nc, x, y, s);
    } else {
      if constexpr (std::is_same_v<B, CausalConv<T>>) {
        if (!sc.shapes_input()) {
          row_ops<T> s = sc;
          s.conv = &n.right();
          return cpu_detail::apply_scaled(n.left(), cx, c0, nc, x, y, s);
        }
      } else if constexpr (is_conv_sum_v<B, T>) {
        if (!sc.shapes_input()) {
          row_ops<T> s = sc;
          push_conv_terms<T>(n.right(), cx, s.conv_sum);
          return cpu_detail::apply_scaled(n.left(), cx, c0, nc, x, y, s);
        }
      }
      scratch<T> tmp(cx.L * nc);
      row_ops<T> in, out;
      in.pre = sc.pre, in.conv = sc.conv, in.conv_sum = sc.conv_sum, in.ldx = sc.ldx;
      out.post = sc.post, out.ldy = sc.ldy;
      cpu_detail::apply_scaled(n.right(), cx, c0, nc, x, tmp.data(), in);
      cpu_detail::apply_scaled(n.left(), cx, c0, nc, tmp.data(), y, out);
    }
  }
  template <class T>
  static void apply_t(const Product<A, B>& n, const context& cx, Index c0, Index nc, const T* x, T* y) {
    scratch<T> tmp(cx.L * nc);
    slab_eval<A>::apply_t(n.left(), cx, c0, nc, x, tmp.data());
    slab_eval<B>::apply_t(n.right(), cx, c0, nc, tmp.data(), y);
  }
};

/// The scans whose apply_scaled honours row_ops' strides (transition.hpp adds Transition), those
/// that also add row_ops::skip (Semiseparable; Transition), and those of them that also take
/// diagonals between the sum and the core, pre[skip_pre..) (Semiseparable: skip_inputs).
template <class T, class Node>
inline constexpr bool streaming_core_v = std::is_same_v<Node, Semiseparable<T>> || std::is_same_v<Node, LinearRecurrence<T>>;
template <class T, class Node>
inline constexpr bool takes_skip_v = std::is_same_v<Node, Semiseparable<T>>;
template <class T, class Node>
inline constexpr bool splits_skip_v = std::is_same_v<Node, Semiseparable<T>>;

/// True when apply_scaled(n, ...) reaches a core that takes row_ops::skip through diagonals only:
/// left-hand ones (the core's output scalings inside the sum) and right-hand ones (`inner`: its
/// input scalings inside the sum, which the skip's row must not have, so only a core that splits
/// its input rows takes them). Nothing else between a sum and its core: a convolution there would
/// shape the core's input and not the skip's.
template <class T, class Node>
constexpr bool skip_reaches(const Node*, bool inner = false) {
  return takes_skip_v<T, Node> && (!inner || splits_skip_v<T, Node>);
}
template <class T, class A, class B>
constexpr bool skip_reaches(const Product<A, B>*, bool inner = false) {
  if constexpr (is_diag_chain_v<B, T>) return skip_reaches<T>(static_cast<const A*>(nullptr), true);
  else if constexpr (is_diag_chain_v<A, T>) return skip_reaches<T>(static_cast<const B*>(nullptr), inner);
  else return false;
}

/// How apply_scaled(n, ...) with fresh row_ops evaluates: `rows` when it reaches one streaming core
/// (a scan) through diagonals and at most one convolution or sum of scaled convolutions, that being
/// the first factor applied to x: then every row of x and y is touched only inside the core's
/// token loop, and apply_slabs hands the caller's matrices over in place instead of copying slabs
/// (row_ops::ldx, ldy); `elementwise` when that core is also channel-local with one state entry
/// per channel (LinearRecurrence), so a slab of any width keeps its state in cache. Mirrors the
/// branches of slab_eval<Product>::apply_scaled; conv_first is false once a diagonal sits to the
/// right of the remaining factors.
enum class stream_kind { none, rows, elementwise };
template <class T, class Node>
constexpr stream_kind streams_rows(const Node*, bool /*conv_first*/) {
  if constexpr (std::is_same_v<Node, LinearRecurrence<T>>) return stream_kind::elementwise;
  else return streaming_core_v<T, Node> ? stream_kind::rows : stream_kind::none;
}
template <class T, class A, class B>
constexpr stream_kind streams_rows(const Sum<A, B>*, bool conv_first);
template <class T, class A, class B>
constexpr stream_kind streams_rows(const Product<A, B>*, bool conv_first) {
  if constexpr (is_diag_chain_v<B, T>) return streams_rows<T>(static_cast<const A*>(nullptr), false);
  else if constexpr (is_diag_chain_v<A, T>) return streams_rows<T>(static_cast<const B*>(nullptr), conv_first);
  else if constexpr (std::is_same_v<B, CausalConv<T>> || is_conv_sum_v<B, T>)
    return conv_first ? streams_rows<T>(static_cast<const A*>(nullptr), false) : stream_kind::none;
  else return stream_kind::none;
}
/// A sum core + diag streams when its diagonal becomes the core's skip (algebra.hpp).
template <class T, class A, class B>
constexpr stream_kind streams_rows(const Sum<A, B>*, bool conv_first) {
  if constexpr (std::is_same_v<B, Diagonal<T>> && skip_reaches<T>(static_cast<const A*>(nullptr)))
    return streams_rows<T>(static_cast<const A*>(nullptr), conv_first);
  else return stream_kind::none;
}
template <class T, class Node>
inline constexpr bool streams_rows_v = streams_rows<T>(static_cast<const Node*>(nullptr), true) != stream_kind::none;
template <class T, class Node>
inline constexpr bool streams_elementwise_v = streams_rows<T>(static_cast<const Node*>(nullptr), true) == stream_kind::elementwise;

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

// The product tiles that read both factors' tiles, as functions of the factors' evaluators and their
// structure (compile-time constants here, run-time flags for AnyOperator's products).

/// B a lower band of width W: (A B)[t, s] = sum_{lag < W} A[t, s+lag] B[s+lag, s], from A's tile
/// widened by W-1 columns and B's band entries (Griffin's masked convolution).
template <class T, class EvA, class EvB>
void band_right_product(const EvA& a, const EvB& b, Index band, bool a_lower, Index L, Index i0, Index i1, Index j0, Index j1,
                        tile<T> out) {
  Index hi = std::min(L, j1 + band - 1);
  if (a_lower) hi = std::min(hi, i1);
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

/// A a lower band of width W: (A B)[t, s] = sum_{lag < W} A[t, t-lag] B[t-lag, s].
template <class T, class EvA, class EvB>
void band_left_product(const EvA& a, const EvB& b, Index band, bool b_lower, Index i0, Index i1, Index j0, Index j1, tile<T> out) {
  Index lo = std::max<Index>(0, i0 - band + 1);
  if (b_lower) lo = std::max(lo, std::min(j0, i1));
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

/// Which triangles the factors of a dense product keep (the inner range follows from them).
struct product_structure {
  bool a_lower, a_upper, b_lower, b_upper;
};

/// The sum over the inner tokens k that the structure of A and B leaves nonzero, as GEMMs of tiles.
template <class T, class EvA, class EvB>
void dense_product(const EvA& a, const EvB& b, product_structure st, Index L, Index i0, Index i1, Index j0, Index j1, tile<T> out) {
  Index lo = 0, hi = L;
  if (st.a_lower) hi = std::min(hi, i1);
  if (st.a_upper) lo = std::max(lo, i0);
  if (st.b_lower) lo = std::max(lo, j0);
  if (st.b_upper) hi = std::min(hi, j1);
  out.set_zero();
  for (Index k0 = lo; k0 < hi; k0 += 4 * tile_size) {
    const Index k1 = std::min(hi, k0 + 4 * tile_size);
    tile_buffer<T> ta(i1 - i0, k1 - k0), tb(k1 - k0, j1 - j0);
    a.block(i0, i1, k0, k1, ta.view);
    b.block(k0, k1, j0, j1, tb.view);
    // out += ta tb (the factors' tiles are evaluated first: they may use this thread's scratch too)
    gemm(gemm_thread_scratch<T>(), i1 - i0, j1 - j0, k1 - k0, T(1), ta.view.data, k1 - k0, tb.view.data, j1 - j0, true,
         out.data, out.stride, true);
  }
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
  void band_right(Index i0, Index i1, Index j0, Index j1, tile<T> out) const {
    band_right_product<T>(a, b, band, is_lower_v<A>, L, i0, i1, j0, j1, out);
  }
  void band_left(Index i0, Index i1, Index j0, Index j1, tile<T> out) const {
    band_left_product<T>(a, b, band, is_lower_v<B>, i0, i1, j0, j1, out);
  }
  void dense(Index i0, Index i1, Index j0, Index j1, tile<T> out) const {
    dense_product<T>(a, b, {is_lower_v<A>, is_upper_v<A>, is_lower_v<B>, is_upper_v<B>}, L, i0, i1, j0, j1, out);
  }
};

}  // namespace iattn::cpu_detail
