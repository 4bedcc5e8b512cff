// The Mamba-2 block (multi-head SSD, groups, D skip, gated group RMSNorm) as implicit attention.
#include <iattn/models/mamba2.hpp>

#include <cstdio>

int main() {
  using namespace iattn;
  using namespace iattn::models;
  const auto w = mamba2_init<double>({.d_model = 64, .d_state = 32, .headdim = 16, .ngroups = 2}, 2);  // 8 heads
  const Matrix<double> u = sample_input<double>(48, 64);

  const auto d = mamba2_decompose(w, u);  // the GroupNorm is bound to the statistics of its input
  const double err = (d.output() - mamba2_forward(w, u)).cwiseAbs().maxCoeff();
  std::printf("Mamba-2: max |block - out_proj(H x + beta)| = %.2e\n", err);

  const Matrix<double> mean = materialize_mean(d.H);  // over all 128 inner channels
  std::printf("channel-mean attention, row 47, last five columns: %.4f %.4f %.4f %.4f %.4f\n", mean(47, 43),
              mean(47, 44), mean(47, 45), mean(47, 46), mean(47, 47));
  return err < 1e-10 ? 0 : 1;
}
