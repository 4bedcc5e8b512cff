// iattn/backend/cpu/complex_semiseparable.hpp: CPU evaluator of ComplexSemiseparable.
//
// apply: the complex scan, per channel N complex states (real and imaginary parts in two arrays),
// vectorised across the state with packs (one body at the SIMD width and at width 1). The decays
// e^{lambda_t} = e^{rho_t} (cos theta_t + i sin theta_t) are formed once per token and head, by packs
// (exp, and sin/cos by a Cody-Waite reduction and minimax polynomials), and shared by the head's P
// channels; with a decay fixed over tokens, once for the whole scan.
//   forward:     h_t = e^{lambda_t} h_{t-1} + B_t x_t,          y_t = Re sum_m C_t[m] h_t[m]
//   transposed:  g_s = e^{lambda_{s+1}} g_{s+1} + C_s x_s,      y_s = Re sum_m B_s[m] g_s[m]
// The transposed form follows from H^T[s, t] = H[t, s] = Re sum_m B_s E(s+1..t) C_t: the same
// product with B and C exchanged and the decay of token s+1 (no conjugate: Re(C E B) is symmetric
// in B and C). Cost O(L nc N) multiply-adds plus O(L H N) exp and sin/cos.
//
// Tiles (channel_eval): the stable block form of docs/design.md section 3 in complex numbers. With
// blocks of tile_size tokens, for a tile of row block I = [i0, i1) strictly below column block
// J = [j0, j1):
//   H[I, J] = Re( Ct_I diag(mid) Bt_J^T ) = [Re(Ct mid), -Im(Ct mid)] [Re Bt, Im Bt]^T   (rank-2N GEMM)
//   Ct[t] = C_t E(i0+1..t),   Bt[s] = B_s E(s+1..j1-1),   mid = E(j1..i0)
// E(a..b) = exp(sum_{k=a..b} rho_k) * cis(sum_{k=a..b} theta_k). The in-block sums run forward or
// backward from a block edge (so every exp argument is <= 0, rho = -inf gives exactly 0), in
// double; angles are block-relative and block totals are reduced mod 2 pi, so mid's angle is a sum
// of numbers in [-pi, pi] (plus one token's angle), and every cos and sin is taken in double before
// the factors are rounded to T: fp32 loses nothing to the length of the sequence (L = 10^6). Diagonal blocks
// use running complex products of the per-token factors (at most tile_size of them), vectorised
// across columns. A full materialize costs 2 L^2 N flops in the GEMMs (L^2 / 2 entries, inner
// dimension 2N), O(tile_size L N) in the diagonal blocks and O(L N) exp and sin/cos per channel.
#pragma once

#include "../../ops/complex_semiseparable.hpp"
#include "gemm.hpp"
#include "simd.hpp"
#include "tile.hpp"

#include <algorithm>
#include <cmath>
#include <type_traits>
#include <vector>

