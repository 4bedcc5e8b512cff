// iattn_compare: the iattn side of bench/compare_pytorch.py. For one length L it draws the inputs
// of a Mamba-1 layer's holistic matrix (D = 1536, N = 16, K = 4, float)
//   H = diag(g) (S diag(dt) + diag(Dskip)) diag(sig) conv(w),  S with decay dt (x) A,
// writes them as .npy, evaluates apply(H, x), materialize(H, c), materialize_mean(H) and
// row(H, t), writes the results as .npy and prints the best-of-reps wall times as one JSON line.
//
//   iattn_compare <dir> <L> [reps=3] [D=1536]
//   iattn_compare --model mamba1 <dir> <L> [reps=3] [D=1536]      (the same)
//
// With --model gdn it draws the inputs of H heads of Gated DeltaNet at Qwen3-Next's head shape
// (dk = dv = 128): per head H_h[t, s] = q_t^T A_t ... A_{s+1} beta_s k_s, A_t = e^{g_t} (I - beta_t k_t k_t^T),
// with q and k L2-normalised per head (q then scaled by dk^-1/2, as the models do, so the reader
// passes scale = 1), v ~ N(0, 1), beta ~ U(0.02, 0.98), g = log(U(0.9, 1)) (decays e^g in (0.9, 1)),
// writes q, k, v, beta, g as .npy (float32; q, k, v (L, H*128), beta, g (L, H)), evaluates
// apply(H, v) (L, H*128), materialize(H, 0) (head 0, (L, L)) and row(H, L - 1) ((H*128, L)), writes
// them as apply.npy, materialize.npy, row.npy and prints the best-of-reps wall times as one JSON line.
//
//   iattn_compare --model gdn <dir> <L> [reps=3] [H=4]
#include <iattn/explain/npy.hpp>
#include <iattn/iattn.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <random>
#include <string>

using iattn::Index;
using Mat = iattn::Matrix<float>;

