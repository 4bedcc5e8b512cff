// 02: composing operators: a Griffin-style gated linear recurrence after a conv, a bidirectional
// sum with a flipped copy, an RWKV-style row-normalised strict form; row and col queries agree with
// the materialized matrix.
#include <iattn/iattn.hpp>

#include <cstdio>
#include <random>

using iattn::Index;
using Mat = iattn::Matrix<double>;

int main() {
  using namespace iattn;
  const Index L = 96, D = 8;
  std::mt19937 rng(3);
  std::uniform_real_distribution<double> unif(0.0, 1.0);
  auto rand = [&](Index r, Index c, double lo, double hi) { Mat m(r, c); for (Index i = 0; i < m.size(); ++i) m.data()[i] = lo + (hi - lo) * unif(rng); return m; };

  const Mat a = rand(L, D, 0.8, 0.999), b = rand(L, D, 0.0, 1.0), gate = rand(L, D, 0.0, 1.0), w = rand(4, D, -0.5, 0.5);
  auto griffin = diagonal(gate) * linear_recurrence(a, b) * causal_conv(w);
  auto bidirectional = griffin + flip(griffin);
  const Mat lam = rand(L, D, -1.0, -0.1), k = rand(L, D, 0.1, 2.0), ones = Mat::Ones(L, D), u = rand(D, 1, 0.5, 1.5);
  auto rwkv = row_normalize(semiseparable(lam, k, ones, u, {.heads = D, .groups = D}));

  const Mat G = materialize(griffin, 3), Bi = materialize(bidirectional, 3), R = materialize(rwkv, 3);
  const Mat r = row(bidirectional, 40), c = col(griffin, 10);
  const double e1 = (r.row(3) - Bi.row(40)).cwiseAbs().maxCoeff();
  const double e2 = (c.row(3) - G.col(10).transpose()).cwiseAbs().maxCoeff();
  const double e3 = (R.rowwise().sum().array() - 1.0).abs().maxCoeff();
  std::printf("griffin: causal %s; bidirectional: symmetric in structure %s\n",
              G.triangularView<Eigen::StrictlyUpper>().toDenseMatrix().isZero() ? "yes" : "no",
              (Bi - Bi.reverse()).isZero(1e-12) ? "(mirror-symmetric)" : "(forward and flipped parts)");
  std::printf("row(H,40) vs materialize: %.1e   col(H,10) vs materialize: %.1e   rwkv rows sum to 1: %.1e\n", e1, e2, e3);
  return (e1 < 1e-12 && e2 < 1e-12 && e3 < 1e-12) ? 0 : 1;
}
