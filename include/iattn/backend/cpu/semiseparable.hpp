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
#include "gemm.hpp"
#include "simd.hpp"
#include "tile.hpp"

#include <algorithm>
#include <limits>
#include <memory>
#include <utility>
#include <vector>

namespace iattn::cpu_detail {

/// The SSD-style apply: chunk length, and the narrowest heads and states that take it. Below them
/// the scan wins: its per-token cost is 2 N P FMAs per head, about what the chunk's state GEMMs
/// (C h and B^T X) cost anyway, and the chunk adds C B^T, its decay mask and the GEMM within the
/// chunk. Measured on the 2-core Zen 3 VM at L = 1024, D = 1536 (docs/performance.md): chunked
/// 1.2-1.35x faster at P = 64 and N >= 64, even at P = 32, N = 128, slower at P <= 16 or N = 16.
inline constexpr Index ssd_chunk = 64;
inline constexpr Index ssd_min_head_dim = 64;
inline constexpr Index ssd_min_state = 64;

/// True when apply(S, x) takes the SSD-style chunked form: one decay per head, inclusive, heads of
/// at least ssd_min_head_dim channels and ssd_min_state states. The transposed apply (row) scans.
template <class T>
bool takes_chunked_apply(const Semiseparable<T>& n) {
  return !n.per_state() && !n.strict() && n.head_dim() >= ssd_min_head_dim && n.state() >= ssd_min_state;
}

template <class T>
struct slab_eval<Semiseparable<T>> {
  static void apply(const Semiseparable<T>& n, const context& cx, Index c0, Index nc, const T* x, T* y) {
    run(false, n, cx, c0, nc, x, y, nullptr);
  }
  /// y = post * (S (pre * x)), the diagonal factors applied per token inside the scan.
  static void apply_scaled(const Semiseparable<T>& n, const context& cx, Index c0, Index nc, const T* x, T* y,
                           const row_ops<T>& sc) {
    run(false, n, cx, c0, nc, x, y, &sc);
  }
  static void apply_t(const Semiseparable<T>& n, const context& cx, Index c0, Index nc, const T* x, T* y) {
    run(true, n, cx, c0, nc, x, y, nullptr);
  }

 private:
  // The direction is a runtime flag, not a template parameter: it decides a few indices per token,
  // never the per-state arithmetic, and one instantiation serves apply and apply_t (compile time,
  // docs/performance.md "Compile time").
  static void run(bool transposed, const Semiseparable<T>& n, const context& cx, Index c0, Index nc, const T* x, T* y,
                  const row_ops<T>* sc) {
    if (n.factored() && n.head_dim() == 1) return run_across_channels(transposed, n, cx, c0, nc, x, y, sc);
    if (!transposed && takes_chunked_apply(n)) return run_chunked(n, cx, c0, nc, x, y, sc);
    skip_inputs<T> inputs(sc, nc);
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
      const Index t = transposed ? L - 1 - i : i;
      const Index k = (transposed && !strict) ? t + 1 : t;  // token whose decay this step applies
      if (k < L) {  // the decays of all the slab's heads: one contiguous run of log-decays
        const T* l = lam.row(k) + h_begin * (n.factored() ? 1 : Nd);
        if (n.factored()) {  // dt[k, h] * A[h, m], formed in dec and exponentiated in place
          const T* A = n.decay_rate().row(h_begin);
          for (Index hh = 0; hh < nh; ++hh)
            for (Index m = 0; m < N; ++m) dec[std::size_t(hh * N + m)] = l[hh] * A[hh * N + m];
          l = dec.data();
        }
        exp_into(nh * Nd, l, dec.data());
      } else {
        std::fill(dec.begin(), dec.end(), T(0));  // the state is still zero here
      }
      const T* Brow = Bc.row(t);
      const T* Crow = Cc.row(t);
      const T* skip = nullptr;  // the row a sum's diagonal reads (row_ops::skip)
      const T* xt = inputs.rows(t, c0, nc, x, &skip);
      T* yt = output_row(sc, t, nc, y);
      for (const head_span& hs : spans) {
        const T* in = (transposed ? Crow : Brow) + hs.g_off;
        const T* out = (transposed ? Brow : Crow) + hs.g_off;
        const T* d = dec.data() + hs.dec_off;
        for (Index j = hs.c_begin; j < hs.c_end; ++j) {
          T* h = state.data() + j * N;
          if (per_state)
            yt[j] = strict ? step_strict<true>(N, d, in, out, hs.bonus, xt[j], h) : step<true>(N, d, in, out, xt[j], h);
          else
            yt[j] = strict ? step_strict<false>(N, d, in, out, hs.bonus, xt[j], h) : step<false>(N, d, in, out, xt[j], h);
        }
      }
      finish_row(sc, t, c0, nc, yt, skip);
    }
  }

