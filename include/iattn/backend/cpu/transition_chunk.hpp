// iattn/backend/cpu/transition_chunk.hpp: the chunked (UT / WY) form of one head of a Transition
// (ops/transition.hpp) over a chunk of C <= 64 tokens, for backend/cpu/transition.hpp.
//
// Tokens t = 0..C-1 of the chunk, A_t = D_t + sum_r b_{t,r} a_{t,r}^T, D_t = Diag(d_t), d_t =
// e^{lambda_t} (per key or per head). F(t, i) = D_t ... D_{i+1} = Diag(d_t (.) ... (.) d_{i+1})
// for t >= i, a running product of at most C factors <= 1 (e^{G_t - G_i} with G the chunk-relative
// sums of lambda, never formed as a difference). With S the state before the chunk (N x P), V the
// chunk's values (C x P) and U_{t,r} = a_{t,r}^T S_{t-1} the removal projections (C R x P), the
// recurrence unrolls to
//   U = A1 S + A2 V,   O = Q' S + Mqb U + Mqk V,   S_out = Diag(gamma) S + B~^T U + K~^T V
// with the pair matrices (each a sum over the keys m of products with F(.,.)[m] <= 1)
//   Mab[(t,r), (i,r')] = a_{t,r}^T F(t-1, i) b_{i,r'}  (i < t)    Mak[(t,r), i] = a_{t,r}^T F(t-1, i) k_i  (i < t)
//   Mqb[t, (i,r)]      = q_t^T F(t, i) b_{i,r}        (i <= t)   Mqk[t, i]     = q_t^T F(t, i) k_i        (i <= t)
// the boundary factors a'_t = F(t-1, -1) a_t, Q'_t = F(t, -1) q_t, B~_i = F(C-1, i) b_i,
// K~_i = F(C-1, i) k_i, gamma = F(C-1, -1) (F(t, -1) = D_t ... D_0), and the UT transform
// [A1 | A2] = (I - Mab)^{-1} [a' | Mak], I - Mab unit lower triangular (forward substitution: the
// WY form of the chunk's product). The chunk's summary for the tiles,
//   Qeff = Q' + Mqb A1 (C x N: q_t^T A_t ... A_0)   Meff = Mqk + Mqb A2 (C x C: the diagonal tile)
//   Keff = K~^T + B~^T A2 (N x C: A_{C-1} ... A_{s+1} k_s)   Phi = Diag(gamma) + B~^T A1 (N x N: A_{C-1} ... A_0)
// gives every tile below the diagonal as Qeff_I Phi_{I-1} ... Phi_{J+1} Keff_J.
//
// Collapsed writes (the delta rules). When every b_{t,r} = c_{t,r} k_t (the factories form
// b = -e^g beta k and k~ = beta k; checked per chunk to 16 units of rounding of b, c from an entry
// where |k_t| is at least half its largest), the state takes one write per token,
// S_t = D_t S_{t-1} + k_t w_t^T with w_t = v_t + sum_r c_{t,r} U_{t,r}, and U gives way to
//   W = (I - Mc)^{-1} (c a' S + V),   Mc[t, i] = sum_r c_{t,r} Mak[(t,r), i],   O = Q' S + Mqk W,
//   S_out = Diag(gamma) S + K~^T W:
// per token and value channel 3N + C multiply-adds instead of 4N + 1.5C (and two pair matrices of
// four), the form of fla's chunked Gated DeltaNet.
//
// Decays. One log-decay per head: F is a scalar and the pair matrices are GEMMs scaled entry by
// entry. One per key: a sum over m cannot carry F(t, i)[m] as one product, and splitting it as
// e^{G_t} e^{-G_i} would need a positive exponent; the chunk is cut into sub-blocks of 8 tokens, and
// a pair (t, i) with i in an earlier sub-block than t splits at that sub-block's last token e:
// F(t, e) F(e, i), both <= 1 (a GEMM per sub-block of columns); pairs inside a sub-block take
// running products of at most 8 decays. The only exp is d_t's own (argument lambda_t <= 0);
// nothing is divided by a decay.
//
// When a chunk takes this form (compute() returns true), else the recurrence runs it token by
// token (transition_scan.hpp), which is exact for any coefficients:
//   - every lambda of the chunk finite and <= 0: a reset (-inf) must leave exact zeros, which the
//     recurrence gives, and a positive log-decay (allow_growth) would make factors above 1; the
//     sequence's first token is exempt (its transition is never read: d = 1 there);
//   - a, b, q and k finite in the chunk (and, for apply, the values: a NaN there must not reach the
//     outputs of earlier tokens through the products' zero entries), checked on W1, W2, W3, which
//     every coefficient reaches, and on the packed values;
//   - R <= 4 (the triangular system has C R rows);
//   - the chunk's products stay within a factor 16 of a non-expansion: every row of A1, which is
//     a_{t,r}^T A_{t-1} ... A_0, has norm <= 16 |a_{t,r}|, and every |A2[(t,r), i]| =
//     |a_{t,r}^T A_{t-1} ... A_{i+1} k_i| <= 16 |a_{t,r}| |k_i| (collapsed: |c| |a| for |a|),
//     checked after the solve.
// The forward substitution computes U = a^T S_{t-1}, the recurrence's own projections, with its
// rounding errors carried by the same products A_{t-1} ... A_{i+1}: it is as stable as the
// recurrence when those products do not grow, which holds when every A_t is a non-expansion
// (normalised keys, |k| = 1, and beta in [0, 2] for the delta rules, where I - beta k k^T has the
// eigenvalues 1 and 1 - beta; decays <= 1; DeltaProduct's product of such factors). The last check
// sends chunks whose products grow (non-normalised keys, beta |k|^2 > 2) to the recurrence.
#pragma once

