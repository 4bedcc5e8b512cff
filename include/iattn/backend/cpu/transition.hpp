// iattn/backend/cpu/transition.hpp: CPU evaluator of Transition (ops/transition.hpp).
//
// apply:   per head met by the slab (only the channels of a cut head that lie in it), chunks of 32
//          tokens in the chunked (UT / WY) form of transition_chunk.hpp: the chunk's factors (pair
//          matrices, the unit-triangular solve) once per chunk and head, then the head's n channels
//          through three GEMMs on the state S (N x n), token-major,
//            U = W1 [S; V],   Y = W2 [S; V; U],   S <- Diag(gamma) S + W3 [V; U],
//          (N + C) C R + (N + C (1 + R) / 2) C + N C (1 + R) multiply-adds per chunk and channel,
//          4N + 1.5C per token at R = 1; with collapsed writes (the delta rules: every b = c k),
//          W = W1 [S; V], Y = W2 [S; W], S <- Diag(gamma) S + W3 W, 3N + C per token. Plus, per
//          chunk and head, O(C^2 N R^2) for the factors. A chunk whose coefficients the chunked form
//          does not take (a reset lambda = -inf, a positive log-decay, a non-finite coefficient or
//          value, R > 4, growing products: transition_chunk.hpp) runs the recurrence token by token
//          (transition_scan.hpp, O(N n (2R + 3)) per token) on the same state, and so does every
//          chunk of a head for which chunk_pays, a cost model of the two forms, finds the
//          recurrence cheaper (few channels per head; rank-2 writes at N = P = 64, RWKV-7's shape).
// apply_t: the anti-causal transposed recurrence, token by token (transition_scan.hpp).
// tiles:   one head's lower-triangular L x L matrix from per-chunk summaries of 64 tokens
//          (transition_chunk.hpp: Qeff (C x N), the diagonal tile Meff, Keff (N x C), the chunk's
//          product Phi (N x N); each computed once on first use, by the chunked form or by the
//          recurrence on identity columns, whichever costs less (summary_by_recurrence_pays), and by
//          the recurrence wherever the chunked form does not apply). Row block I is computed on first
//          use from its diagonal tile leftwards, as far as asked:
//            H[I, J] = R Keff_J,   R <- R Phi_J,   R = Qeff_I at the start,
//          a (C x N)(N x C) and a (C x N)(N x N) product per tile: O(L^2 N (1 + N / C) / 2) for a
//          whole materialize, independent of R. Row blocks are independent, so the drivers'
//          parallel row loops scale; each keeps its tiles while the evaluator lives (L^2 / 2 numbers
//          for a full matrix). One tile (I, J) alone costs the I - J steps to its right and the
//          summaries of chunks J..I. The channels of one head share one such matrix while their
//          evaluators are alive (a registry keyed by the node and the head), so a mean over a head's
//          P channels computes the head once.
#pragma once

#include "../../ops/transition.hpp"
#include "gemm.hpp"
#include "product.hpp"
#include "simd.hpp"
#include "tile.hpp"
#include "transition_chunk.hpp"
#include "transition_kernels.hpp"
#include "transition_scan.hpp"

#include <algorithm>
#include <cmath>
#include <memory>
#include <mutex>
#include <optional>
#include <tuple>
#include <utility>
#include <vector>

