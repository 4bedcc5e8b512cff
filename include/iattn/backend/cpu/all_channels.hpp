// iattn/backend/cpu/all_channels.hpp: materialize_all for sums of terms
//   w * diag(post) * S * diag(pre) * [conv]      (S a Semiseparable in the inclusive form)
//   w * diag(post) * [conv]                      (a band)
// and their flips J term J (Vision Mamba, Hydra), every channel's (L, L) matrix written once.
//
// The tile path (evaluate.hpp) walks each channel's expression tree per 64 x 64 tile: a product
// with the convolution widens its tiles and sums them, every tile is zeroed before it is filled,
// and each node keeps its own temporaries. Here each channel's matrix is formed row panel by row
// panel (panel_rows tokens) in a buffer laid out as the output (panel_rows * L values: in the
// cache for moderate L), then copied out while the next panel is formed in a second buffer.
//
// One term with a core, channel c (head h, group g), in the term's own token order u:
//   U[u]   = w post[u] C[u]                                              (L, N)
//   Z[sig] = sum_lag tap(lag) pre[j] B[j] E(j+1 .. sig),  j = sig-K+1+lag  (the convolution folded
//            into one injection at the latest token it reads; Z = 0 for sig < K-1)
//   G[u, sig] = sum_m U[u, m] E(sig+1 .. u)[m] Z[sig, m]   (sig <= u), at output column sig-K+1;
// the K-1 diagonals above G's (u < sig <= u+K-1: the entries whose convolution window reaches past
// u) are summed directly from the core's entries. G in blocks of panel_rows tokens, as decay_tiles:
// below the diagonal block one product per row panel, Ct_I (rows) against every column to its left
// scaled by its block's mid = E(j1 .. i0) (Ct[u] = U[u] E(i0+1 .. u), Bt[sig] = Z[sig] E(sig+1 ..
// j1-1): a decay shared by the states (factored, lambda = dt A[m], or one per head) as exp(A[m] times
// the block's sum of dt), a per-state one as running products of at most panel_rows per-token
// factors; mid a product of whole blocks' decays); inside the diagonal block running products of
// the per-token factors, vectorised across columns. No exp argument is positive when the
// log-decays are not, nothing is differenced, and lambda = -inf gives exact zeros. The per-channel
// tables are state-major (entry (m, u) at m * lr + pad + u), so the O(L N) set-up runs in whole
// packs over the tokens.
//
// A flipped term's own token u is output row L-1-u: its blocks are cut from the end, so that output
// panel [r0, r1) is its block [L-r1, L-r0), and its columns are laid out reversed when its operands
// are packed, so that every term adds into the same panel in output order.
//
// Anything else (strict or bonus cores, LinearRecurrence, Transition, complex decays, RowNormalize,
// Wkv, softmax, a flip inside a product) takes the tile path.
#pragma once

#include "../../ops/flip.hpp"
#include "mean.hpp"
#include "parallel.hpp"
#include "product.hpp"
#include "simd.hpp"
#include "stream.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <type_traits>
#include <vector>

// all_channels::refer_tiles: AVX2 float (gemm.hpp's 8 x 8 transposes; a flipped term's reversed
// store is a lane permutation across the pack's halves).
#if IATTN_GEMM_PACK_AVX && defined(__AVX2__)
#define IATTN_REFER_TILES 1
#else
#define IATTN_REFER_TILES 0
#endif

namespace iattn::cpu_detail {

template <class N>
struct is_flip_node : std::false_type {};
template <class A>
struct is_flip_node<Flip<A>> : std::true_type {};

/// One term of the expansion and whether it is flipped (J term J).
template <class T>
struct all_term {
  mean_term<T> term;
  bool flipped = false;
};

/// Expands n into out: sums, scalar scales and flips at the top, mean.hpp's expand_terms below.
/// False when n is not a sum of terms this file takes.
template <class T, class Node>
bool expand_all_terms(const Node& n, const context& cx, std::vector<all_term<T>>& out, bool flipped = false,
                      double weight = 1) {
  if constexpr (is_sum_node<Node>::value) {
    return expand_all_terms<T>(n.left(), cx, out, flipped, weight) &&
           expand_all_terms<T>(n.right(), cx, out, flipped, weight);
  } else if constexpr (is_scaled_node<Node>::value) {
    return expand_all_terms<T>(n.inner(), cx, out, flipped, weight * double(n.factor()));
  } else if constexpr (is_flip_node<Node>::value) {
    return expand_all_terms<T>(n.inner(), cx, out, !flipped, weight);
  } else {
    mean_terms<T> terms;
    if (!expand_terms<T>(n, cx, terms)) return false;
    for (auto& t : terms) {
      if (t.has_core() && (t.S == nullptr || t.R != nullptr || t.S->strict())) return false;
      t.weight *= weight;
      out.push_back({std::move(t), flipped});
    }
    return out.size() <= max_mean_terms;
  }
}

template <class T>
class all_channels {
 public:
  static constexpr Index panel_rows = 16;  ///< tokens per row panel (and per block of G)

  /// fresh: out is newly allocated (its pages not yet touched: streaming stores there are slower
  /// than plain ones, which find each page in the cache after the kernel zeroed it).
  all_channels(const std::vector<all_term<T>>& terms, const context& cx, bool fresh)
      : terms_(terms), L_(cx.L), D_(cx.D),
        stream_(!fresh && std::size_t(cx.D * cx.L * cx.L) * sizeof(T) >= stream_min_bytes) {
    for (const auto& a : terms_) maxK_ = std::max(maxK_, a.term.width());
    off_ = maxK_ - 1;
    np_ = (L_ + panel_rows - 1) / panel_rows;
    lr_ = pad + (L_ + W - 1) / W * W + W;
    // Block edges in a term's own order, ascending: output panels [r0, r1) are its blocks [r0, r1)
    // (forward), or [L-r1, L-r0) (flipped).
    for (int f = 0; f < 2; ++f) {
      edges_[f].resize(std::size_t(np_ + 1));
      for (Index b = 0; b <= np_; ++b)
        edges_[f][std::size_t(b)] = f ? L_ - std::min(L_, (np_ - b) * panel_rows) : std::min(L_, b * panel_rows);
    }
    // B and C of every term with a core, state-major (G*N, lr): shared by its channels.
    bt_.resize(terms_.size()), ct_.resize(terms_.size());
    for (std::size_t k = 0; k < terms_.size(); ++k)
      if (const Semiseparable<T>* S = terms_[k].term.S) {
        transpose_rows(S->B(), bt_[k]);
        transpose_rows(S->C(), ct_[k]);
      }
  }