#include "../../ops/transition.hpp"
#include "simd.hpp"
#include "tile.hpp"
#include "transition_kernels.hpp"
#include "transition_scan.hpp"

#include <Eigen/Core>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

namespace iattn::cpu_detail::transition_detail {

inline constexpr Index chunk_len = tile_size;  ///< tokens per chunk of the tiles: their blocks
inline constexpr Index apply_chunk_len = 32;   ///< tokens per chunk of apply (fewer flops than 64)
inline constexpr Index chunk_sub = 8;          ///< sub-blocks of per-key decays inside a chunk
inline constexpr Index chunk_max_rank = 4;     ///< R above this runs the recurrence
inline constexpr double chunk_growth = 16;     ///< allowed growth of the chunk's products (see above)

/// The chunk's factors (the header's A1, A2, Q', Mqb, Mqk, B~, K~, gamma), stored as the three
/// matrices chunk_apply multiplies the state and the chunk's values with (token-major):
///   U = W1 [S; V],   O = W2 [S; V; U],   S <- Diag(gamma) S + W3 [V; U],
/// W1 = [A1 | A2] (CR, N + C), W2 = [Q' | Mqk | Mqb] (C, N + C + CR), W3 = [K~^T | B~^T] (N, C + CR);
/// collapsed writes: W1 = [A1 | A2] (C, N + C) for W, W2 = [Q' | Mqk] (C, N + C), W3 = K~^T (N, C).
/// Every decay factor is a running product of at most C per-token decays d_t = e^{lambda_t} <= 1:
/// no exp but d's own, nothing divided.
template <class T>
struct chunk_factors {
  Index C = 0, N = 0, R = 0;
  Index nu = 0;  ///< rows of U: C R, or C when the writes collapse (below)
  Index vc = 0;  ///< columns of W2 and W3 on V: C, or 0 when the writes collapse
  rmat<T> W1, W2, W3;  // (nu, N + C), (C, N + vc + nu), (N, vc + nu)
  std::vector<T> gamma;  // N