namespace iattn::cpu_detail {

namespace complex_ss {

/// |x| up to which sincos() reduces x exactly: q pi/2 with q < 2^12 (float) or 2^26 (double) is an
/// exact product of q and the split's leading parts.
template <class T>
inline constexpr T sincos_limit = std::is_same_v<T, float> ? T(4096) : T(1048576);

/// s = sin x, c = cos x, lane by lane, for |x| <= sincos_limit<T> (NaN gives NaN). x = q pi/2 + r
/// with q = nearest(x 2/pi) by the 1.5 * 2^p rounding trick and r = x - q pi/2 by a three-part
/// Cody-Waite split of pi/2 (the first two parts with 12 (float) or 26 (double) significant bits,
/// so q times them is exact, and x - q P1 is exact by Sterbenz), |r| <= pi/4 + tiny; then Cephes'
/// minimax polynomials for sin and cos on [-pi/4, pi/4] (about 1 ulp) and the quadrant q mod 4
/// picks and signs them.
template <class T, class P>
void sincos(P x, P& s, P& c) {
  auto B = [](T v) { return P::broadcast(v); };
  constexpr bool f32 = std::is_same_v<T, float>;
  const P magic = B(f32 ? T(12582912.0) : T(6755399441055744.0));  // 1.5 * 2^23, 1.5 * 2^52
  const P q = (x * B(T(0.636619772367581343075535053490057448))) + magic - magic;
  P r;
  if constexpr (f32) {
    r = x - q * B(1.57080078125f);          // 0x1.922p+0
    r = r - q * B(-4.45358455181121826e-06f);  // -0x1.2aep-18
    r = r - q * B(-8.70551575271605316e-10f);  // pi/2 minus the above, rounded
  } else {
    r = x - q * B(1.5707963407039642333984375);         // 0x1.921fb58p+0
    r = r - q * B(-1.39090676753994557657279074e-08);  // -0x1.dde974p-27
    r = r - q * B(6.12323399573676603586882e-17);       // rest, rounded
  }
  const P z = r * r;
  P sp, cp;
  if constexpr (f32) {
    sp = fma(fma(B(-1.9515295891e-4f), z, B(8.3321608736e-3f)), z, B(-1.6666654611e-1f));
    cp = fma(fma(B(2.443315711809948e-5f), z, B(-1.388731625493765e-3f)), z, B(4.166664568298827e-2f));
  } else {
    sp = fma(B(1.58962301576546568060e-10), z, B(-2.50507477628578072866e-8));
    sp = fma(sp, z, B(2.75573136213857245213e-6));
    sp = fma(sp, z, B(-1.98412698295895385996e-4));
    sp = fma(sp, z, B(8.33333333332211858878e-3));
    sp = fma(sp, z, B(-1.66666666666666307295e-1));
    cp = fma(B(-1.13585365213876817300e-11), z, B(2.08757008419747316778e-9));
    cp = fma(cp, z, B(-2.75573141792967388112e-7));
    cp = fma(cp, z, B(2.48015872888517045348e-5));
    cp = fma(cp, z, B(-1.38888888888730564116e-3));
    cp = fma(cp, z, B(4.16666666666665929218e-2));
  }
  const P sr = fma(r * z, sp, r);                        // sin r
  const P cr = fma(z * z, cp, fma(B(T(-0.5)), z, B(T(1))));  // cos r
  // j = q mod 4 in {0, 1, 2, 3}: sin x = (S, C, -S, -C)[j], cos x = (C, -S, -C, S)[j].
  P j = q - B(T(4)) * ((q * B(T(0.25)) + magic) - magic);  // in [-2, 2]
  j = select_ge(j, B(T(0)), j, j + B(T(4)));
  const P sign = select_ge(j, B(T(2)), B(T(-1)), B(T(1)));
  const P odd = j - select_ge(j, B(T(2)), B(T(2)), B(T(0)));  // 0 or 1
  s = sign * select_ge(odd, B(T(1)), cr, sr);
  c = sign * select_ge(odd, B(T(1)), B(T(0)) - sr, cr);
}

/// re[i] + i im[i] = exp(rho[i]) (cos theta[i] + i sin theta[i]) for i < n, by packs. A pack with an
/// angle beyond sincos_limit (or infinite), or a log-magnitude that is NaN or above 80 (only with
/// allow_growth), takes std::exp, std::cos and std::sin in double, lane by lane: xsimd's double exp
/// converts its argument to an integer, which NaN and +inf have none of.
/// ahead_rho and ahead_theta, when given, are the rows a later call will read: their cache lines
/// are prefetched pack by pack (token rows lie a page or more apart, which the hardware
/// prefetchers do not follow).
template <class T>
void exp_cis(Index n, const T* rho, const T* theta, T* re, T* im, const T* ahead_rho = nullptr,
             const T* ahead_theta = nullptr) {
  simd::for_packs<T>(n, [&](auto w, Index i) {
    constexpr int W = decltype(w)::value;
    using P = simd::pack<T, W>;
#if defined(__GNUC__) || defined(__clang__)
    if (ahead_rho) __builtin_prefetch(ahead_rho + i), __builtin_prefetch(ahead_theta + i);
#endif
    const P th = P::load(theta + i), r = P::load(rho + i), zero = P::broadcast(T(0)), one = P::broadcast(T(1));
    const P big = select_ge(max(th, zero - th), P::broadcast(sincos_limit<T>), one, zero) +
                  select_ge(P::broadcast(T(80)), r, zero, one);
    if (reduce_add(big) != T(0)) {
      for (int k = 0; k < W; ++k) {
        const double e = std::exp(double(rho[i + k])), a = double(theta[i + k]);
        re[i + k] = T(e * std::cos(a));
        im[i + k] = T(e * std::sin(a));
      }
      return;
    }
    P s, c;
    sincos<T>(th, s, c);
    const P e = exp(r);
    (e * c).store(re + i);
    (e * s).store(im + i);
  });
}

}  // namespace complex_ss

template <class T>
struct slab_eval<ComplexSemiseparable<T>> {
  static void apply(const ComplexSemiseparable<T>& n, const context& cx, Index c0, Index nc, const T* x, T* y) {
    run(false, n, cx, c0, nc, x, y);
  }
  static void apply_t(const ComplexSemiseparable<T>& n, const context& cx, Index c0, Index nc, const T* x, T* y) {
    run(true, n, cx, c0, nc, x, y);
  }

