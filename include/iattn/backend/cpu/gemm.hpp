// iattn/backend/cpu/gemm.hpp: the library's one matrix-product kernel, C += alpha B A^T for
// row-major A (m, k) and B (n, k) whose rows run along the inner dimension k, into a row-major
// C (n, m); and gemm(), every other product shape (A B, A B^T, blocked and parallel) on top of it.
// Every product in the library (the mean path, the rank-N tiles, the chunked scan, tile products,
// the models' Linear layers) goes through this kernel, never through Eigen's GEMM: each Eigen
// product form costs a translation unit 1.5-3 s of compile time (issue 19 part 5).
//
// A is packed once, k-major, in panels of gemm_mr = 2 packs of rows; B is read in place, one
// element of each of gemm_nr rows broadcast per step; a micro-tile keeps gemm_mr x gemm_nr sums in
// 2 gemm_nr = 12 pack registers (a last panel of one pack: gemm_nr1 = 8 sums), one pack load per 6
// multiply-adds, and nothing of B needs packing, so a caller that rescales B's columns per product
// writes the scaled rows once and the kernel reads them. A micro-tile's packs run along A's rows,
// i.e. along C's rows, so they are added to C in place. The scaling of B and the packing of A are
// the callers' O((m + n) k) work per O(m n k) of products.
#pragma once

#include "parallel.hpp"
#include "simd.hpp"

#include <algorithm>
#include <type_traits>
#include <vector>

// AVX: float panels (16 rows with AVX2, 32 with AVX-512) are packed by 8 x 8 register transposes
// (the one place outside simd.hpp with intrinsics: xsimd 8.1 has no transpose, and its zip_lo
// changed meaning across versions). Double, other ISAs and last panels whose rows are not a
// multiple of 8 take the scalar loop. The transposes read and write memory, not packs, so emulated
// packs (simd.hpp) keep them: width 16 emulated on an AVX2 machine packs 32-row panels as AVX-512 does.
#if defined(__AVX__) && (IATTN_HAS_XSIMD || IATTN_SIMD_EMULATED) && !defined(__CUDACC__)
#include <immintrin.h>
#define IATTN_GEMM_PACK_AVX 1
#else
#define IATTN_GEMM_PACK_AVX 0
#endif