  /// The factors of tokens [t0, t0 + Cn) of hv's head; false when the chunk must run the recurrence.
  bool compute(const head_view<T>& hv, Index t0, Index Cn) {
    C = Cn, N = hv.N, R = hv.R;
    if (R > chunk_max_rank || C < 1) return false;
    per_key = hv.n->per_key();
    const Index CR = C * R, nl = per_key ? N : 1;
    // the chunk's rows, copied contiguous (rows (t, r) of a and b are not equally spaced when R > 1),
    // the copy asking for the rows a few tokens ahead: every later pass reads cached memory
    qc.resize(C, N), kc.resize(C, N), ac.resize(CR, N), bc.resize(CR, N), lc.resize(C, nl);
    const Index ahead = 2;
    for (Index t = 0; t < C; ++t) {
      if (t + ahead < C) {
        const Index g = t0 + t + ahead;
        prefetch_l1(hv.q(g), N), prefetch_l1(hv.k(g), N);
        prefetch_l1(per_key ? hv.n->lambda().row(g) + hv.h * N : hv.n->lambda().row(g) + hv.h, nl);
        if (R > 0) prefetch_l1(hv.a(g), R * N), prefetch_l1(hv.b(g), R * N);
      }
      const Index g = t0 + t;
      copy_row(hv.q(g), N, qc.data() + t * N);
      copy_row(hv.k(g), N, kc.data() + t * N);
      copy_row(per_key ? hv.n->lambda().row(g) + hv.h * N : hv.n->lambda().row(g) + hv.h, nl, lc.data() + t * nl);
      if (R > 0) copy_row(hv.a(g), R * N, ac.data() + t * R * N), copy_row(hv.b(g), R * N, bc.data() + t * R * N);
    }
    qp = qc.data(), kp = kc.data(), ap = ac.data(), bp = bc.data(), ldq = ldk = lda = ldb = N;
    // decays (the sequence's first transition is never read: d = 1 there), checked
    d.resize(C, nl);
    for (Index t = 0; t < C; ++t) {
      if (t0 + t == 0) {
        d.row(t).setOnes();
        continue;
      }
      if (!finite_nonpositive(lc.data() + t * nl, nl)) return false;
      exp_into(lc.data() + t * nl, nl, d.data() + t * nl);
    }
    // e^{G_t} and e^{G_{C-1} - G_t}
    ecur.resize(C, nl), eend.resize(C, nl);
    ecur.row(0) = d.row(0);
    for (Index t = 1; t < C; ++t) ecur.row(t) = ecur.row(t - 1) * d.row(t);
    eend.row(C - 1).setOnes();
    for (Index t = C - 1; t > 0; --t) eend.row(t - 1) = eend.row(t) * d.row(t);
    gamma.resize(std::size_t(N));
    for (Index m = 0; m < N; ++m) gamma[std::size_t(m)] = ecur(C - 1, per_key ? m : 0);
    // The writes collapse when every b_{t,r} = c_{t,r} k_t (the delta rules: b = -e^g beta k,
    // k~ = beta k): then S_t = D_t S_{t-1} + k_t w_t^T with w_t = v_t + sum_r c_{t,r} U_{t,r}, and U
    // gives way to W = (I - Mc)^{-1} ([sum_r c_r a'_r] S + V), Mc[t, i] = sum_r c_{t,r} Mak[(t,r), i].
    collapsed = R > 0 && parallel_writes();
    nu = collapsed ? C : CR, vc = collapsed ? 0 : C;
    if (per_key) pairs_per_key();
    else pairs_per_head();
    // W1 = [A1 | A2] = (I - Mab)^{-1} [a' | Mak] (or (I - Mc)^{-1} [c a' | I]), by forward substitution
    const Index w1 = N + C;
    W1.setZero(nu, w1);
    for (Index r = 0; r < CR; ++r) {
      const Index t = r / R, row = collapsed ? t : r;
      const T cr = collapsed ? cw[std::size_t(r)] : T(1);
      axpy_scaled(cr, a(r), t == 0 ? nullptr : ecur.data() + (t - 1) * ecur.cols(), W1.data() + row * w1);
      if (collapsed) axpy_scaled(cr, mak.data() + r * C, nullptr, mc.data() + t * C, C);
    }
    if (collapsed) {
      for (Index t = 0; t < C; ++t) W1(t, N + t) = T(1);
      for (Index t = 1; t < C; ++t) combine_rows(W1.data() + t * w1, w1, t, mc.data() + t * C, W1.data());
    } else {
      W1.rightCols(C) = mak;
      for (Index r = 1; r < CR; ++r) combine_rows(W1.data() + r * w1, w1, r / R * R, mab.data() + r * CR, W1.data());
    }
    // W2 = [Q' | Mqk | Mqb] (or [Q' | Mqk]), W3 = [K~^T | B~^T] (or K~^T)
    const Index w2 = N + vc + nu, w3 = vc + nu;
    W2.resize(C, w2);
    for (Index t = 0; t < C; ++t) scale_row(q(t), t, W2.data() + t * w2, ecur);
    W2.middleCols(N, C) = mqk;
    if (!collapsed) W2.rightCols(CR) = mqb;
    xs.resize(C + (collapsed ? 0 : CR), N);  // [K~; B~], then transposed into W3
    for (Index t = 0; t < C; ++t) scale_row(k(t), t, xs.data() + t * N, eend);
    if (!collapsed)
      for (Index r = 0; r < CR; ++r) scale_row(b(r), r / R, xs.data() + (C + r) * N, eend);
    W3.resize(N, w3);
    transpose_into(w3, N, xs.data(), N, W3.data(), w3);
    return bounded();
  }