  /// Every channel's matrix into out (D, L, L), row-major [c][t][s], in parallel over channels.
  void run(T* out) {
    gathered& g = gather();
    parallel_for(D_, [&](Index c) { channel(c, g, thread_scratch(), out + c * L_ * L_); });
    // Kept for the next call unless large (3 (D, L) arrays per term: 7 MB for Vision-Mamba-small).
    if (3 * terms_.size() * std::size_t(D_ * L_) * sizeof(T) > (std::size_t(64) << 20)) g = gathered{};
  }

 private:
  template <int V>
  using Pk = simd::pack<T, V>;
  static constexpr int W = simd::width<T>;
  static constexpr int product_cols = 3;                     ///< packs of columns per register block
  static constexpr Index NR = product_cols * W;              ///< columns per register block
  static constexpr Index pad = (max_mean_conv + W - 1) / W * W;  ///< tokens before u = 0 in a table row
  // A flipped term's blocks are whole packs of columns, and a forward pack straddles at most two.
  static_assert(panel_rows % W == 0, "row panels must be whole packs");

  // Per-channel tables are state-major: entry (m, u) at m * lr_ + pad + u, so every pass over the
  // tokens is a run of whole packs, shifted loads reach back up to pad tokens, and the pads hold
  // neutral values (decay 1, everything else 0). The tables share one store starting on a 64-byte
  // boundary; rows are lr apart, a whole number of packs. bt keeps a forward term's sig at
  // sig - (K - 1) (column x of core_rows's products at x), a flipped one's at L - 1 - sig.
  struct tables {
    std::vector<T> store;
    T *fac = nullptr, *U = nullptr, *Bp = nullptr, *Z = nullptr, *ct = nullptr, *bt = nullptr;  // (N, lr) each
    T* band = nullptr;            // (K - 1, lr)
    std::vector<T> blk, tap;      // (blocks, N); the channel's taps (K)
  };
  struct scratch {
    std::vector<tables> tab;
    std::vector<T> panel, panel2, wp, acc, e, lam, cum, post, pre, gat, taps;
  };
  /// Per term, (D, L): w * post, pre and a factored decay's dt, channel-major.
  struct gathered {
    std::vector<std::vector<T>> post, pre, dt;
  };
  // Both kept across calls by the threads that use them: fresh memory page-faults on first touch.
  static scratch& thread_scratch() {
    thread_local scratch s;
    return s;
  }

  const std::vector<all_term<T>>& terms_;
  Index L_, D_, maxK_ = 1, off_ = 0, np_ = 0, lr_ = 0;
  bool stream_;  // the result is streamed out (stream.hpp): larger than the caches, already touched
  std::vector<std::vector<T>> bt_, ct_;
  std::vector<Index> edges_[2];  // [flipped]

  /// p rounded up to a multiple of 64 bytes (whole cache lines: a pack load across two lines costs two).
  static T* aligned64(T* p) {
    return reinterpret_cast<T*>((reinterpret_cast<std::uintptr_t>(p) + 63) & ~std::uintptr_t(63));
  }
  /// v's storage, grown to n elements past a 64-byte boundary.
  static T* sized_aligned(std::vector<T>& v, Index n) { return aligned64(sized(v, n + 64 / Index(sizeof(T)))); }

  /// p[0, n) = v by whole packs, the last one reaching up to W - 1 entries past n where n is not a
  /// multiple of W (the callers' layouts allow it). The value is pinned, so that the compiler does
  /// not turn the stores back into a call of memset: a call per short run was 7 % of a one-thread
  /// call for Vision-Mamba-small's matrices.
  static void fill_packs(T* p, Index n, T v) {
    Pk<W> x = Pk<W>::broadcast(v);
    x.pin();
    for (Index i = 0; i < n; i += W) x.store(p + i);
  }

  /// x (L, M) into out (M, lr) state-major, pads 0.
  void transpose_rows(const coefficient<T>& x, std::vector<T>& out) const {
    const Index M = x.cols();
    out.assign(std::size_t(M * lr_), T(0));
    for (Index u = 0; u < L_; ++u)
      for (Index m = 0; m < M; ++m) out[std::size_t(m * lr_ + pad + u)] = x(u, m);
  }

  /// Every term's diagonals and factored decay, channel-major, read from the (L, D) operands in
  /// blocks of tb tokens: a block's rows are formed token-major in a buffer (whole packs over the
  /// channels, one pass per factor) and transposed into the channel-major arrays by 8 x 8 register
  /// transposes (float with AVX; the remainders and other types entry by entry). tb = 32: two
  /// threads share a cache line of the result only at a block's edge.
  gathered& gather() const {
    thread_local gathered g;
    const std::size_t nt = terms_.size();
    g.post.resize(nt), g.pre.resize(nt), g.dt.resize(nt);
    constexpr Index tb = 32;
    const Index n = D_ * L_, D = D_;
    for (std::size_t k = 0; k < nt; ++k) {
      const mean_term<T>& m = terms_[k].term;
      T* post = sized(g.post[k], n);
      T* pre = sized(g.pre[k], n);
      T* dt = m.S && m.S->factored() ? sized(g.dt[k], n) : nullptr;
      parallel_for((L_ + tb - 1) / tb, [&](Index ub) {
        const Index u0 = ub * tb, u1 = std::min(L_, u0 + tb);
        T* rows = sized(thread_scratch().gat, tb * D);
        // rows[u - u0] = the block's token-major values, then into dst (D, L) channel-major
        auto transpose = [&](T* dst) {
          Index c8 = 0, u8 = u0;  // [0, c8) x [u0, u8) by 8 x 8 transposes
#if IATTN_GEMM_PACK_AVX
          if constexpr (std::is_same_v<T, float>) {
            c8 = D / 8 * 8, u8 = u0 + (u1 - u0) / 8 * 8;
            for (Index c = 0; c < c8; c += 8)
              for (Index u = u0; u < u8; u += 8) transpose8x8(rows + (u - u0) * D + c, D, dst + c * L_ + u, L_);
          }
#endif
          for (Index c = 0; c < D; ++c)
            for (Index u = c < c8 ? u8 : u0; u < u1; ++u) dst[c * L_ + u] = rows[(u - u0) * D + c];
        };
        auto fold = [&](const diag_factors<T>& d, T first, T* dst) {
          for (Index u = u0; u < u1; ++u) {
            T* r = rows + (u - u0) * D;
            std::fill(r, r + D, first);
            for (const auto& f : d.f) {
              const T* x = f.data + (f.rows == 1 ? 0 : u) * D;
              simd::for_packs<T>(D, [&](auto w, Index c) {
                using P = Pk<decltype(w)::value>;
                (P::load(r + c) * P::load(x + c)).store(r + c);
              });
            }
          }
          transpose(dst);
        };
        fold(m.post, T(m.weight), post);
        fold(m.pre, T(1), pre);
        if (dt) {
          const coefficient<T>& x = m.S->lambda();
          const Index hd = m.S->head_dim();  // channel c's head is c / hd
          for (Index u = u0; u < u1; ++u) {
            const T* xr = x.row(u);
            T* r = rows + (u - u0) * D;
            if (hd == 1)
              std::copy(xr, xr + D, r);
            else
              for (Index c = 0; c < D; ++c) r[c] = xr[c / hd];
          }
          transpose(dt);
        }
      });
    }
    return g;
  }

