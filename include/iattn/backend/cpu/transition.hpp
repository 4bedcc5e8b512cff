// iattn/backend/cpu/transition.hpp: CPU evaluator of Transition (ops/transition.hpp).
//
// apply:   per head met by the slab (only the channels of a cut head that lie in it), the state
//          Y (N x n, the head's n channels of the slab) runs the recurrence one token at a time,
//            Y <- Diag(e^lambda_t) Y + sum_r b_{t,r} w_r^T + k_t x_t^T,   y_t = Y^T q_t,
//          with w_r = a_{t,r}^T Y_{t-1} accumulated by the previous token's pass. One pass over Y
//          per token (N n (2R + 3) multiply-adds), vectorised across the head's channels, the
//          projections held in registers; A_t is never formed. O(L N P (R + 2)) per head.
// apply_t: the anti-causal transposed recurrence, the same pass with the roles of a and b and of q
//          and k exchanged: G_s = A_{s+1}^T G_{s+1} + q_s x_s^T, y_s = G_s^T k_s,
//          A^T = Diag(e^lambda) + sum_r a_r b_r^T.
// tiles:   the head's lower-triangular L x L matrix, tile_size x tile_size tiles computed once on
//          first use: column block J is H E_J, the forward scan from token j0 on the identity
//          columns of J, advanced one row block at a time (tile (I, J) costs tile_size^2 N (2R + 3)
//          multiply-adds given the scan state after tile (I-1, J)). A full materialize costs
//          O(L^2 N (R + 1)) and keeps the lower triangle (L^2 / 2 numbers) while the evaluator lives;
//          one tile (I, J) alone costs the I - J + 1 tiles above it, O(L tile_size) memory at most.
//          Threads walking consecutive row blocks (the drivers' tile loops) pipeline along the
//          column blocks (a mutex per column block). The channels of one head share one such matrix
//          while their evaluators are alive (a registry keyed by the node and the head), so a mean
//          over a head's P channels scans the head once.
// Vectorised across the head's value channels (P below the SIMD width runs at width 1).
#pragma once

#include "../../ops/transition.hpp"
#include "simd.hpp"
#include "tile.hpp"

#include <algorithm>
#include <cmath>
#include <map>
#include <memory>
#include <mutex>
#include <tuple>
#include <utility>
#include <vector>

