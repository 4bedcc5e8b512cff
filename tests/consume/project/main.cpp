#include <iattn/iattn.hpp>

#include <cmath>
#include <cstdio>

int main() {
  using namespace iattn;
  const Matrix<float> a = Matrix<float>::Constant(5, 3, 0.5f), b = Matrix<float>::Ones(5, 3);
  const Matrix<float> M = materialize(linear_recurrence(a, b), 0);
  // M[4, 0] = 0.5^4
  const bool ok = std::abs(M(4, 0) - 0.0625f) < 1e-7f;
  std::printf("iattn %s consumed: M[4,0] = %g (%s)\n", iattn::version, M(4, 0), ok ? "ok" : "WRONG");
  return ok ? 0 : 1;
}
