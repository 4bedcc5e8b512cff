// iattn/backend/cpu/tile.hpp: the evaluator interface of the CPU backend.
//
// Every node type has two evaluators (specialised in backend/cpu/<node>.hpp):
//   slab_eval<Node>::apply  (node, ctx, c0, nc, x, y)  y = H x on channels [c0, c0+nc)
//   slab_eval<Node>::apply_t(node, ctx, c0, nc, x, y)  y = H^T x (the anti-causal, transposed apply)
//     x and y are (L, nc) row-major slabs with row stride nc; y never aliases x.
//   channel_eval<Node, T>(node, ctx, c)                prepared once per channel, then
//     .block(i0, i1, j0, j1, out)                      writes H^c[i0:i1, j0:j1] into the tile
//     .diag(t)                                         H^c[t, t], for diagonal nodes only
// Evaluators assume a bound expression (GroupNorm statistics fixed); the drivers check that.
#pragma once

#include "../../core/config.hpp"

#include <Eigen/Core>

#include <algorithm>
#include <memory>
#include <vector>

namespace iattn::cpu_detail {

/// Sizes fixed for one evaluation: L tokens, D channels.
struct context {
  Index L;
  Index D;
};

/// A strided view of a row-major tile of an (L, L) matrix.
template <class T>
struct tile {
  T* data;
  Index rows, cols, stride;

  T& operator()(Index i, Index j) const { return data[i * stride + j]; }
  T* row(Index i) const { return data + i * stride; }
  tile sub(Index i, Index j, Index r, Index c) const { return {data + i * stride + j, r, c, stride}; }
  void set_zero() const {
    for (Index i = 0; i < rows; ++i) std::fill(row(i), row(i) + cols, T(0));
  }
  Eigen::Map<Matrix<T>, 0, Eigen::OuterStride<>> map() const { return {data, rows, cols, Eigen::OuterStride<>(stride)}; }
};

/// An owned (rows, cols) tile buffer.
template <class T>
struct tile_buffer {
  std::vector<T> storage;
  tile<T> view;
  tile_buffer(Index rows, Index cols) : storage(std::size_t(std::max<Index>(rows * cols, 1))), view{storage.data(), rows, cols, cols} {}
};

/// Uninitialised scratch for one (L, nc) slab: every evaluator writes its whole output before
/// reading it, so no pass is spent zeroing.
template <class T>
struct scratch {
  std::unique_ptr<T[]> p;
  explicit scratch(Index n) : p(new T[std::size_t(std::max<Index>(n, 1))]) {}
  T* data() const { return p.get(); }
  T& operator[](Index i) const { return p[std::size_t(i)]; }
};

template <class Node>
struct slab_eval;
template <class Node, class T>
struct channel_eval;

/// Writes the diagonal of a diagonal evaluator into a tile (zero elsewhere).
template <class Ev, class T>
void diagonal_block(const Ev& ev, Index i0, Index i1, Index j0, Index j1, tile<T> out) {
  out.set_zero();
  for (Index t = std::max(i0, j0); t < std::min(i1, j1); ++t) out(t - i0, t - j0) = ev.diag(t);
}

/// Token-block edge used by every tiled evaluator: tiles line up on multiples of it.
inline constexpr Index tile_size = 64;

}  // namespace iattn::cpu_detail
