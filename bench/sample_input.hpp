// bench/sample_input.hpp: the benchmarks' layer input, shared by models_bench.cpp and
// pair/workload.cpp so that bench/pair_ab.sh times the rows' own calls. Internal linkage: the
// paired comparison compiles it once per version of the library (its namespace renamed), and two
// inline definitions differing only in their return type would be merged by the linker.
#pragma once

#include <iattn/core/config.hpp>

#include <random>

namespace {
/// (L, d_model) standard normal entries from a fixed seed.
[[maybe_unused]] iattn::Matrix<float> sample_input(iattn::Index L, iattn::Index d_model) {
  std::mt19937 rng(7);
  std::normal_distribution<float> nd(0.f, 1.f);
  iattn::Matrix<float> u(L, d_model);
  for (iattn::Index i = 0; i < u.size(); ++i) u.data()[i] = nd(rng);
  return u;
}
}  // namespace
