// iattn/backend/cpu/algebra.hpp: CPU evaluators of Sum, Scaled, Flip and RowNormalize.
//   Sum:          y = A x + B x; diagonal scalings around the sum fold into both terms (a plain
//                 diagonal B, like Mamba's skip D, then costs one row pass); a diagonal B adds to
//                 A's tile in place.
//   Scaled:       s * A.
//   Flip:         J A J: apply reverses the slab's tokens around A; a tile is A's mirrored tile.
//   RowNormalize: diag(1/r) A with r = A 1, taken by applying A to ones (per slab, or per channel).
#pragma once

#include "../../ops/diagonal.hpp"
#include "../../ops/flip.hpp"
#include "../../ops/row_normalize.hpp"
#include "../../ops/scaled.hpp"
#include "../../ops/sum.hpp"
#include "product.hpp"  // apply_scaled, diag_ref_of, skip_reaches
#include "tile.hpp"

#include <algorithm>
#include <vector>

namespace iattn::cpu_detail {

template <class A, class B>
struct slab_eval<Sum<A, B>> {
  template <class T>
  static void apply(const Sum<A, B>& n, const context& cx, Index c0, Index nc, const T* x, T* y) {
    apply_scaled(n, cx, c0, nc, x, y, row_ops<T>{});
  }
  /// y = post (A + B)(pre x) = post A (pre x) + post B (pre x), the scalings folded into each term;
  /// a diagonal B whose A reaches a core that takes it becomes that core's skip (row_ops::skip; the
  /// one sum that streams, streams_rows). Otherwise x and y are slabs here: sc.ldx = sc.ldy = 0.
  template <class T>
  static void apply_scaled(const Sum<A, B>& n, const context& cx, Index c0, Index nc, const T* x, T* y,
                           const row_ops<T>& sc) {
    if constexpr (std::is_same_v<B, Diagonal<T>> && skip_reaches<T>(static_cast<const A*>(nullptr))) {
      if (!sc.skip) {  // the diagonal added to the core's rows inside its own pass (row_ops::skip)
        row_ops<T> s = sc;
        s.skip = diag_ref_of(n.right(), cx);
        s.skip_post = s.post.size();
        s.skip_pre = s.pre.size();
        return cpu_detail::apply_scaled(n.left(), cx, c0, nc, x, y, s);
      }
    }
    cpu_detail::apply_scaled(n.left(), cx, c0, nc, x, y, sc);
    if constexpr (std::is_same_v<B, Diagonal<T>>) {
      row_ops<T> s = sc;
      s.pre.push_back({n.right().d().data(), n.right().d().cols(), n.right().constant()});
      std::vector<T> row(static_cast<std::size_t>(nc));
      for (Index t = 0; t < cx.L; ++t) {
        const T* in = input_row(&s, t, c0, nc, x, row.data());
        scale_row(s.post, t, c0, nc, in, row.data());
        T* yt = y + t * nc;
        for (Index j = 0; j < nc; ++j) yt[j] += row[std::size_t(j)];
      }
    } else {
      scratch<T> tmp(cx.L * nc);
      cpu_detail::apply_scaled(n.right(), cx, c0, nc, x, tmp.data(), sc);
      for (Index i = 0; i < cx.L * nc; ++i) y[i] += tmp[i];
    }
  }
  template <class T>
  static void apply_t(const Sum<A, B>& n, const context& cx, Index c0, Index nc, const T* x, T* y) {
    scratch<T> tmp(cx.L * nc);
    slab_eval<A>::apply_t(n.left(), cx, c0, nc, x, y);
    slab_eval<B>::apply_t(n.right(), cx, c0, nc, x, tmp.data());
    for (Index i = 0; i < cx.L * nc; ++i) y[i] += tmp[i];
  }
};

template <class A, class B, class T>
struct channel_eval<Sum<A, B>, T> {
  channel_eval<A, T> a;
  channel_eval<B, T> b;
  channel_eval(const Sum<A, B>& n, const context& cx, Index c) : a(n.left(), cx, c), b(n.right(), cx, c) {}