  void channel(Index c, const gathered& g, scratch& s, T* out) const {
    if (s.tab.size() < terms_.size()) s.tab.resize(terms_.size());
    for (std::size_t k = 0; k < terms_.size(); ++k)
      if (terms_[k].term.S) prepare(terms_[k], c, k, g, s.tab[k], s);
    // Rows [r0, r1) of the output, laid out as there (stride L), formed in the cache and copied
    // out: their panel_rows * L values are contiguous in out. Two panels in turn: the previous
    // panel is copied out in parts between the stages of the next one (after its middle fill,
    // after each term, after its side fills), so that the streaming stores drain while the next
    // panel computes instead of stalling the stores right after one burst.
    const Index cap = panel_rows * L_ + W;  // + W: fill_packs may reach past the last row
    T* panels[2] = {sized_aligned(s.panel, cap), sized_aligned(s.panel2, cap)};
    const Index parts = Index(terms_.size()) + 2;
    const T* from = nullptr;  // the panel being copied out to `to`, n values, parts [0, done) copied
    T* to = nullptr;
    Index n = 0, done = parts;
    // Copies the pending panel up to part k's end (k = parts - 1: all of it). The edges between
    // parts fall on cache lines of the output, so no line is split between two copies.
    auto copy_out = [&](Index k) {
      constexpr Index line = 64 / Index(sizeof(T));  // values per cache line
      auto edge = [&](Index j) {
        if (j <= 0) return Index(0);
        if (j >= parts) return n;
        const Index at = n * j / parts;
        const Index lead = Index((reinterpret_cast<std::uintptr_t>(to + at) % 64) / sizeof(T));
        return std::min(n, lead ? at + (line - lead) : at);
      };
      for (; done <= k; ++done) {  // k < parts
        const Index a = edge(done), b = edge(done + 1);
        if (b <= a) continue;
        if (stream_)
          stream_copy(to + a, from + a, b - a);
        else
          std::copy(from + a, from + b, to + a);
      }
    };
    for (Index p = 0; p < np_; ++p) {
      T* panel = panels[p & 1];
      const Index r0 = p * panel_rows, r1 = std::min(L_, r0 + panel_rows);
      const Index m0 = std::max<Index>(0, r0 - off_), m1 = std::min(L_, r1 + off_);  // the middle columns
      // Zeros past m1 (into the next row) are harmless: the columns outside the middle are written
      // or zero-filled below, after these.
      for (Index t = r0; t < r1; ++t) fill_packs(panel + (t - r0) * L_ + m0, m1 - m0, T(0));
      copy_out(0);
      bool left = false, right = false;  // whether [0, m0) and [m1, L) of rows [r0, r1) are written
      for (std::size_t k = 0; k < terms_.size(); ++k) {
        const all_term<T>& a = terms_[k];
        if (a.term.S)
          core_rows(a, s.tab[k], p, m0, m1, panel, a.flipped ? right : left, s);
        else
          band_rows(a, c, g.post[k].data() + c * L_, r0, r1, panel, s);
        copy_out(Index(k) + 1);
      }
      for (Index t = r0; t < r1; ++t) {
        T* row = panel + (t - r0) * L_;
        if (!left) std::fill(row, row + m0, T(0));
        if (!right) std::fill(row + m1, row + L_, T(0));
      }
      copy_out(parts - 1);
      from = panel, to = out + r0 * L_, n = (r1 - r0) * L_, done = 0;
    }
    copy_out(parts - 1);
    if (stream_) stream_fence();
  }

  // Output row and column of the term's entry (u, s').
  Index out_row(bool flipped, Index u) const { return flipped ? L_ - 1 - u : u; }
  Index out_col(bool flipped, Index sp) const { return flipped ? L_ - 1 - sp : sp; }

  /// A term without a core: H[u, u - lag] = w post[u] tap(lag).
  void band_rows(const all_term<T>& a, Index c, const T* post, Index r0, Index r1, T* panel, scratch& s) const {
    const mean_term<T>& m = a.term;
    const Index K = m.width();
    T* tap = sized(s.taps, K);
    for (Index lag = 0; lag < K; ++lag) tap[lag] = m.conv ? m.conv->tap(lag, c) : T(1);
    // Row t is token u = t (forward; column u - lag) or u = L-1-t (flipped; column L-1-(u-lag) = t + lag).
    for (Index t = r0; t < r1; ++t) {
      T* row = panel + (t - r0) * L_;
      if (a.flipped) {
        const T p = post[L_ - 1 - t];
        for (Index lag = 0; lag < K && lag <= L_ - 1 - t; ++lag) row[t + lag] += p * tap[lag];
      } else {
        const T p = post[t];
        for (Index lag = 0; lag < K && lag <= t; ++lag) row[t - lag] += p * tap[lag];
      }
    }
  }