namespace {

template <class F>
double best_seconds(int reps, F&& f) {
  double best = 1e300;
  for (int r = 0; r < reps; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    f();
    best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  return best;
}

/// Gated DeltaNet, H heads of dk = dv = 128 (see the header).
int run_gdn(const std::filesystem::path& dir, Index L, int reps, Index H) {
  const Index N = 128, P = 128, channel = 0, row_t = L - 1;
  std::filesystem::create_directories(dir);
  std::mt19937 rng(2025);
  std::normal_distribution<float> nd(0.f, 1.f);
  std::uniform_real_distribution<float> ud(0.f, 1.f);
  // (L, H*N) normal rows, each head's N-vector L2-normalised (in double) and scaled by `scale`.
  auto unit_heads = [&](float scale) {
    Mat m(L, H * N);
    for (Index t = 0; t < L; ++t)
      for (Index h = 0; h < H; ++h) {
        double ss = 0;
        for (Index j = 0; j < N; ++j) {
          const float x = nd(rng);
          m(t, h * N + j) = x;
          ss += double(x) * x;
        }
        const float f = float(scale / std::sqrt(ss));
        for (Index j = 0; j < N; ++j) m(t, h * N + j) *= f;
      }
    return m;
  };
  const Mat q = unit_heads(1.f / std::sqrt(float(N))), k = unit_heads(1.f);
  Mat v(L, H * P), beta(L, H), g(L, H);
  for (Index i = 0; i < v.size(); ++i) v.data()[i] = nd(rng);
  for (Index i = 0; i < beta.size(); ++i) beta.data()[i] = 0.02f + 0.96f * ud(rng);
  for (Index i = 0; i < g.size(); ++i) g.data()[i] = std::log(0.9f + 0.1f * ud(rng));  // <= 0

  using namespace iattn;
  Mat y, Mc, R;
  // The factory's coefficient pass (k~ = beta k, b = -e^g beta k) is part of each timed call.
  auto op = [&] { return gated_delta_rule(q, k, beta, g, transition_options{.heads = H, .head_dim = P, .state = N}); };
  const double t_apply = best_seconds(reps, [&] { y = apply(op(), v); });
  const double t_mat = best_seconds(reps, [&] { Mc = materialize(op(), channel); });
  const double t_rowq = best_seconds(reps, [&] { R = row(op(), row_t); });

  for (const auto& [name, m] : {std::pair<const char*, const Mat*>{"q", &q}, {"k", &k}, {"v", &v}, {"beta", &beta},
                                {"g", &g}, {"apply", &y}, {"materialize", &Mc}, {"row", &R}})
    npy::write((dir / (std::string(name) + ".npy")).string(), *m);
  std::printf("{\"model\": \"gdn\", \"L\": %ld, \"H\": %ld, \"dk\": %ld, \"dv\": %ld, \"channel\": %ld, "
              "\"row\": %ld, \"threads\": %d, \"apply\": %.6g, \"materialize\": %.6g, \"row_s\": %.6g}\n",
              long(L), long(H), long(N), long(P), long(channel), long(row_t), cpu_detail::max_threads(), t_apply,
              t_mat, t_rowq);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const char* prog = argv[0];
  std::string model = "mamba1";
  if (argc > 2 && std::string(argv[1]) == "--model") {
    model = argv[2];
    argv += 2;
    argc -= 2;
  }
  if (argc < 3 || (model != "mamba1" && model != "gdn")) {
    std::fprintf(stderr,
                 "usage: %s [--model mamba1] <dir> <L> [reps=3] [D=1536]\n"
                 "       %s --model gdn <dir> <L> [reps=3] [H=4]\n",
                 prog, prog);
    return 2;
  }
  if (model == "gdn")
    return run_gdn(argv[1], std::stol(argv[2]), argc > 3 ? std::stoi(argv[3]) : 3, argc > 4 ? std::stol(argv[4]) : 4);
  const std::filesystem::path dir = argv[1];
  const Index L = std::stol(argv[2]);
  const int reps = argc > 3 ? std::stoi(argv[3]) : 3;
  const Index D = argc > 4 ? std::stol(argv[4]) : 1536, N = 16, K = 4, channel = 7, row_t = L - 1;
  std::filesystem::create_directories(dir);

  std::mt19937 rng(2024);
  std::normal_distribution<float> nd(0.f, 1.f);
  std::uniform_real_distribution<float> ud(0.f, 1.f);
  auto normal = [&](Index r, Index c, float sd) { Mat m(r, c); for (Index i = 0; i < m.size(); ++i) m.data()[i] = sd * nd(rng); return m; };
  auto uniform = [&](Index r, Index c, float lo, float hi) { Mat m(r, c); for (Index i = 0; i < m.size(); ++i) m.data()[i] = lo + (hi - lo) * ud(rng); return m; };
  const Mat x = normal(L, D, 1), g = normal(L, D, 1), dt = uniform(L, D, 0.001f, 0.1f), B = normal(L, N, 1), C = normal(L, N, 1);
  const Mat sig = uniform(L, D, 0, 1), w = normal(K, D, 0.5f), Dskip = normal(1, D, 1);
  Mat A(D, N);
  for (Index c = 0; c < D; ++c)
    for (Index m = 0; m < N; ++m) A(c, m) = -float(m + 1);  // S4D-real: A = -exp(A_log), A_log = log(1..N)

  using namespace iattn;
  const auto H = diagonal(g) * (semiseparable(factored_decay(dt, A), B, C, {.heads = D}) * diagonal(dt) + diagonal(Dskip)) *
                 diagonal(sig) * causal_conv(w);

  Mat y, Mc, Mm, R;
  const double t_apply = best_seconds(reps, [&] { y = apply(H, x); });
  const double t_mat = best_seconds(reps, [&] { Mc = materialize(H, channel); });
  const double t_mean = best_seconds(reps, [&] { Mm = materialize_mean(H); });
  const double t_rowq = best_seconds(reps, [&] { R = row(H, row_t); });

  for (const auto& [name, m] : {std::pair<const char*, const Mat*>{"x", &x}, {"g", &g}, {"dt", &dt}, {"A", &A}, {"B", &B},
                                {"C", &C}, {"sig", &sig}, {"w", &w}, {"Dskip", &Dskip}, {"apply", &y},
                                {"materialize", &Mc}, {"materialize_mean", &Mm}, {"row", &R}})
    npy::write((dir / (std::string(name) + ".npy")).string(), *m);
  std::printf("{\"L\": %ld, \"D\": %ld, \"N\": %ld, \"K\": %ld, \"channel\": %ld, \"row\": %ld, \"threads\": %d, "
              "\"apply\": %.6g, \"materialize\": %.6g, \"materialize_mean\": %.6g, \"row_s\": %.6g}\n",
              long(L), long(D), long(N), long(K), long(channel), long(row_t), cpu_detail::max_threads(), t_apply, t_mat,
              t_mean, t_rowq);
  return 0;
}