namespace iattn::cpu_detail {

namespace transition_detail {

/// What the tiles need of one chunk (header comment): Qeff (C, N), rows q_t^T A_t ... A_0; the
/// diagonal tile Meff (C, C); and packed for the products that read them (gemm_pack_a_t of their
/// (N, C) and (N, N) forms): Keff, the chunk's state on its own identity columns, and Phi, the
/// chunk's product.
template <class T>
struct chunk_summary {
  rmat<T> Qeff, Meff, Keff, Phi;  // Keff and Phi also as they are, for the superblocks' products
  std::vector<T> Keff_p, Phi_p;
  void pack(const T* K, Index ldk, const T* Ph, Index ldp, Index N, Index C) {
    Keff_p.resize(std::size_t(gemm_padded_rows<T>(C) * N));
    Phi_p.resize(std::size_t(gemm_padded_rows<T>(N) * N));
    gemm_pack_a_t(K, ldk, C, N, Keff_p.data());
    gemm_pack_a_t(Ph, ldp, N, N, Phi_p.data());
    Keff.resize(N, C), Phi.resize(N, N);
    for (Index m = 0; m < N; ++m) std::copy_n(K + m * ldk, C, Keff.data() + m * C);
    for (Index m = 0; m < N; ++m) std::copy_n(Ph + m * ldp, N, Phi.data() + m * N);
  }
};

/// What the tiles need of a superblock of super_chunks chunks (every chunk of it full): its
/// product Phi^ = Phi_e ... Phi_b and its state on its own identity columns K^ (N, super_chunks C),
/// K^ column block j = Phi_e ... Phi_{j+1} Keff_j, both packed as the tiles' products read them.
template <class T>
struct super_summary {
  std::vector<T> K_p, Phi_p;
};
inline constexpr Index super_chunks = 4;  ///< chunks per superblock of the tiles' row walk

/// The summary from the chunked factors: with X the columns of W2 on U (Mqb, or Mqk collapsed) and
/// Y those of W3 (B~^T, or K~^T collapsed), Qeff = Q' + X A1, Meff = Mqk + X A2, Keff = K~^T + Y A2,
/// Phi = Diag(gamma) + Y A1 (the V terms Mqk and K~^T only when the writes do not collapse).
template <class T>
void summarize(const chunk_factors<T>& f, chunk_summary<T>& s) {
  constexpr Index MR = gemm_mr<T>;
  const Index N = f.N, C = f.C, nu = f.nu, vc = f.vc, w1 = N + C, w2 = N + vc + nu, w3 = vc + nu;
  s.Qeff = f.W2.leftCols(N);
  rmat<T> Keff = rmat<T>::Zero(N, C), Phi = rmat<T>::Zero(N, N);
  s.Meff.setZero(C, C);
  if (vc > 0) s.Meff = f.W2.middleCols(N, C), Keff = f.W3.leftCols(C);
  for (Index m = 0; m < N; ++m) Phi(m, m) = f.gamma[std::size_t(m)];
  if (nu > 0) {
    std::vector<T> a1(std::size_t(gemm_padded_rows<T>(N) * nu)), a2(std::size_t(gemm_padded_rows<T>(C) * nu));
    gemm_pack_a_t(f.W1.data(), w1, N, nu, a1.data());      // A1^T
    gemm_pack_a_t(f.W1.data() + N, w1, C, nu, a2.data());  // A2^T
    const T* X = f.W2.data() + N + vc;  // (C, nu), row stride w2
    const T* Y = f.W3.data() + vc;      // (N, nu), row stride w3
    mul_packed(C, N, nu, X, w2, a1.data(), MR * nu, s.Qeff.data(), N);
    mul_packed(C, C, nu, X, w2, a2.data(), MR * nu, s.Meff.data(), C);
    mul_packed(N, C, nu, Y, w3, a2.data(), MR * nu, Keff.data(), C);
    mul_packed(N, N, nu, Y, w3, a1.data(), MR * nu, Phi.data(), N);
  }
  for (Index t = 0; t < C; ++t) s.Meff.row(t).tail(C - 1 - t).setZero();  // exact zeros above the diagonal
  s.pack(Keff.data(), C, Phi.data(), N, N, C);
}

/// The summary by the recurrence (any coefficients): the scan of tokens [t0, t0 + C) from the
/// state [I_N | 0] on the inputs [0 | I_C] reads [Qeff | Meff] and ends in [Phi | Keff].
template <class T>
void summarize_by_recurrence(const head_view<T>& hv, Index t0, Index C, chunk_summary<T>& s) {
  const Index N = hv.N, R = hv.R, n = N + C;
  workspace<T> ws(N, R, n);
  ws.grow = N;  // input column N + t is zero before token t, and so is its state
  for (Index m = 0; m < N; ++m) ws.Y[std::size_t(m * n + m)] = T(1);
  if (R > 0 && t0 > 0)  // the projections of the initial state, a_{t0,r}^T [I | 0]
    for (Index r = 0; r < R; ++r) std::copy_n(hv.a(t0) + r * N, N, ws.w.data() + r * n);
  rmat<T> x = rmat<T>::Zero(C, n), y(C, n);
  for (Index t = 0; t < C; ++t) x(t, N + t) = T(1);
  scan_forward(hv, 0, t0, t0 + C, ws, [&](Index t) { return x.data() + (t - t0) * n; },
               [&](Index t) { return y.data() + (t - t0) * n; });
  s.Qeff = y.leftCols(N);
  s.Meff = y.rightCols(C);
  for (Index t = 0; t < C; ++t) s.Meff.row(t).tail(C - 1 - t).setZero();  // not all written (ws.grow)
  s.pack(ws.Y.data() + N, n, ws.Y.data(), n, N, C);
}

/// apply's choice between the chunked form and the recurrence: 0 decides per head with
/// chunk_pays; 1 takes the chunked form wherever it applies, -1 never (the tests' switches). The
/// tiles' summaries follow it too (0: summary_by_recurrence_pays per chunk).
struct chunk_tuning {
  static inline int force = 0;
};

/// The fractions of the FMA peak the forms' parts run at on the development machines
/// (docs/performance.md), the weights of chunk_pays and summary_by_recurrence_pays.
inline constexpr double rate_gemm = 0.8, rate_recurrence = 0.45, rate_factors = 0.25;

/// Whether the chunked form pays for a head of n channels (N states, rank R, its first chunk's
/// writes collapsed or not), by multiply-adds per token weighted by the throughput each kind runs
/// at on the development machines (docs/performance.md): the chunk GEMMs near 0.8 of the FMA peak,
/// the recurrence near 0.45, the per-chunk factors (pair matrices, solve, copies, checks) near 0.25.
/// Gated DeltaNet at N = P = 128 takes the chunked form; RWKV-7 at N = P = 64 (rank-2 writes) and
/// heads of a few channels keep the recurrence.
inline bool chunk_pays(Index N, Index n, Index R, bool per_key, bool collapsed) {
  const double C = double(apply_chunk_len), Nd = double(N), nd = double(n), Rd = double(R);
  const double gemm = collapsed ? 3 * Nd + C : (Nd + C / 2) * Rd + Nd + (C + C * Rd) / 2 + Nd * (1 + Rd);
  const double factors = (per_key ? 3.0 : 1.5) * C * Nd * (collapsed ? 2.0 : Rd + 1);
  const double recurrence = Nd * nd * (2 * Rd + 3);
  return gemm * nd / rate_gemm + factors / rate_factors < recurrence / rate_recurrence;
}

/// The tiles' choice for one chunk's summary (Qeff, Meff, Keff, Phi): the recurrence on the N + C
/// identity columns [I_N | 0] and [0 | I_C] (summarize_by_recurrence) against the chunked factors
/// and the summary's four products (summarize), by multiply-adds per token weighted as in
/// chunk_pays. RWKV-7's heads (N = C = 64, rank 1, a decay per key, whose pair matrices need the
/// sub-blocks) take the recurrence; Gated DeltaNet's (N = 128, a decay per head) the chunked form.
inline bool summary_by_recurrence_pays(Index N, Index C, Index R, bool per_key) {
  const double Cd = double(C), Nd = double(N), Rd = double(R);
  const double factors = (per_key ? 3.0 : 1.5) * Cd * Nd * (Rd + 1);
  const double products = 4 * Nd * Cd * std::max(Rd, 1.0);
  const double recurrence = Nd * (Nd + Cd) * (2 * Rd + 3);
  return recurrence / rate_recurrence < factors / rate_factors + products / rate_gemm;
}

/// One head's lower-triangular L x L matrix (see the header): per-chunk summaries, and per row
/// block the part computed so far, both on first use.
template <class T>
class head_matrix {
 public:
  head_matrix(const Transition<T>& n, Index L, Index h)
      : hv_(n, h), L_(L), nb_((L + chunk_len - 1) / chunk_len), ns_(nb_ / super_chunks), sums_(std::size_t(nb_)),
        supers_(std::size_t(ns_)), once_(new std::once_flag[std::size_t(std::max<Index>(nb_ + ns_, 1))]),
        rows_(std::size_t(nb_)) {
    for (auto& r : rows_) r = std::make_unique<row_panel>();
  }

