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
