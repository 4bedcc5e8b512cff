// iattn/backend/cpu/transition_scan.hpp: the token-by-token recurrence of one head of a Transition
// (ops/transition.hpp), for backend/cpu/transition.hpp: the exact path, taken by the transposed
// apply and by every chunk the chunked (UT) form does not take (transition_chunk.hpp says when).
//
// One token on the state Y (N x n, the head's n channels):
//   Y <- Diag(e^lambda_t) Y + sum_r b_{t,r} w_r^T + k_t x_t^T,   y_t = Y^T q_t,
// with w_r = a_{t,r}^T Y_{t-1} accumulated by the previous token's pass. One pass over Y per token
// (N n (2R + 3) multiply-adds), vectorised across the n channels, the projections held in
// registers; A_t is never formed. The transposed (anti-causal) scan is the same pass with the roles
// of a and b and of q and k exchanged: G_s = A_{s+1}^T G_{s+1} + q_s x_s^T, y_s = G_s^T k_s.
#pragma once

#include "../../ops/transition.hpp"
#include "simd.hpp"
#include "transition_kernels.hpp"  // copy_row

#include <algorithm>
#include <cmath>
#include <type_traits>
#include <utility>
#include <vector>

namespace iattn::cpu_detail::transition_detail {

/// Asks for the n values from p (one token's row) ahead of their use: a load of the first and the
/// last (a load walks the page tables where a missed prefetch may be dropped, and such rows lie a
/// page or more apart, so nearly every one misses the TLB), and prefetches of the lines between
/// into L2 rather than L1, whose few sets such rows map to the state shares.
template <class T>
void prefetch_scan(const T* p, Index n) {
  if (n <= 0) return;
  T v = *static_cast<const volatile T*>(p);
  v += *static_cast<const volatile T*>(p + n - 1);
#if defined(__GNUC__) || defined(__clang__)
  asm volatile("" : : "x"(v));
  const char* c = reinterpret_cast<const char*>(p);
  for (Index b = 64; b < n * Index(sizeof(T)); b += 64) __builtin_prefetch(c + b, 0, 2);
#else
  (void)v;
#endif
}

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
  /// Asks for token t's rows of q, k, b and the log-decays, and a's of t + 1 with next_a (else of
  /// t) (prefetch_scan; scan_block gathers them).
  void prefetch(Index t, bool next_a) const {
    prefetch_scan(q(t), N), prefetch_scan(k(t), N);
    if (R > 0) prefetch_scan(a(next_a ? t + 1 : t), R * N), prefetch_scan(b(t), R * N);
    if (n->per_key()) prefetch_scan(n->lambda().row(t) + h * N, N);
  }
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
  // the coefficient rows in registers (stores to Y could alias a step_coeffs the pass reads)
  const T *const ce = c.e, *const cu = c.u, *const cin = c.in, *const cout = c.out, *const cnext = c.next;
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
      const P e = P::broadcast(ce[m]), in = P::broadcast(cin[m]), out = P::broadcast(cout[m]);
      P v[G];
      for (int g = 0; g < G; ++g) v[g] = fma(e, P::load(yp + g * W), in * xv[g]);
      for (int r = 0; r < RC; ++r) {
        const P u = P::broadcast(cu[r * N + m]);
        for (int g = 0; g < G; ++g) v[g] = fma(u, wr[r][g], v[g]);
      }
      for (int g = 0; g < G; ++g) {
        v[g].store(yp + g * W);
        o[g] = fma(out, v[g], o[g]);
      }
      for (int r = 0; r < RC; ++r) {
        const P nx = P::broadcast(cnext[r * N + m]);
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
/// memory. One body at the SIMD width and at width 1 for the tail. Only the first na <= n channels
/// are stepped (the others, and their outputs and projections, left as they are).
template <class T, int RC>
void step(Index N, Index R, Index n, T* Y, const step_coeffs<T>& c, const T* w, T* wn, const T* x, T* y, Index na) {
  constexpr int W = simd::width<T>, G = step_group<RC>;
  Index j = 0;
  for (; j + G * W <= na; j += G * W) step_packs<T, RC, W, G>(N, R, n, Y, c, w, wn, x, y, j);
  if constexpr (G > 1)
    for (; j + W <= na; j += W) step_packs<T, RC, W, 1>(N, R, n, Y, c, w, wn, x, y, j);
  if constexpr (W > 1)
    for (; j < na; ++j) step_packs<T, RC, 1, 1>(N, R, n, Y, c, w, wn, x, y, j);
}

/// Bytes of one block of a scan's gathered token rows and outputs (scan_block): with the state
/// (16 KiB at N = P = 64) inside a 32 KiB L1.
inline constexpr Index scan_block_bytes = 12 << 10;

/// The state of one scan over n channels and its scratch: the state Y (N x n), the projections
/// w and wn (R x n), and a block of B gathered token rows (scan_block), each
/// [e (N) | in (N) | out (N) | u (R N) | next (R N) | x (n)], with their outputs (n each).
template <class T>
struct workspace {
  Index n, rs, B;
  /// Channels of the scan's i-th token that can be nonzero: all (-1), or [0, grow + i + 1) (the
  /// identity inputs of a chunk's summary: channel grow + i is token i's one-hot input, and the
  /// channels past it hold zero states until theirs), rounded up to whole packs. The channels left
  /// out keep zero states and projections; their outputs are not written.
  Index grow = -1;
  std::vector<T> zeros, Y, w, wn, rows, ys;
  workspace(Index N, Index R, Index channels)
      : n(channels), rs((3 + 2 * R) * N + channels),
        B(std::max<Index>(1, std::min<Index>(16, scan_block_bytes / Index(sizeof(T)) / (rs + channels)))),
        zeros(std::size_t(std::max<Index>(R, 1) * N), T(0)), Y(std::size_t(N * channels), T(0)),
        w(std::size_t(std::max<Index>(R, 1) * channels), T(0)), wn(w.size()), rows(std::size_t(B * rs)),
        ys(std::size_t(B * channels)) {}
};

/// What one token of a scan reads, gathered into row (the layout of workspace::rows): the decays
/// e (exp of the log-decays of token td, or zeros when td < 0), in, out, u and next (R rows; zeros
/// when null) and x.
template <class T>
void gather_token(const head_view<T>& hv, Index td, const T* in, const T* out, const T* u, const T* next, const T* x,
                  Index n, T* row) {
  const Index N = hv.N, RN = hv.R * N;
  auto put = [](const T* src, Index len, T* dst) {
    if (src) copy_row(src, len, dst);
    else std::fill(dst, dst + len, T(0));
  };
  if (td >= 0) hv.decays(td, row);
  else std::fill(row, row + N, T(0));
  put(in, N, row + N), put(out, N, row + 2 * N);
  if (RN > 0) put(u, RN, row + 3 * N), put(next, RN, row + 3 * N + RN);
  put(x, n, row + 3 * N + 2 * RN);
}

/// Tokens i0..i1-1 (at most ws.B) of one head's scan, token i being first + dir i (dir = +1 or -1):
/// the next block's rows prefetched (prefetch(t)), each token's rows gathered contiguous
/// (gather(t, row)), its step on them, and the outputs copied to yrow(t). Token rows lie a page or
/// more apart in the (L, H N) coefficients and the caller's (L, D) values: read in place, their
/// lines fall in a few L1 sets that the state shares (every step would reload the state from L2),
/// and each of them costs a page walk.
template <int RC, class T, class Prefetch, class Gather, class YRow>
void scan_block(const head_view<T>& hv, workspace<T>& ws, Index first, Index count, Index dir, Index i0, Index i1,
                Prefetch&& prefetch, Gather&& gather, YRow&& yrow) {
  const Index N = hv.N, R = hv.R, n = ws.n, RN = R * N;
  for (Index i = i1; i < std::min(count, 2 * i1 - i0); ++i) prefetch(first + dir * i);  // the next block
  for (Index i = i0; i < i1; ++i) gather(first + dir * i, ws.rows.data() + (i - i0) * ws.rs);
  for (Index i = i0; i < i1; ++i) {
    const T* row = ws.rows.data() + (i - i0) * ws.rs;
    const step_coeffs<T> c{row, R > 0 ? row + 3 * N : ws.zeros.data(), row + N, row + 2 * N,
                           R > 0 ? row + 3 * N + RN : ws.zeros.data()};
    constexpr Index W = simd::width<T>;
    const Index na = ws.grow < 0 ? n : std::min(n, (ws.grow + i + W) / W * W);
    step<T, RC>(N, R, n, ws.Y.data(), c, ws.w.data(), ws.wn.data(), row + 3 * N + 2 * RN, ws.ys.data() + (i - i0) * n, na);
    std::swap(ws.w, ws.wn);
  }
  for (Index i = i0; i < i1; ++i) copy_row(ws.ys.data() + (i - i0) * n, n, yrow(first + dir * i));
}

/// Calls f(std::integral_constant<int, RC>) with RC = R for R <= 2, else -1 (any rank).
template <class F>
void with_rank(Index R, F&& f) {
  if (R == 0) f(std::integral_constant<int, 0>{});
  else if (R == 1) f(std::integral_constant<int, 1>{});
  else if (R == 2) f(std::integral_constant<int, 2>{});
  else f(std::integral_constant<int, -1>{});
}

/// Does nothing with a block of finished tokens (scan_forward_heads' default).
struct no_block_hook {
  void operator()(Index, Index) const {}
};

/// scan_forward of nh heads of the same rank at once (hv[k], ws[k], rows xrow(k, t), yrow(k, t)),
/// block by block of tokens, every head in turn on each block: the heads' rows of one token share
/// their pages, so the page walks of a block's rows are paid once for all of them. Once every head
/// has written a block's outputs, done(t_lo, t_hi) is called on its tokens (the caller's finishing
/// pass, on rows still in cache).
template <class T, class XRow, class YRow, class Done = no_block_hook>
void scan_forward_heads(const head_view<T>* hv, workspace<T>* ws, Index nh, Index t0, Index t_begin, Index t_end,
                        XRow&& xrow, YRow&& yrow, Done&& done = {}) {
  if (nh < 1 || t_end <= t_begin) return;
  const Index R = hv[0].R, L = hv[0].n->length(), count = t_end - t_begin;
  Index B = ws[0].B;  // the fewest tokens any head's block holds (heads cut by a slab have fewer channels)
  for (Index k = 1; k < nh; ++k) B = std::min(B, ws[k].B);
  with_rank(R, [&](auto rc) {
    for (Index i0 = 0; i0 < count; i0 += B) {
      for (Index k = 0; k < nh; ++k) {
        const head_view<T>& h = hv[k];
        const Index n = ws[k].n;
        scan_block<decltype(rc)::value>(
            h, ws[k], t_begin, count, 1, i0, std::min(count, i0 + B),
            [&](Index t) {
              h.prefetch(t, R > 0 && t + 1 < L);
              prefetch_scan(xrow(k, t), n);
            },
            [&](Index t, T* row) {
              gather_token(h, t > t0 ? t : -1, h.k(t), h.q(t), R > 0 && t > t0 ? h.b(t) : nullptr,
                           R > 0 && t + 1 < L ? h.a(t + 1) : nullptr, xrow(k, t), n, row);
            },
            [&](Index t) { return yrow(k, t); });
      }
      done(t_begin + i0, t_begin + std::min(count, i0 + B));
    }
  });
}

/// Tokens [t_begin, t_end) of the forward scan of one head that starts at token t0 with a zero
/// state (token t0 is read without a transition; ws is fresh there): y_t = sum_{s=t0..t} H[t, s] x_s
/// on ws.n channels, x and y rows given by xrow(t) and yrow(t). A later call continues the scan.
template <class T, class XRow, class YRow>
void scan_forward(const head_view<T>& hv, Index t0, Index t_begin, Index t_end, workspace<T>& ws, XRow&& xrow,
                  YRow&& yrow) {
  scan_forward_heads(&hv, &ws, 1, t0, t_begin, t_end, [&](Index, Index t) { return xrow(t); },
                     [&](Index, Index t) { return yrow(t); });
}

/// The transposed (anti-causal) scan of one head over all L tokens: y_s = sum_{t>=s} H[t, s] x_t.
template <class T, class XRow, class YRow>
void scan_backward(const head_view<T>& hv, Index L, workspace<T>& ws, XRow&& xrow, YRow&& yrow) {
  const Index R = hv.R, n = ws.n;
  with_rank(R, [&](auto rc) {
    // G_s = A_{s+1}^T G_{s+1} + q_s x_s^T with A^T = Diag(e) + sum_r a_r b_r^T; y_s = G_s^T k_s.
    for (Index i0 = 0; i0 < L; i0 += ws.B)
      scan_block<decltype(rc)::value>(
          hv, ws, L - 1, L, -1, i0, std::min(L, i0 + ws.B),
          [&](Index s) {
            hv.prefetch(s, false);
            if (s + 1 < L) hv.prefetch(s + 1, false);
            prefetch_scan(xrow(s), n);
          },
          [&](Index s, T* row) {
            gather_token(hv, s + 1 < L ? s + 1 : -1, hv.q(s), hv.k(s), R > 0 && s + 1 < L ? hv.a(s + 1) : nullptr,
                         R > 0 && s > 0 ? hv.b(s) : nullptr, xrow(s), n, row);
          },
          yrow);
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

}  // namespace iattn::cpu_detail::transition_detail