  /// H[i0:i1, j0:j1] into out.
  void block(Index i0, Index i1, Index j0, Index j1, tile<T> out) const {
    for (Index ib = i0 / chunk_len; ib * chunk_len < i1; ++ib) {
      const Index b0 = ib * chunk_len, b1 = std::min(L_, b0 + chunk_len);
      const Index r0 = std::max(i0, b0), r1 = std::min(i1, b1), s1 = std::max(j0, std::min(j1, b1));
      const row_panel* p = j0 < s1 ? &panel(ib, j0 / chunk_len) : nullptr;  // columns past b1: zeros
      for (Index t = r0; t < r1; ++t) {
        T* dst = out.row(t - i0);
        for (Index s = j0; s < s1;) {  // tile by tile
          const Index jb = s / chunk_len, e = std::min(s1, std::min(b1, (jb + 1) * chunk_len));
          Index ld = 0;
          const T* src = tile_of(*p, ib, jb, ld) + (t - b0) * ld + (s - jb * chunk_len);
          std::copy(src, src + (e - s), dst + (s - j0));
          s = e;
        }
        std::fill(dst + (s1 - j0), dst + (j1 - j0), T(0));
      }
    }
  }

 private:
  struct row_panel {
    std::mutex mu;
    Index low = -1;  // the leftmost column chunk computed; -1: none yet
    Index phi = 0;   // R = Qeff_I Phi_{I-1} ... Phi_{phi} (phi = I: Qeff_I)
    rmat<T> R, next;  // (rows, N)
    std::vector<std::vector<T>> tiles;   // tiles[J], J in the row block's own superblock: (rows, C) or (rows, rows)
    std::vector<std::vector<T>> strips;  // strips[s], superblocks to the left: (rows, super_chunks C)
  };

