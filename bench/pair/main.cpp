// bench/pair/main.cpp: bench/pair_ab.sh's driver. Calls side a and side b of one case alternately
// in one process (a b, b a, a b, ...: neither always runs first), after one call of each that is not
// counted, and prints the medians and minima of each side and the median of the per-pair ratios a / b
// (above 1: b is faster). Both sides share the process, its heap and the sitting, so the drift of a
// shared VM between processes and runs cancels in each pair's ratio.
//   pair CASE LENGTH PAIRS
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <vector>

double pair_run_a(const char* name, long L);
double pair_run_b(const char* name, long L);

namespace {
double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}
double minimum(const std::vector<double>& v) { return *std::min_element(v.begin(), v.end()); }
double maximum(const std::vector<double>& v) { return *std::max_element(v.begin(), v.end()); }
}  // namespace

int main(int argc, char** argv) {
  if (argc != 4) {
    std::fprintf(stderr, "usage: %s CASE LENGTH PAIRS\n", argv[0]);
    return 2;
  }
  const char* name = argv[1];
  const long L = std::atol(argv[2]);
  const int pairs = std::atoi(argv[3]);
  if (L < 1 || pairs < 1) {
    std::fprintf(stderr, "LENGTH and PAIRS must be positive integers (got '%s', '%s')\n", argv[2], argv[3]);
    return 2;
  }
  try {
    pair_run_a(name, L);  // builds the layer, touches the buffers
    pair_run_b(name, L);
    std::vector<double> a, b, r;
    for (int i = 0; i < pairs; ++i) {
      double x, y;
      if (i % 2 == 0) {
        x = pair_run_a(name, L);
        y = pair_run_b(name, L);
      } else {
        y = pair_run_b(name, L);
        x = pair_run_a(name, L);
      }
      a.push_back(x), b.push_back(y), r.push_back(x / y);
    }
    std::printf("case %s L=%ld pairs=%d\n", name, L, pairs);
    std::printf("a: median %.3f ms, min %.3f ms\n", median(a), minimum(a));
    std::printf("b: median %.3f ms, min %.3f ms\n", median(b), minimum(b));
    std::printf("a/b: median %.3f (pairs %.3f .. %.3f)\n", median(r), minimum(r), maximum(r));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return 0;
}
