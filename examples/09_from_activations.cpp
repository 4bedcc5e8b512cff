// Mamba-1's implicit attention from a layer's activations (what a PyTorch forward hook or the
// authors' code hands you), no weights: attention(acts) and final_state(acts), checked against the
// recurrence written out with plain loops.
#include <iattn/models/mamba.hpp>

#include <cmath>
#include <cstdio>
#include <random>

int main() {
  using namespace iattn;
  using Mat = Matrix<double>;
  const Index L = 40, D = 6, N = 4, K = 4;
  std::mt19937 g(3);
  std::normal_distribution<double> nd(0.0, 1.0);
  std::uniform_real_distribution<double> ud(0.01, 0.2);
  auto rnd = [&](Index r, Index c, bool positive = false) {
    Mat m(r, c);
    for (Index i = 0; i < m.size(); ++i) m.data()[i] = positive ? ud(g) : nd(g);
    return m;
  };
  // The tensors a hook would capture: x and z (in_proj's halves), delta, B, C; and the layer's A, D, conv.
  models::mamba_activations<double> acts{.x = rnd(L, D), .z = rnd(L, D), .delta = rnd(L, D, true),
                                         .A = -rnd(D, N, true) * 10, .B = rnd(L, N), .C = rnd(L, N),
                                         .D = rnd(1, D), .conv1d_weight = rnd(D, K), .conv1d_bias = rnd(1, D)};
  const auto d = models::attention(acts);  // out_proj_weight left empty: output() = H x + beta
  const Mat y = d.output();

  // The recurrence: p = conv(x) + b, a = SiLU(p), h_t = exp(delta A) h + delta B a, y = (C.h + D a) SiLU(z)
  auto silu = [](double v) { return v / (1 + std::exp(-v)); };
  Mat h = Mat::Zero(D, N), expect(L, D);
  for (Index t = 0; t < L; ++t)
    for (Index c = 0; c < D; ++c) {
      double p = acts.conv1d_bias(0, c);
      for (Index k = 0; k < K; ++k)
        if (t - K + 1 + k >= 0) p += acts.conv1d_weight(c, k) * acts.x(t - K + 1 + k, c);
      const double a = silu(p);
      double acc = 0;
      for (Index m = 0; m < N; ++m) {
        h(c, m) = std::exp(acts.delta(t, c) * acts.A(c, m)) * h(c, m) + acts.delta(t, c) * acts.B(t, m) * a;
        acc += acts.C(t, m) * h(c, m);
      }
      expect(t, c) = (acc + acts.D(0, c) * a) * silu(acts.z(t, c));
    }
  const double err_y = (y - expect).cwiseAbs().maxCoeff() / (1 + expect.cwiseAbs().maxCoeff());
  const double err_h = (models::final_state(acts) - h).cwiseAbs().maxCoeff() / (1 + h.cwiseAbs().maxCoeff());
  const Mat H2 = materialize(d.H, 2);  // channel 2's (L, L) matrix, from the hook's tensors alone
  std::printf("from activations: |H x + beta - y| = %.1e, |final_state - h_L| = %.1e, H^2[10, 8..10] = %.4f %.4f %.4f\n",
              err_y, err_h, H2(10, 8), H2(10, 9), H2(10, 10));
  return err_y < 1e-12 && err_h < 1e-12 ? 0 : 1;
}