  /// Tile (ib, jb) of a computed panel and its row stride.
  const T* tile_of(const row_panel& p, Index ib, Index jb, Index& ld) const {
    const Index own = ib / super_chunks * super_chunks;
    if (jb >= own) {
      ld = jb == ib ? std::min(L_, (ib + 1) * chunk_len) - ib * chunk_len : chunk_len;
      return p.tiles[std::size_t(jb - own)].data();
    }
    ld = super_chunks * chunk_len;
    return p.strips[std::size_t(jb / super_chunks)].data() + (jb % super_chunks) * chunk_len;
  }

  const chunk_summary<T>& summary(Index jb) const {
    std::call_once(once_[std::size_t(jb)], [&] {
      const Index t0 = jb * chunk_len, C = std::min(chunk_len, L_ - t0);
      chunk_factors<T> f;
      const bool recurrence = chunk_tuning::force < 0 ||
                              (chunk_tuning::force == 0 && summary_by_recurrence_pays(hv_.N, C, hv_.R, hv_.n->per_key()));
      if (!recurrence && f.compute(hv_, t0, C)) summarize(f, sums_[std::size_t(jb)]);
      else summarize_by_recurrence(hv_, t0, C, sums_[std::size_t(jb)]);
    });
    return sums_[std::size_t(jb)];
  }

  /// Superblock sb's product and state, accumulated from its last chunk leftwards:
  /// Q = Phi_e, column block e - 1 = Q Keff_{e-1}, Q <- Q Phi_{e-1}, ..., Phi^ = Q Phi_b.
  const super_summary<T>& super(Index sb) const {
    std::call_once(once_[std::size_t(nb_ + sb)], [&] {
      constexpr Index MR = gemm_mr<T>;
      const Index N = hv_.N, C = chunk_len, W = super_chunks * C, b = sb * super_chunks, e = b + super_chunks - 1;
      rmat<T> K(N, W), Q = summary(e).Phi, next(N, N);
      K.rightCols(C) = summary(e).Keff;  // column block e: Keff_e
      for (Index j = e - 1; j >= b; --j) {
        mul_packed(N, C, N, Q.data(), N, summary(j).Keff_p.data(), MR * N, K.data() + (j - b) * C, W, true);
        mul_packed(N, N, N, Q.data(), N, summary(j).Phi_p.data(), MR * N, next.data(), N, true);
        Q.swap(next);
      }
      super_summary<T>& s = supers_[std::size_t(sb)];
      s.K_p.resize(std::size_t(gemm_padded_rows<T>(W) * N));
      s.Phi_p.resize(std::size_t(gemm_padded_rows<T>(N) * N));
      gemm_pack_a_t(K.data(), W, W, N, s.K_p.data());
      gemm_pack_a_t(Q.data(), N, N, N, s.Phi_p.data());
    });
    return supers_[std::size_t(sb)];
  }

