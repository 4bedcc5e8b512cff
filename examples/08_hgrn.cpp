// HGRN (hierarchically gated linear RNN) as implicit attention: a lower layer forgets faster.
#include <iattn/models/hgrn.hpp>

#include <cstdio>

int main() {
  using namespace iattn;
  using namespace iattn::models;
  const Index L = 40;
  const Matrix<double> u = sample_input<double>(L, 64);
  double reach[2] = {0, 0};
  for (Index layer : {0, 3}) {  // the forget gate's lower bound grows with depth: 0, then 3/4
    const auto w = hgrn_init<double>({.hidden_size = 64, .layer_idx = layer, .num_layers = 4}, 11);
    const auto d = hgrn_decompose(w, u);
    const double err = (d.output() - hgrn_forward(w, u)).cwiseAbs().maxCoeff();
    std::printf("HGRN layer %lld: max |block - o_proj(H i)| = %.2e", static_cast<long long>(layer), err);
    if (err > 1e-10) return 1;
    const Matrix<double> A = materialize(hgrn_paper_attention(w, u), 0);  // eq. 29, no output norm
    double num = 0, den = 0;
    for (Index t = 0; t < L; ++t)
      for (Index s = 0; s <= t; ++s) {
        num += std::abs(A(t, s)) * double(t - s);
        den += std::abs(A(t, s));
      }
    reach[layer ? 1 : 0] = num / den;
    std::printf(", mean |attention| distance %.2f tokens\n", reach[layer ? 1 : 0]);
  }
  return reach[1] > reach[0] ? 0 : 1;
}