  /// The term's tables for channel c, state-major.
  void prepare(const all_term<T>& a, Index c, std::size_t k, const gathered& gd, tables& tb, scratch& s) const {
    using P = Pk<W>;
    const mean_term<T>& m = a.term;
    const Semiseparable<T>& S = *m.S;
    const Index L = L_, N = S.state(), K = m.width(), h = S.head_of(c), g = S.group_of_head(h) * N;
    const Index lr = lr_, nrow = N * lr;
    const std::vector<Index>& edges = edges_[a.flipped];
    T* base = sized_aligned(tb.store, 6 * nrow + std::max<Index>(K - 1, 1) * lr);
    T* fac = tb.fac = base;
    T* U = tb.U = base + nrow;
    T* Bp = tb.Bp = base + 2 * nrow;
    T* Z = tb.Z = base + 3 * nrow;
    T* ct = tb.ct = base + 4 * nrow;
    T* bt = tb.bt = base + 5 * nrow;
    T* band = tb.band = base + 6 * nrow;
    T* blk = sized(tb.blk, np_ * N);
    T* tap = sized(tb.tap, K);
    for (Index lag = 0; lag < K; ++lag) tap[lag] = m.conv ? m.conv->tap(lag, c) : T(1);
    // post and pre of channel c, padded to whole packs
    T* post_ = sized(s.post, lr);
    T* pre_ = sized(s.pre, lr);
    std::copy(gd.post[k].data() + c * L, gd.post[k].data() + (c + 1) * L, post_);
    std::copy(gd.pre[k].data() + c * L, gd.pre[k].data() + (c + 1) * L, pre_);
    std::fill(post_ + L, post_ + lr, T(0));
    std::fill(pre_ + L, pre_ + lr, T(0));
    // lambda[u, m] = lam[u] * rate[m] when the decay is factored (rate = A's row) or one per head
    // (rate = 1); per state otherwise (shared = false).
    const bool shared = S.factored() || !S.per_state();
    T* lam = sized(s.lam, lr);
    T* rate = sized(s.e, N);
    if (shared) {
      std::fill(lam, lam + lr, T(0));
      if (S.factored())
        std::copy(gd.dt[k].data() + c * L, gd.dt[k].data() + (c + 1) * L, lam + pad);
      else
        for (Index u = 0; u < L; ++u) lam[pad + u] = S.lambda()(u, h);
      for (Index q = 0; q < N; ++q) rate[q] = S.factored() ? S.decay_rate()(h, q) : T(1);
    }
    // ct[u] = U[u] E(b0+1 .. u) forward from the block's first token, bt[sig] = Z[sig] E(sig+1 ..
    // b1-1) backward from its last (stored at L-1-sig when flipped), blk the whole block's decay.
    // A shared decay sums lam over those ranges once for all states, exp(rate * sum) per state,
    // or (AVX2 float, N a multiple of 8: refer_tiles) running products of the factors over tiles
    // transposed to token-major, without those two exponentials per entry; a per-state one takes
    // running products.
    const bool tiles = shared && refer_by_tiles && N % 8 == 0;  // ct and bt by refer_tiles
    T* fwd = nullptr;  // sum of lam over b0+1 .. u; bwd: over sig+1 .. b1-1 (at sig)
    T* bwd = nullptr;
    T* tmp = nullptr;
    if (shared) {
      fwd = sized(s.cum, 3 * lr);
      bwd = fwd + lr;
      tmp = bwd + lr;
      std::fill(fwd, fwd + 2 * lr, T(0));
      for (Index b = 0; b < np_; ++b) {
        const Index b0 = edges[std::size_t(b)], b1 = edges[std::size_t(b) + 1];
        for (Index u = b0 + 1; u < b1 && !tiles; ++u) fwd[u] = fwd[u - 1] + lam[pad + u];
        for (Index u = b1 - 2; u >= b0; --u) bwd[u] = bwd[u + 1] + lam[pad + u + 1];
        const T whole = bwd[b0] + lam[pad + b0];
        simd::for_packs<T>(N, [&](auto w, Index q) {
          using Q = Pk<decltype(w)::value>;
          exp(Q::load(rate + q) * Q::broadcast(whole)).store(blk + b * N + q);
        });
      }
    }
    // The core's K-1 diagonals core[d][u] = sum_m U[u] E(u-d+1 .. u) Bp[u-d] (0 for u < d: Bp's
    // pad), summed over the states into band's rows, and at the end the band above G's diagonal
    // from them in place, band[d][u] = sum_{lag <= d} tap(lag) core[d - lag][u]: what row u adds
    // at column s' = u - d.
    const Index nd = K - 1;
    std::fill(band, band + std::max<Index>(nd, 1) * lr, T(0));
    // One state at a time, all its rows formed while they stay in L1, whole packs over the tokens.
    const Index Lw = (L + W - 1) / W * W;  // the packs' reach; lr >= pad + Lw + W
    for (Index q = 0; q < N; ++q) {
      T* fq = fac + q * lr;
      T* uq = U + q * lr;
      T* bq = Bp + q * lr;
      T* zq = Z + q * lr;
      // Decay factors (pads 1), U = post C and Bp = pre B (pads 0).
      fill_packs(fq, pad, T(1));  // pad: whole packs
      fill_packs(uq, pad, T(0));
      fill_packs(bq, pad, T(0));
      if (!shared)
        for (Index u = 0; u < L; ++u) fq[pad + u] = S.lambda()(u, h * N + q);
      const T* cq = ct_[k].data() + (g + q) * lr + pad;
      const T* Bq = bt_[k].data() + (g + q) * lr + pad;
      const P aq = P::broadcast(shared ? rate[q] : T(1));  // (unused when not shared)
      for (Index u = 0; u < Lw; u += W) {
        const P l = shared ? aq * P::load(lam + pad + u) : P::load(fq + pad + u);
        exp(l).store(fq + pad + u);
        (P::load(post_ + u) * P::load(cq + u)).store(uq + pad + u);
        (P::load(pre_ + u) * P::load(Bq + u)).store(bq + pad + u);
      }
      // past L: decay 1, nothing injected or read out
      std::fill(fq + pad + L, fq + lr, T(1));
      std::fill(uq + pad + L, uq + lr, T(0));
      std::fill(bq + pad + L, bq + lr, T(0));
      // Z[sig] = sum_r tap(K-1-r) Bp[sig-r] E(sig-r+1 .. sig) for sig >= K-1 (0 before, and past L),
      // by Horner from the oldest lag: (..(tap(0) Bp[j0]) f[j0+1] + tap(1) Bp[j0+1]) .. ) f[sig] +
      // tap(K-1) Bp[sig], j0 = sig-K+1.
      std::fill(zq, zq + pad + std::min(L, K - 1), T(0));
      for (Index sig = K - 1; sig < L; sig += W) {
        const T* b0 = bq + pad + sig - (K - 1);
        const T* f0 = fq + pad + sig - (K - 1);
        P v = P::broadcast(tap[0]) * P::load(b0);
        for (Index lag = 1; lag < K; ++lag) v = fma(v, P::load(f0 + lag), P::broadcast(tap[lag]) * P::load(b0 + lag));
        v.store(zq + pad + sig);
      }
      std::fill(zq + pad + L, zq + lr, T(0));
      // This state's share of the core's diagonals.
      for (Index u = 0; u < L && nd > 0; u += W) {
        P e = P::load(uq + pad + u);
        for (Index d = 0; d < nd; ++d) {
          if (d > 0) e = e * P::load(fq + pad + u - d + 1);
          T* cd = band + d * lr + pad + u;
          fma(e, P::load(bq + pad + u - d), P::load(cd)).store(cd);
        }
      }
      // ct, bt (and a per-state decay's blk).
      T* cq_ = ct + q * lr + pad;
      T* bq_ = bt + q * lr;
      std::fill(bq_, bq_ + lr, T(0));
      bq_ += pad;
      if (tiles) {
        // ct and bt after the loop over the states (refer_tiles)
      } else if (shared) {
        T* to = a.flipped ? tmp : bq_ - (K - 1);
        for (Index u = 0; u < Lw; u += W) {
          (exp(aq * P::load(fwd + u)) * P::load(uq + pad + u)).store(cq_ + u);
          (exp(aq * P::load(bwd + u)) * P::load(zq + pad + u)).store(to + u);
        }
        if (a.flipped)
          for (Index sg = 0; sg < L; ++sg) bq_[L - 1 - sg] = tmp[sg];
      } else {
        const T* f = fq + pad;
        const T* uu = uq + pad;
        const T* zz = zq + pad;
        for (Index b = 0; b < np_; ++b) {
          const Index b0 = edges[std::size_t(b)], b1 = edges[std::size_t(b) + 1];
          T e = T(1);
          for (Index u = b0; u < b1; ++u) {
            if (u > b0) e *= f[u];
            cq_[u] = e * uu[u];
          }
          e = T(1);
          for (Index sg = b1 - 1; sg >= b0; --sg) {
            bq_[a.flipped ? L - 1 - sg : sg - (K - 1)] = e * zz[sg];
            e *= f[sg];
          }
          blk[b * N + q] = e;
        }
      }
    }
    if (tiles) refer_tiles(a.flipped, edges, N, K, fac, U, Z, ct, bt);
    // The band from the core's diagonals, in place (d descending: band[d] reads core[0 .. d]).
    for (Index u = 0; u < L && nd > 0; u += W)
      for (Index d = nd - 1; d >= 0; --d) {
        P v = P::broadcast(T(0));
        for (Index lag = 0; lag <= d; ++lag) v = fma(P::broadcast(tap[lag]), P::load(band + (d - lag) * lr + pad + u), v);
        v.store(band + d * lr + pad + u);
      }
  }

