// The Griffin/Hawk recurrent block (RG-LRU) as implicit attention, over two documents.
#include <iattn/models/griffin.hpp>

#include <cstdio>

int main() {
  using namespace iattn;
  using namespace iattn::models;
  const auto w = griffin_init<double>({.width = 64, .lru_width = 64, .num_heads = 4}, 3);
  const Index L = 40;
  const Matrix<double> u = sample_input<double>(L, 64);
  std::vector<Index> segment_pos;  // a second document starts at token 25
  for (Index t = 0; t < L; ++t) segment_pos.push_back(t < 25 ? t : t - 25);

  const auto d = griffin_decompose(w, u, segment_pos);
  const double err = (d.output() - griffin_forward(w, u, segment_pos)).cwiseAbs().maxCoeff();
  std::printf("Griffin: max |block - linear_out(H x + beta)| = %.2e\n", err);

  const Matrix<double> M = materialize(d.H, 0);
  std::printf("channel 0: H[30, 20] = %.3g (across the document boundary), H[30, 28] = %.4f\n", M(30, 20), M(30, 28));
  return err < 1e-10 && M(30, 20) == 0.0 ? 0 : 1;
}
