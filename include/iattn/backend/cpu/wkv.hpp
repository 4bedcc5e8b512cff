// iattn/backend/cpu/wkv.hpp: CPU evaluator of Wkv (ops/wkv.hpp), everything in the log domain.
//   apply:   the running-max recurrence, vectorised across channels in double: state (num, den)
//            scaled by e^-m, y_t from the state before token t and the bonus term.
//   apply_t: vectorised likewise: a forward pass for the row log-normalisers ell_t, then backwards
//            G_s = e^{-ell_{s+1}} x_{s+1} + e^{w_{s+1}} G_{s+1} kept as (g, M) with G = g e^M,
//            y_s = e^{u + k_s - ell_s} x_s + e^{k_s + M_s} g_s  (k_s + M_s <= 0).
//   tiles:   ell per channel (in double), then exp(score - ell) with the decay sums taken from long-double
//            prefix sums (exact differences for any L in practice), or w (t-1-s) when w is constant.
#pragma once

#include "../../ops/wkv.hpp"
#include "simd.hpp"
#include "tile.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

namespace iattn::cpu_detail {

namespace wkv_detail {
// The log-domain quantities (running maxima, log-normalisers) are carried in double whatever T is:
// a float running maximum near 80 drifts by an ulp (8e-6) per step, and the drift changes the weight
// of the current token against the history. The exponentials of their (non-positive) differences
// are then taken in T.
inline constexpr double ninf = -std::numeric_limits<double>::infinity();
inline double logaddexp(double a, double b) {
  const double m = std::max(a, b);
  if (m == ninf) return m;
  return m + std::log1p(std::exp(std::min(a, b) - m));
}
/// ell_t = log sum_{s<=t} exp(score[t, s]) for channel c, t in [0, L).
template <class T>
void row_log_norms(const Wkv<T>& n, Index L, Index c, double* ell) {
  const double u = n.u()(0, c);
  double A = ninf;  // log sum_{s<=t-1} exp(sum_{r=s+1..t-1} w_r + k_s)
  for (Index t = 0; t < L; ++t) {
    const double k = n.k()(t, c);
    ell[t] = logaddexp(A, u + k);
    A = logaddexp(A + double(n.decay(t, c)), k);
  }
}
/// For a pair of log-weights: mx = max(a, b) and ea = e^{a - mx}, eb = e^{b - mx}, with one exp
/// (the larger of the two is exactly 1). -inf against a finite value gives 0.
template <class P>
void pair_exp(P a, P b, P& ea, P& eb, P& mx) {
  mx = max(a, b);
  const P e = exp(min(a, b) - mx), one = P::broadcast(1.0);
  ea = select_ge(a, b, one, e);
  eb = select_ge(a, b, e, one);
}
/// ell[t * ld + j] = ell_t of channel c0 + j for t < L, j < nc: the forward pass of apply_t,
/// vectorised across the channels in double packs (one exp and one log per token and channel).
template <class T>
void log_norms_group(const Wkv<T>& n, Index L, Index c0, Index nc, double* ell, Index ld) {
  const auto sz = static_cast<std::size_t>(nc);
  std::vector<double> den(sz, 0.0), m(sz, ninf), u(sz), kb(sz), wb(sz);
  for (Index j = 0; j < nc; ++j) u[std::size_t(j)] = n.u()(0, c0 + j);
  auto load_row = [&](const coefficient<T>& src, Index t, std::vector<double>& dst) {
    for (Index j = 0; j < nc; ++j) dst[std::size_t(j)] = src(src.rows() == 1 ? 0 : t, c0 + j);
  };
  for (Index t = 0; t < L; ++t) {
    load_row(n.k(), t, kb);
    if (t + 1 < L) load_row(n.w(), t, wb);  // the last token's state is never used
    double* el = ell + t * ld;
    simd::for_packs<double>(nc, [&](auto w, Index j) {
      using P = simd::pack<double, decltype(w)::value>;
      const P k = P::load(kb.data() + j), mv = P::load(m.data() + j), uk = P::load(u.data() + j) + k, de = P::load(den.data() + j);
      P e1, e2, mo;
      pair_exp(mv, uk, e1, e2, mo);
      (mo + log(fma(e1, de, e2))).store(el + j);
      if (t + 1 < L) {
        P f1, f2, ms;
        pair_exp(mv + P::load(wb.data() + j), k, f1, f2, ms);
        fma(f1, de, f2).store(den.data() + j);
        ms.store(m.data() + j);
      }
    });
  }
}
}  // namespace wkv_detail

template <class T>
struct slab_eval<Wkv<T>> {
  // Vectorised across channels in double packs: per token, mo = max(m, u + k),
  // y = (e^{m-mo} num + e^{u+k-mo} x) / (e^{m-mo} den + e^{u+k-mo}), then the state moves to
  // ms = max(m + w, k): num = e^{m+w-ms} num + e^{k-ms} x, den likewise. m = -inf (no history)
  // gives e^{-inf} = 0 through the packs' clamped exp. One exp per pair (pair_exp).
  static void apply(const Wkv<T>& n, const context& cx, Index c0, Index nc, const T* x, T* y) {
    const auto sz = static_cast<std::size_t>(nc);
    std::vector<double> num(sz, 0.0), den(sz, 0.0), m(sz, wkv_detail::ninf), u(sz), kb(sz), wb(sz), xb(sz), yb(sz);
    for (Index j = 0; j < nc; ++j) u[std::size_t(j)] = n.u()(0, c0 + j);
    for (Index t = 0; t < cx.L; ++t) {
      for (Index j = 0; j < nc; ++j) {
        kb[std::size_t(j)] = n.k()(t, c0 + j);
        wb[std::size_t(j)] = n.decay(t, c0 + j);
        xb[std::size_t(j)] = x[t * nc + j];
      }
      simd::for_packs<double>(nc, [&](auto w, Index j) {
        using P = simd::pack<double, decltype(w)::value>;
        const P k = P::load(kb.data() + j), mv = P::load(m.data() + j), uk = P::load(u.data() + j) + k;
        const P xv = P::load(xb.data() + j), nu = P::load(num.data() + j), de = P::load(den.data() + j);
        P e1, e2, mo, f1, f2, ms;
        wkv_detail::pair_exp(mv, uk, e1, e2, mo);
        (fma(e1, nu, e2 * xv) / fma(e1, de, e2)).store(yb.data() + j);
        wkv_detail::pair_exp(mv + P::load(wb.data() + j), k, f1, f2, ms);
        fma(f1, nu, f2 * xv).store(num.data() + j);
        fma(f1, de, f2).store(den.data() + j);
        ms.store(m.data() + j);
      });
      for (Index j = 0; j < nc; ++j) y[t * nc + j] = T(yb[std::size_t(j)]);
    }
  }
  // Vectorised across channels in double packs, like apply. A forward pass keeps (den, m) as apply
  // does and records ell_t = mo + log(e^{m-mo} den + e^{u+k-mo}) for every token of the slab; the
  // backward pass then runs G_s = e^{-ell_{s+1}} x_{s+1} + e^{w_{s+1}} G_{s+1} as (g, M) with
  // G = g e^M, M the running maximum of the log-weights, and
  //   y_s = e^{u + k_s - ell_s} x_s + e^{k_s + M_s} g_s.
  // Every exponent is a difference from a maximum (<= 0); of each pair one is exactly 0, so each
  // pair costs one exp (pair_exp).
  // The stored ell is L doubles per channel: channels are taken in groups small enough to keep it
  // within ell_budget bytes (the whole 128-channel slab up to L = 32768, 4 channels at L = 10^6).
  static void apply_t(const Wkv<T>& n, const context& cx, Index c0, Index nc, const T* x, T* y) {
#ifdef IATTN_WKV_ELL_BUDGET  // tests shrink it to exercise the groups
    constexpr Index W = simd::width<double>, ell_budget = IATTN_WKV_ELL_BUDGET;
#else
    constexpr Index W = simd::width<double>, ell_budget = Index(32) << 20;
#endif
    const Index fit = ell_budget / (std::max<Index>(cx.L, 1) * Index(sizeof(double)));
    const Index group = std::min(nc, std::max(W, fit / W * W));
    for (Index j0 = 0; j0 < nc; j0 += group)
      apply_t_group(n, cx, c0 + j0, std::min(group, nc - j0), x + j0, y + j0, nc);
  }

