#!/usr/bin/env bash
# The CUDA backend on a real GPU (docs/cuda.md): builds with IATTN_ENABLE_CUDA=ON, runs nvcc's
# resource check of every kernel (ptxas: no spills, the register floors), the emulated kernel test,
# the real-GPU test (every kernel against the CPU backend and plain loops, float and double), the
# CUDA example (examples/13_cuda_mamba1.cu) and,
# when Google Benchmark is installed (scripts/deps.sh --bench), the CUDA benchmarks, then, where
# python3 (or $PYTHON) has a CUDA-enabled torch, bench/compare_pytorch_gpu.py: iattn against
# PyTorch's formulations on the same GPU and inputs, checked against float64, as a table.
#
#   bash scripts/gpu-check.sh [build-dir]          default build-dir: build-gpu
#   CUDA_ARCHS="90" bash scripts/gpu-check.sh      architectures (default "80;90")
#   CUDACXX=/path/to/nvcc bash scripts/gpu-check.sh
#
# Without a GPU the tests still build and run: the real-GPU test says why it skipped and passes,
# and the benchmarks are not run. Exit status: non-zero if a build or a test failed.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build-gpu}
archs=${CUDA_ARCHS:-80;90}
nvcc=${CUDACXX:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}
if [ ! -x "$nvcc" ]; then
  echo "gpu-check: nvcc not found (put it on PATH or set CUDACXX)" >&2
  exit 1
fi
jobs=$(nproc 2>/dev/null || echo 2)

gpu=0
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L 2>/dev/null | grep -q '^GPU '; then
  gpu=1
  nvidia-smi -L
else
  echo "gpu-check: no GPU visible to nvidia-smi; building and running what runs without one"
fi
bench=OFF
if [ -f /usr/include/benchmark/benchmark.h ] || [ -f /usr/local/include/benchmark/benchmark.h ]; then
  bench=ON
else
  echo "gpu-check: Google Benchmark not installed (bash scripts/deps.sh --bench); benchmarks skipped"
fi

echo "== configure ($build: $("$nvcc" --version | grep -o "release [0-9.]*"), architectures $archs)"
cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release -DIATTN_ENABLE_CUDA=ON -DCMAKE_CUDA_COMPILER="$nvcc" \
  "-DCMAKE_CUDA_ARCHITECTURES=$archs" -DIATTN_BUILD_TESTS=ON -DIATTN_BUILD_EXAMPLES=ON -DIATTN_INSTALL=OFF \
  -DIATTN_BUILD_BENCHMARKS=$bench
targets=(gpu_kernels_test emulated_kernels_test 13_cuda_mamba1)
[ "$bench" = ON ] && targets+=(iattn_cuda_bench iattn_cuda_compare)
echo "== build: ${targets[*]}"
cmake --build "$build" -j"$jobs" --target "${targets[@]}"

echo "== tests: nvcc resource check, emulated kernels, real-GPU kernels, the CUDA example"
ctest --test-dir "$build" --output-on-failure \
  -R '^(cuda_ptxas_check|cuda_ptxas_check_selftest|emulated_kernels_test|gpu_kernels_test|example_13_cuda_mamba1)$'
# Once more directly, for its device line and comparison count in the log.
"$build/tests/cuda/gpu_kernels_test"

if [ "$gpu" = 1 ] && [ "$bench" = ON ]; then
  echo "== benchmarks (results also in $build/cuda_bench.json)"
  "$build/bench/iattn_cuda_bench" --benchmark_out="$build/cuda_bench.json" --benchmark_out_format=json
  py=${PYTHON:-python3}
  if "$py" -c 'import sys, torch, numpy; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
    echo "== against PyTorch on this GPU (bench/compare_pytorch_gpu.py; rows also in $build/compare_pytorch_gpu.json)"
    "$py" bench/compare_pytorch_gpu.py --tool "$build/bench/iattn_cuda_compare" --json "$build/compare_pytorch_gpu.json"
  else
    echo "gpu-check: $py has no CUDA-enabled torch and numpy; the PyTorch comparison is skipped (PYTHON=... to choose)"
  fi
fi
echo "gpu-check: done"
