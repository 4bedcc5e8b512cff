// Semiseparable against the dense oracle (plain loops over design.md's formula), float and double,
// per-state and per-head decay, heads/groups, strict with and without bonus, lambda = -inf resets.
#include "support/test_common.hpp"

using namespace test;

namespace {

struct ss_case {
  const char* name;
  Index H, P, G, N;
  bool per_state, strict, bonus, resets;
};

const ss_case cases[] = {
    {"mamba1-like per-state N=16", 5, 1, 1, 16, true, false, false, false},
    {"per-state N=3 (SIMD tail)", 3, 1, 1, 3, true, false, false, false},
    {"mamba2-like scalar decay, heads and groups", 4, 3, 2, 5, false, false, false, false},
    {"per-state with head_dim 2 (GLA-like)", 2, 2, 1, 4, true, false, false, false},
    {"strict with bonus (RWKV)", 3, 2, 3, 4, true, true, true, false},
    {"strict without bonus", 2, 1, 1, 3, false, true, false, false},
    {"resets lambda = -inf", 3, 1, 1, 8, true, false, false, true},
    {"strict with bonus and resets", 2, 1, 1, 17, true, true, true, true},
};

template <class T>
void run_case(const ss_case& k, Index L) {
  INFO(k.name << ", L = " << L);
  const Index D = k.H * k.P;
  Mat<T> lam = uniform<T>(L, k.per_state ? k.H * k.N : k.H, -1.0, -0.01);
  if (k.resets)
    for (Index t = 0; t < L; t += 5) lam(t, (t / 5) % lam.cols()) = -std::numeric_limits<T>::infinity();
  const Mat<T> B = normal<T>(L, k.G * k.N), C = normal<T>(L, k.G * k.N), u = normal<T>(k.H, k.N);
  const Mat<T> x = normal<T>(L, D);
  const iattn::semiseparable_options o{.heads = k.H, .head_dim = k.P, .groups = k.G, .strict = k.strict};
  auto S = k.bonus ? iattn::semiseparable(lam, B, C, u, o) : iattn::semiseparable(lam, B, C, o);
  const MatD ud = dd(u);
  auto oracle = [&](Index c) {
    return dense_semiseparable(dd(lam), dd(B), dd(C), k.H, k.P, k.G, c, k.strict, k.bonus ? &ud : nullptr);
  };
  const double tol = tolerance<T>();
  // materialize: first, a middle and the last channel
  for (Index c : {Index(0), D / 2, D - 1}) check_close(iattn::materialize(S, c), oracle(c), tol);
  // apply
  check_close(iattn::apply(S, x), dense_apply(oracle, dd(x)), tol);
}

}  // namespace

TEMPLATE_TEST_CASE("semiseparable matches the dense oracle", "[semiseparable]", float, double) {
  for (const auto& k : cases)
    for (Index L : lengths) run_case<TestType>(k, L);
}

TEST_CASE("semiseparable with lambda = 0 is masked linear attention", "[semiseparable]") {
  const Index L = 70, N = 6;
  const MatD lam = MatD::Zero(L, 1), B = normal<double>(L, N), C = normal<double>(L, N);
  auto S = iattn::semiseparable(lam, B, C, {.heads = 1});
  const MatD M = iattn::materialize(S, 0);
  MatD expected = (C * B.transpose()).triangularView<Eigen::Lower>();
  check_close(M, expected, 1e-12);
}

TEST_CASE("semiseparable: a reset (lambda = -inf) cuts all earlier tokens off exactly", "[semiseparable]") {
  const Index L = 200, N = 4;
  MatD lam = uniform<double>(L, N, -0.5, 0.0);
  lam(100, 2) = -std::numeric_limits<double>::infinity();
  const MatD B = normal<double>(L, N), C = MatD::Zero(L, N);
  MatD Cm = C;
  Cm.col(2).setOnes();  // read only state 2
  auto S = iattn::semiseparable(lam, B, Cm, {.heads = 1});
  const MatD M = iattn::materialize(S, 0);
  REQUIRE(M.allFinite());
  for (Index t = 100; t < L; ++t)
    for (Index s = 0; s < 100; ++s) REQUIRE(M(t, s) == 0.0);
  REQUIRE(M(150, 120) != 0.0);
}

TEST_CASE("semiseparable: N is inferred from B and the groups", "[semiseparable]") {
  const MatD lam = uniform<double>(9, 4, -1, 0), B = normal<double>(9, 6), C = normal<double>(9, 6);
  auto S = iattn::semiseparable(lam, B, C, {.heads = 4, .head_dim = 2, .groups = 2});
  REQUIRE(S.state() == 3);
  REQUIRE(S.channels() == 8);
  REQUIRE_FALSE(S.per_state());
}
