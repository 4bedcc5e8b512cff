// Every structured rewrite of Product (backend/cpu/product.hpp) against the dense product of the
// factors' oracles: diag*diag, diag*S, S*diag, S*conv (semiseparable plus a band), conv*S, the
// fused Mamba-1 chain, and the dense fallback (S*S, LR*flip).
#include "support/expressions.hpp"

using namespace test;

TEMPLATE_TEST_CASE("product rewrites equal the dense products", "[rewrites]", float, double) {
  using T = TestType;
  using namespace iattn;
  const Index D = 3, N = 5;
  for (Index L : lengths) {
    INFO("L = " << L);
    const Mat<T> d = normal<T>(L, D), e = normal<T>(L, D), a = uniform<T>(L, D, 0.2, 0.95), b = normal<T>(L, D);
    const Mat<T> lam = uniform<T>(L, D * N, -1, -0.01), B = normal<T>(L, N), C = normal<T>(L, N);
    const Mat<T> w4 = normal<T>(4, D), wl = normal<T>(std::min<Index>(L, 80), D, 0.2);
    auto S = semiseparable(lam, B, C, {.heads = D});
    auto R = linear_recurrence(a, b);
    const double tol = tolerance<T>();
    for (Index c : {Index(0), D - 1}) {
      const MatD Dd = dense_diagonal(dd(d), c, L), De = dense_diagonal(dd(e), c, L);
      const MatD Sd = dense_semiseparable(dd(lam), dd(B), dd(C), D, 1, 1, c);
      const MatD Rd = dense_linear_recurrence(dd(a), dd(b), c);
      const MatD M4 = dense_conv(dd(w4), c, L), Ml = dense_conv(dd(wl), c, L);
      { INFO("diag(d) diag(e) = diag(d e)"); check_close(materialize(diagonal(d) * diagonal(e), c, L), Dd * De, tol); }
      { INFO("diag(d) S = S(l, B, diag(d) C)"); check_close(materialize(diagonal(d) * S, c), Dd * Sd, tol); }
      { INFO("S diag(e) = S(l, diag(e) B, C)"); check_close(materialize(S * diagonal(e), c), Sd * De, tol); }
      { INFO("S conv = semiseparable plus a band");
        check_close(materialize(S * causal_conv(w4), c), Sd * M4, tol);
        check_close(materialize(S * causal_conv(wl), c), Sd * Ml, tol);
      }
      { INFO("conv S"); check_close(materialize(causal_conv(w4) * S, c), M4 * Sd, tol); }
      { INFO("conv conv"); check_close(materialize(causal_conv(w4) * causal_conv(wl), c, L), M4 * Ml, tol); }
      { INFO("LR conv (Griffin's recurrence after its conv)");
        check_close(materialize(diagonal(d) * R * causal_conv(w4), c), Dd * Rd * M4, tol);
      }
      { INFO("fused diag S diag diag conv (Mamba-1 composite)");
        check_close(materialize(diagonal(d) * S * diagonal(e) * diagonal(a) * causal_conv(w4), c),
                    Dd * Sd * De * dense_diagonal(dd(a), c, L) * M4, tol);
      }
      { INFO("dense fallbacks: S S, R flip(R)");
        check_close(materialize(S * S, c), Sd * Sd, tol);
        if (L <= 257) {
          MatD J = MatD::Zero(L, L);
          for (Index t = 0; t < L; ++t) J(t, L - 1 - t) = 1;
          check_close(materialize(R * flip(R), c), Rd * (J * Rd * J), tol);
        }
      }
    }
  }
}