 private:
  using arr = Eigen::Array<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
  bool per_key = false;
  const T *qp = nullptr, *kp = nullptr, *ap = nullptr, *bp = nullptr;
  Index ldq = 0, ldk = 0, lda = 0, ldb = 0;
  bool collapsed = false;
  std::vector<T> cw;  // c_{t,r} of collapsed writes
  rmat<T> qc, kc, ac, bc, lc, mab, mak, mqb, mqk, mc, xs, ys;
  arr d, ecur, eend, pf, fx, fy;

  /// Whether every b_{t,r} is c_{t,r} k_t to within 16 units of rounding of b's largest entry
  /// (c = b[m] / k[m] at the first entry with |k[m]| >= max |k| / 2); fills cw. Taking b as c k
  /// then changes it by no more than the rounding that formed it.
  bool parallel_writes() {
    cw.assign(std::size_t(C * R), T(0));
    const T tol = T(16) * std::numeric_limits<T>::epsilon();
    for (Index r = 0; r < C * R; ++r) {
      const T *bt = b(r), *kt = k(r / R);
      constexpr int W = simd::width<T>;
      using P = simd::pack<T, W>;
      P km = P::broadcast(T(0));  // c from an entry with |k| >= max |k| / 2: within 3 roundings of b / k
      Index m0 = 0;
      for (; m0 + W <= N; m0 += W) {
        const P v = P::load(kt + m0);
        km = max(km, max(v, P::broadcast(T(0)) - v));
      }
      T kmax = reduce_max(km);
      for (; m0 < N; ++m0) kmax = std::max(kmax, std::abs(kt[m0]));
      Index mx = 0;
      while (mx + 1 < N && std::abs(kt[mx]) < kmax / 2) ++mx;
      const T c = kt[mx] != T(0) ? bt[mx] / kt[mx] : T(0);  // max |b| and max |b - c k| below
      P bm = P::broadcast(T(0)), dm = P::broadcast(T(0));
      Index m = 0;
      for (; m + W <= N; m += W) {
        const P bv = P::load(bt + m), e = bv - P::broadcast(c) * P::load(kt + m);
        bm = max(bm, max(bv, P::broadcast(T(0)) - bv));
        dm = max(dm, max(e, P::broadcast(T(0)) - e));
      }
      T bmax = reduce_max(bm), dev = reduce_max(dm);
      for (; m < N; ++m) bmax = std::max(bmax, std::abs(bt[m])), dev = std::max(dev, std::abs(bt[m] - c * kt[m]));
      if (!(dev <= tol * bmax)) return false;
      cw[std::size_t(r)] = c;
    }
    mc.setZero(C, C);
    return true;
  }
  template <int W>
  static T reduce_max(const simd::pack<T, W>& p) {
    alignas(64) T v[W];
    p.store(v);
    T m = v[0];
    for (int i = 1; i < W; ++i) m = std::max(m, v[i]);
    return m;
  }