  /// Row block ib with at least its tiles [jb, ib] computed, kept while the evaluator lives (in
  /// 16 KiB tiles and superblock strips: reused heap memory rather than fresh pages on a repeated
  /// evaluation). Leftwards from the diagonal: chunk by chunk inside the row block's own
  /// superblock, then a superblock at a time, R <- R Phi^ (N / (4 C) of the tiles' products
  /// instead of N / C).
  const row_panel& panel(Index ib, Index jb) const {
    constexpr Index MR = gemm_mr<T>;
    row_panel& p = *rows_[std::size_t(ib)];
    std::lock_guard<std::mutex> lock(p.mu);
    const Index rows = std::min(L_, (ib + 1) * chunk_len) - ib * chunk_len, N = hv_.N;
    const Index own = ib / super_chunks * super_chunks, W = super_chunks * chunk_len;
    if (p.low < 0) {
      const chunk_summary<T>& s = summary(ib);
      p.tiles.resize(std::size_t(ib - own + 1));
      p.strips.resize(std::size_t(own / super_chunks));
      p.tiles[std::size_t(ib - own)].assign(s.Meff.data(), s.Meff.data() + rows * rows);
      p.R = s.Qeff;
      p.next.resize(rows, N);
      p.phi = p.low = ib;
    }
    auto advance = [&](const std::vector<T>& phi_p) {  // R <- R Phi
      mul_packed(rows, N, N, p.R.data(), N, phi_p.data(), MR * N, p.next.data(), N, true);
      p.R.swap(p.next);
    };
    while (p.low > jb) {
      if (p.low > own) {  // a tile of the own superblock
        const Index J = p.low - 1;
        for (; p.phi > J + 1; --p.phi) advance(summary(p.phi - 1).Phi_p);
        std::vector<T>& t = p.tiles[std::size_t(J - own)];
        t.resize(std::size_t(rows * chunk_len));
        mul_packed(rows, chunk_len, N, p.R.data(), N, summary(J).Keff_p.data(), MR * N, t.data(), chunk_len, true);
        p.low = J;
      } else {  // a strip of the superblock to the left
        const Index sb = p.low / super_chunks - 1;
        while (p.phi > p.low) {  // R up to the superblock's right edge
          if (p.phi <= own) advance(super(p.phi / super_chunks - 1).Phi_p), p.phi -= super_chunks;
          else advance(summary(p.phi - 1).Phi_p), --p.phi;
        }
        std::vector<T>& st = p.strips[std::size_t(sb)];
        st.resize(std::size_t(rows * W));
        mul_packed(rows, W, N, p.R.data(), N, super(sb).K_p.data(), MR * N, st.data(), W, true);
        p.low = sb * super_chunks;
      }
    }
    return p;
  }

