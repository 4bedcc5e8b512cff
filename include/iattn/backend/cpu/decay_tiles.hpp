// iattn/backend/cpu/decay_tiles.hpp: the tile engine shared by Semiseparable and LinearRecurrence.
//
// For one channel it evaluates H[t, s] = sum_m C_t[m] * E(s+1..t)[m] * B_s[m] (s <= t), where
// E(i..j) is the decay accumulated over tokens i..j (exp of a sum of log-decays, or a product of
// linear decays), and the strict form sum_m C_t[m] E(s+1..t-1)[m] B_s[m], diagonal C_t bonus B_t.
//
// Stable block form (docs/design.md section 5). Tokens are cut into blocks of `tile_size`. For a tile of
// row block I = [i0, i1) strictly below column block J = [j0, j1):
//   H[I, J] = Ct_I * diag(mid) * Bt_J^T                                  (a rank-N GEMM)
//   Ct[t] = C_t E(i0+1..t),  Bt[s] = B_s E(s+1..j1-1),  mid = E(j1..i0)   (inclusive)
//   Ct[t] = C_t E(i0..t-1),  Bt[s] = B_s E(s+1..j1-1),  mid = E(j1..i0-1) (strict)
// Every E is accumulated forward or backward from a block edge, never as a quotient or a
// difference of cumulative sums: log-decays are only summed and exp arguments are <= 0 when the
// log-decays are; lambda = -inf (or a = 0) gives exactly 0. Diagonal blocks are computed directly
// with running products of the per-token decays (at most tile_size factors).
#pragma once

#include "gemm.hpp"
#include "simd.hpp"
#include "tile.hpp"

#include <cmath>

namespace iattn::cpu_detail {

/// Decays given as logarithms (Semiseparable): combined by +, turned into factors by exp.
struct log_decay {
  template <class T>
  static T neutral() { return T(0); }
  template <class P>
  static P combine(P a, P b) { return a + b; }
  template <class P>
  static P factor(P a) { return exp(a); }
};
/// Decays given as factors (LinearRecurrence): combined by *, used as they are.
struct linear_decay {
  template <class T>
  static T neutral() { return T(1); }
  template <class P>
  static P combine(P a, P b) { return a * b; }
  template <class P>
  static P factor(P a) { return a; }
};

/// Strided read access to one channel's coefficients: element (t, m) at p[t*stride + m].
template <class T>
struct strided {
  const T* p = nullptr;
  Index stride = 0;
  const T* row(Index t) const { return p + t * stride; }
};

template <class T, class Policy>
class decay_tiles {
 public:
  /// decay: (L, Nd) with Nd in {N, 1}; in = B (L, N); out = C (L, N), or p == nullptr for C = 1
  /// (N must then be 1); bonus: N values or nullptr.
  decay_tiles(Index L, Index N, Index Nd, bool strict, strided<T> decay, strided<T> in, strided<T> out, const T* bonus)
      : L_(L), N_(N), Nd_(Nd), strict_(strict), in_(in), out_(out), bonus_(bonus) {
    const Index nb = (L + tile_size - 1) / tile_size;
    ct_.resize(L, N);
    bt_.resize(L, N);
    fac_.resize(L, Nd);
    blk_.resize(nb, Nd);
    first_.resize(nb, Nd);
    // The accumulated decays of Ct and Bt (log sums or products), turned into factors afterwards
    // in one vectorised pass over the whole table, as fac_ is.
    Matrix<T> ect(L, Nd), ebt(L, Nd);
    std::vector<T> acc(static_cast<std::size_t>(Nd));
    for (Index t = 0; t < L; ++t) std::copy(decay.row(t), decay.row(t) + Nd, fac_.data() + t * Nd);
    for (Index b = 0; b < nb; ++b) {
      const Index b0 = b * tile_size, b1 = std::min(L, b0 + tile_size);
      // Ct, forward from the block start.
      std::fill(acc.begin(), acc.end(), Policy::template neutral<T>());
      for (Index t = b0; t < b1; ++t) {
        if (!strict_ && t > b0) combine_into(acc.data(), decay.row(t));
        std::copy(acc.begin(), acc.end(), ect.data() + t * Nd);
        if (strict_) combine_into(acc.data(), decay.row(t));
      }
      // Bt, backward from the block end.
      std::fill(acc.begin(), acc.end(), Policy::template neutral<T>());
      for (Index s = b1 - 1; s >= b0; --s) {
        std::copy(acc.begin(), acc.end(), ebt.data() + s * Nd);
        combine_into(acc.data(), decay.row(s));
      }
      for (Index m = 0; m < Nd; ++m) {
        blk_(b, m) = acc[std::size_t(m)];
        first_(b, m) = decay.row(b0)[m];
      }
    }
    to_factors(fac_.data(), L * Nd);
    to_factors(ect.data(), L * Nd);
    to_factors(ebt.data(), L * Nd);
    // dst[m] = src[m] * f[m or 0], src == nullptr meaning ones.
    auto scale_row = [&](T* dst, const T* src, const T* f) {
      if (Nd == 1) {
        for (Index m = 0; m < N; ++m) dst[m] = (src ? src[m] : T(1)) * f[0];
      } else {
        simd::for_packs<T>(N, [&](auto w, Index m) {
          using P = simd::pack<T, decltype(w)::value>;
          ((src ? P::load(src + m) : P::broadcast(T(1))) * P::load(f + m)).store(dst + m);
        });
      }
    };
    for (Index t = 0; t < L; ++t) {
      scale_row(ct_.data() + t * N, out_.p ? out_.row(t) : nullptr, ect.data() + t * Nd);
      scale_row(bt_.data() + t * N, in_.row(t), ebt.data() + t * Nd);
    }
  }