  const T* q(Index t) const { return qp + t * ldq; }
  const T* k(Index t) const { return kp + t * ldk; }
  const T* a(Index r) const { return ap + r * lda; }  // row (t, r) = t R + r
  const T* b(Index r) const { return bp + r * ldb; }

  /// out[m] = src[m] * f(t, m) (one decay per key) or * f(t, 0) (per head); f = ecur by default.
  void scale_row(const T* src, Index t, T* out) const { scale_row(src, t, out, ecur); }
  void scale_row(const T* src, Index t, T* out, const arr& f) const {
    const T* fr = f.data() + t * f.cols();
    const bool row = f.cols() > 1;
    simd::for_packs<T>(N, [&](auto w, Index m) {
      using P = simd::pack<T, decltype(w)::value>;
      (P::load(src + m) * (row ? P::load(fr + m) : P::broadcast(fr[0]))).store(out + m);
    });
  }
  /// dst[0:n] += c src[0:n] (.) f, f a row of a decay factor (one entry per key, or one per head), or
  /// ones when null; n = N by default.
  void axpy_scaled(T c, const T* src, const T* f, T* dst, Index n = -1) const {
    if (n < 0) n = N;
    const bool row = per_key;
    simd::for_packs<T>(n, [&](auto w, Index m) {
      using P = simd::pack<T, decltype(w)::value>;
      P v = P::load(src + m) * P::broadcast(c);
      if (f) v = v * (row ? P::load(f + m) : P::broadcast(f[0]));
      (P::load(dst + m) + v).store(dst + m);
    });
  }

  /// One decay per head: the four pair matrices as GEMMs, each entry scaled by e^{G_u - G_i}
  /// (u = t - 1 for a's rows, t for q's), zero for i > u: pf row u + 1, row 0 zero (u = -1).
  void pairs_per_head() {
    const Index CR = C * R;
    pf.setZero(C + 1, C);
    for (Index i = 0; i < C; ++i) {
      T p = T(1);
      pf(i + 1, i) = p;
      for (Index u = i + 1; u < C; ++u) pf(u + 1, i) = p *= d(u, 0);
    }
    mab.resize(CR, CR), mak.resize(CR, C), mqb.resize(C, CR), mqk.resize(C, C);
    if (!collapsed) mul_nt(CR, CR, N, ap, lda, bp, ldb, mab.data(), CR, false);
    mul_nt(CR, C, N, ap, lda, kp, ldk, mak.data(), C, false);
    if (!collapsed) mul_nt(C, CR, N, qp, ldq, bp, ldb, mqb.data(), CR, false);
    mul_nt(C, C, N, qp, ldq, kp, ldk, mqk.data(), C, false);
    mqk.array() *= pf.bottomRows(C);
    if (collapsed) {  // mab and mqb unused
      for (Index t = 0; t < C; ++t)
        for (Index r = 0; r < R; ++r) mak.row(t * R + r).array() *= pf.row(t);
      return;
    }
    if (R == 1) {
      mab.array() *= pf.topRows(C);
      mak.array() *= pf.topRows(C);
      mqb.array() *= pf.bottomRows(C);
      return;
    }
    for (Index t = 0; t < C; ++t)
      for (Index i = 0; i < C; ++i)
        for (Index r = 0; r < R; ++r) {
          mqb(t, i * R + r) *= pf(t + 1, i);
          mak(t * R + r, i) *= pf(t, i);
          for (Index r2 = 0; r2 < R; ++r2) mab(t * R + r, i * R + r2) *= pf(t, i);
        }
  }