  head_view<T> hv_;
  Index L_, nb_, ns_;
  mutable std::vector<chunk_summary<T>> sums_;
  mutable std::vector<super_summary<T>> supers_;
  std::unique_ptr<std::once_flag[]> once_;
  std::vector<std::unique_ptr<row_panel>> rows_;
};

/// The head matrix of (node, head), shared by every evaluator of that head alive at the same time
/// (tile.hpp's shared_while_held, keyed by the node and its coefficients' storage).
template <class T>
std::shared_ptr<head_matrix<T>> shared_head_matrix(const Transition<T>& n, Index L, Index h) {
  using key = std::tuple<const void*, Index, Index, const void*, const void*, const void*, const void*, const void*>;
  return shared_while_held<head_matrix<T>>(key{&n, h, L, n.q().data(), n.k().data(), n.lambda().data(), n.a().data(), n.b().data()},
                                           [&] { return std::make_shared<head_matrix<T>>(n, L, h); });
}

/// apply_head's defaults: the input read in place, the outputs left as they are.
struct read_in_place {
  template <class T>
  bool operator()(Index, Index, T*) const {
    return false;
  }
};
struct no_finish {
  template <class T>
  void operator()(Index, Index, const T*, Index) const {}
};

template <class T, class Shape = read_in_place, class Finish = no_finish>
void apply_head(const Transition<T>& n, Index L, Index h, Index ldx, Index ldy, Index j, Index np, const T* x, T* y,
                Shape&& shape = {}, Finish&& finish = {});

/// Whether apply runs a head of np channels by the recurrence throughout, decided before any
/// chunk's factors: forced, or (at R > 0) when not even collapsed writes, the cheaper case, would
/// make the chunked form pay.
template <class T>
bool recurrence_only(const Transition<T>& n, Index np) {
  return chunk_tuning::force < 0 ||
         (chunk_tuning::force == 0 && n.rank() > 0 && !chunk_pays(n.state(), np, n.rank(), n.per_key(), true));
}

/// Whether every head the slab's channels [c0, c0 + nc) meet runs the recurrence throughout.
template <class T>
bool scans_only(const Transition<T>& n, Index c0, Index nc) {
  bool all = true;
  for_heads(n, c0, nc, [&](Index, Index, Index np) { all = all && recurrence_only(n, np); });
  return all;
}

/// y = H x on the slab's channels (x, y rows ldx and ldy entries apart): every head it meets by
/// apply_head, or, when each of them runs the recurrence throughout, all of them in one scan
/// (scan_forward_heads: their rows of a token share pages). done(t_lo, t_hi) is called once on every
/// token, after all the slab's outputs of those tokens are written: block by block in the scan,
/// at the end otherwise.
template <class T, class Done = transition_detail::no_block_hook>
void apply_slab(const Transition<T>& n, Index L, Index c0, Index nc, Index ldx, Index ldy, const T* x, T* y,
                Done&& done = {}) {
  std::vector<std::tuple<Index, Index, Index>> heads;  // (h, j, np)
  for_heads(n, c0, nc, [&](Index h, Index j, Index np) { heads.emplace_back(h, j, np); });
  if (!scans_only(n, c0, nc) || heads.empty()) {
    for (const auto& [h, j, np] : heads) apply_head(n, L, h, ldx, ldy, j, np, x, y);
    if (L > 0) done(Index(0), L);
    return;
  }
  std::vector<head_view<T>> hv;
  std::vector<workspace<T>> ws;
  for (const auto& [h, j, np] : heads) hv.emplace_back(n, h), ws.emplace_back(n.state(), n.rank(), np);
  scan_forward_heads(hv.data(), ws.data(), Index(heads.size()), 0, 0, L,
                     [&](Index k, Index t) { return x + t * ldx + std::get<1>(heads[std::size_t(k)]); },
                     [&](Index k, Index t) { return y + t * ldy + std::get<1>(heads[std::size_t(k)]); }, done);
}

/// y = H x for one head's np channels (x, y: the columns j.. of rows ldx and ldy entries apart):
/// chunk by chunk, chunked or by the recurrence, on one state; once the recurrence is chosen for
/// the head, the rest of its tokens in one scan. With hooks, chunk by chunk throughout: before the
/// chunk of tokens [t0, t1), shape(t0, t1, buf) may write the head's input rows into buf (np apart;
/// true: they are read from there, false: from x); once its outputs are written,
/// finish(t0, t1, in, ld) with in the input rows the chunk read (ld apart), while they and the
/// outputs are in cache.
template <class T, class Shape, class Finish>
void apply_head(const Transition<T>& n, Index L, Index h, Index ldx, Index ldy, Index j, Index np, const T* x, T* y,
                Shape&& shape, Finish&& finish) {
  constexpr bool hooked = !(std::is_same_v<std::decay_t<Shape>, read_in_place> && std::is_same_v<std::decay_t<Finish>, no_finish>);
  const head_view<T> hv(n, h);
  const Index N = hv.N, R = hv.R;
  const T* xb = x + j;  // the input row of token xt is xb, rows xld apart
  Index xld = ldx, xt = 0;
  std::optional<scratch<T>> shaped;
  auto xrow = [&](Index t) { return xb + (t - xt) * xld; };
  auto yrow = [&](Index t) { return y + t * ldy + j; };
  auto take_input = [&](Index t0, Index t1) {  // the hooked form's input rows of one chunk
    if constexpr (hooked) {
      if (!shaped) shaped.emplace(apply_chunk_len * np);
      if (shape(t0, t1, shaped->data())) xb = shaped->data(), xld = np, xt = t0;
      else xb = x + j, xld = ldx, xt = 0;
    }
  };
  int chunked = recurrence_only(n, np) ? -1 : chunk_tuning::force;  // 0: decided at the first chunk the form takes
  if (chunked < 0 && !hooked) {  // the recurrence throughout
    workspace<T> ws(N, R, np);
    scan_forward(hv, 0, 0, L, ws, xrow, yrow);
    return;
  }
  const Index zrows = N + apply_chunk_len * (1 + R);
  std::optional<workspace<T>> ws;  // the recurrence's state and scratch, when a chunk needs it
  const scratch<T> z(zrows * np), pk(gemm_padded_rows<T>(np) * zrows);  // [S; V; U] and its packing
  std::fill(z.data(), z.data() + N * np, T(0));
  bool in_ws = false;  // the state is ws->Y after the recurrence, else z's first N rows
  chunk_factors<T> f;
  for (Index t0 = 0; t0 < L; t0 += apply_chunk_len) {
    const Index C = std::min(apply_chunk_len, L - t0);
    take_input(t0, t0 + C);
    const bool ok = chunked >= 0 && f.compute(hv, t0, C);
    if (ok && chunked == 0) chunked = chunk_pays(N, np, R, n.per_key(), f.vc == 0 && f.nu > 0) ? 1 : -1;
    if (ok && chunked > 0) {
      for (Index t = t0 + C; t < std::min(L, t0 + 2 * C); ++t) {  // the next chunk's rows, meanwhile
        prefetch_l1(hv.q(t), N), prefetch_l1(hv.k(t), N);
        if (R > 0) prefetch_l1(hv.a(t), R * N), prefetch_l1(hv.b(t), R * N);
      }
      if (in_ws) std::copy(ws->Y.begin(), ws->Y.end(), z.data());
      if (chunk_apply(f, z.data(), np, xrow(t0), xld, pk.data(), yrow(t0), ldy)) {
        in_ws = false;
        if constexpr (hooked) finish(t0, t0 + C, xrow(t0), xld);
        continue;
      }
    }
    if (!ws) ws.emplace(N, R, np);
    if (!in_ws) {  // the state from z, and the projections a_{t0,r}^T S the scan reads first
      std::copy_n(z.data(), N * np, ws->Y.begin());
      if (R > 0 && t0 > 0) {
        std::fill(ws->w.begin(), ws->w.begin() + R * np, T(0));
        for (Index r = 0; r < R; ++r) combine_rows(ws->w.data() + r * np, np, N, hv.a(t0) + r * N, z.data());
      }
      in_ws = true;
    }
    // the recurrence chosen for the head: the rest of its tokens in one scan (hooked: this chunk's)
    const Index t1 = chunked < 0 && !hooked ? L : t0 + C;
    scan_forward(hv, 0, t0, t1, *ws, xrow, yrow);
    if constexpr (hooked) finish(t0, t1, xrow(t0), xld);
    if (chunked < 0 && !hooked) return;
  }
}

/// Asks for entries [c0, c0 + nc) of token t's rows of the factors a finishing pass reads (the post
/// factors and the skip) and, with inputs, of the input scalings (prefetch_scan; constant ones have
/// no rows).
template <class T>
void prefetch_factor_rows(const row_ops<T>& sc, Index t, Index c0, Index nc, bool inputs) {
  auto ask = [&](const diag_ref<T>& f) {
    if (!f.constant) prefetch_scan(f.row(t) + c0, nc);
  };
  if (inputs) {
    for (const diag_ref<T>& f : sc.pre) ask(f);
    for (const conv_term<T>& c : sc.conv_sum) ask(c.scale);
  }
  for (const diag_ref<T>& f : sc.post) ask(f);
  if (sc.skip) ask(*sc.skip);
}

}  // namespace transition_detail

template <class T>
struct slab_eval<Transition<T>> {
  /// y = H x on channels [c0, c0 + nc): every head the slab meets, chunk by chunk.
  static void apply(const Transition<T>& n, const context& cx, Index c0, Index nc, const T* x, T* y) {
    transition_detail::apply_slab(n, cx.L, c0, nc, nc, nc, x, y);
  }
  /// y = post * (H (pre * x)): x and y rows sc.ldx and sc.ldy apart (the caller's (L, D) matrices
  /// when apply_slabs hands them over: streams_rows_v below), an input shaped by pre or conv formed
  /// in a slab first, the post factors applied to the finished rows.
  static void apply_scaled(const Transition<T>& n, const context& cx, Index c0, Index nc, const T* x, T* y,
                           const row_ops<T>& sc) {
    const Index ldy = sc.y_stride(nc);
    Index ldx = sc.x_stride(nc);
    if ((sc.shapes_input() || !sc.post.empty() || sc.skip) && !transition_detail::scans_only(n, c0, nc)) {
      // head by head, each chunk's input shaped and its outputs finished while they are in cache
      transition_detail::for_heads(n, c0, nc, [&](Index h, Index j, Index np) {
        transition_detail::apply_head(
            n, cx.L, h, ldx, ldy, j, np, x, y,
            [&](Index t0, Index t1, T* buf) {
              for (Index t = t1; t < std::min(cx.L, 2 * t1 - t0); ++t) {  // the next chunk's rows, meanwhile
                transition_detail::prefetch_factor_rows(sc, t, c0 + j, np, true);
                transition_detail::prefetch_scan(x + t * ldx + j, np);
              }
              if (!sc.shapes_input()) return false;
              for (Index t = t0; t < t1; ++t) {
                T* row = buf + (t - t0) * np;
                shape_row(sc, t, c0 + j, np, x + j, ldx, row);
              }
              return true;
            },
            [&](Index t0, Index t1, const T* in, Index ld) {
              for (Index t = t0; t < t1; ++t) finish_row(&sc, t, c0 + j, np, y + t * ldy + j, in + (t - t0) * ld);
            });
      });
      return;
    }
    std::optional<scratch<T>> tmp;
    if (sc.shapes_input()) {
      tmp.emplace(cx.L * nc);
      for (Index t = 0; t < cx.L; ++t) {
        T* row = tmp->data() + t * nc;
        const T* in = input_row(&sc, t, c0, nc, x, row);
        if (in != row) std::copy(in, in + nc, row);
      }
      x = tmp->data(), ldx = nc;
    }
    if (sc.post.empty() && !sc.skip) return transition_detail::apply_slab(n, cx.L, c0, nc, ldx, ldy, x, y);
    transition_detail::apply_slab(n, cx.L, c0, nc, ldx, ldy, x, y, [&](Index t_lo, Index t_hi) {
      for (Index t = t_hi; t < std::min(cx.L, 2 * t_hi - t_lo); ++t)  // the next block's rows
        transition_detail::prefetch_factor_rows(sc, t, c0, nc, false);
      for (Index t = t_lo; t < t_hi; ++t) finish_row(&sc, t, c0, nc, y + t * ldy, x + t * ldx);
    });
  }
  /// y = H^T x: the anti-causal transposed scan of every head the slab meets.
  static void apply_t(const Transition<T>& n, const context& cx, Index c0, Index nc, const T* x, T* y) {
    transition_detail::for_heads(n, c0, nc, [&](Index h, Index j, Index np) {
      transition_detail::workspace<T> ws(n.state(), n.rank(), np);
      transition_detail::scan_backward(
          transition_detail::head_view<T>(n, h), cx.L, ws, [&](Index t) { return x + t * nc + j; },
          [&](Index t) { return y + t * nc + j; });
    });
  }
};

/// A Transition reads each row of x and writes each row of y only inside its token loops (every
/// head's scan or chunks, rows ldx and ldy apart) and its finishing pass, so apply_slabs hands it
/// (and a chain around it) the caller's (L, D) matrices instead of copying slabs in and out
/// (product.hpp's streams_rows); its finishing pass adds a sum's diagonal (row_ops::skip).
template <class T>
inline constexpr bool streaming_core_v<T, Transition<T>> = true;
template <class T>
inline constexpr bool takes_skip_v<T, Transition<T>> = true;

template <class T>
struct channel_eval<Transition<T>, T> {
  std::shared_ptr<transition_detail::head_matrix<T>> m;
  channel_eval(const Transition<T>& n, const context& cx, Index c)
      : m(transition_detail::shared_head_matrix(n, cx.L, n.head_of(c))) {}
  void block(Index i0, Index i1, Index j0, Index j1, tile<T> out) const { m->block(i0, i1, j0, j1, out); }
};

}  // namespace iattn::cpu_detail
