// iattn/backend/cpu/semiseparable.hpp: CPU evaluator of Semiseparable.
//
// apply: the selective scan, per channel a state of N values, vectorised across the state with
// packs (one loop body at the SIMD width and at width 1 for the tail). The decay exp(lambda) is
// computed once per token and head and shared by the head's P channels.
//   inclusive, forward:   h = exp(lambda_t) h + B_t x_t;        y_t = C_t . h
//   strict, forward:      y_t = C_t . (h + bonus * B_t x_t);    h = exp(lambda_t) h + B_t x_t
// The transposed apply runs backwards with B and C exchanged; its decay is lambda_{s+1} (inclusive)
// or lambda_s (strict, read before update), which is exactly H^T.
// Tiles: the shared stable block engine (decay_tiles.hpp), rank-N GEMMs off the diagonal.
#pragma once

#include "../../ops/semiseparable.hpp"
#include "decay_tiles.hpp"
#include "simd.hpp"
#include "tile.hpp"

#include <algorithm>
#include <vector>

namespace iattn::cpu_detail {

template <class T>
struct slab_eval<Semiseparable<T>> {
  static void apply(const Semiseparable<T>& n, const context& cx, Index c0, Index nc, const T* x, T* y) {
    run<false>(n, cx, c0, nc, x, y);
  }
  static void apply_t(const Semiseparable<T>& n, const context& cx, Index c0, Index nc, const T* x, T* y) {
    run<true>(n, cx, c0, nc, x, y);
  }

 private:
  template <bool Transposed>
  static void run(const Semiseparable<T>& n, const context& cx, Index c0, Index nc, const T* x, T* y) {
    const Index L = cx.L, N = n.state(), P = n.head_dim();
    const bool per_state = n.per_state(), strict = n.strict();
    const Index Nd = per_state ? N : 1;
    const auto& lam = n.lambda();
    const auto& Bc = n.B();
    const auto& Cc = n.C();
    // The slab's heads, with their group offsets and channel ranges, fixed before the token loop.
    struct head_span {
      Index g_off, dec_off, c_begin, c_end;
      const T* bonus;
    };
    const Index h_begin = c0 / P, h_end = (c0 + nc - 1) / P + 1, nh = h_end - h_begin;
    std::vector<head_span> spans;
    for (Index h = h_begin; h < h_end; ++h)
      spans.push_back({n.group_of_head(h) * N, (h - h_begin) * Nd, std::max(c0, h * P) - c0,
                       std::min(c0 + nc, (h + 1) * P) - c0, strict && n.has_bonus() ? n.bonus().row(h) : nullptr});
    std::vector<T> state(static_cast<std::size_t>(nc * N), T(0)), dec(static_cast<std::size_t>(nh * Nd));
    for (Index i = 0; i < L; ++i) {
      const Index t = Transposed ? L - 1 - i : i;
      const Index k = (Transposed && !strict) ? t + 1 : t;  // token whose decay this step applies
      if (k < L) {  // the decays of all the slab's heads: one contiguous run of lambda's row
        const T* l = lam.row(k) + h_begin * Nd;
        simd::for_packs<T>(nh * Nd, [&](auto w, Index m) {
          using Pk = simd::pack<T, decltype(w)::value>;
          exp(Pk::load(l + m)).store(dec.data() + m);
        });
      } else {
        std::fill(dec.begin(), dec.end(), T(0));  // the state is still zero here
      }
      const T* Brow = Bc.row(t);
      const T* Crow = Cc.row(t);
      const T* xt = x + t * nc;
      T* yt = y + t * nc;
      for (const head_span& hs : spans) {
        const T* in = (Transposed ? Crow : Brow) + hs.g_off;
        const T* out = (Transposed ? Brow : Crow) + hs.g_off;
        const T* d = dec.data() + hs.dec_off;
        for (Index j = hs.c_begin; j < hs.c_end; ++j) {
          T* h = state.data() + j * N;
          if (per_state)
            yt[j] = strict ? step_strict<true>(N, d, in, out, hs.bonus, xt[j], h) : step<true>(N, d, in, out, xt[j], h);
          else
            yt[j] = strict ? step_strict<false>(N, d, in, out, hs.bonus, xt[j], h) : step<false>(N, d, in, out, xt[j], h);
        }
      }
    }
  }

  template <class Pk, bool PerState>
  static Pk decay(const T* dec, Index m) {
    if constexpr (PerState) return Pk::load(dec + m);
    else return Pk::broadcast(dec[0]);
  }

  // h = dec h + in x; return out . h
  template <bool PerState>
  static T step(Index N, const T* dec, const T* in, const T* out, T xv, T* h) {
    return simd::sum_packs<T>(N, [&](auto w, Index m) {
      using Pk = simd::pack<T, decltype(w)::value>;
      const Pk hv = fma(decay<Pk, PerState>(dec, m), Pk::load(h + m), Pk::load(in + m) * Pk::broadcast(xv));
      hv.store(h + m);
      return Pk::load(out + m) * hv;
    });
  }
  // return out . (h + u in x); h = dec h + in x
  template <bool PerState>
  static T step_strict(Index N, const T* dec, const T* in, const T* out, const T* u, T xv, T* h) {
    return simd::sum_packs<T>(N, [&](auto w, Index m) {
      using Pk = simd::pack<T, decltype(w)::value>;
      const Pk ix = Pk::load(in + m) * Pk::broadcast(xv);
      const Pk hv = Pk::load(h + m);
      const Pk read = u ? fma(Pk::load(u + m), ix, hv) : hv;
      fma(decay<Pk, PerState>(dec, m), hv, ix).store(h + m);
      return Pk::load(out + m) * read;
    });
  }
};

template <class T>
struct channel_eval<Semiseparable<T>, T> {
  decay_tiles<T, log_decay> tiles;
  channel_eval(const Semiseparable<T>& n, const context& cx, Index c) : tiles(make(n, cx, c)) {}
  void block(Index i0, Index i1, Index j0, Index j1, tile<T> out) const { tiles.block(i0, i1, j0, j1, out); }

 private:
  static decay_tiles<T, log_decay> make(const Semiseparable<T>& n, const context& cx, Index c) {
    const Index h = n.head_of(c), g = n.group_of_head(h), N = n.state();
    const Index Nd = n.per_state() ? N : 1;
    return decay_tiles<T, log_decay>(cx.L, N, Nd, n.strict(), {n.lambda().data() + h * Nd, n.lambda().cols()},
                                     {n.B().data() + g * N, n.B().cols()}, {n.C().data() + g * N, n.C().cols()},
                                     n.has_bonus() ? n.bonus().row(h) : nullptr);
  }
};

}  // namespace iattn::cpu_detail