  // SSD-style chunked apply (one decay per head, inclusive form), chunks of ssd_chunk tokens.
  // Within a chunk, with chunk-relative log-decay sums seg(i, j) = sum_{r=j+1..i} lambda_r and
  // pre(i) = sum_{r=0..i} lambda_r (running sums: never differences, so lambda = -inf is exact and
  // no exp argument is positive), and the state h (N, P) left by the earlier chunks:
  //   Y_h = (C B^T o exp(seg), lower) X_h + diag(exp(pre)) C h
  //   h   = exp(pre(last)) h + B^T diag(exp(seg(last, .))) X_h
  // The heads of one B/C group share C B^T, C h and B^T X' (X' = X with each head's rows scaled):
  // three GEMMs per chunk and group, and one (chunk, chunk) x (chunk, P) GEMM per head.
  static void run_chunked(const Semiseparable<T>& n, const context& cx, Index c0, Index nc, const T* x, T* y,
                          const row_ops<T>* sc) {
    const Index L = cx.L, N = n.state(), P = n.head_dim(), Tk = ssd_chunk, ld = n.B().cols();
    // Runs of channels [j0, j1) whose heads share a group.
    struct group_run { Index g, j0, j1; };
    std::vector<group_run> runs;
    for (Index h = c0 / P; h * P < c0 + nc; ++h) {
      const Index j0 = std::max(c0, h * P) - c0, j1 = std::min(c0 + nc, (h + 1) * P) - c0;
      if (!runs.empty() && runs.back().g == n.group_of_head(h)) runs.back().j1 = j1;
      else runs.push_back({n.group_of_head(h), j0, j1});
    }
    // Row-major buffers: the state h (N, nc); the chunk's input X, X' and C h (Tk, nc); C B^T and
    // its masked form (Tk, Tk); B^T (N, Tk). The products run on gemm.hpp's kernel.
    auto buffer = [](Index size) { return std::vector<T>(static_cast<std::size_t>(size), T(0)); };
    std::vector<T> state = buffer(N * nc), xin = buffer(Tk * nc), xs = buffer(Tk * nc), Z = buffer(Tk * nc),
                   CB = buffer(Tk * Tk), M = buffer(Tk * Tk), BgT = buffer(N * Tk), seg = buffer(Tk), ex = buffer(Tk),
                   ep = buffer(Tk);
    gemm_scratch<T> gs;
    T* const h = state.data();
    // A sum's diagonal (row_ops::skip) reads each token's row shaped without the diagonals between
    // the sum and the core: the chunk's such rows in sk, or where they are x's own or xin's rows,
    // there (skips).
    const skip_inputs<T> inputs(sc);
    std::vector<T> sk = buffer(inputs.split() ? Tk * nc : 0);
    std::vector<const T*> skips(static_cast<std::size_t>(Tk));
    for (Index t0 = 0; t0 < L; t0 += Tk) {
      const Index tc = std::min(Tk, L - t0);
      const bool carry = t0 > 0, pass_on = t0 + tc < L;  // a state comes in / goes out
      for (Index i = 0; i < tc; ++i) {
        T* row = xin.data() + i * nc;
        const T* in = inputs.rows(t0 + i, c0, nc, x, row, sk.data() + (inputs.split() ? i * nc : 0), &skips[std::size_t(i)]);
        if (in != row) std::copy(in, in + nc, row);
      }
      T* Y = output_row(sc, t0, nc, y);
      const Index ldy = sc ? sc->y_stride(nc) : nc;
      for (const group_run& r : runs) {
        const T* Bg = n.B().row(t0) + r.g * N;  // (tc, N), row stride ld
        const T* Cg = n.C().row(t0) + r.g * N;
        const Index wr = r.j1 - r.j0;
        gemm(gs, tc, tc, N, T(1), Cg, ld, Bg, ld, false, CB.data(), Tk, false);  // C B^T
        if (carry) gemm(gs, tc, wr, N, T(1), Cg, ld, h + r.j0, nc, true, Z.data() + r.j0, nc, false);  // C h
        for (Index j0 = r.j0; j0 < r.j1;) {
          const Index hd = (c0 + j0) / P, w = std::min(r.j1, (hd + 1) * P - c0) - j0;
          // Row i of C B^T o exp(seg); ex ends as exp(seg(last, .)), ep as pre.
          T run = 0;
          for (Index i = 0; i < tc; ++i) {
            const T li = n.lambda()(t0 + i, hd);
            run += li;
            ep[std::size_t(i)] = run;
            for (Index j = 0; j < i; ++j) seg[std::size_t(j)] += li;
            seg[std::size_t(i)] = T(0);
            exp_into(i + 1, seg.data(), ex.data());
            T* mi = M.data() + i * Tk;
            const T* cb = CB.data() + i * Tk;
            for (Index j = 0; j <= i; ++j) mi[j] = cb[j] * ex[std::size_t(j)];
            for (Index j = i + 1; j < tc; ++j) mi[j] = T(0);
          }
          gemm(gs, tc, w, tc, T(1), M.data(), Tk, xin.data() + j0, nc, true, Y + j0, ldy, false);  // Y_h = M X_h
          if (carry) {
            exp_into(tc, ep.data(), ep.data());
            for (Index i = 0; i < tc; ++i) {  // Y_h += diag(exp(pre)) C h
              T* yi = Y + i * ldy + j0;
              const T* zi = Z.data() + i * nc + j0;
              const T e = ep[std::size_t(i)];
              for (Index c = 0; c < w; ++c) yi[c] += e * zi[c];
            }
            if (pass_on)
              for (Index m = 0; m < N; ++m)
                for (Index c = 0; c < w; ++c) h[m * nc + j0 + c] *= ep[std::size_t(tc - 1)];
          }
          if (pass_on)
            for (Index i = 0; i < tc; ++i) {  // X' = diag(exp(seg(last, .))) X_h
              const T e = ex[std::size_t(i)];
              const T* xi = xin.data() + i * nc + j0;
              T* si = xs.data() + i * nc + j0;
              for (Index c = 0; c < w; ++c) si[c] = e * xi[c];
            }
          j0 += w;
        }
        if (pass_on) {  // h += B^T X'
          for (Index i = 0; i < tc; ++i)
            for (Index m = 0; m < N; ++m) BgT[std::size_t(m * Tk + i)] = Bg[i * ld + m];
          gemm(gs, N, wr, tc, T(1), BgT.data(), Tk, xs.data() + r.j0, nc, true, h + r.j0, nc, true);
        }
      }
      for (Index i = 0; i < tc; ++i) finish_row(sc, t0 + i, c0, nc, output_row(sc, t0 + i, nc, y), skips[std::size_t(i)]);
    }
  }
  // out[i] = exp(in[i]) for i < count (out may be in).
  static void exp_into(Index count, const T* in, T* out) {
    simd::for_packs<T>(count, [&](auto w, Index i) {
      using Pk = simd::pack<T, decltype(w)::value>;
      exp(Pk::load(in + i)).store(out + i);
    });
  }