  /// One decay per key: sub-blocks of chunk_sub tokens; pairs across sub-blocks split at the
  /// earlier sub-block's last token e (two factors <= 1, one GEMM per column sub-block), pairs
  /// inside a sub-block by running products of the per-token decays.
  void pairs_per_key() {
    const Index CR = C * R, Rb = collapsed ? 0 : R;  // b's rows per token that the pairs read
    mab.setZero(CR, CR), mak.setZero(CR, C), mqb.setZero(C, CR), mqk.setZero(C, C);
    fx.resize(C, N), fy.resize(chunk_sub, N);
    std::vector<T> z(static_cast<std::size_t>((Rb + 1) * N));
    for (Index i0 = 0; i0 < C; i0 += chunk_sub) {
      const Index i1 = std::min(C, i0 + chunk_sub), e = i1 - 1, nb = i1 - i0;
      // columns of the sub-block scaled by e^{G_e - G_i} = d_e ... d_{i+1}: b's rows, then k's
      fy.row(nb - 1).setOnes();
      for (Index i = e; i > i0; --i) fy.row(i - 1 - i0) = fy.row(i - i0) * d.row(i);
      ys.resize(nb * (Rb + 1), N);
      for (Index i = i0; i < i1; ++i) {
        for (Index r = 0; r < Rb; ++r) scale_row(b(i * R + r), i - i0, ys.data() + ((i - i0) * Rb + r) * N, fy);
        scale_row(k(i), i - i0, ys.data() + (nb * Rb + i - i0) * N, fy);
      }
      // rows after the sub-block, scaled by e^{G_u - G_e} = d_u ... d_{e+1} (fx row u): a's rows of
      // tokens t >= e + 2 (u = t - 1), q's of t >= e + 1 (u = t)
      if (e + 1 < C) {
        fx.row(e + 1) = d.row(e + 1);
        for (Index u = e + 2; u < C; ++u) fx.row(u) = fx.row(u - 1) * d.row(u);
      }
      for (int side = 0; side < 2; ++side) {
        const Index tfirst = side == 0 ? e + 2 : e + 1, Rr = side == 0 ? R : 1;
        if (tfirst >= C || Rr == 0) continue;
        const Index rows = (C - tfirst) * Rr;
        xs.resize(rows, N);
        for (Index t = tfirst; t < C; ++t)
          for (Index r = 0; r < Rr; ++r)
            scale_row(side == 0 ? a(t * R + r) : q(t), side == 0 ? t - 1 : t, xs.data() + ((t - tfirst) * Rr + r) * N,
                      fx);
        rmat<T>& mb = side == 0 ? mab : mqb;
        rmat<T>& mk = side == 0 ? mak : mqk;
        if (Rb > 0)
          mul_nt(rows, nb * R, N, xs.data(), N, ys.data(), N, mb.data() + tfirst * Rr * CR + i0 * R, CR, false);
        mul_nt(rows, nb, N, xs.data(), N, ys.data() + nb * Rb * N, N, mk.data() + tfirst * Rr * C + i0, C, false);
      }
      // pairs inside the sub-block: z = e^{G_u - G_i} (.) y_i for b_i's rows and k_i, advanced by d_u
      for (Index i = i0; i < i1; ++i) {
        for (Index r = 0; r < Rb; ++r) std::copy_n(b(i * R + r), N, z.data() + r * N);
        std::copy_n(k(i), N, z.data() + Rb * N);
        for (Index u = i; u <= e; ++u) {
          if (u > i) scale_by(z.data(), Rb + 1, d.data() + u * N);
          const T* xr[1 + chunk_max_rank];  // q's row u, a's rows of token u + 1
          Index nx = 1;
          xr[0] = q(u);
          if (u + 1 < C)
            for (Index r1 = 0; r1 < R; ++r1) xr[nx++] = a((u + 1) * R + r1);
          T res[(1 + chunk_max_rank) * (1 + chunk_max_rank)] = {};
          multi_dot(xr, nx, z.data(), Rb + 1, res);
          for (Index r = 0; r < Rb; ++r) mqb(u, i * R + r) = res[r];
          mqk(u, i) = res[Rb];
          for (Index x = 1; x < nx; ++x) {
            for (Index r = 0; r < Rb; ++r) mab((u + 1) * R + x - 1, i * R + r) = res[x * (Rb + 1) + r];
            mak((u + 1) * R + x - 1, i) = res[x * (Rb + 1) + Rb];
          }
        }
      }
    }
  }

