// iattn/backend/cpu/diagonal.hpp: CPU evaluators of the diagonal nodes: Diagonal, Identity and a
// bound GroupNorm (apply is a SIMD scaling across channels; a tile holds the diagonal).
#pragma once

#include "../../ops/diagonal.hpp"
#include "../../ops/group_norm.hpp"
#include "../../ops/identity.hpp"
#include "simd.hpp"
#include "tile.hpp"

#include <algorithm>
#include <string>

namespace iattn::cpu_detail {

/// y[t, j] = d[t, j] * x[t, j] for the channel slab, d read from row pointers.
template <class T, class RowOf>
void scale_rows(Index L, Index nc, RowOf&& d_row, const T* x, T* y) {
  for (Index t = 0; t < L; ++t) {
    const T* d = d_row(t);
    simd::for_packs<T>(nc, [&](auto w, Index j) {
      using P = simd::pack<T, decltype(w)::value>;
      (P::load(d + j) * P::load(x + t * nc + j)).store(y + t * nc + j);
    });
  }
}

template <class T>
struct slab_eval<Diagonal<T>> {
  static void apply(const Diagonal<T>& n, const context& cx, Index c0, Index nc, const T* x, T* y) {
    scale_rows(cx.L, nc, [&](Index t) { return n.d().row(n.constant() ? 0 : t) + c0; }, x, y);
  }
  static void apply_t(const Diagonal<T>& n, const context& cx, Index c0, Index nc, const T* x, T* y) {
    apply(n, cx, c0, nc, x, y);
  }
};

template <class T>
struct channel_eval<Diagonal<T>, T> {
  const Diagonal<T>* n;
  Index c;
  channel_eval(const Diagonal<T>& node, const context&, Index ch) : n(&node), c(ch) {}
  T diag(Index t) const { return n->value(t, c); }
  void block(Index i0, Index i1, Index j0, Index j1, tile<T> out) const { diagonal_block(*this, i0, i1, j0, j1, out); }
};

template <>
struct slab_eval<Identity> {
  template <class T>
  static void apply(const Identity&, const context& cx, Index, Index nc, const T* x, T* y) {
    std::copy(x, x + cx.L * nc, y);
  }
  template <class T>
  static void apply_t(const Identity& n, const context& cx, Index c0, Index nc, const T* x, T* y) {
    apply(n, cx, c0, nc, x, y);
  }
};

template <class T>
struct channel_eval<Identity, T> {
  channel_eval(const Identity&, const context&, Index) {}
  T diag(Index) const { return T(1); }
  void block(Index i0, Index i1, Index j0, Index j1, tile<T> out) const { diagonal_block(*this, i0, i1, j0, j1, out); }
};

/// A bound GroupNorm's (L, D) diagonal (formed by bound_to), checked against the evaluation's shape.
template <class T>
const Matrix<T>& bound_scale(const GroupNorm<T>& n, const context& cx) {
  if (!n.bound()) detail::fail("apply", "a GroupNorm without statistics reached a slab pass; bind(H, X) first");
  const Matrix<T>& s = n.scale();
  if (s.rows() != cx.L || s.cols() != cx.D)
    detail::fail("apply", "a GroupNorm bound to (" + std::to_string(s.rows()) + ", " + std::to_string(s.cols()) +
                              ") statistics is applied to (L=" + std::to_string(cx.L) + ", D=" + std::to_string(cx.D) +
                              "); bind it to an input of that shape");
  return s;
}

/// A bound GroupNorm: diag(weight[c] / sigma_t[g(c)]).
template <class T>
struct slab_eval<GroupNorm<T>> {
  static void apply(const GroupNorm<T>& n, const context& cx, Index c0, Index nc, const T* x, T* y) {
    const Matrix<T>& s = bound_scale(n, cx);
    scale_rows(cx.L, nc, [&](Index t) { return s.data() + t * cx.D + c0; }, x, y);
  }
  static void apply_t(const GroupNorm<T>& n, const context& cx, Index c0, Index nc, const T* x, T* y) {
    apply(n, cx, c0, nc, x, y);
  }
};

template <class T>
struct channel_eval<GroupNorm<T>, T> {
  const GroupNorm<T>* n;
  Index c, D;
  channel_eval(const GroupNorm<T>& node, const context& cx, Index ch) : n(&node), c(ch), D(cx.D) {}
  T diag(Index t) const { return n->value(t, c, D); }
  void block(Index i0, Index i1, Index j0, Index j1, tile<T> out) const { diagonal_block(*this, i0, i1, j0, j1, out); }
};

}  // namespace iattn::cpu_detail