  // Factored decay with one channel per head (Mamba-1): vectorised across channels, the state of
  // the slab stored state-major (N, nc), each decay exp2(dt[t, c] * A[c, m] * log2 e) formed in a
  // register. No horizontal reductions, and L*nc + nc*N decay inputs instead of L*nc*N.
  static void run_across_channels(bool transposed, const Semiseparable<T>& n, const context& cx, Index c0, Index nc,
                                  const T* x, T* y, const row_ops<T>* sc) {
    skip_inputs<T> inputs(sc, nc);
    const Index L = cx.L, N = n.state();
    const bool strict = n.strict();
    const auto& dt = n.lambda();
    std::vector<T> state(static_cast<std::size_t>(N * nc), T(0)), rate(static_cast<std::size_t>(N * nc)),
        bonus(n.has_bonus() ? static_cast<std::size_t>(N * nc) : 0), zero(static_cast<std::size_t>(nc), T(0));
    const T log2e = T(1.4426950408889634074);
    for (Index j = 0; j < nc; ++j)
      for (Index m = 0; m < N; ++m) {
        rate[std::size_t(m * nc + j)] = n.decay_rate()(c0 + j, m) * log2e;
        if (n.has_bonus()) bonus[std::size_t(m * nc + j)] = n.bonus()(c0 + j, m);
      }
    // Every exponent dt * A log2(e) of a token lies in [-125, 0] when A <= 0 and the token's dt is in
    // [0, dt_max), dt_max = 125 / max |A log2(e)| (the normal case): then its decays take
    // exp2_bounded_n, the same bits two operations sooner. Otherwise (dt < 0, A > 0, NaN, decays
    // below 2^-125, lambda = -inf) the clamped exp2_n.
    const T rate_min = rate.empty() ? T(0) : *std::min_element(rate.begin(), rate.end());
    const bool rate_nonpos = std::none_of(rate.begin(), rate.end(), [](T r) { return !(r <= T(0)); });
    const T dt_max = rate_nonpos ? (rate_min < T(0) ? T(125) / -rate_min : std::numeric_limits<T>::infinity()) : T(0);
    const T* u = bonus.empty() ? nullptr : bonus.data();
    // Runs of channels [j0, j1) that share a B/C group, whose columns start at g_off.
    struct group_run {
      Index j0, j1, g_off;
    };
    std::vector<group_run> runs;
    for (Index j = 0; j < nc;) {
      const Index g = n.group_of_head(c0 + j);
      Index e = j + 1;
      while (e < nc && n.group_of_head(c0 + e) == g) ++e;
      runs.push_back({j, e, g * N});
      j = e;
    }
    // The (L, D) rows the token loop reads or writes, prefetched prefetch_ahead tokens early one
    // cache line per array and channel group inside the sweep (a burst of dozens of prefetches per
    // token stalls the core): row t of array q starts at base + t * stride bytes.
    struct stream {
      const char* base;
      Index stride;
    };
    constexpr int max_streams = 8;
    stream reads[max_streams];
    int nreads = 0;
    auto add_stream = [&](const T* base, Index ld) {
      const stream st{reinterpret_cast<const char*>(base), ld * Index(sizeof(T))};
      for (int q = 0; q < nreads; ++q)
        if (reads[q].base == st.base && reads[q].stride == st.stride) return;
      if (nreads < max_streams) reads[nreads++] = st;
    };
    add_stream(dt.data() + c0, dt.cols());
    if (sc) {
      for (const auto* fs : {&sc->pre, &sc->post})
        for (const diag_ref<T>& f : *fs)
          if (!f.constant) add_stream(f.data + c0, f.cols);
      if (sc->skip && !sc->skip->constant) add_stream(sc->skip->data + c0, sc->skip->cols);
      if (sc->ldx) add_stream(x, sc->ldx);
    }
    char* const ybase = sc && sc->ldy ? reinterpret_cast<char*>(y) : nullptr;
    // One output factor (a gate) scales each pack as the kernel stores it, where no sum's diagonal
    // is added before it (Mamba-1's skip D: then finish_row's pass over the row, in L1).
    const bool one_post = sc && sc->post.size() == 1 && !sc->skip;
    const Index ystride = sc ? sc->ldy * Index(sizeof(T)) : 0;
    for (Index i = 0; i < L; ++i) {
      const Index t = transposed ? L - 1 - i : i;
      const Index k = (transposed && !strict) ? t + 1 : t;
      const T* dtr = k < L ? dt.row(k) + c0 : zero.data();  // k = L: the state is still zero
      const bool bounded = rate_nonpos && all_within(dtr, nc, dt_max);
      const Index ahead = transposed ? t - prefetch_ahead : t + prefetch_ahead;
      const char* pf[max_streams];
      const int npf = ahead >= 0 && ahead < L ? nreads : 0;
      for (int q = 0; q < npf; ++q) pf[q] = reads[q].base + ahead * reads[q].stride;
      char* const pfw = npf && ybase ? ybase + ahead * ystride : nullptr;
      const T* skip = nullptr;  // the row a sum's diagonal reads (row_ops::skip)
      const T* xt = inputs.rows(t, c0, nc, x, &skip);
      T* yt = output_row(sc, t, nc, y);
      const T* post = one_post ? sc->post[0].row(t) + c0 : nullptr;  // else finish_row scales yt
      for (const group_run& run : runs) {
        const Index j0 = run.j0, j1 = run.j1, g_off = run.g_off;
        const T* in = (transposed ? n.C().row(t) : n.B().row(t)) + g_off;
        const T* out = (transposed ? n.B().row(t) : n.C().row(t)) + g_off;
        auto sweep = [&]<bool Strict, bool Bounded>() {  // two packs at a time, then one, then single channels
          constexpr int W = simd::width<T>;
          Index j = j0;
          for (; j + 2 * W <= j1; j += 2 * W) {
            for (int q = 0; q < npf; ++q) __builtin_prefetch(pf[q] + j * Index(sizeof(T)));
            if (pfw) __builtin_prefetch(pfw + j * Index(sizeof(T)), 1);
            slab_eval::template scan_channels<W, 2, Strict, Bounded>(N, nc, j, dtr, xt, rate.data(), u, state.data(), in, out, post, yt);
          }
          for (int q = 0; q < npf; ++q) __builtin_prefetch(pf[q] + (j1 - 1) * Index(sizeof(T)));
          if (pfw) __builtin_prefetch(pfw + (j1 - 1) * Index(sizeof(T)), 1);
          for (; j + W <= j1; j += W) slab_eval::template scan_channels<W, 1, Strict, Bounded>(N, nc, j, dtr, xt, rate.data(), u, state.data(), in, out, post, yt);
          for (; j < j1; ++j) slab_eval::template scan_channels<1, 1, Strict, Bounded>(N, nc, j, dtr, xt, rate.data(), u, state.data(), in, out, post, yt);
        };
        if (strict) {
          if (bounded) sweep.template operator()<true, true>();
          else sweep.template operator()<true, false>();
        } else {
          if (bounded) sweep.template operator()<false, true>();
          else sweep.template operator()<false, false>();
        }
      }
      if (!one_post) finish_row(sc, t, c0, nc, yt, skip);
    }
  }

