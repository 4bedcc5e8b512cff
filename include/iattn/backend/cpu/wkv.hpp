// iattn/backend/cpu/wkv.hpp: CPU evaluator of Wkv (ops/wkv.hpp), everything in the log domain.
//   apply:   the running-max recurrence, vectorised across channels in double: state (num, den)
//            scaled by e^-m, y_t from the state before token t and the bonus term.
//   apply_t: a forward pass for the row log-normalisers ell_t, then backwards
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
template <class T>
T exp_of(double v) { return T(std::exp(v)); }
}  // namespace wkv_detail

template <class T>
struct slab_eval<Wkv<T>> {
  // Vectorised across channels in double packs: per token, mo = max(m, u + k),
  // y = (e^{m-mo} num + e^{u+k-mo} x) / (e^{m-mo} den + e^{u+k-mo}), then the state moves to
  // ms = max(m + w, k): num = e^{m+w-ms} num + e^{k-ms} x, den likewise. m = -inf (no history)
  // gives e^{-inf} = 0 through the packs' clamped exp.
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
        const P mo = max(mv, uk);
        const P e1 = exp(mv - mo), e2 = exp(uk - mo);
        (fma(e1, nu, e2 * xv) / fma(e1, de, e2)).store(yb.data() + j);
        const P md = mv + P::load(wb.data() + j), ms = max(md, k);
        const P f1 = exp(md - ms), f2 = exp(k - ms);
        fma(f1, nu, f2 * xv).store(num.data() + j);
        fma(f1, de, f2).store(den.data() + j);
        ms.store(m.data() + j);
      });
      for (Index j = 0; j < nc; ++j) y[t * nc + j] = T(yb[std::size_t(j)]);
    }
  }
  static void apply_t(const Wkv<T>& n, const context& cx, Index c0, Index nc, const T* x, T* y) {
    using wkv_detail::exp_of;
    using wkv_detail::ninf;
    std::vector<double> ell(static_cast<std::size_t>(std::max<Index>(cx.L, 1)));
    for (Index j = 0; j < nc; ++j) {
      const Index c = c0 + j;
      wkv_detail::row_log_norms(n, cx.L, c, ell.data());
      const double u = n.u()(0, c);
      T g = 0;  // G_s = g e^M
      double M = ninf;
      for (Index s = cx.L - 1; s >= 0; --s) {
        if (s + 1 < cx.L) {  // G_s from G_{s+1}
          const double a = -ell[std::size_t(s + 1)], b = M + double(n.decay(s + 1, c)), Mn = std::max(a, b);
          g = x[(s + 1) * nc + j] * exp_of<T>(a - Mn) + (b == ninf ? T(0) : g * exp_of<T>(b - Mn));
          M = Mn;
        }
        const double k = n.k()(s, c);
        const T tail = M == ninf ? T(0) : exp_of<T>(k + M) * g;
        y[s * nc + j] = exp_of<T>(u + k - ell[std::size_t(s)]) * x[s * nc + j] + tail;
      }
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
