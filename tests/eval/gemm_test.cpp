// The mean path's product kernel (backend/cpu/gemm.hpp) against plain loops in double: every
// micro-tile tail (rows past a whole panel, a last panel of one pack of rows, fewer than gemm_nr
// columns), inner lengths with and without SIMD tails, row strides larger than the rows,
// accumulation into existing values, a slice of a longer packing, float and double. Built once for
// the baseline ISA and, where the compiler takes -march=native, once more for the build machine's
// (gemm_native_test), so both pack widths run.
#include "support/test_common.hpp"

#include <iattn/backend/cpu/gemm.hpp>

using namespace test;
using iattn::cpu_detail::gemm_mr;
using iattn::cpu_detail::gemm_nr;

namespace {

template <class T>
void check_gemm(Index m, Index n, Index k) {
  INFO("m = " << m << ", n = " << n << ", k = " << k << ", gemm_mr = " << gemm_mr<T>);
  const Index lda = k + 3, ldb = k + 5, ldo = m + 2;
  const Mat<T> A = normal<T>(m, lda), B = normal<T>(n, ldb), O = normal<T>(n, ldo);
  const T alpha = T(0.75);
  Mat<T> out = O;
  iattn::cpu_detail::gemm_scratch<T> s;
  iattn::cpu_detail::gemm_nt<T>(m, n, k, alpha, A.data(), lda, B.data(), ldb, out.data(), ldo, s);
  MatD ref = dd(O);
  for (Index i = 0; i < m; ++i)
    for (Index j = 0; j < n; ++j) {
      double v = 0;
      for (Index p = 0; p < k; ++p) v += double(A(i, p)) * double(B(j, p));
      ref(j, i) += double(alpha) * v;
    }
  check_close(out, ref, std::is_same_v<T, float> ? 1e-5 * std::sqrt(double(k + 1)) : 1e-13 * std::sqrt(double(k + 1)));
}

}  // namespace

TEST_CASE("gemm: every micro-tile tail and inner length", "[gemm]") {
  constexpr Index W = iattn::simd::width<float>;  // a panel of one pack of rows takes the half kernel
  for (Index m : {Index(1), W, gemm_mr<float> - 1, gemm_mr<float>, gemm_mr<float> + 1, gemm_mr<float> + W, Index(33),
                  Index(64)})
    // n rows of B in strips of widths as equal as can be, at most gemm_nr (gemm_nr1 = 8 against a
    // panel of one pack): 7 = 4 + 3 (one strip of 7 for one pack), 13 = 5 + 4 + 4, 15 = 8 + 7 and
    // 16 = 8 + 8 for one pack, 32 = 6 + 6 + 5 + 5 + 5 + 5, 64 = 9 * 6 + 5 + 5
    for (Index n : {Index(1), gemm_nr - 1, gemm_nr, gemm_nr + 1, gemm_nr + 2, 2 * gemm_nr - 1, Index(13), Index(15),
                    Index(16), Index(17), Index(32), Index(64)})
      for (Index k : {Index(0), Index(1), Index(7), Index(8), Index(9), Index(64), Index(257)}) {
        check_gemm<float>(m, n, k);
        check_gemm<double>(m, n, k);
      }
}

TEST_CASE("gemm: the packed panels hold A's rows k-major and zeros past row m", "[gemm]") {
  // Every panel shape: whole panels, a last panel of 8, 16 or 24 rows (the 8 x 8 transposes of the
  // AVX packing, 16- and 32-row panels), rows that are not a multiple of 8 (the scalar loop), and
  // inner lengths around the transposes' multiple of 8. The buffer starts as NaN, so a padding
  // entry not written to zero fails.
  using namespace iattn::cpu_detail;
  constexpr Index MR = gemm_mr<float>;
  for (Index m : {Index(1), Index(5), Index(8), Index(16), Index(24), MR - 8, MR, MR + 8, MR + 13, MR + 24, 3 * MR})
    for (Index k : {Index(1), Index(7), Index(8), Index(9), Index(23), Index(64)}) {
      if (m <= 0) continue;  // MR - 8 without SIMD (gemm_mr = 2)
      INFO("m = " << m << ", k = " << k << ", gemm_mr = " << MR);
      const Index lda = k + 5;
      const Mat<float> A = normal<float>(m, lda);
      std::vector<float> ap(std::size_t(gemm_padded_rows<float>(m) * k), std::numeric_limits<float>::quiet_NaN());
      gemm_pack_a(A.data(), lda, m, k, ap.data());
      for (Index q = 0; q * MR < m; ++q)
        for (Index p = 0; p < k; ++p)
          for (Index r = 0; r < MR; ++r) {
            const Index i = q * MR + r;
            const float want = i < m ? A(i, p) : 0.f;
            REQUIRE(ap[std::size_t(q * MR * k + p * MR + r)] == want);
          }
    }
}

