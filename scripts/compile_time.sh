#!/usr/bin/env bash
# Compile-time probes (issue 19 part 5): how long a researcher waits for one translation unit.
# Compiles bench/compile/one_model.cpp (full, -DONLY_APPLY, -DPARSE_ONLY) and
# bench/compile/all_models.cpp with g++ (and clang++ if present) at -O2 with the flags a user
# linking iattn::simd and iattn::openmp gets (no -march), RUNS times each, and prints a markdown
# table of the minima (user CPU s, wall s, max RSS MB), the CPU model and the compiler versions.
#
# usage: scripts/compile_time.sh [ROOT] [RUNS]
#   ROOT  checkout whose include/ and bench/compile/ are measured (default: this repository)
#   RUNS  runs per probe (default 3)
# env: CXXS="g++ clang++" to choose compilers, PROBES="full apply parse all" to choose probes.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
root="$(cd "${1:-$here}" && pwd)"
runs="${2:-3}"
cxxs="${CXXS:-g++ clang++}"
probes="${PROBES:-full apply parse all}"
timer=/usr/bin/time
[[ -x $timer ]] || { echo "needs GNU time at /usr/bin/time" >&2; exit 1; }
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT

flags=(-std=c++20 -O2 -fopenmp -DIATTN_USE_XSIMD -I"$root/include" -I/usr/include/eigen3)

probe_args() {
  case "$1" in
    full) echo "$root/bench/compile/one_model.cpp" ;;
    apply) echo "-DONLY_APPLY $root/bench/compile/one_model.cpp" ;;
    parse) echo "-DPARSE_ONLY $root/bench/compile/one_model.cpp" ;;
    all) echo "$root/bench/compile/all_models.cpp" ;;
  esac
}
probe_name() {
  case "$1" in
    full) echo "one model (apply + materialize + materialize_mean)" ;;
    apply) echo "one model, apply only" ;;
    parse) echo "one model, parse only (no main)" ;;
    all) echo "all 15 models" ;;
  esac
}

echo "| probe | compiler | min user s | min wall s | max RSS MB |"
echo "|---|---|---:|---:|---:|"
for cxx in $cxxs; do
  command -v "$cxx" >/dev/null || continue
  for p in $probes; do
    best_u="" best_w="" max_r=0
    for ((i = 0; i < runs; i++)); do
      # shellcheck disable=SC2046
      $timer -f "%U %e %M" -o "$tmp/t" "$cxx" "${flags[@]}" $(probe_args "$p") -c -o "$tmp/o.o"
      read -r u w r <"$tmp/t"
      best_u=$(awk -v a="$best_u" -v b="$u" 'BEGIN{print (a=="" || b<a) ? b : a}')
      best_w=$(awk -v a="$best_w" -v b="$w" 'BEGIN{print (a=="" || b<a) ? b : a}')
      max_r=$(awk -v a="$max_r" -v b="$r" 'BEGIN{print (b>a) ? b : a}')
    done
    printf '| %s | %s | %.1f | %.1f | %d |\n' "$(probe_name "$p")" "$cxx" "$best_u" "$best_w" \
      "$((max_r / 1024))"
  done
done
echo
echo "flags: -std=c++20 -O2 -fopenmp -DIATTN_USE_XSIMD -Iinclude -I/usr/include/eigen3 -c; $runs runs each, minima (RSS: maximum)"
echo "CPU: $(lscpu | sed -n 's/^Model name: *//p') ($(nproc) cores)"
echo "g++: $(g++ --version | head -1)"
command -v clang++ >/dev/null && echo "clang++: $(clang++ --version | head -1)"
true
