// iattn/backend/cpu/wkv_mean.hpp: the channel mean of  s · diag(r) · Wkv  (RWKV-4's time mixing;
// r and s optional) as blocked products whose inner dimension runs over the channels.
//
// Blocks of b = wkv_mean_block tokens. For t in block I = [i0, i1) and s in an earlier block
// J = [j0, j1), with P_I(t) = Σ_{i0<=r<t} w_r, R_J(s) = Σ_{s<r<j1} w_r and G(J, I) = Σ_{j1<=r<i0} w_r
// (a sum of whole blocks' totals: every cumulative sum is block-relative),
//   H^c[t, s] = r_t exp(k_s + R_J(s) + G(J, I) + P_I(t) − ℓ_t) = A_t · exp(D_IJ) · B_s,
//   A_t  = r_t exp(P_I(t) − ℓ_t − α_I),     α_I = max_{t∈I} (P_I(t) − ℓ_t),
//   B_s  = exp(k_s + R_J(s) − m_J),          m_J = max_{s∈J} (k_s + R_J(s)),
//   D_IJ = G(J, I) + m_J + α_I = max_{s∈J} score[t*, s] − ℓ_{t*} <= 0   (t* the row giving α_I),
// per channel. No exponent is positive (D_IJ is clamped at 0 against rounding), and each factor
// bounds the entry, so a factor that underflows belongs to an entry smaller still. Per row block,
// the mean of those entries is one product of A_I (b × n) with the B_J scaled by exp(D_IJ)
// (gemm.hpp): L²n/2 multiply-adds for n channels, against the tile path's L²n/2 scalar exps.
// Diagonal blocks are summed directly, vectorised across channels: per (t, s) the channels'
// r_t exp(k_s + Σ_{s<r<t} w_r − ℓ_t), the decay sum running backwards from t (b/2 exps per entry
// and channel). ℓ_t is apply_t's forward pass (double), as in the tiles. A reset (w = −inf) gives
// exact zeros through the factors. The mean of |H^c| takes |r| (every other factor is positive).
#pragma once

#include "../../ops/diagonal.hpp"
#include "../../ops/product.hpp"
#include "../../ops/scaled.hpp"
#include "../../ops/wkv.hpp"
#include "gemm.hpp"
#include "parallel.hpp"
#include "simd.hpp"
#include "wkv.hpp"

#include <algorithm>
#include <cmath>
#include <type_traits>
#include <vector>