  static constexpr bool refer_by_tiles = IATTN_REFER_TILES && std::is_same_v<T, float> && W == 8;

  /// ct[u] = U[u] E(b0+1 .. u) and bt[sig] = Z[sig] E(sig+1 .. b1-1) of every block [b0, b1) (bt at
  /// sig - (K-1), or at L-1-sig flipped), for a decay shared by the states (which prepare would take
  /// with two exponentials per entry): running products of the factors over 8 x 8 tiles transposed
  /// to token-major, 8 states a pack, and transposed back. N a multiple of 8.
  void refer_tiles(bool flipped, const std::vector<Index>& edges, Index N, Index K, const T* fac, const T* U,
                   const T* Z, T* ct, T* bt) const {
#if IATTN_REFER_TILES
    if constexpr (refer_by_tiles) {
      const Index lr = lr_, L = L_, Lt = (L + 7) / 8 * 8;
      alignas(32) float tile[64], back[64];
      const __m256 one = _mm256_set1_ps(1.f);
      const __m256i rev = _mm256_set_epi32(0, 1, 2, 3, 4, 5, 6, 7);
      for (Index q0 = 0; q0 < N; q0 += 8) {
        const Index o = q0 * lr + pad;
        // forward: F(u) = 1 at a block's first token, F(u-1) fac(u) after
        __m256 F = one;
        std::size_t e = 0;  // edges[e] is the next block start at or after u
        for (Index u0 = 0; u0 < Lt; u0 += 8) {
          transpose8x8(fac + o + u0, lr, tile, 8);
          for (Index j = 0; j < 8; ++j) {
            const Index u = u0 + j;
            while (e < edges.size() && edges[e] < u) ++e;
            F = e < edges.size() && edges[e] == u ? one : _mm256_mul_ps(F, _mm256_load_ps(tile + 8 * j));
            _mm256_store_ps(tile + 8 * j, F);
          }
          transpose8x8(tile, 8, back, 8);
          for (Index i = 0; i < 8; ++i) {
            const Index row = (q0 + i) * lr + pad + u0;
            _mm256_storeu_ps(ct + row, _mm256_mul_ps(_mm256_load_ps(back + 8 * i), _mm256_loadu_ps(U + row)));
          }
        }
        // backward: G(sig) = 1 at a block's last token, fac(sig+1) G(sig+1) before
        __m256 G = one, next = one;  // next: fac(sig+1) as a pack over the states
        std::size_t f = edges.size();  // edges[f - 1] is the last block start at or below sig + 1
        for (Index u0 = Lt - 8; u0 >= 0; u0 -= 8) {
          transpose8x8(fac + o + u0, lr, tile, 8);
          for (Index j = 7; j >= 0; --j) {
            const Index sg = u0 + j;
            while (f > 0 && edges[f - 1] > sg + 1) --f;
            const __m256 fs = _mm256_load_ps(tile + 8 * j);
            G = (f > 0 && edges[f - 1] == sg + 1) || sg + 1 >= L ? one : _mm256_mul_ps(G, next);
            next = fs;
            _mm256_store_ps(tile + 8 * j, G);
          }
          transpose8x8(tile, 8, back, 8);
          for (Index i = 0; i < 8; ++i) {
            const __m256 v = _mm256_mul_ps(_mm256_load_ps(back + 8 * i), _mm256_loadu_ps(Z + (q0 + i) * lr + pad + u0));
            T* row = bt + (q0 + i) * lr + pad;
            if (flipped)  // sig = u0 + j at L-1-sig: the pack reversed, from L-8-u0
              _mm256_storeu_ps(row + L - 8 - u0, _mm256_permutevar8x32_ps(v, rev));
            else
              _mm256_storeu_ps(row + u0 - (K - 1), v);
          }
        }
      }
      return;
    }
#endif
    (void)flipped, (void)edges, (void)N, (void)K, (void)fac, (void)U, (void)Z, (void)ct, (void)bt;
  }

