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
    using simd::pack;
    const Index nb = (L + tile_size - 1) / tile_size;
    ct_.resize(L, N);
    bt_.resize(L, N);
    fac_.resize(L, Nd);
    blk_.resize(nb, Nd);
    first_.resize(nb, Nd);
    std::vector<T> acc(static_cast<std::size_t>(Nd)), f(static_cast<std::size_t>(Nd));
    for (Index t = 0; t < L; ++t)
      for (Index m = 0; m < Nd; ++m) fac_(t, m) = Policy::factor(simd::pack<T, 1>{decay.row(t)[m]}).v;
    auto scale_row = [&](T* dst, const T* src) {  // dst[m] = src[m] * factor(acc[m or 0])
      for (Index m = 0; m < Nd; ++m) f[m] = Policy::factor(simd::pack<T, 1>{acc[m]}).v;
      for (Index m = 0; m < N; ++m) dst[m] = (src ? src[m] : T(1)) * f[Nd == 1 ? 0 : m];
    };
    for (Index b = 0; b < nb; ++b) {
      const Index b0 = b * tile_size, b1 = std::min(L, b0 + tile_size);
      // Ct, forward from the block start.
      std::fill(acc.begin(), acc.end(), Policy::template neutral<T>());
      for (Index t = b0; t < b1; ++t) {
        if (!strict_ && t > b0) combine_into(acc, decay.row(t));
        scale_row(ct_.data() + t * N, out_.p ? out_.row(t) : nullptr);
        if (strict_) combine_into(acc, decay.row(t));
      }
      // Bt, backward from the block end.
      std::fill(acc.begin(), acc.end(), Policy::template neutral<T>());
      for (Index s = b1 - 1; s >= b0; --s) {
        scale_row(bt_.data() + s * N, in_.row(s));
        combine_into(acc, decay.row(s));
      }
      for (Index m = 0; m < Nd; ++m) {
        blk_(b, m) = acc[m];
        first_(b, m) = decay.row(b0)[m];
      }
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
  void combine_into(std::vector<T>& acc, const T* d) const {
    for (Index m = 0; m < Nd_; ++m) acc[std::size_t(m)] = Policy::combine(simd::pack<T, 1>{acc[std::size_t(m)]}, simd::pack<T, 1>{d[m]}).v;
  }

  // Rows [r0, r1) of block bi, columns [q0, q1) of block bj < bi.
  void off_diagonal(Index bi, Index bj, Index r0, Index r1, Index q0, Index q1, tile<T> sub) const {
    Eigen::Matrix<T, 1, Eigen::Dynamic> mid(Nd_);
    for (Index m = 0; m < Nd_; ++m) {
      auto acc = simd::pack<T, 1>{strict_ ? Policy::template neutral<T>() : first_(bi, m)};
      for (Index b = bi - 1; b > bj; --b) acc = Policy::combine(acc, simd::pack<T, 1>{blk_(b, m)});
      mid[m] = Policy::factor(acc).v;
    }
    Eigen::Map<const Matrix<T>> ct(ct_.data() + r0 * N_, r1 - r0, N_);
    Eigen::Map<const Matrix<T>> bt(bt_.data() + q0 * N_, q1 - q0, N_);
    auto dst = sub.map();
    if (Nd_ == 1) {
      dst.noalias() = (mid[0] * ct) * bt.transpose();
    } else {
      Matrix<T> scaled = ct * mid.asDiagonal();
      dst.noalias() = scaled * bt.transpose();
    }
  }

  // Rows [r0, r1) and columns [q0, q1) inside one diagonal block: running products.
  void diagonal(Index r0, Index r1, Index q0, Index q1, tile<T> sub) const {
    sub.set_zero();
    std::vector<T> acc(static_cast<std::size_t>(N_));
    for (Index s = q0; s < q1; ++s) {
      const T* Bs = in_.row(s);
      std::fill(acc.begin(), acc.end(), T(1));
      for (Index t = s; t < r1; ++t) {
        const T* Ct = out_.p ? out_.row(t) : nullptr;
        T v;
        if (t == s) {
          if (strict_) {
            v = 0;
            if (bonus_)
              for (Index m = 0; m < N_; ++m) v += (Ct ? Ct[m] : T(1)) * bonus_[m] * Bs[m];
          } else {
            v = dot(Ct, acc.data(), Bs);
          }
        } else {
          if (!strict_) scale(acc.data(), fac_.row(t).data());
          v = dot(Ct, acc.data(), Bs);
          if (strict_) scale(acc.data(), fac_.row(t).data());
        }
        if (t >= r0) sub(t - r0, s - q0) = v;
      }
    }
  }
  // acc[m] *= fac[m or 0]
  void scale(T* acc, const T* fac) const {
    if (Nd_ == 1) {
      const auto f = fac[0];
      simd::for_packs<T>(N_, [&](auto w, Index m) {
        using P = simd::pack<T, decltype(w)::value>;
        (P::load(acc + m) * P::broadcast(f)).store(acc + m);
      });
    } else {
      simd::for_packs<T>(N_, [&](auto w, Index m) {
        using P = simd::pack<T, decltype(w)::value>;
        (P::load(acc + m) * P::load(fac + m)).store(acc + m);
      });
    }
  }
  // sum_m C[m] acc[m] B[m], C == nullptr meaning ones.
  T dot(const T* C, const T* acc, const T* B) const {
    T v = 0;
    simd::for_packs<T>(N_, [&](auto w, Index m) {
      using P = simd::pack<T, decltype(w)::value>;
      const P c = C ? P::load(C + m) : P::broadcast(T(1));
      v += reduce_add(c * P::load(acc + m) * P::load(B + m));
    });
    return v;
  }

  Index L_, N_, Nd_;
  bool strict_;
  strided<T> in_, out_;
  const T* bonus_;
  Matrix<T> ct_, bt_, fac_, blk_, first_;
};

}  // namespace iattn::cpu_detail
