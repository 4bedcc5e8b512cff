// RWKV-4 time mixing as implicit attention: diag(sigmoid r) row_normalize(WKV) over the values.
#include <iattn/models/rwkv4.hpp>

#include <cstdio>

int main() {
  using namespace iattn;
  using namespace iattn::models;
  const auto w = rwkv4_init<double>({.hidden_size = 64, .attention_hidden_size = 64, .layer_id = 2, .num_hidden_layers = 6}, 4);
  const Matrix<double> u = sample_input<double>(48, 64);

  const auto d = rwkv4_decompose(w, u);
  const double err = (d.output() - rwkv4_forward(w, u)).cwiseAbs().maxCoeff();
  std::printf("RWKV-4: max |block - output(H v)| = %.2e\n", err);

  // Before the receptance gate every row of the WKV matrix is a weighted average: it sums to one.
  const Matrix<double> wkv = materialize(rwkv4_wkv(activations(w, u)), 9);
  std::printf("channel 9: WKV row 20 sums to %.15f\n", wkv.row(20).sum());
  return err < 1e-10 ? 0 : 1;
}