namespace iattn::cpu_detail {

namespace transition_detail {

/// One head's coefficient rows.
template <class T>
struct head_view {
  const Transition<T>* n;
  Index h, N, R;
  head_view(const Transition<T>& node, Index head) : n(&node), h(head), N(node.state()), R(node.rank()) {}
  const T* q(Index t) const { return n->q().row(t) + h * N; }
  const T* k(Index t) const { return n->k().row(t) + h * N; }
  const T* a(Index t) const { return n->a().row(t) + h * R * N; }  // R x N, only when R > 0
  const T* b(Index t) const { return n->b().row(t) + h * R * N; }
  /// e[m] = exp(lambda_t[h, m]) for m < N.
  void decays(Index t, T* e) const {
    if (n->per_key()) {
      const T* lam = n->lambda().row(t) + h * N;
      simd::for_packs<T>(N, [&](auto w, Index m) {
        using P = simd::pack<T, decltype(w)::value>;
        exp(P::load(lam + m)).store(e + m);
      });
    } else {
      std::fill(e, e + N, T(std::exp(n->lambda()(t, h))));
    }
  }
};

/// What one step reads: Y <- Diag(e) Y + sum_r u_r w_r^T + in x^T, y = Y^T out, wn_r = Y^T next_r.
template <class T>
struct step_coeffs {
  const T* e;     // N
  const T* u;     // R x N
  const T* in;    // N
  const T* out;   // N
  const T* next;  // R x N
};

/// Packs of channels one pass over the state carries together, by the compile-time rank RC:
/// independent accumulation chains (the readout and the projections are sums over the N rows) and
/// whole cache lines of each row, as many as the registers hold (rank 2 keeps twice the
/// projections live, any rank keeps them in memory).
template <int RC>
inline constexpr int step_group = RC < 0 ? 1 : RC <= 1 ? 4 : 2;

/// Channels [j, j + G W) of one token (see step).
template <class T, int RC, int W, int G>
inline void step_packs(Index N, Index R, Index n, T* Y, const step_coeffs<T>& c, const T* w, T* wn, const T* x, T* y,
                       Index j) {
  using P = simd::pack<T, W>;
  P xv[G], o[G];
  for (int g = 0; g < G; ++g) {
    xv[g] = P::load(x + j + g * W);
    o[g] = P::broadcast(T(0));
  }
  T* yp = Y + j;
  if constexpr (RC >= 0) {
    constexpr int RS = RC > 0 ? RC : 1;
    P wr[RS][G], acc[RS][G];
    for (int r = 0; r < RC; ++r)
      for (int g = 0; g < G; ++g) {
        wr[r][g] = P::load(w + r * n + j + g * W);
        acc[r][g] = P::broadcast(T(0));
      }
    for (Index m = 0; m < N; ++m, yp += n) {
      const P e = P::broadcast(c.e[m]), in = P::broadcast(c.in[m]), out = P::broadcast(c.out[m]);
      P v[G];
      for (int g = 0; g < G; ++g) v[g] = fma(e, P::load(yp + g * W), in * xv[g]);
      for (int r = 0; r < RC; ++r) {
        const P u = P::broadcast(c.u[r * N + m]);
        for (int g = 0; g < G; ++g) v[g] = fma(u, wr[r][g], v[g]);
      }
      for (int g = 0; g < G; ++g) {
        v[g].store(yp + g * W);
        o[g] = fma(out, v[g], o[g]);
      }
      for (int r = 0; r < RC; ++r) {
        const P nx = P::broadcast(c.next[r * N + m]);
        for (int g = 0; g < G; ++g) acc[r][g] = fma(nx, v[g], acc[r][g]);
      }
    }
    for (int r = 0; r < RC; ++r)
      for (int g = 0; g < G; ++g) acc[r][g].store(wn + r * n + j + g * W);
  } else {  // any rank, the projections through memory (G = 1)
    static_assert(G == 1, "the any-rank step takes one pack at a time");
    for (Index r = 0; r < R; ++r) P::broadcast(T(0)).store(wn + r * n + j);
    for (Index m = 0; m < N; ++m, yp += n) {
      P v = fma(P::broadcast(c.e[m]), P::load(yp), P::broadcast(c.in[m]) * xv[0]);
      for (Index r = 0; r < R; ++r) v = fma(P::broadcast(c.u[r * N + m]), P::load(w + r * n + j), v);
      v.store(yp);
      o[0] = fma(P::broadcast(c.out[m]), v, o[0]);
      for (Index r = 0; r < R; ++r)
        fma(P::broadcast(c.next[r * N + m]), v, P::load(wn + r * n + j)).store(wn + r * n + j);
    }
  }
  for (int g = 0; g < G; ++g) o[g].store(y + j + g * W);
}

/// One token on the state Y (N rows of n entries, row stride n):
///   Y <- Diag(e) Y + sum_r u_r w_r^T + in x^T,   y = Y^T out,   wn_r = Y^T next_r,
/// w (R x n) holding the old state's projections, wn receiving the new one's. One pass over Y,
/// vectorised across the n channels, step_group packs at a time; with a compile-time rank RC the
/// projections stay in registers for the whole pass over the N rows, RC = -1 runs any R through
/// memory. One body at the SIMD width and at width 1 for the tail.
template <class T, int RC>
void step(Index N, Index R, Index n, T* Y, const step_coeffs<T>& c, const T* w, T* wn, const T* x, T* y) {
  constexpr int W = simd::width<T>, G = step_group<RC>;
  Index j = 0;
  for (; j + G * W <= n; j += G * W) step_packs<T, RC, W, G>(N, R, n, Y, c, w, wn, x, y, j);
  if constexpr (G > 1)
    for (; j + W <= n; j += W) step_packs<T, RC, W, 1>(N, R, n, Y, c, w, wn, x, y, j);
  if constexpr (W > 1)
    for (; j < n; ++j) step_packs<T, RC, 1, 1>(N, R, n, Y, c, w, wn, x, y, j);
}

/// The state of one scan over n channels and its scratch.
template <class T>
struct workspace {
  Index n;
  std::vector<T> e, zeros, Y, w, wn;
  workspace(Index N, Index R, Index channels)
      : n(channels), e(std::size_t(N)), zeros(std::size_t(std::max<Index>(R, 1) * N), T(0)),
        Y(std::size_t(N * channels), T(0)), w(std::size_t(std::max<Index>(R, 1) * channels), T(0)), wn(w.size()) {}
};

/// Calls f(std::integral_constant<int, RC>) with RC = R for R <= 2, else -1 (any rank).
template <class F>
void with_rank(Index R, F&& f) {
  if (R == 0) f(std::integral_constant<int, 0>{});
  else if (R == 1) f(std::integral_constant<int, 1>{});
  else if (R == 2) f(std::integral_constant<int, 2>{});
  else f(std::integral_constant<int, -1>{});
}

/// Tokens [t_begin, t_end) of the forward scan of one head that starts at token t0 with a zero
/// state (token t0 is read without a transition; ws is fresh there): y_t = sum_{s=t0..t} H[t, s] x_s
/// on ws.n channels, x and y rows given by xrow(t) and yrow(t). A later call continues the scan.
template <class T, class XRow, class YRow>
void scan_forward(const head_view<T>& hv, Index t0, Index t_begin, Index t_end, workspace<T>& ws, XRow&& xrow,
                  YRow&& yrow) {
  const Index N = hv.N, R = hv.R, L = hv.n->length();
  with_rank(R, [&](auto rc) {
    constexpr int RC = decltype(rc)::value;
    for (Index t = t_begin; t < t_end; ++t) {
      step_coeffs<T> c{ws.zeros.data(), ws.zeros.data(), hv.k(t), hv.q(t), ws.zeros.data()};
      if (t > t0) {
        hv.decays(t, ws.e.data());
        c.e = ws.e.data();
        if (R > 0) c.u = hv.b(t);
      }
      if (R > 0 && t + 1 < L) c.next = hv.a(t + 1);
      step<T, RC>(N, R, ws.n, ws.Y.data(), c, ws.w.data(), ws.wn.data(), xrow(t), yrow(t));
      std::swap(ws.w, ws.wn);
    }
  });
}

/// The transposed (anti-causal) scan of one head over all L tokens: y_s = sum_{t>=s} H[t, s] x_t.
template <class T, class XRow, class YRow>
void scan_backward(const head_view<T>& hv, Index L, workspace<T>& ws, XRow&& xrow, YRow&& yrow) {
  const Index N = hv.N, R = hv.R;
  with_rank(R, [&](auto rc) {
    constexpr int RC = decltype(rc)::value;
    for (Index s = L - 1; s >= 0; --s) {
      // G_s = A_{s+1}^T G_{s+1} + q_s x_s^T with A^T = Diag(e) + sum_r a_r b_r^T; y_s = G_s^T k_s.
      step_coeffs<T> c{ws.zeros.data(), ws.zeros.data(), hv.q(s), hv.k(s), ws.zeros.data()};
      if (s + 1 < L) {
        hv.decays(s + 1, ws.e.data());
        c.e = ws.e.data();
        if (R > 0) c.u = hv.a(s + 1);
      }
      if (R > 0 && s > 0) c.next = hv.b(s);
      step<T, RC>(N, R, ws.n, ws.Y.data(), c, ws.w.data(), ws.wn.data(), xrow(s), yrow(s));
      std::swap(ws.w, ws.wn);
    }
  });
}

/// Calls f(h, j, np) for each head h met by the slab's channels [c0, c0 + nc): its channels are
/// the slab's columns [j, j + np).
template <class T, class F>
void for_heads(const Transition<T>& n, Index c0, Index nc, F&& f) {
  const Index P = n.head_dim();
  for (Index c = c0; c < c0 + nc;) {
    const Index h = c / P, end = std::min(c0 + nc, (h + 1) * P);
    f(h, c - c0, end - c);
    c = end;
  }
}

/// One head's lower-triangular L x L matrix in tile_size x tile_size tiles, each computed once on
/// first use. Column block J is H E_J: the forward scan from token j0 on the identity columns of J,
/// advanced one row block at a time, so tile (I, J) needs the tiles (J..I, J) above it and nothing
/// else, and threads walking consecutive row blocks (the drivers' tile loops) form a pipeline along
/// the column blocks instead of waiting for whole columns. A column block's scan state
/// (N x tile_size) is kept until its last tile is done; the tiles stay (O(L^2 / 2) when all are used).
template <class T>
class head_matrix {
 public:
  head_matrix(const Transition<T>& n, Index L, Index h)
      : hv_(n, h), L_(L), nb_((L + tile_size - 1) / tile_size), cols_(std::size_t(nb_)) {
    for (Index jb = 0; jb < nb_; ++jb) {
      cols_[std::size_t(jb)] = std::make_unique<column>();
      cols_[std::size_t(jb)]->next = jb;
      cols_[std::size_t(jb)]->tiles.resize(std::size_t(nb_ - jb));
    }
    for (int k = 0; k < 2; ++k) {
      const Index w = k == 0 ? tile_size : L % tile_size;
      eye_[k].assign(std::size_t((w + 1) * w), T(0));
      for (Index j = 0; j < w; ++j) eye_[k][std::size_t(j * w + j)] = T(1);
    }
  }