 private:
  // apply_t on channels [c0, c0 + nc) whose x and y rows are ld entries apart.
  static void apply_t_group(const Wkv<T>& n, const context& cx, Index c0, Index nc, const T* x, T* y, Index ld) {
    const Index L = cx.L;
    const auto sz = static_cast<std::size_t>(nc);
    std::vector<double> ell(static_cast<std::size_t>(L) * sz), u(sz), kb(sz), wb(sz);
    std::vector<double> g(sz, 0.0), M(sz, wkv_detail::ninf), xb(sz), xn(sz), yb(sz);
    for (Index j = 0; j < nc; ++j) u[std::size_t(j)] = n.u()(0, c0 + j);
    auto load_row = [&](const coefficient<T>& src, Index t, std::vector<double>& dst) {
      for (Index j = 0; j < nc; ++j) dst[std::size_t(j)] = src(src.rows() == 1 ? 0 : t, c0 + j);
    };
    wkv_detail::log_norms_group(n, L, c0, nc, ell.data(), nc);
    for (Index s = L - 1; s >= 0; --s) {
      load_row(n.k(), s, kb);
      const bool carry = s + 1 < L;  // G_s from G_{s+1}
      if (carry) load_row(n.w(), s + 1, wb);
      std::swap(xb, xn);  // xn: x_{s+1}, read by the previous step
      for (Index j = 0; j < nc; ++j) xb[std::size_t(j)] = double(x[s * ld + j]);
      const double* el = ell.data() + std::size_t(s) * sz;
      simd::for_packs<double>(nc, [&](auto w, Index j) {
        using P = simd::pack<double, decltype(w)::value>;
        P gv = P::load(g.data() + j), Mv = P::load(M.data() + j);
        if (carry) {
          P ea, eb, Mn;
          wkv_detail::pair_exp(P::broadcast(0.0) - P::load(el + sz + j), Mv + P::load(wb.data() + j), ea, eb, Mn);
          gv = fma(P::load(xn.data() + j), ea, gv * eb);
          Mv = Mn;
          gv.store(g.data() + j);
          Mv.store(M.data() + j);
        }
        const P k = P::load(kb.data() + j);
        fma(exp(P::load(u.data() + j) + k - P::load(el + j)), P::load(xb.data() + j), exp(k + Mv) * gv).store(yb.data() + j);
      });
      for (Index j = 0; j < nc; ++j) y[s * ld + j] = T(yb[std::size_t(j)]);
    }
  }

};

template <class T>
struct channel_eval<Wkv<T>, T> {
  const Wkv<T>* n;
  Index c, L;
  std::vector<double> ell;
  std::vector<long double> prefix;  // prefix[i] = sum of the finite w_r, r < i, when w varies over tokens
  std::vector<Index> resets;        // resets[i] = how many w_r = -inf, r < i
  channel_eval(const Wkv<T>& node, const context& cx, Index ch) : n(&node), c(ch), L(cx.L), ell(std::size_t(std::max<Index>(cx.L, 1))) {
    wkv_detail::row_log_norms(node, L, c, ell.data());
    if (!node.constant_decay()) {
      prefix.assign(std::size_t(L + 1), 0.0L);
      resets.assign(std::size_t(L + 1), 0);
      for (Index r = 0; r < L; ++r) {
        const T w = node.decay(r, c);
        const bool reset = w == -std::numeric_limits<T>::infinity();
        prefix[std::size_t(r + 1)] = prefix[std::size_t(r)] + (reset ? 0.0L : static_cast<long double>(w));
        resets[std::size_t(r + 1)] = resets[std::size_t(r)] + (reset ? 1 : 0);
      }
    }
  }
  /// sum_{r=s+1..t-1} w_r for s < t (-inf when a reset lies in between).
  double decay_sum(Index t, Index s) const {
    if (n->constant_decay()) return t - 1 == s ? 0.0 : double(n->decay(0, c)) * double(t - 1 - s);
    if (resets[std::size_t(t)] != resets[std::size_t(s + 1)]) return wkv_detail::ninf;
    return double(prefix[std::size_t(t)] - prefix[std::size_t(s + 1)]);
  }
  void block(Index i0, Index i1, Index j0, Index j1, tile<T> out) const {
    const double u = n->u()(0, c);
    for (Index t = i0; t < i1; ++t)
      for (Index s = j0; s < j1; ++s) {
        T v = 0;
        if (s == t) v = T(std::exp(u + double(n->k()(t, c)) - ell[std::size_t(t)]));
        else if (s < t) v = T(std::exp(decay_sum(t, s) + double(n->k()(s, c)) - ell[std::size_t(t)]));
        out(t - i0, s - j0) = v;
      }
  }
};

}  // namespace iattn::cpu_detail
