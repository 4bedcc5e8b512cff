// Concurrent evaluation of one shared expression: six threads apply, materialize and take rows of
// one (bound) expression and must agree bit for bit with a single-threaded evaluation. Its own
// program, small on purpose: scripts/test.sh builds it under ThreadSanitizer (stage 4).
#include "support/test_common.hpp"

#include <thread>
#include <vector>

using namespace test;
using namespace iattn;

TEST_CASE("concurrent apply, materialize and row on one shared expression agree bit for bit", "[reliability][threads]") {
  const Index L = 300, D = 24, N = 8, K = 4;
  const Mat<float> dt = uniform<float>(L, D, 0.01, 0.2), A = uniform<float>(D, N, -2, -0.1), B = normal<float>(L, N), C = normal<float>(L, N);
  const Mat<float> g = uniform<float>(L, D, 0, 1), w = normal<float>(K, D), x = normal<float>(L, D);
  const auto H = group_norm<float>(4) * diagonal(g) * semiseparable(factored_decay(dt, A), B, C, {.heads = D}) * diagonal(dt) * causal_conv(w);
  const Mat<float> y0 = apply(H, x);
  const auto Hb = bind(H, x);
  const Mat<float> m0 = materialize(Hb, 7), r0 = row(Hb, 150);
  std::vector<std::thread> pool;
  std::vector<int> mismatches(6, 0);
  for (int i = 0; i < 6; ++i)
    pool.emplace_back([&, i] {
      for (int it = 0; it < 10; ++it) {
        if (Mat<float>(apply(H, x)) != y0) ++mismatches[std::size_t(i)];
        if (Mat<float>(materialize(Hb, 7)) != m0) ++mismatches[std::size_t(i)];
        if (Mat<float>(row(Hb, 150)) != r0) ++mismatches[std::size_t(i)];
      }
    });
  for (auto& t : pool) t.join();
  for (int m : mismatches) REQUIRE(m == 0);
}