  /// Output rows of panel p of one term with a core, into the panel (rows [r0, r1) of the output, row
  /// stride L): its products left (forward) or right (flipped) of the middle columns [m0, m1) written
  /// when `written` is false, added otherwise (set), the rest added.
  void core_rows(const all_term<T>& a, const tables& tb, Index p, Index m0, Index m1, T* panel, bool& written,
                 scratch& s) const {
    const mean_term<T>& m = a.term;
    const Index N = m.S->state(), K = m.width(), lr = lr_;
    const bool fl = a.flipped;
    const Index b = fl ? np_ - 1 - p : p;  // the term's block
    const std::vector<Index>& edges = edges_[fl];
    const Index i0 = edges[std::size_t(b)], i1 = edges[std::size_t(b) + 1], n = i1 - i0;
    // 1. Below the diagonal block: columns sig in [K-1, i0), as panel columns ascending.
    const Index lo = K - 1;
    if (i0 > lo) {
      // ncp: whole packs (aligned rows) and zeros past nc for a register block starting anywhere.
      const Index nc = i0 - lo, nca = (nc + W - 1) / W * W, ncp = nca + NR;
      T* wp = sized_aligned(s.wp, ncp * N);  // (N, ncp): column x of the panel's range, state-major
      // mid[J N + q] = E(j1 .. i0)[q] of block J < b: fac[i0] times blk of the blocks strictly between;
      // 0 for J = b (the lanes past nc).
      T* mid = sized(s.e, (b + 1) * N);
      for (Index q = 0; q < N; ++q) {
        mid[b * N + q] = T(0);
        mid[(b - 1) * N + q] = tb.fac[q * lr + pad + i0];
      }
      for (Index J = b - 2; J >= 0; --J)
        simd::for_packs<T>(N, [&](auto w, Index q) {
          using Q = Pk<decltype(w)::value>;
          (Q::load(mid + (J + 1) * N + q) * Q::load(tb.blk.data() + (J + 1) * N + q)).store(mid + J * N + q);
        });
      // wp[q][x] = bt(sig) mid[J(sig)][q], whole aligned packs of x (so the products' loads of them
      // are forwarded from these stores): forward x = sig - lo, flipped x = i0 - 1 - sig (columns
      // reversed); bt keeps sig at x + shift, aligned too (forward: at sig - lo, shift = 0; flipped:
      // at L - 1 - sig, shift = L - i0, a multiple of panel_rows). Flipped blocks are whole packs of
      // x; a forward pack straddles two blocks, its lanes from `split` on in the next one.
      using P = Pk<W>;
      const Index shift = fl ? L_ - i0 : 0;
      const P lane = P::iota(T(0));
      for (Index x = 0; x < nca; x += W) {
        const Index J0 = fl ? std::max<Index>(0, np_ - 1 - (x + shift) / panel_rows) : std::min(b, (x + lo) / panel_rows);
        const Index split = fl ? Index(W) : std::min<Index>(W, panel_rows - (x + lo) % panel_rows);
        const Index J1 = std::min(b, J0 + 1);
        const T* from = tb.bt + pad + x + shift;
        T* to = wp + x;
        if (split == W)
          for (Index q = 0; q < N; ++q) (P::load(from + q * lr) * P::broadcast(mid[J0 * N + q])).store(to + q * ncp);
        else {
          const P at = P::broadcast(T(split));
          for (Index q = 0; q < N; ++q) {
            const P m = select_ge(lane, at, P::broadcast(mid[J1 * N + q]), P::broadcast(mid[J0 * N + q]));
            (P::load(from + q * lr) * m).store(to + q * ncp);
          }
        }
      }
      for (Index q = 0; q < N; ++q) fill_packs(wp + q * ncp + nca, NR, T(0));  // ncp = nca + NR
      // Output column of x: forward sig - K + 1 = x (sig = lo .. i0-1); flipped L-1-(sig-K+1) = col0 + x,
      // ascending as sig descends from i0-1. Rows: u ascending forward, descending flipped. The
      // columns outside the middle [m0, m1): no other term reaches them in this direction but the
      // same direction's products.
      const Index col0 = fl ? L_ - i0 + K - 1 : 0;
      const Index xm0 = fl ? 0 : m0, xm1 = fl ? std::min(nc, m1 - col0) : nc;  // x of the middle
      const T* a0 = tb.ct + pad + (fl ? i1 - 1 : i0);
      auto columns = [&](auto add, Index x0, Index x1) {  // x in [x0, x1), added or written
        product<decltype(add)::value>(a0, fl ? -1 : 1, lr, n, wp, ncp, N, x0, x1, panel + col0 + x0, L_);
      };
      if (xm0 < xm1) columns(std::true_type{}, xm0, xm1);
      const Index xd0 = fl ? std::max<Index>(0, xm1) : 0, xd1 = fl ? nc : std::min(nc, m0);  // x outside
      if (xd0 < xd1) {
        if (written)
          columns(std::true_type{}, xd0, xd1);
        else
          columns(std::false_type{}, xd0, xd1);
        written = true;
      }
    }
    // 2. The diagonal block: lanes k are columns sig = i0 + k (forward) or i1 - 1 - k (flipped).
    diagonal_block(tb, N, K, fl, i0, i1, panel, s);
    // 3. The band above G's diagonal, output columns s' = u - d in (u-K+1, u] (prepare's band).
    const T* band = tb.band + pad;
    for (Index u = i0; u < i1; ++u) {
      T* row = panel + (fl ? i1 - 1 - u : u - i0) * L_;
      for (Index d = 0; d < K - 1 && d <= u; ++d) row[out_col(fl, u - d)] += band[d * lr + u];
    }
  }

