// iattn/backend/cpu/toeplitz_mean.hpp: channel means of sums of terms whose cores are Toeplitz.
//
// A term w * diag(post) * Core * diag(pre) * [conv] of mean.hpp's expansion has, for channel c,
//   H^c[t, s] = w post_c[t] sum_{lag < K, lag <= t-s} k_c[t - s - lag] pre_c[s + lag] tap_c(lag)   (s <= t)
// when its core is Toeplitz, Core^c[t, j] = k_c[t - j]:
//   - a convolution in the core's place (diag * conv * diag * [conv], the Hyena's long filter:
//     mean.hpp's tconv): k_c = its taps;
//   - a ComplexSemiseparable with decays given once for all tokens ((1, H*N) rows of rho and theta)
//     and projections B, C equal at every token (the LRU, S4D run as a recurrence):
//     k_c[n] = Re sum_m C[g, m] lambda[h, m]^n B[g, m];
//   - none (a band: a diagonal, k = delta, or a convolution, k = its taps, and no pre or conv after).
// The convolution after the core is at most max_mean_conv wide.
//
// Fixed diagonals ((1, D) rows, or L = 1): every channel's matrix is Toeplitz and so is the mean,
//   mean_c H^c [t, s] = g[t - s],   g[n] = (1/|C|) sum_{c in C} k'_c[n]   (|k'_c[n]| for |H^c|),
// with k'_c the channel's whole kernel (its terms summed): O(|C| N L + L^2) (the LRU at d_model
// 1024, L = 1024: 6.8 ms against 371 ms on the per-channel tile path, docs/performance.md).
// Otherwise (the Hyena's gates) every entry is a sum over the channels, O(L * ext * |C| K) for
// kernels of ext lags: tiles of 16 x 16 entries and chunks of 1024 channels, whose kernel, pre and post
// rows stay in L2, the channels in SIMD packs; where one term alone reaches an entry with all its
// lags (the Hyena's long filter away from the diagonal), four rows of one column at a time, which
// share its pre rows and all but one kernel row. Taken only where no head path applies.
//
// The complex powers are chunk-relative, in double: lambda^(64 b + j) = e^(64 b rho) (cos, sin)(64 b
// theta, reduced mod 2 pi) times lambda^j, the latter by products of lambda (j < 64); lambda^0 = 1
// exactly (the diagonal never reads a decay, as in the recurrence) and rho = -inf gives exact zeros
// past it. No exp argument is positive when rho <= 0.
#pragma once

#include "../../core/means.hpp"
#include "../../ops/causal_conv.hpp"
#include "../../ops/complex_semiseparable.hpp"
#include "mean.hpp"
#include "parallel.hpp"
#include "simd.hpp"

#include <algorithm>
#include <cmath>
#include <complex>
#include <limits>
#include <vector>