 private:
  // The direction is a runtime flag: it decides which token's decay a step applies and which of B
  // and C goes in and out, never the per-state arithmetic.
  static void run(bool transposed, const ComplexSemiseparable<T>& n, const context& cx, Index c0, Index nc,
                  const T* x, T* y) {
    const Index L = cx.L, N = n.state(), P = n.head_dim();
    if (L == 0 || nc == 0) return;
    struct head_span {
      Index g_off, dec_off, c_begin, c_end;
    };
    const Index h_begin = c0 / P, h_end = (c0 + nc - 1) / P + 1, nh = h_end - h_begin;
    std::vector<head_span> spans;
    for (Index h = h_begin; h < h_end; ++h)
      spans.push_back({n.group_of_head(h) * N, (h - h_begin) * N, std::max(c0, h * P) - c0,
                       std::min(c0 + nc, (h + 1) * P) - c0});
    const std::size_t ns = std::size_t(nc * N), nd = std::size_t(nh * N);
    std::vector<T> hr(ns, T(0)), hi(ns, T(0)), er(nd, T(0)), ei(nd, T(0));
    const auto& rho = n.log_mag();
    const auto& th = n.angle();
    // The decays of the slab's heads at token k: one contiguous run of rho and theta each.
    auto row_of = [&](const coefficient<T>& m, Index k) { return m.row(m.rows() == 1 ? 0 : k) + h_begin * N; };
    auto decays = [&](Index k, Index ahead) {
      const bool pf = ahead >= 0 && ahead < L;
      complex_ss::exp_cis<T>(nh * N, row_of(rho, k), row_of(th, k), er.data(), ei.data(),
                             pf ? row_of(rho, ahead) : nullptr, pf ? row_of(th, ahead) : nullptr);
    };
    const bool fixed = rho.rows() == 1 && th.rows() == 1;
    if (fixed) decays(0, -1);
    for (Index i = 0; i < L; ++i) {
      const Index t = transposed ? L - 1 - i : i;
      const Index k = transposed ? t + 1 : t;  // the token whose decay this step applies
      if (!fixed && k < L) decays(k, transposed ? k - prefetch_ahead : k + prefetch_ahead);  // (k = L: h = 0)
      const Index ld = n.B_re().cols();
      const T* in_r = (transposed ? n.C_re() : n.B_re()).data() + t * ld;
      const T* in_i = (transposed ? n.C_im() : n.B_im()).data() + t * ld;
      const T* out_r = (transposed ? n.B_re() : n.C_re()).data() + t * ld;
      const T* out_i = (transposed ? n.B_im() : n.C_im()).data() + t * ld;
      const T* xt = x + t * nc;
      T* yt = y + t * nc;
      for (const head_span& s : spans) {
        const T* a = er.data() + s.dec_off;
        const T* b = ei.data() + s.dec_off;
        for (Index j = s.c_begin; j < s.c_end; ++j)
          yt[j] = step(N, a, b, in_r + s.g_off, in_i + s.g_off, out_r + s.g_off, out_i + s.g_off, xt[j],
                       hr.data() + j * N, hi.data() + j * N);
      }
    }
  }

