#!/usr/bin/env bash
# The whole test suite, as CI runs it (.ci/run):
#   stage 1   g++: the examples (each runs), the header self-containment and consumption checks, the
#             nvcc builds and ptxas' resource check; no unit-test program (IATTN_TEST_PROGRAMS=OFF)
#   stage 2   clang: every unit-test program, built with AddressSanitizer and UndefinedBehaviorSanitizer
#             (Eigen's assertions on), and run
#   stage 3   the Python package (pip install . into .venv) and its tests (scripts/python.sh)
#   stage 4   ThreadSanitizer: the concurrency stress test, the CUDA kernels on the host emulator, and
#             the missing-barrier race check
# Each test program is compiled once, in stage 2: compiling them twice (g++ release and clang
# sanitized) was half of CI's time (docs/decisions.md, "The test command's time, session 17").
# IATTN_SKIP_SANITIZERS=1 builds the test programs in stage 1 instead (g++, release) and skips
# stages 2 and 4 (local iteration).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/deps.sh --python
# Room for torch's wheels and the build trees, checked now rather than found missing 20 minutes in
bash scripts/check-disk.sh --with-builds
# The Python stage's venv and pinned packages (torch: about 3 GB to download on a fresh machine) are
# fetched in the background while stages 1 and 2 compile; stage 3 waits for them.
mkdir -p build
# OpenMP threads that wait by spinning steal the cores of the tests and compilers beside them (ctest
# -j2 on 2 cores: up to 4x slower); every stage lets them sleep instead (torch's libgomp too).
export OMP_WAIT_POLICY="${OMP_WAIT_POLICY:-PASSIVE}"
bash scripts/python.sh --deps >build/python-deps.log 2>&1 &
python_deps=$!
skip_sanitizers="${IATTN_SKIP_SANITIZERS:-0}"
programs=OFF
[ "$skip_sanitizers" = "1" ] && programs=ON
echo "== [${SECONDS} s] stage 1: release build (g++): examples, build-system checks$([ "$programs" = ON ] && echo ", all tests")"
# With nvcc on the PATH (or in /usr/local/cuda), the CUDA backend's GPU test and example are
# compiled too (for sm_90; they print why and exit 0 without a device); its kernels run on the host
# emulator in the test programs (docs/cuda.md).
cuda=()
if command -v nvcc >/dev/null || [ -x /usr/local/cuda/bin/nvcc ]; then
  # The test and the example for sm_90 only (the H100s and H200s we are lent); the ptxas check
  # still compiles every kernel for sm_80 and sm_90. Half the device compiles: about 60 s of CPU.
  # Their host code at -O1 (nvcc's -O sets the host compiler's level only; the device code is
  # optimised either way): here they only print that no device is present, and the GPU test's host
  # side (the CPU backend as its oracle, float and double) took 117 s of g++ at -O3, 59 s at -O1.
  cuda=(-DIATTN_ENABLE_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 "-DCMAKE_CUDA_FLAGS_RELEASE=-O1 -DNDEBUG")
  command -v nvcc >/dev/null || export PATH="/usr/local/cuda/bin:$PATH"
fi
# -O1 rather than Release's -O3: less compile time (demo.cpp: 64.6 s of g++ at -O2, 49.8 s at -O1),
# and what the tests check does not depend on it; the benchmarks and the Python package keep their
# own flags.
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release "-DCMAKE_CXX_FLAGS_RELEASE=-O1 -DNDEBUG" -DIATTN_BUILD_TESTS=ON \
  -DIATTN_TEST_PROGRAMS=$programs -DIATTN_BUILD_EXAMPLES=ON "${cuda[@]}"
cmake --build build -j2
ctest --test-dir build --output-on-failure -j2
python_stage() {
  echo "== [${SECONDS} s] stage 3: the Python package (pip install . into .venv), its tests"
  if ! wait "$python_deps"; then
    echo "iattn: creating the venv or installing its packages failed:"; tail -n 30 build/python-deps.log; exit 1
  fi
  bash scripts/python.sh --test
}
if [ "$skip_sanitizers" = "1" ]; then
  python_stage
  echo "== stages 2 and 4 skipped (IATTN_SKIP_SANITIZERS=1)"
  exit 0
fi
bash scripts/deps.sh --sanitize
echo "== [${SECONDS} s] stage 2: every test program, AddressSanitizer + UndefinedBehaviorSanitizer (clang)"
# clang compiles the tests in less time than g++ and checks more (float-cast-overflow, for one).
# No debug information: reports name the functions (symbols), not file:line; the compile takes 12 %
# less time (rewrites_test.cpp: 71 s with -gline-tables-only, 63 s without). To see lines, rebuild
# the failing test locally with -gline-tables-only added to CMAKE_CXX_FLAGS.
# IATTN_TEST_BUNDLES: the Catch2 test files compiled in four bundle programs, each library template
# instantiated once per bundle rather than once per file (tests/CMakeLists.txt; CTest still runs and
# names each file's tests on their own).
CXX=clang++ cmake -S . -B build-sanitize -DCMAKE_BUILD_TYPE= "-DCMAKE_CXX_FLAGS=-O1" \
  -DIATTN_BUILD_TESTS=ON -DIATTN_BUILD_EXAMPLES=OFF -DIATTN_INSTALL=OFF -DIATTN_SANITIZE=address,undefined \
  -DIATTN_TEST_BUNDLES=ON
cmake --build build-sanitize -j2
ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1 \
  ctest --test-dir build-sanitize --output-on-failure -j2
python_stage
echo "== [${SECONDS} s] stage 4: ThreadSanitizer on the concurrency stress test"
# Debian's libgomp is not built with ThreadSanitizer (its barriers read as races), so OpenMP runs
# one thread here; the test's own std::threads share one expression.
cmake -S . -B build-tsan -DCMAKE_BUILD_TYPE= "-DCMAKE_CXX_FLAGS=-O1 -g1" -DIATTN_BUILD_TESTS=ON \
  -DIATTN_BUILD_EXAMPLES=OFF -DIATTN_INSTALL=OFF -DIATTN_SANITIZE=thread
cmake --build build-tsan -j2 --target threads_test emulated_kernels_test emulator_race_check
OMP_NUM_THREADS=1 TSAN_OPTIONS=halt_on_error=1 ./build-tsan/tests/threads_test
echo "== [${SECONDS} s] stage 4b: the CUDA kernels on the host emulator under ThreadSanitizer, and the missing-barrier race check"
TSAN_OPTIONS=halt_on_error=1 ./build-tsan/tests/cuda/emulated_kernels_test "[concurrent],[emulator],[errors]"
ctest --test-dir build-tsan -R '^emulator_race_check$' --output-on-failure
echo "== [${SECONDS} s] test.sh: every stage passed"
