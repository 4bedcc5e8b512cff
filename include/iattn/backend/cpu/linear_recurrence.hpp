// iattn/backend/cpu/linear_recurrence.hpp: CPU evaluator of LinearRecurrence. apply is the scan
// h_t = a_t h_{t-1} + b_t x_t vectorised across channels (memory-bound); the transposed apply runs
// g_s = x_s + a_{s+1} g_{s+1}, y_s = b_s g_s backwards; tiles come from the shared decay engine.
#pragma once

#include "../../ops/linear_recurrence.hpp"
#include "decay_tiles.hpp"
#include "simd.hpp"
#include "tile.hpp"

#include <vector>

namespace iattn::cpu_detail {

template <class T>
struct slab_eval<LinearRecurrence<T>> {
  static void apply(const LinearRecurrence<T>& n, const context& cx, Index c0, Index nc, const T* x, T* y) {
    apply_scaled(n, cx, c0, nc, x, y, row_ops<T>{});
  }
  /// y = post * (R (pre * x)), the diagonal factors applied per token inside the scan.
  static void apply_scaled(const LinearRecurrence<T>& n, const context& cx, Index c0, Index nc, const T* x, T* y,
                           const row_ops<T>& sc) {
    if (sc.row_t >= 0) return row_scaled(n, cx, c0, nc, sc.row_t, y, sc);
    std::vector<T> h(static_cast<std::size_t>(nc), T(0)), xbuf(static_cast<std::size_t>(nc));
    for (Index t = 0; t < cx.L; ++t) {
      const T* a = n.a().row(t) + c0;
      const T* b = n.b().row(t) + c0;
      prefetch_scales(&sc, cx.L, t + prefetch_ahead, c0, nc, x);
      if (t + prefetch_ahead < cx.L) {
        prefetch_row(n.a().data(), n.a().cols(), t + prefetch_ahead, c0, nc);
        prefetch_row(n.b().data(), n.b().cols(), t + prefetch_ahead, c0, nc);
      }
      const T* xt = input_row(&sc, t, c0, nc, x, xbuf.data());
      T* yt = output_row(&sc, t, nc, y);
      simd::for_packs<T>(nc, [&](auto w, Index j) {
        using P = simd::pack<T, decltype(w)::value>;
        const P hv = fma(P::load(a + j), P::load(h.data() + j), P::load(b + j) * P::load(xt + j));
        hv.store(h.data() + j);
        hv.store(yt + j);
      });
      finish_row(&sc, t, c0, nc, yt);
    }
  }
  /// Row t of the chain post * R * (pre * shaping) on the slab's channels, as rows of the (D, L)
  /// result (channel j's L entries at y + j L; entries after t are 0): the transposed chain in one
  /// backward pass from token t, without slab scratch. g_s = [s = t] post_t + a_{s+1} g_{s+1} is
  /// R^T's recurrence (apply_t) on the one-hot input, v_s = pre_s b_s g_s, and the shaping's
  /// transpose z_s = sum_k sum_lag w_k[lag] scale_k[s+lag] v_{s+lag} reads the last K rows of v
  /// (a ring). z is gathered in blocks of 16 tokens, so each channel's row is written 64 bytes at
  /// a time.
  static void row_scaled(const LinearRecurrence<T>& n, const context& cx, Index c0, Index nc, Index t, T* y,
                         const row_ops<T>& sc) {
    const Index L = cx.L;
    for (Index j = 0; j < nc; ++j) std::fill(y + j * L + t + 1, y + (j + 1) * L, T(0));
    Index K = sc.conv ? sc.conv->width() : 1;
    for (const conv_term<T>& term : sc.conv_sum) K = std::max(K, term.hi);
    constexpr Index tb = 16;
    const std::size_t w = static_cast<std::size_t>(nc);
    std::vector<T> g(w, T(1)), ring(static_cast<std::size_t>(K) * w), z(static_cast<std::size_t>(tb) * w);
    scale_row(sc.post, t, c0, nc, g.data(), g.data());
    for (Index s = t; s >= 0; --s) {
      if (s >= prefetch_ahead) {
        prefetch_scales(&sc, L, s - prefetch_ahead, c0, nc);
        prefetch_row(n.a().data(), n.a().cols(), s + 1 - prefetch_ahead, c0, nc);
        prefetch_row(n.b().data(), n.b().cols(), s - prefetch_ahead, c0, nc);
      }
      const T* a = s < t ? n.a().row(s + 1) + c0 : nullptr;
      const T* b = n.b().row(s) + c0;
      T* v = ring.data() + static_cast<std::size_t>(s % K) * w;
      simd::for_packs<T>(nc, [&](auto width, Index j) {
        using P = simd::pack<T, decltype(width)::value>;
        P gv = P::load(g.data() + j);
        if (a) (gv = P::load(a + j) * gv).store(g.data() + j);
        (P::load(b + j) * gv).store(v + j);
      });
      scale_row(sc.pre, s, c0, nc, v, v);
      T* zs = z.data() + static_cast<std::size_t>(s % tb) * w;
      const Index reach = t - s;  // v_{s+lag} is 0 for s + lag > t
      auto vrow = [&](Index lag) { return ring.data() + static_cast<std::size_t>((s + lag) % K) * w; };
      if (sc.conv) {
        const CausalConv<T>& conv = *sc.conv;
        const Index lags = std::min(conv.width() - 1, reach), wld = conv.w().cols();
        const T* wt = conv.w().data() + c0;
        simd::for_packs<T>(nc, [&](auto width, Index j) {
          using P = simd::pack<T, decltype(width)::value>;
          P acc = P::load(wt + (conv.width() - 1) * wld + j) * P::load(v + j);
          for (Index lag = 1; lag <= lags; ++lag) acc = fma(P::load(wt + (conv.width() - 1 - lag) * wld + j), P::load(vrow(lag) + j), acc);
          acc.store(zs + j);
        });
      } else if (!sc.conv_sum.empty()) {
        std::fill(zs, zs + nc, T(0));
        for (const conv_term<T>& term : sc.conv_sum) {
          const Index Kt = term.conv->width(), wld = term.conv->w().cols(), hi = std::min(term.hi - 1, reach);
          const T* wt = term.conv->w().data() + c0;
          for (Index lag = term.lo; lag <= hi; ++lag) {
            const T* sr = term.scale.row(s + lag) + c0;
            const T* vl = vrow(lag);
            simd::for_packs<T>(nc, [&](auto width, Index j) {
              using P = simd::pack<T, decltype(width)::value>;
              fma(P::load(wt + (Kt - 1 - lag) * wld + j) * P::load(sr + j), P::load(vl + j), P::load(zs + j)).store(zs + j);
            });
          }
        }
      } else {
        std::copy(v, v + nc, zs);
      }
      if (s % tb == 0) {  // tokens [s, min(t, s + tb - 1)] of every channel, contiguous per channel
        const Index e = std::min(t, s + tb - 1);
        for (Index j = 0; j < nc; ++j)
          for (Index u = s; u <= e; ++u) y[j * L + u] = z[static_cast<std::size_t>(u - s) * w + static_cast<std::size_t>(j)];
      }
    }
  }
  static void apply_t(const LinearRecurrence<T>& n, const context& cx, Index c0, Index nc, const T* x, T* y) {
    std::vector<T> g(static_cast<std::size_t>(nc), T(0));
    for (Index s = cx.L - 1; s >= 0; --s) {
      const T* b = n.b().row(s) + c0;
      const T* a = s + 1 < cx.L ? n.a().row(s + 1) + c0 : nullptr;
      simd::for_packs<T>(nc, [&](auto w, Index j) {
        using P = simd::pack<T, decltype(w)::value>;
        const P gv = a ? fma(P::load(a + j), P::load(g.data() + j), P::load(x + s * nc + j)) : P::load(x + s * nc + j);
        gv.store(g.data() + j);
        (P::load(b + j) * gv).store(y + s * nc + j);
      });
    }
  }
};

template <class T>
struct channel_eval<LinearRecurrence<T>, T> {
  decay_tiles<T, linear_decay> tiles;
  channel_eval(const LinearRecurrence<T>& n, const context& cx, Index c)
      : tiles(cx.L, 1, 1, false, {n.a().data() + c, n.a().cols()}, {n.b().data() + c, n.b().cols()}, {}, nullptr) {}
  void block(Index i0, Index i1, Index j0, Index j1, tile<T> out) const { tiles.block(i0, i1, j0, j1, out); }
};

}  // namespace iattn::cpu_detail
