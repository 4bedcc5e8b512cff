// RWKV-7 time mixing as implicit attention: its transition is diagonal plus rank one (A_t =
// Diag(w_t) - (kk_t a_t) kk_t^T), so its matrix is not a decay-weighted q k^T; the example checks the
// exact decomposition on two layers (layer 1 mixes in layer 0's values) and prints the bonus diagonal.
#include <iattn/models/rwkv7.hpp>

#include <cstdio>

int main() {
  using namespace iattn;
  using namespace iattn::models;
  const rwkv7_config c{.hidden_size = 32, .head_dim = 8, .decay_low_rank_dim = 8, .a_low_rank_dim = 8,
                       .v_low_rank_dim = 8, .gate_low_rank_dim = 8, .num_hidden_layers = 2};
  auto w0 = rwkv7_init<double>(c, 1);
  auto c1 = c;
  c1.layer_idx = 1;
  auto w1 = rwkv7_init<double>(c1, 2);
  init::generator g(5);  // the reference init zeroes o_proj: draw one so the output is not 0
  w0.o_proj_weight = init::normal<double>(g, 32, 32, 0.2);
  w1.o_proj_weight = init::normal<double>(g, 32, 32, 0.2);
  const Index L = 33;
  const Matrix<double> x = sample_input<double>(L, 32);

  const auto a0 = activations(w0, x);
  const auto d0 = attention(a0), d1 = decompose(w1, x, a0.v);
  const double e0 = (d0.output() - rwkv7_forward(w0, x)).cwiseAbs().maxCoeff();
  const double e1 = (d1.output() - rwkv7_forward(w1, x, a0.v)).cwiseAbs().maxCoeff();
  std::printf("RWKV-7: max |layer - out_proj(H v + beta)| = %.2e (layer 0), %.2e (layer 1)\n", e0, e1);

  const Matrix<double> T = materialize(rwkv7_transition(a0), 0);
  const Matrix<double> bonus = a0.bonus();
  std::printf("head 0: T[t, t] + bonus[t] for t < 4:");
  for (Index t = 0; t < 4; ++t) std::printf(" %+.4f", T(t, t) + bonus(t, 0));
  std::printf("\n");
  return e0 < 1e-10 && e1 < 1e-10 ? 0 : 1;
}
