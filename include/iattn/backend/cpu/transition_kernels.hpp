// iattn/backend/cpu/transition_kernels.hpp: the small kernels of the chunked Transition evaluator
// (transition_chunk.hpp, transition.hpp): products through gemm.hpp's kernel with the packed side
// along the channels, packing from token-major rows, the forward substitution's row kernel, and
// checks on whole rows in SIMD packs.
#pragma once

#include "../../core/config.hpp"
#include "gemm.hpp"
#include "simd.hpp"

#include <Eigen/Core>

#include <algorithm>
#include <cmath>
#include <vector>

namespace iattn::cpu_detail::transition_detail {

template <class T>
using rmat = Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

/// out (n, m) = B A^T, or out += B A^T with accumulate; B (n, k) and A (m, k) row-major with row
/// strides ldb and lda: gemm.hpp's kernel (A packed, B read in place), every product of this file.
template <class T>
void mul_nt(Index n, Index m, Index k, const T* B, Index ldb, const T* A, Index lda, T* out, Index ldo,
            bool accumulate) {
  if (!accumulate)
    for (Index i = 0; i < n; ++i) std::fill(out + i * ldo, out + i * ldo + m, T(0));
  if (n <= 0 || m <= 0 || k <= 0) return;
  thread_local gemm_scratch<T> s;
  gemm_nt(m, n, k, T(1), A, lda, B, ldb, out, ldo, s);
}

/// Whether the n values from p are all finite (x * 0 is 0 for finite x, NaN for inf and NaN).
template <class T>
bool all_finite(const T* p, Index n) {
  const T z = simd::sum_packs<T>(n, [&](auto w, Index i) {
    using P = simd::pack<T, decltype(w)::value>;
    return P::load(p + i) * P::broadcast(T(0));
  });
  return z == T(0);
}

/// dst[0:n] = src[0:n] in packs (a chunk's coefficient row; no library call per row).
template <class T>
void copy_row(const T* src, Index n, T* dst) {
  simd::for_packs<T>(n, [&](auto w, Index i) {
    using P = simd::pack<T, decltype(w)::value>;
    P::load(src + i).store(dst + i);
  });
}

/// Asks for the n values from p in L1, a few tokens before the copy reads them.
template <class T>
void prefetch_l1(const T* p, Index n) {
#if defined(__GNUC__) || defined(__clang__)
  const char* c = reinterpret_cast<const char*>(p);
  for (Index b = 0; b < n * Index(sizeof(T)); b += 64) __builtin_prefetch(c + b, 0, 3);
#else
  (void)p, (void)n;
#endif
}

/// Whether the n values from p are all finite and <= 0 (log-decays the chunked form takes).
template <class T>
bool finite_nonpositive(const T* p, Index n) {
  constexpr int W = simd::width<T>;
  using P = simd::pack<T, W>;
  P z = P::broadcast(T(0)), mx = P::broadcast(T(0));
  Index i = 0;
  for (; i + W <= n; i += W) {
    const P v = P::load(p + i);
    z = z + v * P::broadcast(T(0));
    mx = max(mx, v);
  }
  T zs = reduce_add(z), ms = T(0);
  alignas(64) T lanes[W];
  mx.store(lanes);
  for (int k = 0; k < W; ++k) ms = std::max(ms, lanes[k]);
  for (; i < n; ++i) zs += p[i] * T(0), ms = std::max(ms, p[i]);
  return zs == T(0) && ms <= T(0);
}

/// dst (cols, rows) = src (rows, cols)^T, row-major with row strides lds and ldd.
template <class T>
void transpose_into(Index rows, Index cols, const T* src, Index lds, T* dst, Index ldd) {
  constexpr Index b = 16;
  for (Index i0 = 0; i0 < rows; i0 += b)
    for (Index j0 = 0; j0 < cols; j0 += b)
      for (Index j = j0; j < std::min(cols, j0 + b); ++j)
        for (Index i = i0; i < std::min(rows, i0 + b); ++i) dst[j * ldd + i] = src[i * lds + j];
}

/// out (n, m) += B A^T, A given packed (gemm_pack_a_t or gemm_pack_a, k inner indices, panels
/// panel_stride apart: a slice [p0, p0 + k) of a longer packing of K starts at ap + p0 gemm_mr
/// with panel_stride gemm_mr K); B (n, k) row-major with row stride ldb. set: out = B A^T instead,
/// out not read (it need not be initialised; k = 0 writes zeros).
template <class T>
void mul_packed(Index n, Index m, Index k, const T* B, Index ldb, const T* ap, Index panel_stride, T* out, Index ldo,
                bool set = false) {
  if (n > 0 && m > 0 && (k > 0 || set)) gemm_tile_add(m, n, k, ap, panel_stride, B, ldb, out, ldo, T(1), set);
}

/// dst[c:c + G W] += sum_{j < J} coef[j] src[j * w + c:c + G W], the G packs' sums held in registers
/// across j (one load and one multiply-add per pack and j).
template <class T, int G>
void combine_packs(T* dst, Index w, Index J, const T* coef, const T* src, Index c) {
  constexpr int W = simd::width<T>;
  using P = simd::pack<T, W>;
  P acc[G];
  for (int g = 0; g < G; ++g) acc[g] = P::load(dst + c + g * W);
  for (Index j = 0; j < J; ++j) {
    const P m = P::broadcast(coef[j]);
    for (int g = 0; g < G; ++g) acc[g] = fma(m, P::load(src + j * w + c + g * W), acc[g]);
  }
  for (int g = 0; g < G; ++g) acc[g].store(dst + c + g * W);
}

/// dst[0:w] += sum_{j < J} coef[j] src[j * w + 0:w]: a row of a forward substitution, four packs of
/// columns at a time, then single packs, then single columns. With AVX-512 (W = 16) Gated DeltaNet's
/// rows of N + C = 160 columns end in two single packs, which the scalar loop used to take (this
/// function was 22 % of that model's apply on Zen 5, most of it there).
template <class T>
void combine_rows(T* dst, Index w, Index J, const T* coef, const T* src) {
  constexpr int W = simd::width<T>, G = 4;
  Index c = 0;
  for (; c + G * W <= w; c += G * W) combine_packs<T, G>(dst, w, J, coef, src, c);
  for (; c + W <= w; c += W) combine_packs<T, 1>(dst, w, J, coef, src, c);
  for (; c < w; ++c) {
    T acc = dst[c];
    for (Index j = 0; j < J; ++j) acc += coef[j] * src[j * w + c];
    dst[c] = acc;
  }
}

/// out[0:n] = exp(in[0:n]) (the library's exp packs).
template <class T>
void exp_into(const T* in, Index n, T* out) {
  simd::for_packs<T>(n, [&](auto w, Index i) {
    using P = simd::pack<T, decltype(w)::value>;
    exp(P::load(in + i)).store(out + i);
  });
}

}  // namespace iattn::cpu_detail::transition_detail