namespace iattn::cpu_detail {

/// Tokens per block of the Wkv mean.
inline constexpr Index wkv_mean_block = 16;

/// s · diag(r) · Wkv as matched in an expression (r null: no receptance).
template <class T>
struct wkv_mean_form {
  const Wkv<T>* wkv = nullptr;
  const coefficient<T>* r = nullptr;
  double scale = 1;
};

template <class T, class Node>
bool match_wkv_mean(const Node& n, wkv_mean_form<T>& f) {
  if constexpr (std::is_same_v<Node, Wkv<T>>) {
    f.wkv = &n;
    return true;
  } else if constexpr (std::is_same_v<Node, Product<Diagonal<T>, Wkv<T>>>) {
    f.r = &n.left().d();
    f.wkv = &n.right();
    return true;
  } else if constexpr (requires { n.factor(); n.inner(); }) {
    f.scale *= n.factor();
    return match_wkv_mean<T>(n.inner(), f);
  } else {
    return false;
  }
}

/// Mean over channels [c0, c1) of H^c (|H^c| with abs) for H = s · diag(r) · Wkv, (L, L).
template <class T>
Matrix<T> wkv_mean(const wkv_mean_form<T>& f, Index L, Index c0, Index c1, bool abs) {
  constexpr Index b = wkv_mean_block;
  constexpr double ninf = wkv_detail::ninf;
  Matrix<T> out = Matrix<T>::Zero(L, L);
  if (L == 0 || c1 <= c0) return out;
  const Wkv<T>& n = *f.wkv;
  const Index nb = (L + b - 1) / b, group = 64;
  const Index chunk = std::min<Index>(c1 - c0, 256);  // a block's scaled panels stay in L1
  const double scale = f.scale / double(c1 - c0);
  const T alpha = T(scale);
  std::vector<double> ell, alpha_I, m_J, tot;
  std::vector<T> Af, Bc;  // A_t rows (L, g); B_J compact and k-major: Bc[J b g + p b + r] = B_{J b + r}[p]
  const Index padded = gemm_padded_rows<T>(b);  // rows of the kernel's panels for one block
  struct scratch {
    std::vector<double> a, b, c, d;
    std::vector<T> bs, et;
  };
  std::vector<scratch> scr(static_cast<std::size_t>(max_threads()));
  auto rv = [&](Index t, Index c) -> double {
    if (!f.r) return 1.0;
    const double v = (*f.r)(f.r->rows() == 1 ? 0 : t, c);
    return abs ? std::abs(v) : v;
  };
  for (Index cc = c0; cc < c1; cc += chunk) {
    const Index g = std::min(chunk, c1 - cc);
    const auto G = std::size_t(g);
    ell.resize(std::size_t(L) * G);
    alpha_I.resize(std::size_t(nb) * G);
    m_J.resize(std::size_t(nb) * G);
    tot.resize(std::size_t(nb) * G);
    Af.resize(std::size_t(L) * G);
    Bc.resize(std::size_t(nb * b) * G);
    // ℓ, in groups of channels (apply_t's forward pass).
    parallel_for((g + group - 1) / group, [&](Index q) {
      const Index j0 = q * group;
      wkv_detail::log_norms_group(n, L, cc + j0, std::min(group, g - j0), ell.data() + j0, g);
    });
    // Per block: A, α (prefix sums forward), B, m, the total (suffix sums backward).
    parallel_for(nb, [&](Index I) {
      scratch& sc = scr[std::size_t(thread_index())];
      const Index i0 = I * b, i1 = std::min(L, i0 + b), nI = i1 - i0;
      double* v = sized(sc.a, nI * g);  // P_I(t) − ℓ_t, then k_s + R_J(s)
      double* acc = sized(sc.b, g);
      double* mx = alpha_I.data() + I * g;
      std::fill(acc, acc + g, 0.0);
      std::fill(mx, mx + g, ninf);
      for (Index t = i0; t < i1; ++t) {
        double* vt = v + (t - i0) * g;
        const double* el = ell.data() + t * g;
        for (Index j = 0; j < g; ++j) {
          vt[j] = acc[j] - el[j];
          mx[j] = std::max(mx[j], vt[j]);
          acc[j] += double(n.decay(t, cc + j));
        }
      }
      double* tb = tot.data() + I * g;
      std::copy(acc, acc + g, tb);
      for (Index t = i0; t < i1; ++t) {
        double* vt = v + (t - i0) * g;
        simd::for_packs<double>(g, [&](auto w, Index j) {
          using P = simd::pack<double, decltype(w)::value>;
          exp(P::load(vt + j) - P::load(mx + j)).store(vt + j);
        });
        T* a = Af.data() + t * g;
        for (Index j = 0; j < g; ++j) a[j] = T(rv(t, cc + j) * vt[j]);
      }
      // Backward: R_J(s) = Σ_{s<r<j1} w_r.
      double* mj = m_J.data() + I * g;
      std::fill(acc, acc + g, 0.0);
      std::fill(mj, mj + g, ninf);
      for (Index s = i1 - 1; s >= i0; --s) {
        double* vs = v + (s - i0) * g;
        for (Index j = 0; j < g; ++j) {
          vs[j] = double(n.k()(s, cc + j)) + acc[j];
          mj[j] = std::max(mj[j], vs[j]);
          acc[j] += double(n.decay(s, cc + j));
        }
      }
      for (Index s = i0; s < i1; ++s) {
        double* vs = v + (s - i0) * g;
        simd::for_packs<double>(g, [&](auto w, Index j) {
          using P = simd::pack<double, decltype(w)::value>;
          exp(P::load(vs + j) - P::load(mj + j)).store(vs + j);
        });
      }
      {  // B_J, k-major, once for every product it enters (rows past the last token: zeros)
        T* bc = Bc.data() + I * b * g;
        for (Index p = 0; p < g; ++p)
          for (Index r = 0; r < b; ++r) bc[p * b + r] = r < nI ? T(v[r * g + p]) : T(0);
      }
      // The diagonal block, directly: per row t, the decay sum runs back from t.
      double* kd = sized(sc.c, 2 * nI * g);  // k_s, then w_s, of the block's tokens
      double* wb = kd + nI * g;
      double* tmp = sized(sc.d, 3 * g);  // r_t, the running decay sum, u
      double* rt = tmp;
      double* wd = tmp + g;
      double* ud = tmp + 2 * g;
      for (Index s = i0; s < i1; ++s)
        for (Index j = 0; j < g; ++j) {
          kd[(s - i0) * g + j] = double(n.k()(s, cc + j));
          wb[(s - i0) * g + j] = double(n.decay(s, cc + j));
        }
      for (Index j = 0; j < g; ++j) ud[j] = double(n.u()(0, cc + j));
      for (Index t = i0; t < i1; ++t) {
        const double* el = ell.data() + t * g;
        const double* kt = kd + (t - i0) * g;
        for (Index j = 0; j < g; ++j) {
          rt[j] = rv(t, cc + j);
          wd[j] = 0.0;
        }
        T* orow = out.data() + t * L;
        orow[t] += T(scale * simd::sum_packs<double>(g, [&](auto w, Index j) {
                       using P = simd::pack<double, decltype(w)::value>;
                       return P::load(rt + j) * exp(P::load(ud + j) + P::load(kt + j) - P::load(el + j));
                     }));
        for (Index s = t - 1; s >= i0; --s) {
          const double* ks = kd + (s - i0) * g;
          const double* ws = wb + (s - i0) * g;
          const double sum = simd::sum_packs<double>(g, [&](auto w, Index j) {
            using P = simd::pack<double, decltype(w)::value>;
            const P acc = P::load(wd + j);
            (acc + P::load(ws + j)).store(wd + j);
            return P::load(rt + j) * exp(P::load(ks + j) + acc - P::load(el + j));
          });
          orow[s] += T(scale * sum);
        }
      }
    });
    // Below the diagonal blocks: per pair (I, J), B_J scaled by exp(D_IJ) into the kernel's packed
    // panels, times A_I's rows read in place (gemm.hpp). A task takes a group of row blocks (longest
    // first), so each B_J is read once for all of them.
    constexpr Index R = 4;
    const Index ngroups = (nb + R - 1) / R;
    parallel_for(ngroups, [&](Index q) {
      constexpr Index MR = gemm_mr<T>, W = simd::width<T>;
      const Index I0 = (ngroups - 1 - q) * R, I1 = std::min(nb, I0 + R);
      scratch& sc = scr[std::size_t(thread_index())];
      T* bs = sized(sc.bs, padded * g);
      T* et = sized(sc.et, g);
      double* Gs = sized(sc.a, (R + 1) * g);  // G(J, I) per row block of the group, then D_IJ
      double* dsum = Gs + R * g;
      std::fill(Gs, Gs + R * g, 0.0);
      for (Index J = I1 - 2; J >= 0; --J) {
        const double* mj = m_J.data() + J * g;
        const T* src = Bc.data() + J * b * g;
        for (Index I = std::max(I0, J + 1); I < I1; ++I) {
          const Index i0 = I * b, i1 = std::min(L, i0 + b);
          const double* aI = alpha_I.data() + I * g;
          double* GI = Gs + (I - I0) * g;
          simd::for_packs<double>(g, [&](auto w, Index j) {
            using P = simd::pack<double, decltype(w)::value>;
            min(P::load(GI + j) + P::load(mj + j) + P::load(aI + j), P::broadcast(0.0)).store(dsum + j);
          });
          for (Index j = 0; j < g; ++j) et[j] = T(dsum[j]);  // D_IJ <= 0: e^D to T's precision
          simd::for_packs<T>(g, [&](auto w, Index j) {
            using P = simd::pack<T, decltype(w)::value>;
            exp(P::load(et + j)).store(et + j);
          });
          for (Index p0 = 0; p0 < b; p0 += MR) {  // each panel: only the packs that hold rows
            const Index lanes = std::min(MR, (b - p0 + W - 1) / W * W), rows = std::min(MR, b - p0);
            for (Index p = 0; p < g; ++p) {
              const T ep = et[p];
              T* dst = bs + p0 * g + p * MR;
              const T* from = src + p * b + p0;
              for (Index r = 0; r < rows; ++r) dst[r] = from[r] * ep;
              for (Index r = rows; r < lanes; ++r) dst[r] = T(0);
            }
          }
          gemm_tile_add<T>(b, i1 - i0, g, bs, MR * g, Af.data() + i0 * g, g, out.data() + i0 * L + J * b, L, alpha);
          const double* tj = tot.data() + J * g;
          for (Index j = 0; j < g; ++j) GI[j] += tj[j];
        }
      }
    });
  }
  return out;
}

}  // namespace iattn::cpu_detail
