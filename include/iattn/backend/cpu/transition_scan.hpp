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

#include <algorithm>
#include <cmath>
#include <type_traits>
#include <utility>
#include <vector>

namespace iattn::cpu_detail::transition_detail {

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

}  // namespace iattn::cpu_detail::transition_detail