  /// out[r][x - x0] (+)= sum_m A(r, m) Wp[m][x] for r < rows and x in [x0, x1) (added when Add,
  /// written otherwise), A(r, m) at a[r * astep + m * qs], Wp (N, ncp) with ncp >= x1 + NR (the
  /// columns past x1 are read, never written out): register blocks of NR columns, 8 or 4 rows at a
  /// time, then the rest; a last, partial block by its whole packs and its last partial pack
  /// through a small buffer, so nothing past x1 is touched.
  template <bool Add>
  static void product(const T* a, Index astep, Index qs, Index rows, const T* wp, Index ncp, Index N, Index x0, Index x1,
                      T* out, Index ld) {
    static_assert(product_cols == 3, "a last block's whole packs are taken as 2 + 1");
    for (Index x = x0; x < x1; x += NR) {
      const Index nx = std::min(NR, x1 - x);
      T* o = out + (x - x0);
      const T* w = wp + x;
      if (nx == NR) {
        rows_of<Add, product_cols>(a, astep, qs, rows, w, ncp, N, o, ld);
        continue;
      }
      // The last block: its whole packs directly, then the columns of a partial pack through a buffer.
      const Index full = nx / W, rem = nx - full * W;
      Index k = 0;
      if (full >= 2) rows_of<Add, 2>(a, astep, qs, rows, w, ncp, N, o, ld), k = 2;
      if (full > k) rows_of<Add, 1>(a, astep, qs, rows, w + k * W, ncp, N, o + k * W, ld);
      if (rem > 0) {
        const Index xr = full * W;
        alignas(64) T tmp[4 * W];
        for (Index r = 0; r < rows; r += 4) {
          const Index nr = std::min<Index>(4, rows - r);
          rows_of<false, 1>(a + r * astep, astep, qs, nr, w + xr, ncp, N, tmp, W);
          for (Index i = 0; i < nr; ++i)
            for (Index j = 0; j < rem; ++j) {
              T& d = o[(r + i) * ld + xr + j];
              d = Add ? d + tmp[i * W + j] : tmp[i * W + j];
            }
        }
      }
    }
  }
  /// One register block of C packs of columns, rows [0, rows).
  template <bool Add, int C>
  static void rows_of(const T* a, Index astep, Index qs, Index rows, const T* wp, Index ncp, Index N, T* out, Index ld) {
    Index r = 0;
    // 8 rows at a time with AVX-512's 32 registers (24 sums, the column packs, a broadcast): each
    // column pack loaded once per 8 rows; 4 otherwise.
    if constexpr (W >= 16)
      for (; r + 8 <= rows; r += 8) micro<8, C, Add>(a + r * astep, astep, qs, wp, ncp, N, out + r * ld, ld);
    for (; r + 4 <= rows; r += 4) micro<4, C, Add>(a + r * astep, astep, qs, wp, ncp, N, out + r * ld, ld);
    switch (rows - r) {
      case 3: micro<3, C, Add>(a + r * astep, astep, qs, wp, ncp, N, out + r * ld, ld); break;
      case 2: micro<2, C, Add>(a + r * astep, astep, qs, wp, ncp, N, out + r * ld, ld); break;
      case 1: micro<1, C, Add>(a + r * astep, astep, qs, wp, ncp, N, out + r * ld, ld); break;
      default: break;
    }
  }
  template <int R, int C, bool Add>
  static void micro(const T* a, Index astep, Index qs, const T* wp, Index ncp, Index N, T* out, Index ld) {
    using P = Pk<W>;
    P acc[R][C];
    for (int i = 0; i < R; ++i)
      for (int k = 0; k < C; ++k) acc[i][k] = P::broadcast(T(0));
    for (Index q = 0; q < N; ++q) {
      P b[C];
      for (int k = 0; k < C; ++k) {
        b[k] = P::load(wp + q * ncp + k * W);
        if constexpr (R > 1) b[k].pin();  // one load per pack, not one per row
      }
      const T* aq = a + q * qs;
      for (int i = 0; i < R; ++i) {
        const P v = P::broadcast(aq[i * astep]);
        for (int k = 0; k < C; ++k) acc[i][k] = fma(v, b[k], acc[i][k]);
      }
    }
    for (int i = 0; i < R; ++i)
      for (int k = 0; k < C; ++k) {
        if constexpr (Add) acc[i][k] = acc[i][k] + P::load(out + i * ld + k * W);
        acc[i][k].store(out + i * ld + k * W);
      }
  }

  /// The pack of a diagonal block's running products after row k: lane k takes z, the lanes injected
  /// before it (below k forward, above k flipped) keep v, the others are 0.
  template <class P>
  static P inject(bool fl, P lane, P kk, P z, P v) {
    const P zero = P::broadcast(T(0));
    return fl ? select_ge(lane, kk, select_ge(kk, lane, z, v), zero) : select_ge(kk, lane, select_ge(lane, kk, z, v), zero);
  }

