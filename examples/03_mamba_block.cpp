// The Mamba-1 block as implicit attention: exact decomposition, the papers' matrices, one channel.
#include <iattn/models/mamba.hpp>

#include <cstdio>

int main() {
  using namespace iattn;
  using namespace iattn::models;
  const auto w = mamba_init<double>({.d_model = 64, .d_state = 16}, /*seed=*/1);  // d_inner = 128
  const Matrix<double> u = sample_input<double>(/*L=*/48, 64);

  const auto d = mamba_decompose(w, u);  // block(u) == out_proj(H x + beta)
  const double err = (d.output() - mamba_forward(w, u)).cwiseAbs().maxCoeff();
  std::printf("Mamba-1: max |block - out_proj(H x + beta)| = %.2e\n", err);

  const Matrix<double> exact = materialize(d.H, 5);
  const Matrix<double> paper = materialize(holistic_attention(w, u), 5);  // eq. 9: D and bias dropped
  const Matrix<double> s6 = materialize(s6_attention(w, u), 5);          // Ali et al.: S6 only
  std::printf("channel 5, row 10: exact H %.4f %.4f %.4f | eq. 9 %.4f %.4f %.4f | S6 %.4f %.4f %.4f\n", exact(10, 8),
              exact(10, 9), exact(10, 10), paper(10, 8), paper(10, 9), paper(10, 10), s6(10, 8), s6(10, 9), s6(10, 10));
  return err < 1e-10 ? 0 : 1;
}