  // h = (a + i b) h + (ir + i ii) x;  return Re sum_m (or + i oi) h
  static T step(Index N, const T* a, const T* b, const T* ir, const T* ii, const T* or_, const T* oi, T xv, T* hr,
                T* hi) {
    return simd::sum_packs<T>(N, [&](auto w, Index m) {
      using Pk = simd::pack<T, decltype(w)::value>;
      const Pk ar = Pk::load(a + m), ai = Pk::load(b + m), xx = Pk::broadcast(xv);
      const Pk r0 = Pk::load(hr + m), i0 = Pk::load(hi + m);
      const Pk nr = fma(ar, r0, Pk::load(ir + m) * xx - ai * i0);
      const Pk ni = fma(ar, i0, fma(ai, r0, Pk::load(ii + m) * xx));
      nr.store(hr + m);
      ni.store(hi + m);
      return Pk::load(or_ + m) * nr - Pk::load(oi + m) * ni;
    });
  }
};

template <class T>
struct channel_eval<ComplexSemiseparable<T>, T> {
  channel_eval(const ComplexSemiseparable<T>& n, const context& cx, Index c);

  /// H^c[i0:i1, j0:j1] into out.
  void block(Index i0, Index i1, Index j0, Index j1, tile<T> out) const {
    for (Index bi = i0 / tile_size; bi * tile_size < i1; ++bi) {
      const Index r0 = std::max(i0, bi * tile_size), r1 = std::min(i1, (bi + 1) * tile_size);
      for (Index bj = j0 / tile_size; bj * tile_size < j1; ++bj) {
        const Index q0 = std::max(j0, bj * tile_size), q1 = std::min(j1, (bj + 1) * tile_size);
        tile<T> sub = out.sub(r0 - i0, q0 - j0, r1 - r0, q1 - q0);
        if (bj > bi) sub.set_zero();
        else if (bj < bi) off_diagonal(bi, bj, r0, r1, q0, q1, sub);
        else diagonal(r0, r1, q0, q1, sub);
      }
    }
  }

 private:
  void off_diagonal(Index bi, Index bj, Index r0, Index r1, Index q0, Index q1, tile<T> sub) const;
  void diagonal(Index r0, Index r1, Index q0, Index q1, tile<T> sub) const;