  /// H[i0:i1, j0:j1] into out.
  void block(Index i0, Index i1, Index j0, Index j1, tile<T> out) const {
    for (Index bi = i0 / tile_size; bi * tile_size < i1; ++bi) {
      const Index r0 = std::max(i0, bi * tile_size), r1 = std::min(i1, (bi + 1) * tile_size);
      for (Index bj = j0 / tile_size; bj * tile_size < j1; ++bj) {
        const Index q0 = std::max(j0, bj * tile_size), q1 = std::min(j1, (bj + 1) * tile_size);
        tile<T> sub = out.sub(r0 - i0, q0 - j0, r1 - r0, q1 - q0);
        if (bj > bi)
          sub.set_zero();
        else if (bj < bi)
          off_diagonal(bi, bj, r0, r1, q0, q1, sub);
        else
          diagonal(r0, r1, q0, q1, sub);
      }
    }
  }

 private:
  // acc[m] = combine(acc[m], d[m]) for m < Nd.
  void combine_into(T* acc, const T* d) const {
    for (Index m = 0; m < Nd_; ++m) acc[m] = Policy::combine(simd::pack<T, 1>{acc[m]}, simd::pack<T, 1>{d[m]}).v;
  }
  // p[i] = Policy::factor(p[i]) for i < n.
  static void to_factors(T* p, Index n) {
    simd::for_packs<T>(n, [&](auto w, Index i) {
      using P = simd::pack<T, decltype(w)::value>;
      Policy::factor(P::load(p + i)).store(p + i);
    });
  }

  // Rows [r0, r1) of block bi, columns [q0, q1) of block bj < bi: Ct diag(mid) Bt^T, with Bt's rows
  // packed for the product kernel (gemm.hpp) and scaled by mid there, Ct's rows read in place.
  void off_diagonal(Index bi, Index bj, Index r0, Index r1, Index q0, Index q1, tile<T> sub) const {
    gemm_scratch<T>& s = gemm_thread_scratch<T>();
    T* mid = sized(s.aux, Nd_);
    for (Index m = 0; m < Nd_; ++m) {
      auto acc = simd::pack<T, 1>{strict_ ? Policy::template neutral<T>() : first_(bi, m)};
      for (Index b = bi - 1; b > bj; --b) acc = Policy::combine(acc, simd::pack<T, 1>{blk_(b, m)});
      mid[m] = Policy::factor(acc).v;
    }
    const Index nq = q1 - q0;
    T* ap = sized(s.ap, gemm_padded_rows<T>(nq) * N_);
    gemm_pack_a(bt_.data() + q0 * N_, N_, nq, N_, ap);
    if (Nd_ > 1) gemm_scale_packed(ap, nq, N_, mid);
    sub.set_zero();
    gemm_tile_add(nq, r1 - r0, N_, ap, gemm_mr<T> * N_, ct_.data() + r0 * N_, N_, sub.data, sub.stride,
                  Nd_ == 1 ? mid[0] : T(1));
  }