namespace iattn::cpu_detail {

/// Whether every row of x equals its first (bitwise: a NaN makes the rows differ).
template <class T>
bool rows_constant(const coefficient<T>& x) {
  const Index n = x.cols();
  for (Index t = 1; t < x.rows(); ++t)
    if (!std::equal(x.row(t), x.row(t) + n, x.row(0))) return false;
  return true;
}

/// Whether the diagonals are fixed over tokens.
template <class T>
bool diagonals_fixed(const diag_factors<T>& d, Index L) {
  return L <= 1 || std::all_of(d.f.begin(), d.f.end(), [](const typename diag_factors<T>::factor& x) { return x.rows == 1; });
}

/// Whether the term's core is Toeplitz (see the header comment); with fixed_only, its diagonals
/// fixed over tokens too.
template <class T>
bool toeplitz_term(const mean_term<T>& t, Index L, bool fixed_only) {
  if (fixed_only && !(diagonals_fixed(t.post, L) && diagonals_fixed(t.pre, L))) return false;
  if (t.conv && t.has_core() && t.conv->width() > max_mean_conv) return false;
  if (!t.has_core() || t.tconv) return true;
  if (t.kind != mean_term<T>::core_kind::complex || t.S != nullptr || t.R != nullptr) return false;
  const auto& cs = *static_cast<const ComplexSemiseparable<T>*>(t.node);
  if (L > 1 && !(cs.constant_log_mag() && cs.constant_angle())) return false;
  return rows_constant(cs.B_re()) && rows_constant(cs.B_im()) && rows_constant(cs.C_re()) && rows_constant(cs.C_im());
}

/// Whether toeplitz_mean takes the terms: every core Toeplitz (with fixed_only, every diagonal
/// fixed over tokens), and at least one core (sums of bands keep mean.hpp's band path).
template <class T>
bool toeplitz_mean_takes(const mean_terms<T>& terms, Index L, bool fixed_only) {
  bool core = false;
  for (const auto& t : terms) {
    if (!toeplitz_term(t, L, fixed_only)) return false;
    core = core || t.has_core();
  }
  return core;
}

/// kern[n] += scale * Re sum_m C[g, m] lambda[h, m]^n B[g, m] for n < L, the powers chunk-relative.
template <class T>
void add_complex_kernel(const ComplexSemiseparable<T>& cs, Index c, double scale, Index L, double* kern,
                        std::vector<std::complex<double>>& pw) {
  using cd = std::complex<double>;
  constexpr Index chunk = 64;
  constexpr double two_pi = 6.283185307179586476925286766559;
  const Index N = cs.state(), h = cs.head_of(c), g = cs.group_of_head(h);
  pw.resize(std::size_t(chunk));
  for (Index m = 0; m < N; ++m) {
    const double rho = double(cs.log_mag()(0, h * N + m)), theta = double(cs.angle()(0, h * N + m));
    const Index bg = g * N + m;
    const cd a = cd(double(cs.C_re()(0, bg)), double(cs.C_im()(0, bg))) * cd(double(cs.B_re()(0, bg)), double(cs.B_im()(0, bg))) * scale;
    const bool reset = rho == -std::numeric_limits<double>::infinity();  // lambda = 0 exactly, whatever theta
    const cd lam = reset ? cd(0, 0) : std::exp(rho) * cd(std::cos(theta), std::sin(theta));
    pw[0] = cd(1, 0);
    for (Index j = 1; j < chunk; ++j) pw[std::size_t(j)] = pw[std::size_t(j - 1)] * lam;
    for (Index b0 = 0; b0 < L; b0 += chunk) {
      cd block(1, 0);  // lambda^b0
      if (b0 > 0) {
        const double n = double(b0), phase = std::remainder(n * theta, two_pi);
        block = reset ? cd(0, 0) : std::exp(n * rho) * cd(std::cos(phase), std::sin(phase));
      }
      const cd ab = a * block;
      const Index e = std::min(L, b0 + chunk);
      for (Index n = b0; n < e; ++n) kern[n] += (ab * pw[std::size_t(n - b0)]).real();
    }
  }
}

/// Lags the core's kernel spans (its entries past them are zero).
template <class T>
Index core_extent(const mean_term<T>& t, Index L) {
  if (t.tconv) return std::min(L, t.tconv->width());
  if (t.has_core()) return L;
  return std::min(L, t.width());  // a band: its convolution's taps, or the diagonal
}

/// k[n] = the core's kernel of channel c for n < core_extent (a band's taps, or delta), scaled.
template <class T>
void core_kernel(const mean_term<T>& t, Index c, double scale, Index L, double* k, std::vector<std::complex<double>>& pw) {
  const Index ext = core_extent(t, L);
  std::fill(k, k + ext, 0.0);
  if (t.tconv) {
    for (Index n = 0; n < ext; ++n) k[n] = scale * double(t.tconv->tap(n, c));
  } else if (t.has_core()) {
    add_complex_kernel(*static_cast<const ComplexSemiseparable<T>*>(t.node), c, scale, L, k, pw);
  } else {
    for (Index n = 0; n < ext; ++n) k[n] = scale * (t.conv ? double(t.conv->tap(n, c)) : 1.0);
  }
}

/// The convolution after a term's core (a band's convolution is its core): taps, or none.
template <class T>
const CausalConv<T>* after_core(const mean_term<T>& t) {
  return t.has_core() ? t.conv : nullptr;
}

/// Fixed diagonals: the mean is Toeplitz, from the channels' kernels. The channels are summed in
/// blocks of a fixed size, each block in order and the blocks in order, so the result does not
/// depend on which thread took which block (the same bits on every call).
template <class T>
Matrix<T> toeplitz_mean_fixed(const mean_terms<T>& terms, const context& cx, detail::mean_request rq) {
  constexpr Index block = 64;
  const Index L = cx.L, D = cx.D, nc = rq.c1 - rq.c0, nb = (nc + block - 1) / block;
  Matrix<T> out = Matrix<T>::Zero(L, L);
  std::vector<std::vector<double>> part(static_cast<std::size_t>(nb), std::vector<double>(std::size_t(L), 0.0));
  struct scratch {
    std::vector<double> kern, core;
    std::vector<std::complex<double>> pw;
    std::vector<T> fac;
  };
  std::vector<scratch> sc(static_cast<std::size_t>(std::max<Index>(1, max_threads())));
  parallel_for(nb, [&](Index b) {
    scratch& s = sc[std::min<std::size_t>(std::size_t(thread_index()), sc.size() - 1)];
    std::vector<double>& p = part[std::size_t(b)];
    for (Index c = rq.c0 + b * block; c < std::min(rq.c1, rq.c0 + (b + 1) * block); ++c) {
      s.kern.assign(std::size_t(L), 0.0);
      s.core.resize(std::size_t(L));
      for (const auto& t : terms) {
        auto at = [&](const diag_factors<T>& d) {
          const T* r = d.row(0, D, c, 1, s.fac);
          return r ? double(r[0]) : 1.0;
        };
        const Index ext = core_extent(t, L);
        core_kernel(t, c, t.weight * at(t.post) * at(t.pre), L, s.core.data(), s.pw);
        const CausalConv<T>* conv = after_core(t);
        const Index K = conv ? conv->width() : 1;
        for (Index n = 0; n < std::min(L, ext + K - 1); ++n) {
          double v = 0;
          for (Index lag = std::max<Index>(0, n - ext + 1); lag < K && lag <= n; ++lag)
            v += (conv ? double(conv->tap(lag, c)) : 1.0) * s.core[std::size_t(n - lag)];
          s.kern[std::size_t(n)] += v;
        }
      }
      for (Index n = 0; n < L; ++n) p[std::size_t(n)] += rq.abs ? std::abs(s.kern[std::size_t(n)]) : s.kern[std::size_t(n)];
    }
  });
  std::vector<double> g(std::size_t(L), 0.0);
  for (const auto& p : part)
    for (Index n = 0; n < L; ++n) g[std::size_t(n)] += p[std::size_t(n)];
  for (Index t = 0; t < L; ++t)
    for (Index s = 0; s <= t; ++s) out(t, s) = T(g[std::size_t(t - s)] / double(nc));
  return out;
}

/// Four entries (t + r, s), r < 4, of one term with all K lags in reach, over channels [c0, c1):
/// out[r] += sum_c (|.|) post[t+r][c] sum_l kt[n+r-l][c] y[l][s][c], n = t - s, the pre rows y[l][s]
/// and the K + 3 kernel rows each loaded once per pack for the four rows.
template <class T, int K>
void toeplitz_rows4(const T* const* kr, const T* const* yr, const T* const* pr, Index c0, Index c1, bool abs, T* out) {
  constexpr int W = simd::width<T>;
  using P = simd::pack<T, W>;
  P acc[4] = {P::broadcast(T(0)), P::broadcast(T(0)), P::broadcast(T(0)), P::broadcast(T(0))};
  for (Index c = c0; c < c1; c += W) {
    P y[K], k[K + 3];
    for (int l = 0; l < K; ++l) y[l] = P::load(yr[l] + c);
    for (int i = 0; i < K + 3; ++i) k[i] = P::load(kr[i] + c);  // kr[i]: kt row n - K + 1 + i
    for (int r = 0; r < 4; ++r) {
      P z = k[K - 1 + r] * y[0];
      for (int l = 1; l < K; ++l) z = fma(k[K - 1 + r - l], y[l], z);
      const P v = pr[r] ? P::load(pr[r] + c) * z : z;
      acc[r] = acc[r] + (abs ? max(v, P::broadcast(T(0)) - v) : v);
    }
  }
  for (int r = 0; r < 4; ++r) out[r] += reduce_add(acc[r]);
}

/// Diagonals varying over tokens: every entry a sum over the channels (see the header comment).
template <class T>
Matrix<T> toeplitz_mean_general(const mean_terms<T>& terms, const context& cx, detail::mean_request rq) {
  constexpr Index W = simd::width<T>, tile_rows = 16, chunk = 1024;
  using P = simd::pack<T, int(W)>;
  const Index L = cx.L, D = cx.D, nc = rq.c1 - rq.c0, ncp = (nc + W - 1) / W * W;
  // Per term, rows of ncp channel values (zero past nc): the kernel kt (ext rows), y[lag] (L rows:
  // (w/nc) pre[s + lag] tap(lag), zero past L) and post (L rows, or none).
  struct table {
    Index ext = 1, K = 1;
    std::vector<T> kt, y, post;
  };
  std::vector<table> tabs(terms.size());
  Index reach = 1;  // entries with t - s >= reach are zero
  for (std::size_t k = 0; k < terms.size(); ++k) {
    const mean_term<T>& t = terms[k];
    table& tb = tabs[k];
    const CausalConv<T>* conv = after_core(t);
    tb.ext = core_extent(t, L);
    tb.K = conv ? conv->width() : 1;
    reach = std::max(reach, std::min(L, tb.ext + tb.K - 1));
    tb.kt.assign(std::size_t(tb.ext * ncp), T(0));
    tb.y.assign(std::size_t(tb.K * L * ncp), T(0));
    if (!t.post.empty()) tb.post.assign(std::size_t(L * ncp), T(0));
    const Index nth = std::max<Index>(1, max_threads());
    std::vector<std::vector<double>> kern(std::size_t(nth), std::vector<double>(std::size_t(tb.ext)));
    std::vector<std::vector<std::complex<double>>> pw(static_cast<std::size_t>(nth));
    parallel_for(nc, [&](Index i) {  // the kernels, one channel at a time
      const std::size_t th = std::min<std::size_t>(std::size_t(thread_index()), kern.size() - 1);
      const Index c = rq.c0 + i;
      core_kernel(t, c, 1.0, L, kern[th].data(), pw[th]);
      for (Index n = 0; n < tb.ext; ++n) tb.kt[std::size_t(n * ncp + i)] = T(kern[th][std::size_t(n)]);
    });
    parallel_for(L, [&](Index u) {  // post and y, one token at a time
      std::vector<T> fac, fac2;
      const T* po = t.post.row(u, D, rq.c0, nc, fac);
      if (po) std::copy(po, po + nc, tb.post.begin() + u * ncp);
      const T* pr = t.pre.row(u, D, rq.c0, nc, fac2);
      for (Index lag = 0; lag < tb.K && u - lag >= 0; ++lag) {  // y[lag][u - lag] reads pre[u]
        T* dst = tb.y.data() + ((lag * L) + (u - lag)) * ncp;
        for (Index i = 0; i < nc; ++i)
          dst[i] = T(t.weight / double(nc)) * (pr ? pr[i] : T(1)) * (conv ? conv->tap(lag, rq.c0 + i) : T(1));
      }
    });
  }
  // The term that alone reaches the lags from quiet on (the others' last lag is below it).
  Index single = -1, quiet = 0;
  for (std::size_t k = 0; k < tabs.size(); ++k) {
    const Index rk = std::min(L, tabs[k].ext + tabs[k].K - 1);
    if (single < 0 || rk > std::min(L, tabs[std::size_t(single)].ext + tabs[std::size_t(single)].K - 1)) single = Index(k);
  }
  for (std::size_t k = 0; k < tabs.size(); ++k)
    if (Index(k) != single) quiet = std::max(quiet, std::min(L, tabs[k].ext + tabs[k].K - 1));
  Matrix<T> out = Matrix<T>::Zero(L, L);
  const Index tiles = (L + tile_rows - 1) / tile_rows;
  // One term's rows for entry (t, s): pairs of kernel and y rows (one per lag that reaches), post.
  struct rows {
    const T* k[max_mean_conv];
    const T* y[max_mean_conv];
    const T* post;
    int n;
  };
  parallel_for(tiles, [&](Index it) {
    const Index t0 = it * tile_rows, t1 = std::min(L, t0 + tile_rows);
    std::vector<rows> act(tabs.size());
    std::vector<T> vbuf(static_cast<std::size_t>(chunk));
    for (Index s0 = std::max<Index>(0, t0 - reach + 1) / tile_rows * tile_rows; s0 < t1; s0 += tile_rows) {
      const Index s1 = std::min(t1, s0 + tile_rows);
      for (Index c0 = 0; c0 < ncp; c0 += chunk) {
        const Index c1 = std::min(ncp, c0 + chunk);
        // Four rows at a time where one term alone reaches them with all its lags (the Hyena's long
        // filter away from the diagonal), entry by entry elsewhere.
        for (Index s = s0; s < s1; ++s)
          for (Index t = std::max(t0, s); t < t1;) {
            const Index n = t - s;
            if (n >= reach) break;
            if (single >= 0 && t + 3 < t1) {
              const table& tb = tabs[std::size_t(single)];
              if (n >= quiet && n >= tb.K - 1 && n + 3 < tb.ext && tb.K <= 4) {
                const T* kr[4 + 3];
                const T* yr[4];
                const T* pr[4];
                for (Index i = 0; i < tb.K + 3; ++i) kr[i] = tb.kt.data() + (n - tb.K + 1 + i) * ncp;
                for (Index l = 0; l < tb.K; ++l) yr[l] = tb.y.data() + (l * L + s) * ncp;
                for (Index r = 0; r < 4; ++r) pr[r] = tb.post.empty() ? nullptr : tb.post.data() + (t + r) * ncp;
                T sums[4] = {T(0), T(0), T(0), T(0)};
                switch (tb.K) {
                  case 1: toeplitz_rows4<T, 1>(kr, yr, pr, c0, c1, rq.abs, sums); break;
                  case 2: toeplitz_rows4<T, 2>(kr, yr, pr, c0, c1, rq.abs, sums); break;
                  case 3: toeplitz_rows4<T, 3>(kr, yr, pr, c0, c1, rq.abs, sums); break;
                  default: toeplitz_rows4<T, 4>(kr, yr, pr, c0, c1, rq.abs, sums); break;
                }
                for (Index r = 0; r < 4; ++r) out(t + r, s) += sums[r];
                t += 4;
                continue;
              }
            }
            std::size_t na = 0;  // the terms that reach lag n
            for (const table& tb : tabs) {
              rows& r = act[na];
              r.n = 0;
              for (Index lag = std::max<Index>(0, n - tb.ext + 1); lag < tb.K && lag <= n; ++lag, ++r.n) {
                r.k[r.n] = tb.kt.data() + (n - lag) * ncp;
                r.y[r.n] = tb.y.data() + (lag * L + s) * ncp;
              }
              r.post = tb.post.empty() ? nullptr : tb.post.data() + t * ncp;
              if (r.n > 0) ++na;
            }
            if (na == 0) {
              ++t;
              continue;
            }
            // one term's channel values into v (registers with one term, else vbuf)
            auto term = [&](const rows& r, Index c) {
              P z = fma(P::load(r.k[0] + c), P::load(r.y[0] + c), P::broadcast(T(0)));
              for (int l = 1; l < r.n; ++l) z = fma(P::load(r.k[l] + c), P::load(r.y[l] + c), z);
              return r.post ? P::load(r.post + c) * z : z;
            };
            P acc = P::broadcast(T(0));
            if (na == 1) {
              for (Index c = c0; c < c1; c += W) {
                const P v = term(act[0], c);
                acc = acc + (rq.abs ? max(v, P::broadcast(T(0)) - v) : v);
              }
            } else {
              for (Index c = c0; c < c1; c += W) term(act[0], c).store(vbuf.data() + (c - c0));
              for (std::size_t k = 1; k < na; ++k)
                for (Index c = c0; c < c1; c += W) (P::load(vbuf.data() + (c - c0)) + term(act[k], c)).store(vbuf.data() + (c - c0));
              for (Index c = c0; c < c1; c += W) {
                const P v = P::load(vbuf.data() + (c - c0));
                acc = acc + (rq.abs ? max(v, P::broadcast(T(0)) - v) : v);
              }
            }
            out(t, s) += reduce_add(acc);
            ++t;
          }
      }
    }
  });
  return out;
}

/// The mean over channels [rq.c0, rq.c1) of H^c or |H^c| (rq.abs) for terms toeplitz_mean_takes
/// accepts (with fixed_only = fixed): lower triangular, Toeplitz when fixed.
template <class T>
Matrix<T> toeplitz_mean(const mean_terms<T>& terms, const context& cx, detail::mean_request rq, bool fixed) {
  if (cx.L == 0 || rq.c1 <= rq.c0) return Matrix<T>::Zero(cx.L, cx.L);
  return fixed ? toeplitz_mean_fixed<T>(terms, cx, rq) : toeplitz_mean_general<T>(terms, cx, rq);
}

}  // namespace iattn::cpu_detail
