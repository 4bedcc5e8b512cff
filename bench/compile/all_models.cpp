// Compile-time probe (issue 19 part 5): all fifteen models, each decomposed from default weights,
// applied, one channel materialized and the channel mean, in float. Built by
// scripts/compile_time.sh, not by CMake (it checks nothing; the tests do).
#include <iattn/iattn.hpp>
#include <iattn/models/all.hpp>

#include <cstdio>

namespace {
template <class W>
void run(const char* name, const W& w, iattn::Index d_model) {
  const auto d = iattn::models::decompose(w, iattn::models::sample_input<float>(16, d_model));
  const iattn::Matrix<float> y = iattn::apply(d.H, d.x);
  const iattn::Matrix<float> a = iattn::materialize(d.H, 0);
  const iattn::Matrix<float> m = iattn::materialize_mean(d.H);
  std::printf("%s %g %g %g\n", name, double(y(1, 0)), double(a(1, 0)), double(m(1, 0)));
}
}  // namespace

int main() {
  using namespace iattn::models;
  using T = float;
  run("mamba", mamba_init<T>({}), 64);
  run("mamba2", mamba2_init<T>({}), 64);
  run("griffin", griffin_init<T>({}), 64);
  run("rwkv4", rwkv4_init<T>({}), 64);
  run("retnet", retnet_init<T>({}), 64);
  run("hgrn", hgrn_init<T>({}), 64);
  run("gla", gla_init<T>({}), 64);
  run("hgrn2", hgrn2_init<T>({}), 64);
  run("rwkv6", rwkv6_init<T>({}), 64);
  run("linear_attention", linear_attention_init<T>({}), 64);
  run("transformer", transformer_init<T>({}), 64);
  run("s4d", s4d_init<T>({}), 64);
  run("hyena", hyena_init<T>({}), 64);
  run("vision_mamba", vision_mamba_init<T>({}), 64);
  run("mlstm", mlstm_init<T>({}), 32);
}
