// L = 100 000 with strong decay: no NaN or Inf, and fp32 matches fp64 to 1e-4 relative, for apply,
// row, col and a tile far from the start.
#include "support/expressions.hpp"

using namespace test;

TEST_CASE("long sequences: fp32 matches fp64, everything finite", "[long]") {
  const Index L = 100000, D = 4, N = 16;
  MatD lam = uniform<double>(L, D * N, -8.0, -0.5);  // strong decay
  for (Index t = 0; t < L; t += 997) lam(t, 3) = -std::numeric_limits<double>::infinity();
  const MatD B = normal<double>(L, N), C = normal<double>(L, N), g = normal<double>(L, D), x = normal<double>(L, D);
  const MatD a = uniform<double>(L, D, 0.0, 0.9), b = normal<double>(L, D);
  const MatD w = normal<double>(4, D);
  auto build = [&](const auto& lam_, const auto& B_, const auto& C_, const auto& g_, const auto& a_, const auto& b_, const auto& w_) {
    using namespace iattn;
    return diagonal(g_) * (semiseparable(lam_, B_, C_, {.heads = D}) + linear_recurrence(a_, b_)) * causal_conv(w_);
  };
  const Mat<float> lamf = lam.cast<float>(), Bf = B.cast<float>(), Cf = C.cast<float>(), gf = g.cast<float>(),
                   af = a.cast<float>(), bf = b.cast<float>(), wf = w.cast<float>(), xf = x.cast<float>();
  auto H64 = build(lam, B, C, g, a, b, w);
  auto H32 = build(lamf, Bf, Cf, gf, af, bf, wf);

  const MatD y64 = iattn::apply(H64, x);
  const Mat<float> y32 = iattn::apply(H32, xf);
  REQUIRE(y64.allFinite());
  REQUIRE(y32.allFinite());
  check_close(y32, y64, 1e-4);

  const MatD r64 = iattn::row(H64, L - 1);
  const Mat<float> r32 = iattn::row(H32, L - 1);
  REQUIRE(r32.allFinite());
  check_close(r32, r64, 1e-4);

  const MatD c64 = iattn::col(H64, L / 2);
  const Mat<float> c32 = iattn::col(H32, L / 2);
  check_close(c32, c64, 1e-4);

  const iattn::range rows{L - 300, L - 100}, cols{L - 400, L - 150};
  const MatD t64 = iattn::block(H64, 2, rows, cols);
  const Mat<float> t32 = iattn::block(H32, 2, rows, cols);
  REQUIRE(t32.allFinite());
  check_close(t32, t64, 1e-4);
  // the tile equals the row evaluation
  check_close(t64.row(199), r64.row(2).segment(cols.begin, cols.size()), 1e-10);
}
