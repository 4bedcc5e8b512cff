// The race check under ThreadSanitizer: the broken neighbour_sum (no sync_threads between the
// shared-memory writes and the neighbours' reads) on the emulator's concurrent schedule. Built in
// a ThreadSanitizer build only (IATTN_SANITIZE=thread); its CTest entry passes when TSan reports
// the data race in neighbour_sum<false> (and fails if the kernel runs clean: a missed race).
#include "simt_kernels.hpp"

#include <cstdio>
#include <vector>

int main() {
  namespace simt = iattn::simt;
  const simt::index n = 512;
  std::vector<float> in(n, 1.0f), out(n);
  simt::launch("neighbour_sum<false>", &simt_test::neighbour_sum<false, float>, {{2}, {256}, 0},
               {simt::schedule::concurrent}, in.data(), out.data(), n);
  std::printf("emulator_race_check: the broken kernel ran\n");
  return 0;
}