  // Rows [r0, r1) and columns [q0, q1) inside one diagonal block: running products, vectorised
  // across columns. A group of W consecutive columns s (the lanes) keeps, per state m, the running
  // product acc[m] = E(s+1..t)[m] (inclusive) or E(s+1..t-1)[m] (strict) as one pack, restarted at
  // 1 in every lane with s >= t, so each lane multiplies the same per-token factors in the same
  // order as a scalar loop over t would: no quotient, a factor 0 gives exact zeros. Per row t:
  //   inclusive: acc = (s < t ? acc * fac_t : 1);  v = sum_m C_t[m] acc[m] B_s[m]  (s <= t, else 0)
  //   strict:    v = sum_m C_t[m] acc[m] B_s[m] (s < t), sum_m C_t[m] bonus[m] B_t[m] (s == t),
  //              0 (s > t);  then acc = (s < t ? acc * fac_t : 1)
  // and v is one pack store into the tile row. Rows t < r0 advance acc and store nothing. The sum
  // over m runs in four partial sums (the FMA latency, not the throughput, bounds one). Columns
  // left over after the full groups form one partial group (lanes past q1 see B = 0 and are not
  // stored), not W - 1 single columns: tiles widened by a convolution (K - 1 extra columns) would
  // otherwise spend more time in their few tail columns than in the whole triangle.
  void diagonal(Index r0, Index r1, Index q0, Index q1, tile<T> sub) const {
    constexpr int W = simd::width<T>;
    using P = simd::pack<T, W>;
    std::vector<T> buf(static_cast<std::size_t>(2 * N_ * W + N_ + W));
    T* acc = buf.data();             // (N, W): acc[m * W + lane]
    T* bt = acc + N_ * W;            // (N, W): B_{s0 + lane}[m], transposed
    T* ones = bt + N_ * W;           // C = 1 when there is no C
    T* row = ones + N_;              // one row of a partial group
    std::fill(ones, ones + N_, T(1));
    const Index fs = Nd_ == 1 ? 0 : 1;  // fac_t[m * fs]
    const P one = P::broadcast(T(1)), zero = P::broadcast(T(0));
    // Row t of the group at lanes s0 + k: advance acc (before the sum when inclusive, after when
    // strict) and return the sum over m; Edge: some lane has s >= t, so lanes are masked.
    auto row_sum = [&](auto strict, auto edge, const T* Ct, const T* ft, P lane, P tp) {
      auto advance = [&](Index m, P a) {
        a = a * P::broadcast(ft[m * fs]);
        if constexpr (decltype(edge)::value) a = select_ge(lane, tp, one, a);
        a.store(acc + m * W);
        return a;
      };
      P v0 = zero, v1 = zero, v2 = zero, v3 = zero;
      auto term = [&](Index m, P& v) {
        P a = P::load(acc + m * W);
        if constexpr (!decltype(strict)::value) a = advance(m, a);
        v = fma(P::broadcast(Ct[m]) * a, P::load(bt + m * W), v);
        if constexpr (decltype(strict)::value) advance(m, a);
      };
      Index m = 0;
      for (; m + 4 <= N_; m += 4) term(m, v0), term(m + 1, v1), term(m + 2, v2), term(m + 3, v3);
      for (; m < N_; ++m) term(m, v0);
      return (v0 + v1) + (v2 + v3);
    };
    auto group = [&](auto strict, Index j, Index cnt) {  // columns q0 + j .. q0 + j + cnt, cnt <= W
      const Index s0 = q0 + j;
      for (Index k = 0; k < W; ++k) {
        const T* Bs = k < cnt ? in_.row(s0 + k) : nullptr;
        for (Index m = 0; m < N_; ++m) bt[m * W + k] = Bs ? Bs[m] : T(0);
      }
      auto put = [&](Index t, P v) {
        if (cnt == W) return v.store(sub.row(t - r0) + j);
        v.store(row);
        std::copy(row, row + cnt, sub.row(t - r0) + j);
      };
      for (Index t = r0; t < std::min(r1, s0); ++t) put(t, zero);
      const P lane = P::iota(T(0));  // lanes and rows relative to s0: exact in float at any L
      for (Index m = 0; m < N_; ++m) one.store(acc + m * W);
      for (Index t = s0; t < r1; ++t) {
        const T* Ct = out_.p ? out_.row(t) : ones;
        const T* ft = fac_.row(t).data();
        const P tp = P::broadcast(T(t - s0));
        if (t >= s0 + W) {  // every lane has s < t
          const P v = row_sum(strict, std::false_type{}, Ct, ft, lane, tp);
          if (t >= r0) put(t, v);
          continue;
        }
        P v = row_sum(strict, std::true_type{}, Ct, ft, lane, tp);
        if constexpr (decltype(strict)::value) {
          T d = 0;  // the diagonal lane s == t
          if (bonus_) {
            const T* Bt = in_.row(t);
            for (Index m = 0; m < N_; ++m) d += Ct[m] * bonus_[m] * Bt[m];
          }
          v = select_ge(lane, tp, select_ge(tp, lane, P::broadcast(d), zero), v);
        } else {
          v = select_ge(tp, lane, v, zero);
        }
        if (t >= r0) put(t, v);
      }
    };
    auto groups = [&](auto strict) {
      const Index nq = q1 - q0;
      Index j = 0;
      for (; j + W <= nq; j += W) group(strict, j, W);
      if (j < nq) group(strict, j, nq - j);
    };
    if (strict_) groups(std::true_type{});
    else groups(std::false_type{});
  }

  Index L_, N_, Nd_;
  bool strict_;
  strided<T> in_, out_;
  const T* bonus_;
  Matrix<T> ct_, bt_, fac_, blk_, first_;
};

}  // namespace iattn::cpu_detail
