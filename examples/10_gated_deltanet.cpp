// Qwen3-Next's Gated DeltaNet layer as implicit attention: the exact decomposition, and what the
// delta rule's key removal does to the matrix. The same layer with beta = 0 in the transition (no
// removal: gated linear attention) gives a different matrix; the "heuristic" map that drops the
// removal is not the layer's attention.
#include <iattn/models/qwen3_next.hpp>

#include <cstdio>

int main() {
  using namespace iattn;
  using namespace iattn::models;
  auto w = qwen3_next_init<double>({.hidden_size = 32, .linear_num_value_heads = 4, .linear_num_key_heads = 2,
                                    .linear_key_head_dim = 8, .linear_value_head_dim = 8, .initializer_range = 0.3},
                                   3);
  w.A_log.setConstant(std::log(0.2));  // slow decays: the removal term matters over many tokens
  const Index L = 40;
  const Matrix<double> u = sample_input<double>(L, 32);

  const auto acts = activations(w, u);
  const auto d = attention(acts);
  const double err = (d.output() - qwen3_next_forward(w, u)).cwiseAbs().maxCoeff();
  std::printf("Qwen3-Next GDN: max |layer - out_proj(H x + beta)| = %.2e\n", err);

  // The head's transition alone, and the same gates without the key removal (beta * k k^T dropped
  // from A_t, the write beta k v^T kept): how far apart are the two matrices of value head 0?
  Matrix<double> q, k, v;
  acts.qkv(q, k, v);
  const auto T_exact = qwen3_next_transition(acts);
  Matrix<double> kb = k;  // beta k per value head: the write
  for (Index t = 0; t < L; ++t)
    for (Index h = 0; h < 4; ++h) kb.row(t).segment(h * 8, 8) *= acts.beta(t, h);
  auto lambda = acts.g;   // gated linear attention: S(g, beta k, q) with one decay per head
  const auto T_no_removal = semiseparable(lambda, kb, q, {.heads = 4, .head_dim = 8, .groups = 4});
  const Matrix<double> A = materialize(T_exact, 0), B = materialize(T_no_removal, 0);
  const double rel = (A - B).norm() / A.norm();
  std::printf("value head 0: |T - T without key removal| / |T| = %.3f\n", rel);
  std::printf("last row of T, its last 6 tokens:");
  for (Index s = L - 6; s < L; ++s) std::printf(" %+.4f", A(L - 1, s));
  std::printf("\n");
  return err < 1e-10 && rel > 1e-3 ? 0 : 1;
}