  /// rows[r * N + 0:N] *= f[0:N] for r < nr.
  void scale_by(T* rows, Index nr, const T* f) const {
    for (Index r = 0; r < nr; ++r)
      simd::for_packs<T>(N, [&](auto w, Index m) {
        using P = simd::pack<T, decltype(w)::value>;
        (P::load(rows + r * N + m) * P::load(f + m)).store(rows + r * N + m);
      });
  }

  /// res[x * ny + y] = xr[x] . ys[y * N + 0:N]: every dot product in one pass over the N keys.
  template <int NX, int NY>
  void multi_dot_n(const T* const* xr, const T* ys, T* res) const {
    constexpr int W = simd::width<T>;
    using P = simd::pack<T, W>;
    P acc[NX][NY];
    for (int x = 0; x < NX; ++x)
      for (int y = 0; y < NY; ++y) acc[x][y] = P::broadcast(T(0));
    Index m = 0;
    for (; m + W <= N; m += W)
      for (int x = 0; x < NX; ++x) {
        const P xv = P::load(xr[x] + m);
        for (int y = 0; y < NY; ++y) acc[x][y] = fma(xv, P::load(ys + y * N + m), acc[x][y]);
      }
    for (int x = 0; x < NX; ++x)
      for (int y = 0; y < NY; ++y) {
        T v = reduce_add(acc[x][y]);
        for (Index mm = m; mm < N; ++mm) v += xr[x][mm] * ys[y * N + mm];
        res[x * NY + y] = v;
      }
  }
  void multi_dot(const T* const* xr, Index nx, const T* ys, Index ny, T* res) const {
    if (nx == 2 && ny == 2) return multi_dot_n<2, 2>(xr, ys, res);
    if (nx == 1 && ny == 2) return multi_dot_n<1, 2>(xr, ys, res);
    if (nx == 1 && ny == 1) return multi_dot_n<1, 1>(xr, ys, res);
    for (Index x = 0; x < nx; ++x)
      for (Index y = 0; y < ny; ++y) res[x * ny + y] = dot(xr[x], ys + y * N);
  }

  T dot(const T* x, const T* y) const {
    return simd::sum_packs<T>(N, [&](auto w, Index m) {
      using P = simd::pack<T, decltype(w)::value>;
      return P::load(x + m) * P::load(y + m);
    });
  }
  T norm(const T* x) const { return std::sqrt(dot(x, x)); }