  T diag(Index t) const
    requires(is_diagonal_v<A> && is_diagonal_v<B>)
  {
    return a.diag(t) + b.diag(t);
  }
  void block(Index i0, Index i1, Index j0, Index j1, tile<T> out) const {
    a.block(i0, i1, j0, j1, out);
    if constexpr (is_diagonal_v<B>) {
      for (Index t = std::max(i0, j0); t < std::min(i1, j1); ++t) out(t - i0, t - j0) += b.diag(t);
    } else {
      tile_buffer<T> tb(i1 - i0, j1 - j0);
      b.block(i0, i1, j0, j1, tb.view);
      for (Index i = 0; i < out.rows; ++i)
        for (Index j = 0; j < out.cols; ++j) out(i, j) += tb.view(i, j);
    }
  }
};

template <class A>
struct slab_eval<Scaled<A>> {
  template <class T>
  static void apply(const Scaled<A>& n, const context& cx, Index c0, Index nc, const T* x, T* y) {
    slab_eval<A>::apply(n.inner(), cx, c0, nc, x, y);
    for (Index i = 0; i < cx.L * nc; ++i) y[i] *= T(n.factor());
  }
  template <class T>
  static void apply_t(const Scaled<A>& n, const context& cx, Index c0, Index nc, const T* x, T* y) {
    slab_eval<A>::apply_t(n.inner(), cx, c0, nc, x, y);
    for (Index i = 0; i < cx.L * nc; ++i) y[i] *= T(n.factor());
  }
};

template <class A, class T>
struct channel_eval<Scaled<A>, T> {
  channel_eval<A, T> a;
  T s;
  channel_eval(const Scaled<A>& n, const context& cx, Index c) : a(n.inner(), cx, c), s(T(n.factor())) {}
  T diag(Index t) const
    requires is_diagonal_v<A>
  {
    return s * a.diag(t);
  }
  void block(Index i0, Index i1, Index j0, Index j1, tile<T> out) const {
    a.block(i0, i1, j0, j1, out);
    for (Index i = 0; i < out.rows; ++i)
      for (Index j = 0; j < out.cols; ++j) out(i, j) *= s;
  }
};

template <class T>
void reverse_tokens(Index L, Index nc, const T* x, T* y) {
  for (Index t = 0; t < L; ++t) std::copy(x + (L - 1 - t) * nc, x + (L - t) * nc, y + t * nc);
}

template <class A>
struct slab_eval<Flip<A>> {
  template <class T>
  static void apply(const Flip<A>& n, const context& cx, Index c0, Index nc, const T* x, T* y) {
    std::vector<T> xr(static_cast<std::size_t>(cx.L * nc)), yr(static_cast<std::size_t>(cx.L * nc));
    reverse_tokens(cx.L, nc, x, xr.data());
    slab_eval<A>::apply(n.inner(), cx, c0, nc, xr.data(), yr.data());
    reverse_tokens(cx.L, nc, yr.data(), y);
  }
  template <class T>
  static void apply_t(const Flip<A>& n, const context& cx, Index c0, Index nc, const T* x, T* y) {
    std::vector<T> xr(static_cast<std::size_t>(cx.L * nc)), yr(static_cast<std::size_t>(cx.L * nc));
    reverse_tokens(cx.L, nc, x, xr.data());
    slab_eval<A>::apply_t(n.inner(), cx, c0, nc, xr.data(), yr.data());
    reverse_tokens(cx.L, nc, yr.data(), y);
  }
};

template <class A, class T>
struct channel_eval<Flip<A>, T> {
  channel_eval<A, T> a;
  Index L;
  channel_eval(const Flip<A>& n, const context& cx, Index c) : a(n.inner(), cx, c), L(cx.L) {}
  T diag(Index t) const
    requires is_diagonal_v<A>
  {
    return a.diag(L - 1 - t);
  }
  // flip(A)[t, s] = A[L-1-t, L-1-s]
  void block(Index i0, Index i1, Index j0, Index j1, tile<T> out) const {
    tile_buffer<T> m(i1 - i0, j1 - j0);
    a.block(L - i1, L - i0, L - j1, L - j0, m.view);
    for (Index i = 0; i < out.rows; ++i)
      for (Index j = 0; j < out.cols; ++j) out(i, j) = m.view(out.rows - 1 - i, out.cols - 1 - j);
  }
};

template <class A>
struct slab_eval<RowNormalize<A>> {
  template <class T>
  static std::vector<T> row_sums(const RowNormalize<A>& n, const context& cx, Index c0, Index nc) {
    std::vector<T> ones(static_cast<std::size_t>(cx.L * nc), T(1)), r(static_cast<std::size_t>(cx.L * nc));
    slab_eval<A>::apply(n.inner(), cx, c0, nc, ones.data(), r.data());
    return r;
  }
  template <class T>
  static void apply(const RowNormalize<A>& n, const context& cx, Index c0, Index nc, const T* x, T* y) {
    const auto r = row_sums<T>(n, cx, c0, nc);
    slab_eval<A>::apply(n.inner(), cx, c0, nc, x, y);
    for (Index i = 0; i < cx.L * nc; ++i) y[i] /= r[std::size_t(i)];
  }
  template <class T>
  static void apply_t(const RowNormalize<A>& n, const context& cx, Index c0, Index nc, const T* x, T* y) {
    const auto r = row_sums<T>(n, cx, c0, nc);
    std::vector<T> xs(static_cast<std::size_t>(cx.L * nc));
    for (Index i = 0; i < cx.L * nc; ++i) xs[std::size_t(i)] = x[i] / r[std::size_t(i)];
    slab_eval<A>::apply_t(n.inner(), cx, c0, nc, xs.data(), y);
  }
};

template <class A, class T>
struct channel_eval<RowNormalize<A>, T> {
  channel_eval<A, T> a;
  std::vector<T> r;  // r[t] = (A^c 1)_t
  channel_eval(const RowNormalize<A>& n, const context& cx, Index c)
      : a(n.inner(), cx, c), r(slab_eval<RowNormalize<A>>::template row_sums<T>(n, cx, c, 1)) {}
  T diag(Index t) const
    requires is_diagonal_v<A>
  {
    return a.diag(t) / r[std::size_t(t)];
  }
  void block(Index i0, Index i1, Index j0, Index j1, tile<T> out) const {
    a.block(i0, i1, j0, j1, out);
    for (Index i = 0; i < out.rows; ++i)
      for (Index j = 0; j < out.cols; ++j) out(i, j) /= r[std::size_t(i0 + i)];
  }
};

}  // namespace iattn::cpu_detail