  // True when 0 <= p[j] < hi for every j < n (NaN fails).
  static bool all_within(const T* p, Index n, T hi) {
    return simd::sum_packs<T>(n, [&](auto w, Index j) {
             using Pk = simd::pack<T, decltype(w)::value>;
             const Pk v = Pk::load(p + j), zero = Pk::broadcast(T(0)), one = Pk::broadcast(T(1));
             return select_ge(v, zero, zero, one) + select_ge(v, Pk::broadcast(hi), one, zero);
           }) == T(0);
  }

  // One token of the channel-vectorised scan for U packs of W channels starting at slab column j:
  // U independent chains give the FMA units work while one chain waits on its accumulator.
  //   inclusive: h = e h + in x; y = out . h        strict: y = out . (h + u in x); h = e h + in x
  // with e = 2^(dt * rate), rate = A log2(e), all (N, nc) arrays state-major.
  template <int W, int U, bool Strict, bool Bounded>
  static void scan_channels(Index N, Index nc, Index j, const T* dt, const T* x, const T* rate, const T* bonus,
                            T* state, const T* in, const T* out, const T* post, T* y) {
    using Pk = simd::pack<T, W>;
    Pk d[U], xv[U], acc[U];
    for (int q = 0; q < U; ++q) {
      d[q] = Pk::load(dt + j + q * W);
      xv[q] = Pk::load(x + j + q * W);
      acc[q] = Pk::broadcast(T(0));
    }
    // One state at a time, its U decays formed together (exp2_n interleaves their chains). in[m]
    // and out[m] are broadcast once, before the state stores that the compiler cannot tell apart
    // from them (measured 4 % faster than pairs of states in a kernel microbenchmark).
    for (Index m = 0; m < N; ++m) {
      const Pk bi = Pk::broadcast(in[m]), bo = Pk::broadcast(out[m]);
      Pk e[U];
      for (int q = 0; q < U; ++q) e[q] = d[q] * Pk::load(rate + m * nc + j + q * W);
      if constexpr (Bounded) exp2_bounded_n(e);
      else exp2_n(e);
      for (int q = 0; q < U; ++q) {
        T* h = state + m * nc + j + q * W;
        const Pk ix = bi * xv[q];
        const Pk hv = Pk::load(h);
        if constexpr (Strict) {
          acc[q] = fma(bo, bonus ? fma(Pk::load(bonus + m * nc + j + q * W), ix, hv) : hv, acc[q]);
          fma(e[q], hv, ix).store(h);
        } else {
          const Pk hn = fma(e[q], hv, ix);
          hn.store(h);
          acc[q] = fma(bo, hn, acc[q]);
        }
      }
    }
    for (int q = 0; q < U; ++q) (post ? acc[q] * Pk::load(post + j + q * W) : acc[q]).store(y + j + q * W);
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
  std::shared_ptr<const Matrix<T>> lam;  // one head's (L, N) log-decays, formed from a factored decay
  decay_tiles<T, log_decay> tiles;
  channel_eval(const Semiseparable<T>& n, const context& cx, Index c) : lam(expand(n, cx, c)), tiles(make(n, cx, c, *lam)) {}
  void block(Index i0, Index i1, Index j0, Index j1, tile<T> out) const { tiles.block(i0, i1, j0, j1, out); }

 private:
  static std::shared_ptr<const Matrix<T>> expand(const Semiseparable<T>& n, const context& cx, Index c) {
    auto l = std::make_shared<Matrix<T>>();
    if (!n.factored()) return l;
    const Index h = n.head_of(c);
    l->resize(cx.L, n.state());
    for (Index t = 0; t < cx.L; ++t)
      for (Index m = 0; m < n.state(); ++m) (*l)(t, m) = n.log_decay(t, h, m);
    return l;
  }
  static decay_tiles<T, log_decay> make(const Semiseparable<T>& n, const context& cx, Index c, const Matrix<T>& lam) {
    const Index h = n.head_of(c), g = n.group_of_head(h), N = n.state();
    const Index Nd = n.per_state() ? N : 1;
    const strided<T> decay = n.factored() ? strided<T>{lam.data(), N}
                                          : strided<T>{n.lambda().data() + h * Nd, n.lambda().cols()};
    return decay_tiles<T, log_decay>(cx.L, N, Nd, n.strict(), decay,
                                     {n.B().data() + g * N, n.B().cols()}, {n.C().data() + g * N, n.C().cols()},
                                     n.has_bonus() ? n.bonus().row(h) : nullptr);
  }
};

}  // namespace iattn::cpu_detail