  /// The growth check of the header comment on A1 and A2.
  bool bounded() const {
    // a non-finite q, k, a or b reaches W1, W2 or W3 (q: Q'; k: K~; a: a'; b: B~ or, collapsed,
    // parallel_writes fails on it), so checking them checks the chunk's coefficients
    const Index w1 = N + C;
    if (!all_finite(W1.data(), nu * w1) || !all_finite(W2.data(), W2.size()) || !all_finite(W3.data(), W3.size()))
      return false;
    const T g = T(chunk_growth);
    std::vector<T> kn(static_cast<std::size_t>(C)), an(static_cast<std::size_t>(nu), T(0));
    for (Index t = 0; t < C; ++t) kn[std::size_t(t)] = norm(k(t));
    // a row's bound: g |a_{t,r}|, or g sum_r |c_{t,r}| |a_{t,r}| for the collapsed rows of W
    for (Index r = 0; r < C * R; ++r)
      an[std::size_t(collapsed ? r / R : r)] += g * norm(a(r)) * (collapsed ? std::abs(cw[std::size_t(r)]) : T(1));
    for (Index row = 0; row < nu; ++row) {
      const T* w = W1.data() + row * w1;
      const T bound = an[std::size_t(row)];
      if (norm(w) > bound) return false;  // the first N entries: A1's row
      for (Index i = 0; i < C; ++i)  // A2's row, past the unit diagonal of the collapsed form
        if ((!collapsed || i < row) && std::abs(w[N + i]) > bound * kn[std::size_t(i)]) return false;
    }
    return true;
  }
};

/// One chunk of apply, token-major, on the state S (N, n) (Z's first N rows, row stride n; Z has
/// room for nu more rows at row N + C) and the chunk's values V, x's C rows (row stride ldx):
///   U = W1 [S; V],   O = W2 [S; V; U],   S <- Diag(gamma) S + W3 [V; U]
/// (collapsed writes: W = W1 [S; V], O = W2 [S; W], S <- Diag(gamma) S + W3 W), O (C, n) into o with
/// row stride ldo. [S; V; U] is packed once along the channels (the products' packed side, into
/// pk: gemm_padded_rows(n) (N + C + nu) entries; W takes V's place), the factors' rows are read in
/// place, and rows of W1 and W2 go in strips of gemm_nr that read only the V and U rows their
/// triangular factors reach. False, with S unchanged, when V is not finite (the caller runs the
/// recurrence).
template <class T>
bool chunk_apply(const chunk_factors<T>& f, T* Z, Index n, const T* x, Index ldx, T* pk, T* o, Index ldo) {
  constexpr Index MR = gemm_mr<T>, NR = gemm_nr;
  const Index N = f.N, C = f.C, nu = f.nu, vc = f.vc, w1 = N + C, w2 = N + vc + nu, w3 = vc + nu;
  const Index K = N + C + (vc > 0 ? nu : 0), uoff = vc > 0 ? N + C : N, ps = MR * K, per = nu > 0 ? nu / C : 1;
  const Index panels = gemm_padded_rows<T>(n) / MR;
  gemm_pack_a_t(Z, n, n, N, pk, K);              // S
  gemm_pack_a_t(x, ldx, n, C, pk + N * MR, K);   // V, read in place
  for (Index q = 0; q < panels; ++q)
    if (!all_finite(pk + q * ps + N * MR, C * MR)) return false;  // a non-finite value: the recurrence
  if (nu > 0) {
    T* U = Z + (N + C) * n;
    std::fill(U, U + nu * n, T(0));
    for (Index r0 = 0; r0 < nu; r0 += NR) {  // U rows of tokens t read V rows < t (W rows: <= t)
      const Index r1 = std::min(nu, r0 + NR), tl = (r1 - 1) / per;
      gemm_tile_add(n, r1 - r0, N + (vc > 0 ? tl : tl + 1), pk, ps, f.W1.data() + r0 * w1, w1, U + r0 * n, n, T(1));
    }
    gemm_pack_a_t(U, n, n, nu, pk + uoff * MR, K);
  }
  for (Index t0 = 0; t0 < C; t0 += NR) {  // O rows of tokens t read V, U or W rows of tokens <= t
    const Index t1 = std::min(C, t0 + NR);
    for (Index t = t0; t < t1; ++t) std::fill(o + t * ldo, o + t * ldo + n, T(0));
    gemm_tile_add(n, t1 - t0, N + t1, pk, ps, f.W2.data() + t0 * w2, w2, o + t0 * ldo, ldo, T(1));
    if (vc > 0 && nu > 0)
      gemm_tile_add(n, t1 - t0, t1 * per, pk + uoff * MR, ps, f.W2.data() + t0 * w2 + N + C, w2, o + t0 * ldo, ldo,
                    T(1));
  }
  for (Index m = 0; m < N; ++m) {
    T* s = Z + m * n;
    const T g = f.gamma[std::size_t(m)];
    simd::for_packs<T>(n, [&](auto w, Index c) {
      using P = simd::pack<T, decltype(w)::value>;
      (P::load(s + c) * P::broadcast(g)).store(s + c);
    });
  }
  if (w3 > 0) gemm_tile_add(n, N, w3, pk + N * MR, ps, f.W3.data(), w3, Z, n, T(1));
  return true;
}

}  // namespace iattn::cpu_detail::transition_detail
