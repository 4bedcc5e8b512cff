// Compile-time probe (issue 19 part 5): <iattn/iattn.hpp>, one model, apply + materialize +
// materialize_mean, as a researcher's first program. Built by scripts/compile_time.sh, not by CMake.
#include <iattn/iattn.hpp>
#include <iattn/models/mamba.hpp>

#include <cstdio>

#ifndef PARSE_ONLY
int main() {
  using namespace iattn;
  const auto w = models::mamba_init<float>({.d_model = 64, .d_state = 16}, 0);
  const Matrix<float> u = models::sample_input<float>(64, 64);
  const auto d = models::mamba_decompose(w, u);
  const Matrix<float> y = apply(d.H, d.x);
#ifndef ONLY_APPLY
  const Matrix<float> a = materialize(d.H, 3);
  const Matrix<float> m = materialize_mean(d.H);
  std::printf("%g %g %g\n", double(y(5, 5)), double(a(7, 2)), double(m(9, 1)));
#else
  std::printf("%g\n", double(y(5, 5)));
#endif
}
#endif