namespace iattn::cpu_detail {

template <class T>
inline constexpr Index gemm_mr = 2 * simd::width<T>;  ///< rows of A per micro-tile (packed panel)
inline constexpr Index gemm_nr = 6;                   ///< rows of B per micro-tile (broadcast)
inline constexpr Index gemm_nr1 = 8;                  ///< rows of B per micro-tile of a one-pack panel (8 sums)

/// v's storage, grown to at least n elements (kept across calls: fresh allocations page-fault).
template <class T>
T* sized(std::vector<T>& v, Index n) {
  if (v.size() < std::size_t(n)) v.resize(std::size_t(n));
  return v.data();
}

/// Scratch of one thread: the packed A, and a few values its caller forms beside it.
template <class T>
struct gemm_scratch {
  std::vector<T> ap, aux;
};
/// The calling thread's own scratch, kept across calls (tile evaluators are shared by threads).
template <class T>
gemm_scratch<T>& gemm_thread_scratch() {
  thread_local gemm_scratch<T> s;
  return s;
}

/// Rows of A rounded up to whole panels.
template <class T>
inline Index gemm_padded_rows(Index m) {
  return (m + gemm_mr<T> - 1) / gemm_mr<T> * gemm_mr<T>;
}

#if IATTN_GEMM_PACK_AVX
/// dst[j * ldd + i] = src[i * lds + j] for i, j < 8: one 8 x 8 transpose in registers (inlined into
/// its loops: a call per tile costs a tenth of it).
[[gnu::always_inline]] inline void transpose8x8(const float* src, Index lds, float* dst, Index ldd) {
  __m256 r[8], t[8], u[8];
  for (int i = 0; i < 8; ++i) r[i] = _mm256_loadu_ps(src + i * lds);
  for (int i = 0; i < 8; i += 2) {
    t[i] = _mm256_unpacklo_ps(r[i], r[i + 1]);
    t[i + 1] = _mm256_unpackhi_ps(r[i], r[i + 1]);
  }
  for (int i = 0; i < 8; i += 4) {
    u[i] = _mm256_shuffle_ps(t[i], t[i + 2], _MM_SHUFFLE(1, 0, 1, 0));
    u[i + 1] = _mm256_shuffle_ps(t[i], t[i + 2], _MM_SHUFFLE(3, 2, 3, 2));
    u[i + 2] = _mm256_shuffle_ps(t[i + 1], t[i + 3], _MM_SHUFFLE(1, 0, 1, 0));
    u[i + 3] = _mm256_shuffle_ps(t[i + 1], t[i + 3], _MM_SHUFFLE(3, 2, 3, 2));
  }
  for (int j = 0; j < 4; ++j) {
    _mm256_storeu_ps(dst + j * ldd, _mm256_permute2f128_ps(u[j], u[j + 4], 0x20));
    _mm256_storeu_ps(dst + (j + 4) * ldd, _mm256_permute2f128_ps(u[j], u[j + 4], 0x31));
  }
}

// dst[p * MR + r] = src[r * lda + p] for r < rows and p < k0 (a multiple of 8), by 8 x 8
// transposes, and zeros for rows [rows, MR); rows is a multiple of 8. MR is 16 with AVX2 (two
// packs of 8) and 32 with AVX-512 (two packs of 16): the panels of AVX-512 once took the scalar
// loop, 15 % of Mamba-1's channel mean on Zen 5 (docs/performance.md, session 28).
template <Index MR>
inline void gemm_pack_avx(const float* src, Index lda, Index k0, float* dst, Index rows) {
  static_assert(MR % 8 == 0);
  for (Index p = 0; p < k0; p += 8) {
    for (int j = 0; j < 8; ++j)
      for (Index r = rows; r < MR; r += 8) _mm256_storeu_ps(dst + (p + j) * MR + r, _mm256_setzero_ps());
    for (Index h = 0; h < rows; h += 8) transpose8x8(src + h * lda + p, lda, dst + p * MR + h, MR);
  }
}
#endif

/// ap = rows [0, m) of A (row stride lda), k-major in panels of gemm_mr rows: panel q holds
/// ap[q * gemm_mr * k + p * gemm_mr + r] = A[(q * gemm_mr + r) * lda + p], zero past row m.
template <class T>
void gemm_pack_a(const T* A, Index lda, Index m, Index k, T* ap) {
  constexpr Index MR = gemm_mr<T>;
  for (Index q = 0; q * MR < m; ++q) {
    T* dst = ap + q * MR * k;
    const Index rows = std::min(MR, m - q * MR);
    Index p0 = 0;  // columns [0, p0) packed (and padded) by the transposes
#if IATTN_GEMM_PACK_AVX
    if constexpr (std::is_same_v<T, float> && MR % 8 == 0)
      if (rows % 8 == 0) {
        p0 = k / 8 * 8;
        gemm_pack_avx<MR>(A + q * MR * lda, lda, p0, dst, rows);
      }
#endif
    for (Index r = 0; r < rows; ++r) {
      const T* src = A + (q * MR + r) * lda;
      for (Index p = p0; p < k; ++p) dst[p * MR + r] = src[p];
    }
    for (Index p = p0; p < k; ++p)
      for (Index r = rows; r < MR; ++r) dst[p * MR + r] = T(0);
  }
}

/// ap = rows [0, m) of A packed as gemm_pack_a packs them, for A given transposed: row i of A is
/// column i of a row-major (k, m) matrix with row stride lda (element (i, p) at At[p * lda + i]), so
/// each panel row is a contiguous copy. K >= k is the panel stride in inner indices (panels MR K
/// apart; K = -1: k), so the k indices may be one slice of a longer packing.
template <class T>
void gemm_pack_a_t(const T* At, Index lda, Index m, Index k, T* ap, Index K = -1) {
  constexpr Index MR = gemm_mr<T>;
  if (K < 0) K = k;
  for (Index q = 0; q * MR < m; ++q) {
    T* dst = ap + q * MR * K;
    const Index rows = std::min(MR, m - q * MR);
    if (rows == MR) {  // whole panels: packs of W lanes, no call per row
      constexpr int W = simd::width<T>;
      using P = simd::pack<T, W>;
      for (Index p = 0; p < k; ++p)
        for (Index r = 0; r < MR; r += W) P::load(At + p * lda + q * MR + r).store(dst + p * MR + r);
      continue;
    }
    for (Index p = 0; p < k; ++p) {
      const T* src = At + p * lda + q * MR;
      std::copy(src, src + rows, dst + p * MR);
      std::fill(dst + p * MR + rows, dst + (p + 1) * MR, T(0));
    }
  }
}

/// Column p of a packing of m rows over k inner indices times scale[p]: ap as gemm_pack_a(A) left
/// it becomes the packing of A diag(scale).
template <class T>
void gemm_scale_packed(T* ap, Index m, Index k, const T* scale) {
  constexpr Index MR = gemm_mr<T>;
  for (Index q = 0; q * MR < m; ++q) {
    T* dst = ap + q * MR * k;
    for (Index p = 0; p < k; ++p)
      for (Index r = 0; r < MR; ++r) dst[p * MR + r] *= scale[p];
  }
}

// C[c * ldc + r] += alpha sum_p ap[p * MR + r] B[c * ldb + p] for one panel, NR columns, the
// panel's first `rows` rows (all MR of them but in the last panel); PK packs of rows are computed
// (1 when rows fit one pack: the panel's zero half is skipped). set: = instead of +=.
template <class T, int NR, int PK>
inline void gemm_micro(Index k, const T* ap, const T* B, Index ldb, T* C, Index ldc, T alpha, Index rows,
                       bool set = false) {
  constexpr int W = simd::width<T>;
  using P = simd::pack<T, W>;
  P acc[PK][NR];
  for (int h = 0; h < PK; ++h)
    for (int c = 0; c < NR; ++c) acc[h][c] = P::broadcast(T(0));
  const T* b[NR];
  for (int c = 0; c < NR; ++c) b[c] = B + c * ldb;
  for (Index p = 0; p < k; ++p) {
    P a[PK];
    for (int h = 0; h < PK; ++h) a[h] = P::load(ap + p * 2 * W + h * W);
    for (int c = 0; c < NR; ++c) {
      const P bc = P::broadcast(b[c][p]);
      for (int h = 0; h < PK; ++h) acc[h][c] = fma(a[h], bc, acc[h][c]);
    }
  }
  const P al = P::broadcast(alpha);
  if (rows == PK * W) {
    for (int c = 0; c < NR; ++c)
      for (int h = 0; h < PK; ++h)
        (set ? acc[h][c] * al : fma(acc[h][c], al, P::load(C + c * ldc + h * W))).store(C + c * ldc + h * W);
  } else {
    T tmp[PK * W];
    for (int c = 0; c < NR; ++c) {
      for (int h = 0; h < PK; ++h) acc[h][c].store(tmp + h * W);
      for (Index r = 0; r < rows; ++r) C[c * ldc + r] = (set ? T(0) : C[c * ldc + r]) + alpha * tmp[r];
    }
  }
}

// One panel against nr <= gemm_nr rows of B (gemm_nr1 when the panel is one pack, PK = 1).
template <class T, int PK>
inline void gemm_micro_any(Index nr, Index k, const T* ap, const T* B, Index ldb, T* C, Index ldc, T alpha,
                           Index rows, bool set = false) {
  switch (nr) {
    case 8:
      if constexpr (PK == 1) gemm_micro<T, 8, 1>(k, ap, B, ldb, C, ldc, alpha, rows, set);
      break;
    case 7:
      if constexpr (PK == 1) gemm_micro<T, 7, 1>(k, ap, B, ldb, C, ldc, alpha, rows, set);
      break;
    case 6: gemm_micro<T, 6, PK>(k, ap, B, ldb, C, ldc, alpha, rows, set); break;
    case 5: gemm_micro<T, 5, PK>(k, ap, B, ldb, C, ldc, alpha, rows, set); break;
    case 4: gemm_micro<T, 4, PK>(k, ap, B, ldb, C, ldc, alpha, rows, set); break;
    case 3: gemm_micro<T, 3, PK>(k, ap, B, ldb, C, ldc, alpha, rows, set); break;
    case 2: gemm_micro<T, 2, PK>(k, ap, B, ldb, C, ldc, alpha, rows, set); break;
    case 1: gemm_micro<T, 1, PK>(k, ap, B, ldb, C, ldc, alpha, rows, set); break;
    default: break;
  }
}
static_assert(gemm_nr == 6 && gemm_nr1 == 8, "gemm_micro_any dispatches up to 6 rows of B (8 for one pack)");

/// C[j * ldc + i] += alpha sum_p A[i, p] B[j * ldb + p] for i < m, j < n: the product of A, given
/// packed (gemm_pack_a of at least m rows), and B's rows [0, n) over k inner indices, added to C
/// in place with A's rows running along C's rows (so each micro-tile's sums go straight to C, with
/// no scratch tile and no transposition). The panels of ap are panel_stride apart (gemm_mr * k
/// when ap holds exactly these k columns; a slice [p0, p0 + k) of a longer packing starts at
/// ap + p0 * gemm_mr). Entries of C outside the m x n block are not touched. set: C = instead of
/// C += (the block need not be initialised).
template <class T>
void gemm_tile_add(Index m, Index n, Index k, const T* ap, Index panel_stride, const T* B, Index ldb, T* C, Index ldc,
                   T alpha, bool set = false) {
  for (Index q = 0; q * gemm_mr<T> < m; ++q) {  // one panel of A against every row strip of B
    const T* a = ap + q * panel_stride;
    T* c = C + q * gemm_mr<T>;
    const Index rows = std::min(gemm_mr<T>, m - q * gemm_mr<T>);
    // Strips of B's rows as equal in width as can be, at most gemm_nr against a panel of two packs
    // (12 sums) and gemm_nr1 against one pack (8 sums): a narrow strip keeps too few sums to hide
    // the multiply-adds' latency (a strip of 4 against two packs ran at 68 % of the kernel's rate;
    // the diagonal blocks' 8-row products against 4 + 4 columns, 4 sums each, at about half). So
    // 64 = 9 * 6 + 5 + 5, 32 = 6 + 6 + 5 + 5 + 5 + 5 (6 + 6 + 6 + 6 + 4 + 4 before), and 8 columns
    // against one pack one strip (4 + 4 before; docs/performance.md, session 45). Each sum is the
    // same chain of multiply-adds either way: the results do not change.
    const bool two = rows > simd::width<T>;
    const Index widest = two ? gemm_nr : gemm_nr1, strips = (n + widest - 1) / widest;
    for (Index s = 0, j = 0; s < strips; ++s) {
      const Index nr = n / strips + (s < n % strips ? 1 : 0);
      if (two)
        gemm_micro_any<T, 2>(nr, k, a, B + j * ldb, ldb, c + j * ldc, ldc, alpha, rows, set);
      else
        gemm_micro_any<T, 1>(nr, k, a, B + j * ldb, ldb, c + j * ldc, ldc, alpha, rows, set);
      j += nr;
    }
  }
}

/// gemm's blocking: row strips of C of gemm_task_rows (one task of the parallel loop), passes over
/// gemm_kc inner indices and gemm_nc rows of the packed operand (96 KiB in float: it stays in L2
/// while a strip's rows pass it), and the packed operand formed gemm_pack_elems elements at a time.
inline constexpr Index gemm_task_rows = 8 * gemm_nr;
inline constexpr Index gemm_kc = 256;
inline constexpr Index gemm_nc = 96;
inline constexpr Index gemm_pack_elems = Index(1) << 22;
static_assert(gemm_nc % 16 == 0, "gemm_nc holds whole panels of every pack width up to 16 rows");

/// C (m, n) = alpha A op(B), or C += alpha A op(B) with accumulate, all row-major: A (m, k) with row
/// stride lda; B (n, k) with row stride ldb, op(B) = B^T (a PyTorch Linear: X W^T), or with b_kn
/// (k, n), op(B) = B; C with row stride ldc. B is packed (in s) whole or in chunks of rows of at
/// most gemm_pack_elems elements, A's rows are read in place. With parallel (outside a parallel
/// region, and when large enough) the row strips of C run in parallel, one parallel loop per chunk,
/// the packing before it too when it is large.
template <class T>
void gemm(gemm_scratch<T>& s, Index m, Index n, Index k, T alpha, const T* A, Index lda, const T* B, Index ldb, bool b_kn,
          T* C, Index ldc, bool accumulate, bool parallel = false) {
  if (m <= 0 || n <= 0) return;
  if (!accumulate)
    for (Index i = 0; i < m; ++i) std::fill(C + i * ldc, C + i * ldc + n, T(0));
  if (k <= 0) return;
  constexpr Index MR = gemm_mr<T>;
  const Index chunk = std::max(gemm_nc, gemm_pack_elems / k / gemm_nc * gemm_nc);
  const Index tasks = (m + gemm_task_rows - 1) / gemm_task_rows;
  const bool par = parallel && tasks > 1 && double(m) * double(n) * double(k) >= double(1 << 21);
  for (Index j0 = 0; j0 < n; j0 += chunk) {
    const Index nj = std::min(chunk, n - j0), panels = (nj + MR - 1) / MR;
    T* ap = sized(s.ap, panels * MR * k);
    auto pack = [&](Index q) {  // panel q: rows j0 + q MR .. of B, over all k
      const Index r = q * MR, rows = std::min(MR, nj - r);
      if (b_kn)
        gemm_pack_a_t(B + j0 + r, ldb, rows, k, ap + r * k);
      else
        gemm_pack_a(B + (j0 + r) * ldb, ldb, rows, k, ap + r * k);
    };
    auto strip = [&](Index task) {
      const Index i0 = task * gemm_task_rows, rows = std::min(gemm_task_rows, m - i0);
      for (Index p0 = 0; p0 < k; p0 += gemm_kc)
        for (Index jj = 0; jj < nj; jj += gemm_nc)
          gemm_tile_add(std::min(gemm_nc, nj - jj), rows, std::min(gemm_kc, k - p0), ap + jj * k + p0 * MR, MR * k,
                        A + i0 * lda + p0, lda, C + i0 * ldc + j0 + jj, ldc, alpha);
    };
    if (par) {  // one parallel loop where packing is cheap (each costs a fork and a join)
      if (nj * k >= gemm_pack_elems / 16)
        parallel_for(panels, pack);
      else
        for (Index q = 0; q < panels; ++q) pack(q);
      parallel_for(tasks, strip);
    } else {
      for (Index q = 0; q < panels; ++q) pack(q);
      for (Index task = 0; task < tasks; ++task) strip(task);
    }
  }
}

/// out[j * ldo + i] += alpha sum_p A[i * lda + p] B[j * ldb + p] for i < m, j < n, p < k, i.e.
/// out (n, m) += alpha B A^T, row-major.
template <class T>
void gemm_nt(Index m, Index n, Index k, T alpha, const T* A, Index lda, const T* B, Index ldb, T* out, Index ldo,
             gemm_scratch<T>& s) {
  if (m <= 0 || n <= 0) return;
  T* ap = sized(s.ap, gemm_padded_rows<T>(m) * k);
  gemm_pack_a(A, lda, m, k, ap);
  gemm_tile_add(m, n, k, ap, gemm_mr<T> * k, B, ldb, out, ldo, alpha);
}

}  // namespace iattn::cpu_detail