  /// G inside the diagonal block [i0, i1): row u adds sum_m U[u, m] acc[m][k], acc[m][k] the
  /// running product E(sig_k+1 .. u)[m] Z[sig_k, m] (0 until the row reaches sig_k).
  void diagonal_block(const tables& tb, Index N, Index K, bool fl, Index i0, Index i1, T* panel, scratch& s) const {
    using P = Pk<W>;
    constexpr Index G = (panel_rows + W - 1) / W;  // packs per row of the block
    const Index lr = lr_;
    // Output column of lane 0: forward sig = i0 -> i0 - K + 1; flipped lane k is sig = i1-1-k,
    // output column L-1-(i1-1-k-K+1) = L - i1 + K - 1 + k.
    const Index col0 = fl ? out_col(true, i1 - 1 - K + 1) : out_col(false, i0 - K + 1);
    P lane[G];
    for (Index gi = 0; gi < G; ++gi) lane[gi] = P::iota(T(gi * W));
    const P zero = P::broadcast(T(0));
    if constexpr (G == 1) {
      // One pack per row (AVX-512 float): the running products of diag_states states at a time
      // stay in registers through the block's rows, each row's sum added into the panel per group.
      for (Index q0 = 0; q0 < N; q0 += diag_states) {
        const Index nq = std::min(diag_states, N - q0), o0 = q0 * lr + pad;
        auto group = [&](auto flc, auto full) {
          diag_group<decltype(flc)::value, decltype(full)::value>(tb.fac + o0, tb.Z + o0, tb.U + o0, nq, i0, i1, col0, panel);
        };
        const bool full = nq == diag_states;
        if (fl)
          full ? group(std::true_type{}, std::true_type{}) : group(std::true_type{}, std::false_type{});
        else
          full ? group(std::false_type{}, std::true_type{}) : group(std::false_type{}, std::false_type{});
      }
      return;
    }
    T* acc = sized(s.acc, N * G * W);
    fill_packs(acc, N * G * W, T(0));
    for (Index u = i0; u < i1; ++u) {
      const T* f = tb.fac + pad + u;
      const T* z = tb.Z + pad + u;
      const T* Uu = tb.U + pad + u;
      // Lane k takes Z[u] (no scalar store into the packs: it would stall their next load);
      // lanes injected before it (below k forward, above k flipped) advance by fac[u].
      // Only packs with a lane injected by now take part (forward: lanes <= k, flipped: lanes >= k),
      // and only lane k's pack selects; the others advance every lane.
      const Index k = fl ? i1 - 1 - u : u - i0;
      const Index gk = k / W, ga = fl ? gk : 0, gb = fl ? G : gk + 1;  // active packs [ga, gb)
      const P kk = P::broadcast(T(k));
      P o[G];
      for (Index gi = 0; gi < G; ++gi) o[gi] = zero;
      for (Index gi = ga; gi < gb; ++gi) {
        T* ag = acc + gi * W;
        // Four partial sums over the states: one chain of N multiply-adds per row was the block's
        // bound (its latency, not the core's throughput).
        auto states = [&](auto injects) {
          P og[4] = {zero, zero, zero, zero};
          auto step = [&](Index q, P& s) {
            P v = P::load(ag + q * G * W) * P::broadcast(f[q * lr]);
            if constexpr (decltype(injects)::value) v = inject(fl, lane[gi], kk, P::broadcast(z[q * lr]), v);
            v.store(ag + q * G * W);
            s = fma(P::broadcast(Uu[q * lr]), v, s);
          };
          Index q = 0;
          for (; q + 4 <= N; q += 4) step(q, og[0]), step(q + 1, og[1]), step(q + 2, og[2]), step(q + 3, og[3]);
          for (; q < N; ++q) step(q, og[0]);
          return (og[0] + og[1]) + (og[2] + og[3]);
        };
        o[gi] = gi == gk ? states(std::true_type{}) : states(std::false_type{});
      }
      T* row = panel + (fl ? i1 - 1 - u : u - i0) * L_;
      for (Index gi = ga; gi < gb; ++gi) add_lanes(row, col0 + gi * W, o[gi]);
    }
  }

  static constexpr Index diag_states = 8;  ///< states per register group of the one-pack diagonal block

  /// diagonal_block's one-pack form for nq <= diag_states states (all of them when Full) whose
  /// factor, Z and U rows start at f, z, Uu (row stride lr_, token u at u): the direction and the
  /// group's size fixed at compile time, so the unrolled loop over the states has no branches.
  template <bool Fl, bool Full>
  void diag_group(const T* f, const T* z, const T* Uu, Index nq, Index i0, Index i1, Index col0, T* panel) const {
    using P = Pk<W>;
    const Index lr = lr_;
    const P zero = P::broadcast(T(0)), lane = P::iota(T(0));
    P v[diag_states];
    for (Index j = 0; j < diag_states; ++j) v[j] = zero;
    for (Index u = i0; u < i1; ++u) {
      const Index k = Fl ? i1 - 1 - u : u - i0;
      const P kk = P::broadcast(T(k));
      P o = zero;
#if !defined(__CUDACC__)  // nvcc's front end does not know the pragma (this is host code there)
#pragma GCC unroll 8
#endif
      for (Index j = 0; j < diag_states; ++j)
        if (Full || j < nq) {
          const P v0 = v[j] * P::broadcast(f[j * lr + u]);
          v[j] = inject(Fl, lane, kk, P::broadcast(z[j * lr + u]), v0);
          o = fma(P::broadcast(Uu[j * lr + u]), v[j], o);
        }
      add_lanes(panel + k * L_, col0, o);
    }
  }

  /// row[col + j] += lane j of o, for the columns inside [0, L) only: a diagonal block's packs
  /// reach past the matrix's first and last columns (lanes of no column, dropped).
  void add_lanes(T* row, Index col, Pk<W> o) const {
    using P = Pk<W>;
    if (col >= 0 && col + W <= L_) {
      (P::load(row + col) + o).store(row + col);
      return;
    }
    alignas(64) T lanes[W];
    o.store(lanes);
    for (Index j = std::max<Index>(0, -col); j < W && col + j < L_; ++j) row[col + j] += lanes[j];
  }
};

/// Every channel's matrix of n into out (D, L, L) through all_channels when n expands into terms it
/// takes; false (out untouched) otherwise. fresh: out is newly allocated.
template <class T, class Node>
bool materialize_all_terms(const Node& n, const context& cx, T* out, bool fresh) {
  std::vector<all_term<T>> terms;
  if (!expand_all_terms<T>(n, cx, terms)) return false;
  all_channels<T>(terms, cx, fresh).run(out);
  return true;
}

}  // namespace iattn::cpu_detail