  /// H[i0:i1, j0:j1] into out.
  void block(Index i0, Index i1, Index j0, Index j1, tile<T> out) const {
    for (Index jb = j0 / tile_size; jb * tile_size < j1; ++jb) {
      const Index b0 = jb * tile_size, width = std::min(L_, b0 + tile_size) - b0;
      const Index s0 = std::max(j0, b0), s1 = std::min(j1, b0 + width);
      for (Index ib = i0 / tile_size; ib * tile_size < i1; ++ib) {
        const Index r0 = std::max(i0, ib * tile_size), r1 = std::min(i1, (ib + 1) * tile_size);
        const T* src = ib >= jb ? tile_of(ib, jb) : nullptr;
        for (Index t = r0; t < r1; ++t) {
          T* dst = out.row(t - i0) + (s0 - j0);
          if (!src) std::fill(dst, dst + (s1 - s0), T(0));
          else std::copy_n(src + (t - ib * tile_size) * width + (s0 - b0), s1 - s0, dst);
        }
      }
    }
  }

 private:
  struct column {
    std::mutex mu;
    Index next = 0;                        // the next row block to compute
    std::unique_ptr<workspace<T>> state;   // the scan's state after row block next - 1
    std::vector<std::vector<T>> tiles;     // tiles[ib - jb]: (rows, width) row-major
  };