TEST_CASE("gemm: a slice of a longer packing accumulates in place", "[gemm]") {
  using namespace iattn::cpu_detail;
  const Index m = 21, n = 11, k = 50, p0 = 13, kc = 24;
  const MatD A = normal<double>(m, k), B = normal<double>(n, k);
  std::vector<double> ap(std::size_t(gemm_padded_rows<double>(m) * k));
  gemm_pack_a(A.data(), k, m, k, ap.data());
  const Index ldc = gemm_padded_rows<double>(m) + 3;  // C's rows longer than the block
  std::vector<double> C(std::size_t(ldc * n), 1.0);
  gemm_tile_add(m, n, kc, ap.data() + p0 * gemm_mr<double>, gemm_mr<double> * k, B.data() + p0, k, C.data(), ldc, 0.5);
  for (Index i = 0; i < m; ++i)
    for (Index j = 0; j < n; ++j) {
      double v = 0.0;
      for (Index p = p0; p < p0 + kc; ++p) v += A(i, p) * B(j, p);
      v = 1.0 + 0.5 * v;
      INFO("i = " << i << ", j = " << j);
      REQUIRE(std::abs(C[std::size_t(j * ldc + i)] - v) <= 1e-12 * (1 + std::abs(v)));
    }
  for (Index j = 0; j < n; ++j)  // entries of C past the block's rows stay as they were
    for (Index i = m; i < ldc; ++i) REQUIRE(C[std::size_t(j * ldc + i)] == 1.0);
}

TEST_CASE("gemm: the set form writes the block without reading it", "[gemm]") {
  // Rows of A: one partial panel, one of exactly one pack (48 with AVX-512 float: a full panel and
  // a 16-row one), several panels; n = 11: a whole register block of columns and a partial one;
  // k = 0 writes zeros. C holds NaN, which += would keep.
  using namespace iattn::cpu_detail;
  for (Index m : {Index(1), Index(9), Index(21), Index(40), Index(48)})
    for (Index k : {Index(17), Index(0)}) {
      INFO("m = " << m << ", k = " << k);
      const Index n = 11, kk = std::max<Index>(k, 1);
      const Mat<float> A = normal<float>(m, kk), B = normal<float>(n, kk);
      std::vector<float> ap(std::size_t(gemm_padded_rows<float>(m) * kk));
      gemm_pack_a(A.data(), kk, m, k, ap.data());
      const Index ldc = m + 3;
      std::vector<float> C(std::size_t(ldc * n), std::numeric_limits<float>::quiet_NaN());
      gemm_tile_add(m, n, k, ap.data(), gemm_mr<float> * k, B.data(), kk, C.data(), ldc, 2.f, true);
      for (Index j = 0; j < n; ++j) {
        for (Index i = 0; i < m; ++i) {
          double v = 0.0;
          for (Index p = 0; p < k; ++p) v += double(A(i, p)) * double(B(j, p));
          INFO("i = " << i << ", j = " << j);
          REQUIRE(std::abs(C[std::size_t(j * ldc + i)] - 2.0 * v) <= 1e-5 * (1 + std::abs(v)));
        }
        for (Index i = m; i < ldc; ++i) REQUIRE(std::isnan(C[std::size_t(j * ldc + i)]));  // past the block: untouched
      }
    }
}

