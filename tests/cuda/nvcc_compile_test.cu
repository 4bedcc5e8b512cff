// The core headers compile in an nvcc translation unit (no GPU needed: host code only). The CPU
// backend's xsimd shim is never included under nvcc: width 1 here.
#include <iattn/iattn.hpp>

#include <cstdio>

int main() {
  using namespace iattn;
  static_assert(simd::width<float> == 1, "no xsimd under nvcc");
  const Matrix<double> lam = Matrix<double>::Constant(8, 2, -0.5), B = Matrix<double>::Ones(8, 1);
  const Matrix<double> x = Matrix<double>::Ones(8, 2);
  auto S = semiseparable(lam, B, B, {.heads = 2});
  const Matrix<double> y = apply(S, x);
  // y_7 = sum_{s<=7} exp(-0.5 (7 - s))
  double expected = 0;
  for (int s = 0; s <= 7; ++s) expected += std::exp(-0.5 * (7 - s));
  const bool ok = std::abs(y(7, 1) - expected) < 1e-12;
  std::printf("nvcc translation unit: y[7] = %.15f, expected %.15f: %s\n", y(7, 1), expected, ok ? "ok" : "WRONG");
  return ok ? 0 : 1;
}