  Index L_, N_;
  const T *Br_, *Bi_, *Cr_, *Ci_;  // the channel's group columns of B and C, rows ld_ apart
  Index ld_;
  Matrix<T> ct_, bt_;  // (L, 2N): [Re, Im] of C_t E(b0+1..t) and of B_s E(s+1..b1-1)
  Matrix<T> fr_, fi_;  // (L, N): Re and Im of e^{lambda_t}
  Matrix<double> blk_rho_, blk_th_;      // (nb, N): block sums of rho, and of theta reduced mod 2 pi
  Matrix<double> first_rho_, first_th_;  // (nb, N): rho and theta at the block's first token
};

template <class T>
channel_eval<ComplexSemiseparable<T>, T>::channel_eval(const ComplexSemiseparable<T>& n, const context& cx, Index c)
    : L_(cx.L), N_(n.state()) {
  const Index L = L_, N = N_, h = n.head_of(c), g = n.group_of_head(h), nb = (L + tile_size - 1) / tile_size;
  ld_ = n.B_re().cols();
  Br_ = n.B_re().data() + g * N, Bi_ = n.B_im().data() + g * N;
  Cr_ = n.C_re().data() + g * N, Ci_ = n.C_im().data() + g * N;
  ct_.resize(L, 2 * N), bt_.resize(L, 2 * N), fr_.resize(L, N), fi_.resize(L, N);
  blk_rho_.resize(nb, N), blk_th_.resize(nb, N), first_rho_.resize(nb, N), first_th_.resize(nb, N);
  // Block by block, in double: the exponents per token (f), forward from the block start (c) and
  // backward from the block end (b), then exp and cis of each set in one vectorised pass. One
  // workspace of 12 (tile_size, N) arrays, reused by every block.
  const double two_pi = 6.283185307179586476925286766559;
  const Index bs = tile_size * N;
  std::vector<double> ws(static_cast<std::size_t>(12 * bs));
  double *rf = ws.data(), *af = rf + bs, *rc = af + bs, *ac = rc + bs, *rb = ac + bs, *ab = rb + bs;
  double *fre = ab + bs, *fim = fre + bs, *cre = fim + bs, *cim = cre + bs, *bre = cim + bs, *bim = bre + bs;
  for (Index b = 0; b < nb; ++b) {
    const Index b0 = b * tile_size, nt = std::min(L, b0 + tile_size) - b0;
    for (Index i = 0; i < nt; ++i)
      for (Index m = 0; m < N; ++m)
        rf[i * N + m] = double(n.log_mag_at(b0 + i, h, m)), af[i * N + m] = double(n.angle_at(b0 + i, h, m));
    for (Index m = 0; m < N; ++m) {
      double r = 0, a = 0;
      for (Index i = 0; i < nt; ++i) {
        if (i > 0) r += rf[i * N + m], a += af[i * N + m];
        rc[i * N + m] = r, ac[i * N + m] = a;
      }
      r = 0, a = 0;
      for (Index i = nt - 1; i >= 0; --i) {
        rb[i * N + m] = r, ab[i * N + m] = a;
        r += rf[i * N + m], a += af[i * N + m];
      }
      blk_rho_(b, m) = r;
      blk_th_(b, m) = std::isfinite(a) ? std::remainder(a, two_pi) : a;
      first_rho_(b, m) = rf[m];
      first_th_(b, m) = af[m];
    }
    complex_ss::exp_cis<double>(nt * N, rf, af, fre, fim);
    complex_ss::exp_cis<double>(nt * N, rc, ac, cre, cim);
    complex_ss::exp_cis<double>(nt * N, rb, ab, bre, bim);
    for (Index i = 0; i < nt; ++i) {
      const Index t = b0 + i;
      const T *cr = Cr_ + t * ld_, *ci = Ci_ + t * ld_, *br = Br_ + t * ld_, *bi = Bi_ + t * ld_;
      T *ct = ct_.row(t).data(), *bt = bt_.row(t).data(), *fr = fr_.row(t).data(), *fi = fi_.row(t).data();
      for (Index m = 0, k = i * N; m < N; ++m, ++k) {
        fr[m] = T(fre[k]), fi[m] = T(fim[k]);
        const double c_r = cr[m], c_i = ci[m], b_r = br[m], b_i = bi[m];
        ct[m] = T(c_r * cre[k] - c_i * cim[k]);
        ct[N + m] = T(c_r * cim[k] + c_i * cre[k]);
        bt[m] = T(b_r * bre[k] - b_i * bim[k]);
        bt[N + m] = T(b_r * bim[k] + b_i * bre[k]);
      }
    }
  }
}

// Rows [r0, r1) of block bi, columns [q0, q1) of block bj < bi: [Re(Ct mid), -Im(Ct mid)] Bt^T.
template <class T>
void channel_eval<ComplexSemiseparable<T>, T>::off_diagonal(Index bi, Index bj, Index r0, Index r1, Index q0,
                                                            Index q1, tile<T> sub) const {
  const Index N = N_, rows = r1 - r0;
  std::vector<double> R(static_cast<std::size_t>(N)), A(R), mr(R), mi(R);
  for (Index m = 0; m < N; ++m) {  // mid = E(j1..i0): the first token of block bi and the blocks between
    double r = first_rho_(bi, m), a = first_th_(bi, m);
    for (Index b = bi - 1; b > bj; --b) r += blk_rho_(b, m), a += blk_th_(b, m);
    R[std::size_t(m)] = r, A[std::size_t(m)] = a;
  }
  complex_ss::exp_cis<double>(N, R.data(), A.data(), mr.data(), mi.data());
  gemm_scratch<T>& s = gemm_thread_scratch<T>();
  T* U = sized(s.aux, rows * 2 * N);  // (rows, 2N)
  for (Index i = 0; i < rows; ++i) {
    const T* c = ct_.row(r0 + i).data();
    T* u = U + i * 2 * N;
    for (Index m = 0; m < N; ++m) {
      const T a = T(mr[std::size_t(m)]), b = T(mi[std::size_t(m)]);
      u[m] = c[m] * a - c[N + m] * b;
      u[N + m] = -(c[m] * b + c[N + m] * a);
    }
  }
  const Index nq = q1 - q0;
  T* ap = sized(s.ap, gemm_padded_rows<T>(nq) * 2 * N);
  gemm_pack_a(bt_.row(q0).data(), 2 * N, nq, 2 * N, ap);
  sub.set_zero();
  gemm_tile_add(nq, rows, 2 * N, ap, gemm_mr<T> * 2 * N, U, 2 * N, sub.data, sub.stride, T(1));
}

// Rows [r0, r1) and columns [q0, q1) inside one diagonal block, by running complex products
// vectorised across columns (as decay_tiles.hpp's diagonal blocks): a group of W consecutive
// columns s (the lanes) keeps, per state m, acc[m] = E(s+1..t)[m] as two packs (Re, Im), restarted
// at 1 in every lane with s >= t, so each lane multiplies the same per-token factors in the same
// order as a scalar loop over t: no quotient, a factor 0 gives exact zeros. Per row t:
//   acc = (s < t ? acc * f_t : 1);   v = Re sum_m C_t[m] acc[m] B_s[m]   (s <= t, else 0)
// Rows t < r0 advance acc and store nothing; lanes past q1 see B = 0 and are not stored.
template <class T>
void channel_eval<ComplexSemiseparable<T>, T>::diagonal(Index r0, Index r1, Index q0, Index q1, tile<T> sub) const {
  constexpr int W = simd::width<T>;
  using P = simd::pack<T, W>;
  const Index N = N_;
  std::vector<T> buf(std::size_t(4 * N * W + W));
  T* ar = buf.data();     // (N, W): Re acc
  T* ai = ar + N * W;     // (N, W): Im acc
  T* br = ai + N * W;     // (N, W): Re B_{s0 + lane}[m]
  T* bi = br + N * W;     // (N, W): Im B_{s0 + lane}[m]
  T* row = bi + N * W;    // one row of a partial group
  const P one = P::broadcast(T(1)), zero = P::broadcast(T(0));
  const P lane = P::iota(T(0));  // lanes and rows relative to s0: exact in float at any L
  auto group = [&](Index j, Index cnt) {  // columns q0 + j .. q0 + j + cnt, cnt <= W
    const Index s0 = q0 + j;
    for (Index k = 0; k < W; ++k)
      for (Index m = 0; m < N; ++m) {
        br[m * W + k] = k < cnt ? Br_[(s0 + k) * ld_ + m] : T(0);
        bi[m * W + k] = k < cnt ? Bi_[(s0 + k) * ld_ + m] : T(0);
      }
    auto put = [&](Index t, P v) {
      if (cnt == W) return v.store(sub.row(t - r0) + j);
      v.store(row);
      std::copy(row, row + cnt, sub.row(t - r0) + j);
    };
    for (Index t = r0; t < std::min(r1, s0); ++t) put(t, zero);
    for (Index m = 0; m < N; ++m) one.store(ar + m * W), zero.store(ai + m * W);
    for (Index t = s0; t < r1; ++t) {
      const T *cr = Cr_ + t * ld_, *ci = Ci_ + t * ld_, *fr = fr_.row(t).data(), *fi = fi_.row(t).data();
      const P tp = P::broadcast(T(t - s0));
      const bool edge = t < s0 + W;  // some lane has s >= t
      P v0 = zero, v1 = zero;
      for (Index m = 0; m < N; ++m) {
        const P a = P::load(ar + m * W), b = P::load(ai + m * W), f = P::broadcast(fr[m]), e = P::broadcast(fi[m]);
        P nr = a * f - b * e, ni = fma(a, e, b * f);
        if (edge) nr = select_ge(lane, tp, one, nr), ni = select_ge(lane, tp, zero, ni);
        nr.store(ar + m * W);
        ni.store(ai + m * W);
        const P c = P::broadcast(cr[m]), d = P::broadcast(ci[m]);
        const P wr = c * nr - d * ni, wi = fma(c, ni, d * nr);  // C_t acc
        v0 = fma(wr, P::load(br + m * W), v0);
        v1 = fma(wi, P::load(bi + m * W), v1);
      }
      P v = v0 - v1;
      if (edge) v = select_ge(tp, lane, v, zero);
      if (t >= r0) put(t, v);
    }
  };
  const Index nq = q1 - q0;
  Index j = 0;
  for (; j + W <= nq; j += W) group(j, W);
  if (j < nq) group(j, nq - j);
}

}  // namespace iattn::cpu_detail
