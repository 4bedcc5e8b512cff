#!/usr/bin/env bash
# Builds the libFuzzer targets in fuzz/ with clang (ASan + UBSan) and runs each for a bounded time.
#   bash scripts/fuzz.sh [seconds per target = 60]
# Inputs that crash are saved to build-fuzz/crashes/<target>/; copy them to tests/data/fuzz/<target>/,
# where the CTest entries fuzz_<target>_replay run them on every test run (regression tests).
set -euo pipefail
cd "$(dirname "$0")/.."
secs="${1:-60}"
pkgs=(clang libclang-rt-14-dev libeigen3-dev nlohmann-json3-dev)
missing=()
for p in "${pkgs[@]}"; do dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p"); done
if [ ${#missing[@]} -gt 0 ]; then
  sudo_cmd=(); [ "$(id -u)" -ne 0 ] && sudo_cmd=(sudo)
  "${sudo_cmd[@]}" apt-get update -q && "${sudo_cmd[@]}" apt-get install -y -q --no-install-recommends "${missing[@]}"
fi
mkdir -p build-fuzz
status=0
for target in npy expr safetensors; do
  echo "== fuzz_${target}: building"
  clang++ -std=c++20 -O1 -g -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=all \
    -Iinclude -I/usr/include/eigen3 "fuzz/${target}_fuzz.cpp" -o "build-fuzz/${target}_fuzz"
  corpus="build-fuzz/corpus/${target}"
  crashes="build-fuzz/crashes/${target}"
  mkdir -p "$corpus" "$crashes"
  seeds=("tests/data/fuzz/${target}")
  [ "$target" = npy ] && seeds+=(tests/data/npy)
  echo "== fuzz_${target}: running ${secs} s"
  if ! "build-fuzz/${target}_fuzz" -max_total_time="$secs" -timeout=10 -rss_limit_mb=2048 \
      -artifact_prefix="${crashes}/" "$corpus" "${seeds[@]}" 2> "build-fuzz/${target}.log"; then
    status=1
  fi
  tail -n 3 "build-fuzz/${target}.log"
  n=$(find "$crashes" -type f | wc -l)
  echo "== fuzz_${target}: ${n} crashing input(s) in ${crashes}"
  [ "$n" -gt 0 ] && status=1
done
exit "$status"
