// iattn/backend/cpu/bind.hpp: the data-dependent part of evaluation.
//
// GroupNorm's statistics depend on its own input, so it synchronises all channels of a group.
// apply_full walks an expression that contains an unbound GroupNorm at full width (every channel),
// computing statistics where they are needed; every GroupNorm-free subexpression still runs as a
// slab-fused pass. bind_node returns a copy with every GroupNorm's statistics fixed from the
// forward pass on X. is_bound tells whether an expression can be evaluated channel by channel.
#pragma once

#include "../../ops/flip.hpp"
#include "../../ops/group_norm.hpp"
#include "../../ops/product.hpp"
#include "../../ops/row_normalize.hpp"
#include "../../ops/scaled.hpp"
#include "../../ops/sum.hpp"
#include "parallel.hpp"
#include "product.hpp"
#include "tile.hpp"

#include <algorithm>
#include <vector>

namespace iattn::cpu_detail {

/// Channels per slab: a multiple of every SIMD width, small enough to keep an (L, slab) column
/// block in cache for moderate L.
inline constexpr Index slab_width = 128;

/// Channels per slab of a streaming chain whose core keeps one state entry per channel
/// (streams_elementwise_v: Griffin's and HGRN's linear recurrences): the channels split evenly
/// between the threads, in multiples of 64. Each token then reads one long contiguous piece of
/// every (L, D) row, which the hardware prefetchers follow; 128-channel slabs read 512 bytes per
/// row and page, and ran 2-3x slower at model widths (docs/performance.md, issue 22). Slab edges
/// stay on multiples of the SIMD width, so a channel runs in the same lane at any thread count.
inline Index stream_width(Index D) {
  constexpr Index unit = 64;
  const Index threads = std::max(1, max_threads());
  const Index per = (D + threads - 1) / threads;
  return std::max(slab_width, (per + unit - 1) / unit * unit);
}

/// How apply_slabs_into reads and writes: H^T instead of H (transposed_op), the result as (D, L)
/// instead of (L, D) (transpose_out: channel c's L values contiguous, what row and col return), and
/// the input e_onehot in every channel instead of X (X unused: no (L, D) one-hot matrix is formed).
struct slab_io {
  bool transposed_op = false;
  bool transpose_out = false;
  Index onehot = -1;
};

/// The slab loop of apply_slabs_into for any expression: each slab's (L, nc) input gathered from X
/// (or a one-hot), run(node, cx, c0, nc, x, y, transposed_op) on it, the result scattered into Y.
/// Compiled once per scalar type, not once per expression (issue 19 part 5).
template <class T>
void slabs_into(const context& cx, const T* X, T* Y, slab_io io,
                void (*run)(const void*, const context&, Index, Index, const T*, T*, bool), const void* node) {
  const Index nslabs = (cx.D + slab_width - 1) / slab_width, L = cx.L;
  parallel_for(nslabs, [&](Index s) {
    const Index c0 = s * slab_width, nc = std::min(slab_width, cx.D - c0);
    scratch<T> x(L * nc), y(L * nc);
    if (io.onehot >= 0) {
      std::fill(x.data(), x.data() + L * nc, T(0));
      std::fill(x.data() + io.onehot * nc, x.data() + (io.onehot + 1) * nc, T(1));
    } else {
      for (Index t = 0; t < L; ++t) std::copy(X + t * cx.D + c0, X + t * cx.D + c0 + nc, x.data() + t * nc);
    }
    run(node, cx, c0, nc, x.data(), y.data(), io.transposed_op);
    if (io.transpose_out) {
      constexpr Index tb = 32;  // a block of tokens per pass keeps the slab's rows and Y's lines in cache
      for (Index t0 = 0; t0 < L; t0 += tb)
        for (Index c = 0; c < nc; ++c) {
          T* dst = Y + (c0 + c) * L;
          for (Index t = t0; t < std::min(L, t0 + tb); ++t) dst[t] = y[t * nc + c];
        }
    } else {
      for (Index t = 0; t < L; ++t) std::copy(y.data() + t * nc, y.data() + (t + 1) * nc, Y + t * cx.D + c0);
    }
  });
}

/// Y = H X (or the variants of slab_io) for a bound expression into the caller's Y, slab by slab
/// (in parallel): the fused, channel-local pass. A chain that streams (streams_rows_v: diag * scan
/// * diag * conv) reads X's rows and writes Y's in place; everything else runs on (L, nc) slabs
/// taken from the threads' scratch pools. Y must not alias X.
/// Transposes = false: io.transposed_op is never set (apply), so H^T's evaluators are not
/// instantiated for expressions that are only applied (issue 19 part 5).
template <class T, class Node, bool Transposes = true>
void apply_slabs_into(const Node& n, const context& cx, const T* X, T* Y, slab_io io = {}) {
  if (cx.L == 0 || cx.D == 0) return;
  const Index L = cx.L;
  if constexpr (streams_rows_v<T, Node>) {
    if (!io.transposed_op && !io.transpose_out && io.onehot < 0) {
      const Index width = streams_elementwise_v<T, Node> ? stream_width(cx.D) : slab_width;
      parallel_for((cx.D + width - 1) / width, [&](Index s) {
        const Index c0 = s * width, nc = std::min(width, cx.D - c0);
        row_ops<T> rio;
        rio.ldx = rio.ldy = cx.D;
        apply_scaled(n, cx, c0, nc, X + c0, Y + c0, rio);
      });
      return;
    }
    if constexpr (streams_elementwise_v<T, Node>) {
      if (io.transposed_op && io.transpose_out && io.onehot >= 0) {  // row: one backward pass per slab
        const Index width = stream_width(cx.D);
        parallel_for((cx.D + width - 1) / width, [&](Index s) {
          const Index c0 = s * width, nc = std::min(width, cx.D - c0);
          row_ops<T> rio;
          rio.row_t = io.onehot;
          apply_scaled(n, cx, c0, nc, X, Y + c0 * L, rio);
        });
        return;
      }
    }
  }
  slabs_into<T>(cx, X, Y, io, [](const void* node, const context& c, Index c0, Index nc, const T* x, T* y, bool t) {
    const Node& nd = *static_cast<const Node*>(node);
    if constexpr (Transposes) {
      if (t) return slab_eval<Node>::apply_t(nd, c, c0, nc, x, y);
    }
    slab_eval<Node>::apply(nd, c, c0, nc, x, y);
  }, &n);
}

/// Y = H X for a bound expression, as a new (L, D) matrix.
template <class T, class Node>
Matrix<T> apply_slabs(const Node& n, const context& cx, const Matrix<T>& X) {
  Matrix<T> Y(cx.L, cx.D);
  apply_slabs_into<T, Node, false>(n, cx, X.data(), Y.data());
  return Y;
}

template <class T>
Matrix<T> reverse_rows(const Matrix<T>& X) {
  return X.colwise().reverse();
}

// ---- is_bound: no GroupNorm without statistics -------------------------------------------------
template <class T>
bool is_bound(const GroupNorm<T>& n);
template <class A, class B>
bool is_bound(const Product<A, B>& n);
template <class A, class B>
bool is_bound(const Sum<A, B>& n);
template <class A>
bool is_bound(const Scaled<A>& n);
template <class A>
bool is_bound(const Flip<A>& n);
template <class A>
bool is_bound(const RowNormalize<A>& n);

template <class Node>
bool is_bound(const Node&) {
  static_assert(!has_group_norm_v<Node>, "iattn: missing is_bound overload for a node containing a GroupNorm");
  return true;
}
template <class T>
bool is_bound(const GroupNorm<T>& n) { return n.bound(); }
template <class A, class B>
bool is_bound(const Product<A, B>& n) { return is_bound(n.left()) && is_bound(n.right()); }
template <class A, class B>
bool is_bound(const Sum<A, B>& n) { return is_bound(n.left()) && is_bound(n.right()); }
template <class A>
bool is_bound(const Scaled<A>& n) { return is_bound(n.inner()); }
template <class A>
bool is_bound(const Flip<A>& n) { return is_bound(n.inner()); }
template <class A>
bool is_bound(const RowNormalize<A>& n) { return is_bound(n.inner()); }

// ---- bind_node: fix statistics from X ------------------------------------------------------------
template <class T, class Node>
Node bind_node(const Node& n, const context&, const Matrix<T>&) {
  static_assert(!has_group_norm_v<Node>, "iattn: missing bind overload for a node containing a GroupNorm");
  return n;
}
template <class T, class A, class B>
Product<A, B> bind_node(const Product<A, B>& n, const context& cx, const Matrix<T>& X);
template <class T, class A, class B>
Sum<A, B> bind_node(const Sum<A, B>& n, const context& cx, const Matrix<T>& X);
template <class T, class A>
Scaled<A> bind_node(const Scaled<A>& n, const context& cx, const Matrix<T>& X);
template <class T, class A>
Flip<A> bind_node(const Flip<A>& n, const context& cx, const Matrix<T>& X);
template <class T, class A>
RowNormalize<A> bind_node(const RowNormalize<A>& n, const context& cx, const Matrix<T>& X);
template <class T>
GroupNorm<T> bind_node(const GroupNorm<T>& n, const context& cx, const Matrix<T>& X) {
  n.check_input(X.rows(), X.cols(), "bind");
  return n.bound_to(n.compute(X.data(), cx.L, cx.D));
}

// ---- apply_full: Y = H X at full width, computing statistics on the way --------------------------
template <class T, class Node>
Matrix<T> apply_full(const Node& n, const context& cx, const Matrix<T>& X) {
  static_assert(!has_group_norm_v<Node>, "iattn: missing apply_full overload for a node containing a GroupNorm");
  return apply_slabs(n, cx, X);
}
template <class T>
Matrix<T> apply_full(const GroupNorm<T>& n, const context& cx, const Matrix<T>& X) {
  if (n.bound()) return apply_slabs(n, cx, X);
  return apply_slabs(bind_node(n, cx, X), cx, X);
}
template <class T, class A, class B>
Matrix<T> apply_full(const Product<A, B>& n, const context& cx, const Matrix<T>& X) {
  if constexpr (!has_group_norm_v<Product<A, B>>) return apply_slabs(n, cx, X);
  else if (is_bound(n)) return apply_slabs(n, cx, X);  // statistics fixed: one fused pass
  else return apply_full(n.left(), cx, apply_full(n.right(), cx, X));
}
template <class T, class A, class B>
Matrix<T> apply_full(const Sum<A, B>& n, const context& cx, const Matrix<T>& X) {
  if constexpr (!has_group_norm_v<Sum<A, B>>) return apply_slabs(n, cx, X);
  else if (is_bound(n)) return apply_slabs(n, cx, X);  // statistics fixed: one fused pass
  else return apply_full(n.left(), cx, X) + apply_full(n.right(), cx, X);
}
template <class T, class A>
Matrix<T> apply_full(const Scaled<A>& n, const context& cx, const Matrix<T>& X) {
  if constexpr (!has_group_norm_v<A>) return apply_slabs(n, cx, X);
  else if (is_bound(n)) return apply_slabs(n, cx, X);  // statistics fixed: one fused pass
  else return T(n.factor()) * apply_full(n.inner(), cx, X);
}
template <class T, class A>
Matrix<T> apply_full(const Flip<A>& n, const context& cx, const Matrix<T>& X) {
  if constexpr (!has_group_norm_v<A>) return apply_slabs(n, cx, X);
  else if (is_bound(n)) return apply_slabs(n, cx, X);  // statistics fixed: one fused pass
  else return reverse_rows<T>(apply_full(n.inner(), cx, reverse_rows<T>(X)));
}
template <class T, class A>
Matrix<T> apply_full(const RowNormalize<A>& n, const context& cx, const Matrix<T>& X) {
  if constexpr (!has_group_norm_v<A>) return apply_slabs(n, cx, X);
  else if (is_bound(n)) return apply_slabs(n, cx, X);  // statistics fixed: one fused pass
  else return apply_slabs(bind_node(n, cx, X), cx, X);
}

// ---- bind_node definitions -------------------------------------------------------------------------
template <class T, class A, class B>
Product<A, B> bind_node(const Product<A, B>& n, const context& cx, const Matrix<T>& X) {
  B b = bind_node(n.right(), cx, X);
  if constexpr (has_group_norm_v<A>) {
    const Matrix<T> V = apply_slabs(b, cx, X);
    return Product<A, B>(bind_node(n.left(), cx, V), std::move(b));
  } else {
    return Product<A, B>(n.left(), std::move(b));
  }
}
template <class T, class A, class B>
Sum<A, B> bind_node(const Sum<A, B>& n, const context& cx, const Matrix<T>& X) {
  return Sum<A, B>(bind_node(n.left(), cx, X), bind_node(n.right(), cx, X));
}
template <class T, class A>
Scaled<A> bind_node(const Scaled<A>& n, const context& cx, const Matrix<T>& X) {
  return Scaled<A>(n.factor(), bind_node(n.inner(), cx, X));
}
template <class T, class A>
Flip<A> bind_node(const Flip<A>& n, const context& cx, const Matrix<T>& X) {
  return Flip<A>(bind_node(n.inner(), cx, reverse_rows<T>(X)));
}
template <class T, class A>
RowNormalize<A> bind_node(const RowNormalize<A>& n, const context& cx, const Matrix<T>& X) {
  return RowNormalize<A>(bind_node(n.inner(), cx, X));
}

}  // namespace iattn::cpu_detail
