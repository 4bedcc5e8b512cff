// RetNet multi-scale retention as implicit attention: the exact matrix and the paper's G R (eq. 24).
#include <iattn/models/retnet.hpp>

#include <cstdio>

int main() {
  using namespace iattn;
  using namespace iattn::models;
  const auto w = retnet_init<double>({.embed_dim = 64, .value_dim = 128, .num_heads = 4}, 7);
  const Index L = 48;
  const Matrix<double> u = sample_input<double>(L, 64);

  const auto d = retnet_decompose(w, u);
  const double err = (d.output() - retnet_forward(w, u)).cwiseAbs().maxCoeff();
  std::printf("RetNet: max |block - out_proj(H v + beta)| = %.2e\n", err);

  // Head 0 decays with gamma = 1 - 2^-5, head 3 with 1 - 2^-8: head 3 reaches further back.
  const Matrix<double> M0 = materialize(d.H, 0), M3 = materialize(d.H, 127);
  const double far0 = M0.row(L - 1).head(L / 2).cwiseAbs().sum() / M0.row(L - 1).cwiseAbs().sum();
  const double far3 = M3.row(L - 1).head(L / 2).cwiseAbs().sum() / M3.row(L - 1).cwiseAbs().sum();
  std::printf("share of the last row's weight on the first half: head 0 %.3f, head 3 %.3f\n", far0, far3);

  const double paper = (Matrix<double>(materialize(retnet_paper_attention(w, u), 5)) - Matrix<double>(materialize(d.H, 5))).cwiseAbs().maxCoeff();
  std::printf("paper G R against the exact H (RMS norm: the same matrix): %.2e\n", paper);
  return err < 1e-10 && paper < 1e-12 && far3 > far0 ? 0 : 1;
}
