// iattn/backend/cpu/evaluate.hpp: the CPU drivers behind apply, materialize, materialize_mean,
// row, col and block: they set up the context, cut the work into slabs or tiles and run them in
// parallel. Checks happen in iattn/evaluate.hpp before anything here runs.
#pragma once

#include "../../core/means.hpp"
#include "algebra.hpp"
#include "all_channels.hpp"
#include "bind.hpp"
#include "causal_conv.hpp"
#include "complex_semiseparable.hpp"
#include "diagonal.hpp"
#include "head_mean.hpp"
#include "linear_recurrence.hpp"
#include "mean.hpp"
#include "parallel.hpp"
#include "product.hpp"
#include "semiseparable.hpp"
#include "softmax_attention.hpp"
#include "tile.hpp"
#include "toeplitz_mean.hpp"
#include "transition.hpp"
#include "wkv.hpp"
#include "wkv_mean.hpp"

#include <algorithm>
#include <optional>
#include <vector>

namespace iattn::cpu_detail {

/// Whether the expression type N contains the node type Leaf anywhere (compile time), so that
/// evaluators instantiate only the kernels an expression can reach.
template <class Leaf, class N>
inline constexpr bool contains_v = std::is_same_v<Leaf, N>;
template <class Leaf, class A, class B>
inline constexpr bool contains_v<Leaf, Product<A, B>> = contains_v<Leaf, A> || contains_v<Leaf, B>;
template <class Leaf, class A, class B>
inline constexpr bool contains_v<Leaf, Sum<A, B>> = contains_v<Leaf, A> || contains_v<Leaf, B>;
template <class Leaf, class A>
inline constexpr bool contains_v<Leaf, Scaled<A>> = contains_v<Leaf, A>;
template <class Leaf, class A>
inline constexpr bool contains_v<Leaf, Flip<A>> = contains_v<Leaf, A>;
template <class Leaf, class A>
inline constexpr bool contains_v<Leaf, RowNormalize<A>> = contains_v<Leaf, A>;

/// Whether tile [i0, i1) x [j0, j1) of a lower (upper) triangular matrix lies wholly above (below)
/// its diagonal.
inline bool zero_tile(bool lower, bool upper, Index i0, Index i1, Index j0, Index j1) {
  return (lower && j0 >= i1) || (upper && i0 >= j1);
}

/// Writes tile (bi, bj) of channel c's matrix, or zeros where the structure says so.
template <class Node, class T>
void structured_block(const channel_eval<Node, T>& ev, Index i0, Index i1, Index j0, Index j1, tile<T> out) {
  if (zero_tile(is_lower_v<Node>, is_upper_v<Node>, i0, i1, j0, j1)) {
    out.set_zero();
    return;
  }
  ev.block(i0, i1, j0, j1, out);
}

/// The channels of an expression as the tile drivers see them: evaluators made a chunk of channels
/// at a time, then asked for tiles. Type-erased, so that the drivers (one channel's matrix, the
/// tile path's mean) are compiled once per scalar type, and an expression's evaluators once, not
/// once per driver (issue 19 part 5).
template <class T>
struct tile_channels {
  virtual void prepare(Index c0, Index nc) = 0;  ///< evaluators of channels [c0, c0 + nc), in parallel
  virtual void block(Index j, Index i0, Index i1, Index j0, Index j1, tile<T> out) const = 0;  ///< of channel c0 + j
 protected:
  ~tile_channels() = default;
};

/// channel_eval<Node, T> behind tile_channels: the one place the tile drivers make and ask them.
template <class Node, class T>
struct channel_tiles final : tile_channels<T> {
  const Node& n;
  const context& cx;
  std::vector<std::optional<channel_eval<Node, T>>> evs;
  channel_tiles(const Node& n_, const context& cx_) : n(n_), cx(cx_) {}
  void prepare(Index c0, Index nc) override {
    evs = std::vector<std::optional<channel_eval<Node, T>>>(std::size_t(nc));
    parallel_for(nc, [&](Index j) { evs[std::size_t(j)].emplace(n, cx, c0 + j); });
  }
  void block(Index j, Index i0, Index i1, Index j0, Index j1, tile<T> out) const override {
    evs[std::size_t(j)]->block(i0, i1, j0, j1, out);
  }
};

/// The prepared channel 0 of ch as an (L, L) matrix into out (L * L, row-major): every entry
/// written, tiles above (lower) or below (upper) the diagonal as zeros.
template <class T>
void materialize_tiles(const tile_channels<T>& ch, const context& cx, T* out, bool lower, bool upper) {
  const Index nb = (cx.L + tile_size - 1) / tile_size;
  parallel_for(nb, [&](Index bi) {
    const Index i0 = bi * tile_size, i1 = std::min(cx.L, i0 + tile_size);
    for (Index bj = 0; bj < nb; ++bj) {
      const Index j0 = bj * tile_size, j1 = std::min(cx.L, j0 + tile_size);
      tile<T> dst{out + i0 * cx.L + j0, i1 - i0, j1 - j0, cx.L};
      if (zero_tile(lower, upper, i0, i1, j0, j1)) dst.set_zero();
      else ch.block(0, i0, i1, j0, j1, dst);
    }
  });
}

/// Channel c's (L, L) matrix into out (L * L, row-major): every entry written.
template <class T, class Node>
void materialize_into(const Node& n, const context& cx, Index c, T* out) {
  if (cx.L == 0) return;
  channel_tiles<Node, T> ch(n, cx);
  ch.prepare(c, 1);
  materialize_tiles<T>(ch, cx, out, is_lower_v<Node>, is_upper_v<Node>);
}
template <class T, class Node>
Matrix<T> materialize(const Node& n, const context& cx, Index c) {
  Matrix<T> out(cx.L, cx.L);
  materialize_into<T>(n, cx, c, out.data());
  return out;
}

/// What a channel mean averages (core/means.hpp).
using mean_request = detail::mean_request;
/// The path of materialize_mean: the cheapest that applies (automatic), or one forced, for the
/// benchmarks' baselines and the tests: `channels` never takes head_mean.hpp's path nor
/// wkv_mean.hpp's (mean.hpp's (channel, state) GEMMs, else tiles), `heads` takes head_mean.hpp's
/// whenever the expression allows.
enum class mean_path { automatic, channels, heads };

/// Mean over channels [c0, c1) of H^c (or |H^c|), accumulated tile by tile: channel evaluators
/// are prepared a chunk of channels at a time, so memory is O(L^2) for the result plus
/// O(chunk * L * N). Tiles above (lower) or below (upper) the diagonal are skipped.
template <class T>
Matrix<T> mean_of_tiles(tile_channels<T>& ch, const context& cx, mean_request rq, bool lower, bool upper) {
  Matrix<T> out = Matrix<T>::Zero(cx.L, cx.L);
  if (cx.L == 0 || rq.c1 <= rq.c0) return out;
  const Index nb = (cx.L + tile_size - 1) / tile_size;
  struct tile_id { Index bi, bj; };
  std::vector<tile_id> tiles;
  for (Index bi = 0; bi < nb; ++bi)
    for (Index bj = 0; bj < nb; ++bj) {
      if (lower && bj > bi) continue;
      if (upper && bj < bi) continue;
      tiles.push_back({bi, bj});
    }
  const Index chunk = std::max<Index>(1, std::min<Index>(rq.c1 - rq.c0, 64));
  for (Index c0 = rq.c0; c0 < rq.c1; c0 += chunk) {
    const Index nc = std::min(chunk, rq.c1 - c0);
    ch.prepare(c0, nc);
    parallel_for(Index(tiles.size()), [&](Index k) {
      const Index i0 = tiles[std::size_t(k)].bi * tile_size, i1 = std::min(cx.L, i0 + tile_size);
      const Index j0 = tiles[std::size_t(k)].bj * tile_size, j1 = std::min(cx.L, j0 + tile_size);
      tile_buffer<T> tmp(i1 - i0, j1 - j0);
      tile<T> dst{out.data() + i0 * cx.L + j0, i1 - i0, j1 - j0, cx.L};
      for (Index j = 0; j < nc; ++j) {
        ch.block(j, i0, i1, j0, j1, tmp.view);
        if (rq.abs) dst.map() += tmp.view.map().cwiseAbs();
        else dst.map() += tmp.view.map();
      }
    });
  }
  out *= T(1) / T(rq.c1 - rq.c0);
  return out;
}

/// The path for expressions that neither mean.hpp nor head_mean.hpp can expand: mean_of_tiles over
/// the expression's channel evaluators.
template <class T, class Node>
Matrix<T> materialize_mean_tiles(const Node& n, const context& cx, mean_request rq) {
  channel_tiles<Node, T> ch(n, cx);
  return mean_of_tiles<T>(ch, cx, rq, is_lower_v<Node>, is_upper_v<Node>);
}

/// Whether n is a Flip, or a sum or scalar multiple with a Flip among its top-level terms (Vision
/// Mamba, Hydra: H_f + flip(H_b)).
template <class Node>
constexpr bool has_top_flip() {
  if constexpr (is_flip_node<Node>::value) return true;
  else if constexpr (is_sum_node<Node>::value)
    return has_top_flip<std::decay_t<decltype(std::declval<const Node&>().left())>>() ||
           has_top_flip<std::decay_t<decltype(std::declval<const Node&>().right())>>();
  else if constexpr (is_scaled_node<Node>::value) return has_top_flip<std::decay_t<decltype(std::declval<const Node&>().inner())>>();
  else return false;
}

template <class T, class Node>
Matrix<T> materialize_mean(const Node& n, const context& cx, mean_request rq, mean_path path = mean_path::automatic);

/// out += w * the signed mean of n, split at its flips: a flipped term's mean is J mean(inner) J
/// (the mean commutes with the token reversal), a subtree without a flip at its top is one mean,
/// each on the path that takes it (a Flip would keep the tile path for the whole sum).
template <class T, class Node>
void add_mean_by_terms(const Node& n, const context& cx, mean_request rq, mean_path path, T w, Matrix<T>& out) {
  if constexpr (!has_top_flip<Node>()) {
    out.noalias() += w * materialize_mean<T>(n, cx, rq, path);
  } else if constexpr (is_sum_node<Node>::value) {
    add_mean_by_terms<T>(n.left(), cx, rq, path, w, out);
    add_mean_by_terms<T>(n.right(), cx, rq, path, w, out);
  } else if constexpr (is_scaled_node<Node>::value) {
    add_mean_by_terms<T>(n.inner(), cx, rq, path, w * T(n.factor()), out);
  } else if constexpr (is_flip_node<Node>::value) {
    const Matrix<T> m = materialize_mean<T>(n.inner(), cx, rq, path);
    out.noalias() += w * m.reverse();
  }
}

/// Mean over channels [c0, c1) of H^c or |H^c|: one core per head and rank-P products when the
/// heads share their cores and that is cheaper (head_mean.hpp; always for |H^c|), blocked GEMMs
/// over (channel, state) for diag * core * diag * conv terms (mean.hpp), the tile path otherwise.
/// A signed mean of a sum with flipped terms is taken term by term (add_mean_by_terms).
template <class T, class Node>
Matrix<T> materialize_mean(const Node& n, const context& cx, mean_request rq, mean_path path) {
  if (cx.L == 0 || rq.c1 <= rq.c0) return Matrix<T>::Zero(cx.L, cx.L);
  if constexpr (has_top_flip<Node>()) {
    if (!rq.abs) {  // |.| does not split over a sum's terms
      Matrix<T> out = Matrix<T>::Zero(cx.L, cx.L);
      add_mean_by_terms<T>(n, cx, rq, path, T(1), out);
      return out;
    }
  }
  constexpr bool has_S = contains_v<Semiseparable<T>, Node>, has_R = contains_v<LinearRecurrence<T>, Node>;
  // One expansion serves both structured paths (mean.hpp): the heads' when the heads share the
  // cores and that is cheaper (or |H^c| is asked for), else the (channel, state) GEMMs.
  mean_terms<T> terms;
  const bool expanded = expand_terms<T>(n, cx, terms);
  // Toeplitz cores (toeplitz_mean.hpp): with every diagonal fixed over tokens (the LRU) the mean is
  // Toeplitz, from the channels' kernels; with gates (the Hyena) only where no head path applies.
  constexpr bool toeplitz = contains_v<ComplexSemiseparable<T>, Node> || contains_v<CausalConv<T>, Node>;
  if constexpr (toeplitz) {
    if (path == mean_path::automatic && expanded && toeplitz_mean_takes(terms, cx.L, true)) return toeplitz_mean<T>(terms, cx, rq, true);
  }
  if constexpr (has_S || contains_v<Transition<T>, Node> || contains_v<ComplexSemiseparable<T>, Node> ||
                contains_v<SoftmaxAttention<T, true>, Node>) {  // heads exist only there
    const Index P = path != mean_path::channels && expanded ? shared_head_dim(terms, cx) : 0;
    if (P != 0) {
      const head_plan<T> plan{terms, P};
      if (path == mean_path::heads || rq.abs || plan.cheaper_than_channel_gemm(cx)) {
        Matrix<T> out = Matrix<T>::Zero(cx.L, cx.L);
        head_means<T>(plan, cx, rq.abs).run(cx, rq.c0, rq.c1, out.data(), false);
        return out;
      }
    }
  }
  if constexpr (contains_v<Wkv<T>, Node>) {  // RWKV-4: s · diag(r) · Wkv as blocked products
    wkv_mean_form<T> f;
    if (path != mean_path::channels && match_wkv_mean<T>(n, f)) return wkv_mean<T>(f, cx.L, rq.c0, rq.c1, rq.abs);
  }
  if constexpr (toeplitz) {
    if (path == mean_path::automatic && expanded && toeplitz_mean_takes(terms, cx.L, false) && shared_head_dim(terms, cx) == 0)
      return toeplitz_mean<T>(terms, cx, rq, false);
  }
  if (!rq.abs && expanded && channel_path_takes(terms)) return mean_of_terms<T, has_S, has_R>(terms, cx, rq.c0, rq.c1);
  return materialize_mean_tiles<T>(n, cx, rq);
}
template <class T, class Node>
Matrix<T> materialize_mean(const Node& n, const context& cx) {
  return materialize_mean<T>(n, cx, mean_request{0, cx.D, false});
}

/// out (D / P, L, L): the mean over each head's P channels, zeroed first; in one pass of
/// head_mean.hpp when the heads share their cores, head by head otherwise.
template <class T, class Node>
void materialize_head_means(const Node& n, const context& cx, Index P, bool abs, T* out, mean_path path = mean_path::automatic) {
  const Index H = cx.D / P, LL = cx.L * cx.L;
  std::fill(out, out + H * LL, T(0));
  if (cx.L == 0) return;
  head_plan<T> plan;
  if (path != mean_path::channels && make_head_plan<T>(n, cx, plan) && plan.P == P) {
    head_means<T>(plan, cx, abs).run(cx, 0, cx.D, out, true);
    return;
  }
  for (Index h = 0; h < H; ++h) {
    const Matrix<T> m = materialize_mean<T>(n, cx, mean_request{h * P, (h + 1) * P, abs}, mean_path::channels);
    std::copy(m.data(), m.data() + LL, out + h * LL);
  }
}

/// Every channel's matrix into out (D, L, L), row-major [c][t][s]: sums of diag * S * diag * conv
/// terms and their flips by row panels (all_channels.hpp); otherwise in parallel over channels, each
/// evaluator writing its tiles straight into its slice (tiles above the diagonal of a causal
/// expression set to zero, once), no temporaries. fresh: out is newly allocated (untouched pages).
template <class T, class Node>
void materialize_all(const Node& n, const context& cx, T* out, bool fresh) {
  const Index L = cx.L, nb = (L + tile_size - 1) / tile_size;
  if (L == 0) return;
  if constexpr (contains_v<Semiseparable<T>, Node>) {
    if (materialize_all_terms<T>(n, cx, out, fresh)) return;  // sums of diag * S * diag * conv, and flips
  }
  parallel_for(cx.D, [&](Index c) {
    const channel_eval<Node, T> ev(n, cx, c);
    T* base = out + c * L * L;
    for (Index bi = 0; bi < nb; ++bi) {
      const Index i0 = bi * tile_size, i1 = std::min(L, i0 + tile_size);
      for (Index bj = 0; bj < nb; ++bj) {
        const Index j0 = bj * tile_size, j1 = std::min(L, j0 + tile_size);
        structured_block(ev, i0, i1, j0, j1, tile<T>{base + i0 * L + j0, i1 - i0, j1 - j0, L});
      }
    }
  });
}

/// (D, L): row t (transposed apply of e_t) or column s (apply of e_s) of every channel's matrix.
template <class T, class Node>
void row_or_col_into(const Node& n, const context& cx, Index k, bool is_row, T* out) {
  apply_slabs_into<T>(n, cx, nullptr, out, slab_io{is_row, true, k});
}
template <class T, class Node>
Matrix<T> row_or_col(const Node& n, const context& cx, Index k, bool is_row) {
  Matrix<T> out(cx.D, cx.L);
  row_or_col_into<T>(n, cx, k, is_row, out.data());
  return out;
}

template <class T, class Node>
Matrix<T> block(const Node& n, const context& cx, Index c, range rows, range cols) {
  Matrix<T> out(rows.size(), cols.size());
  if (rows.size() == 0 || cols.size() == 0) return out;
  const channel_eval<Node, T> ev(n, cx, c);
  structured_block(ev, rows.begin, rows.end, cols.begin, cols.end, tile<T>{out.data(), rows.size(), cols.size(), cols.size()});
  return out;
}

}  // namespace iattn::cpu_detail