namespace {

// gemm(): C = alpha A op(B) (+ C), op(B) = B^T (B (n, k)) or B (b_kn: B (k, n)), against plain loops.
template <class T>
void check_gemm_general(Index m, Index n, Index k, bool b_kn, bool accumulate, bool parallel) {
  INFO("m = " << m << ", n = " << n << ", k = " << k << ", b_kn = " << b_kn << ", accumulate = " << accumulate
               << ", parallel = " << parallel);
  const Index lda = k + 3, ldb = (b_kn ? n : k) + 2, ldc = n + 5;
  const Mat<T> A = normal<T>(m, lda), B = normal<T>(b_kn ? k : n, ldb), C0 = normal<T>(m, ldc);
  const T alpha = T(-1.25);
  Mat<T> C = C0;
  iattn::cpu_detail::gemm_scratch<T> s;
  iattn::cpu_detail::gemm<T>(s, m, n, k, alpha, A.data(), lda, B.data(), ldb, b_kn, C.data(), ldc, accumulate, parallel);
  MatD ref = dd(C0);
  for (Index i = 0; i < m; ++i)
    for (Index j = 0; j < n; ++j) {
      double v = 0;
      for (Index p = 0; p < k; ++p) v += double(A(i, p)) * double(b_kn ? B(p, j) : B(j, p));
      ref(i, j) = (accumulate ? ref(i, j) : 0.0) + double(alpha) * v;
    }
  check_close(C, ref, std::is_same_v<T, float> ? 1e-5 * std::sqrt(double(k + 1)) : 1e-13 * std::sqrt(double(k + 1)));
}

}  // namespace

TEST_CASE("gemm: A B and A B^T, blocked over k and n, serial and parallel", "[gemm]") {
  using iattn::cpu_detail::gemm_kc;
  using iattn::cpu_detail::gemm_nc;
  using iattn::cpu_detail::gemm_task_rows;
  for (Index m : {Index(1), Index(7), gemm_task_rows + 1, Index(130)})
    for (Index n : {Index(1), Index(17), gemm_nc + 3})
      for (Index k : {Index(0), Index(5), gemm_kc + 9})
        for (bool b_kn : {false, true})
          for (bool accumulate : {false, true}) {
            check_gemm_general<float>(m, n, k, b_kn, accumulate, true);
            check_gemm_general<double>(m, n, k, b_kn, accumulate, m == 130);
          }
}

TEST_CASE("gemm: the packed operand in several chunks of rows", "[gemm]") {
  using iattn::cpu_detail::gemm_nc;
  using iattn::cpu_detail::gemm_pack_elems;
  const Index k = gemm_pack_elems / gemm_nc + 7;  // chunks of gemm_nc rows
  for (bool b_kn : {false, true}) {
    check_gemm_general<double>(3, 2 * gemm_nc + 5, k, b_kn, true, false);
    check_gemm_general<float>(iattn::cpu_detail::gemm_task_rows + 2, gemm_nc + 1, k, b_kn, false, true);
  }
}

TEST_CASE("gemm: packing from a transposed source and scaling the packed columns", "[gemm]") {
  using namespace iattn::cpu_detail;
  const Index m = 21, k = 13, ld = m + 4;
  const MatD At = normal<double>(k, ld), s = normal<double>(1, k);
  MatD A(m, k);
  for (Index i = 0; i < m; ++i)
    for (Index p = 0; p < k; ++p) A(i, p) = At(p, i) * s(0, p);
  std::vector<double> ap(std::size_t(gemm_padded_rows<double>(m) * k)), ref(ap.size());
  gemm_pack_a_t(At.data(), ld, m, k, ap.data());
  gemm_scale_packed(ap.data(), m, k, s.data());
  gemm_pack_a(A.data(), k, m, k, ref.data());
  for (std::size_t i = 0; i < ap.size(); ++i) REQUIRE(std::abs(ap[i] - ref[i]) <= 1e-15 * (1 + std::abs(ref[i])));
}