  /// Tile (ib, jb), ib >= jb, computed with the ones above it when missing.
  const T* tile_of(Index ib, Index jb) const {
    column& col = *cols_[std::size_t(jb)];
    std::lock_guard<std::mutex> lock(col.mu);
    while (col.next <= ib) advance(col, jb);
    return col.tiles[std::size_t(ib - jb)].data();
  }
  void advance(column& col, Index jb) const {
    const Index j0 = jb * tile_size, width = std::min(L_, j0 + tile_size) - j0;
    const Index ib = col.next, i0 = ib * tile_size, i1 = std::min(L_, i0 + tile_size);
    if (ib == jb) col.state = std::make_unique<workspace<T>>(hv_.N, hv_.R, width);
    std::vector<T>& buf = col.tiles[std::size_t(ib - jb)];
    buf.resize(std::size_t((i1 - i0) * width));
    // x: row t - j0 of the width x width identity on the block's own tokens, zeros after them.
    const T* eye = eye_[width == tile_size ? 0 : 1].data();
    scan_forward(
        hv_, j0, i0, i1, *col.state, [&](Index t) { return eye + std::min(t - j0, width) * width; },
        [&](Index t) { return buf.data() + (t - i0) * width; });
    if (ib == jb)
      for (Index i = 0; i < width; ++i)  // above the diagonal: exact zeros whatever the coefficients
        std::fill(buf.data() + i * width + i + 1, buf.data() + (i + 1) * width, T(0));
    if (++col.next == nb_) col.state.reset();
  }
  head_view<T> hv_;
  Index L_, nb_;
  std::vector<std::unique_ptr<column>> cols_;
  std::vector<T> eye_[2];  // (w + 1, w) row-major: the w x w identity and a zero row; w = tile_size, L % tile_size
};

/// The head matrix of (node, head), shared by every evaluator of that head alive at the same time
/// (the channels of one head in a channel mean). Keyed by the node's address and its coefficients'
/// storage: an entry lives only as long as an evaluator holds it, and evaluators never outlive the
/// evaluation call that made them, during which the node is alive and unchanged.
template <class T>
std::shared_ptr<head_matrix<T>> shared_head_matrix(const Transition<T>& n, Index L, Index h) {
  using key = std::tuple<const void*, Index, Index, const void*, const void*, const void*, const void*, const void*>;
  static std::mutex mu;
  static std::map<key, std::weak_ptr<head_matrix<T>>> registry;
  const key k{&n, h, L, n.q().data(), n.k().data(), n.lambda().data(), n.a().data(), n.b().data()};
  std::lock_guard<std::mutex> lock(mu);
  if (auto it = registry.find(k); it != registry.end())
    if (auto m = it->second.lock()) return m;
  for (auto it = registry.begin(); it != registry.end();) it = it->second.expired() ? registry.erase(it) : std::next(it);
  auto m = std::make_shared<head_matrix<T>>(n, L, h);
  registry[k] = m;
  return m;
}

}  // namespace transition_detail

template <class T>
struct slab_eval<Transition<T>> {
  /// y = H x on channels [c0, c0 + nc): the forward scan of every head the slab meets.
  static void apply(const Transition<T>& n, const context& cx, Index c0, Index nc, const T* x, T* y) {
    transition_detail::for_heads(n, c0, nc, [&](Index h, Index j, Index np) {
      transition_detail::workspace<T> ws(n.state(), n.rank(), np);
      transition_detail::scan_forward(
          transition_detail::head_view<T>(n, h), 0, 0, cx.L, ws, [&](Index t) { return x + t * nc + j; },
          [&](Index t) { return y + t * nc + j; });
    });
  }
  /// y = H^T x: the anti-causal transposed scan of every head the slab meets.
  static void apply_t(const Transition<T>& n, const context& cx, Index c0, Index nc, const T* x, T* y) {
    transition_detail::for_heads(n, c0, nc, [&](Index h, Index j, Index np) {
      transition_detail::workspace<T> ws(n.state(), n.rank(), np);
      transition_detail::scan_backward(
          transition_detail::head_view<T>(n, h), cx.L, ws, [&](Index t) { return x + t * nc + j; },
          [&](Index t) { return y + t * nc + j; });
    });
  }
};

template <class T>
struct channel_eval<Transition<T>, T> {
  std::shared_ptr<transition_detail::head_matrix<T>> m;
  channel_eval(const Transition<T>& n, const context& cx, Index c)
      : m(transition_detail::shared_head_matrix(n, cx.L, n.head_of(c))) {}
  void block(Index i0, Index i1, Index j0, Index j1, tile<T> out) const { m->block(i0, i1, j0, j1, out); }
};

}  // namespace iattn::cpu_detail
