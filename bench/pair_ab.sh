#!/usr/bin/env bash
# Compares two versions of the headers in one process, call against call (bench/pair/).
#
#   bench/pair_ab.sh [--case mamba1_mean|mamba2_mean|vim_all|mamba1_apply|mamba2_apply|vim_apply] [--length L] [--pairs P]
#                    [--threads T] A B
#
# A and B: a git revision of this repository (its include/ is exported) or a directory holding
# include/iattn (a checkout, a copy being edited). bench/pair/workload.cpp is compiled once against
# each, with the library's namespace renamed (iattn_a, iattn_b), and linked into one program that
# calls the two versions alternately (bench/pair/main.cpp): one uncounted call of each, then P
# pairs, alternating which side goes first. It prints each side's median and minimum and the median
# of the per-pair ratios a / b (above 1: B is faster).
#
# Why: the development VMs drift by 10-40 % within minutes and between processes (another tenant's
# load, the host's backing of fresh memory), so separate runs of two builds, even alternated
# (bench/ab.py), resolve a few per cent only with many rounds. In one process each pair's two calls
# share the heap and the moment. Comparing a version with itself (A = B) shows the resolution of a
# sitting: docs/performance.md, session 40, measured medians of 0.97-1.02 over 20 pairs of the
# Mamba-1 mean. Defaults: the case's benchmark length (1024; vim_all 197), 20 pairs, the
# environment's OMP_NUM_THREADS. CXX (default g++) and CXXFLAGS (added) choose the compiler.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/.." && pwd)

usage() { sed -n '4,5p' "$0" | sed 's/^# //' >&2; exit 2; }
name=mamba1_mean length="" pairs=20 threads="" specs=()
while [ $# -gt 0 ]; do
  case "$1" in
    --case) name=${2:?--case needs a value}; shift 2 ;;
    --length) length=${2:?--length needs a value}; shift 2 ;;
    --pairs) pairs=${2:?--pairs needs a value}; shift 2 ;;
    --threads) threads=${2:?--threads needs a value}; shift 2 ;;
    -h|--help) usage ;;
    -*) echo "pair_ab.sh: unknown option '$1'" >&2; usage ;;
    *) specs+=("$1"); shift ;;
  esac
done
[ ${#specs[@]} -eq 2 ] || { echo "pair_ab.sh: expected two versions A and B, got ${#specs[@]}" >&2; usage; }
case "$name" in
  mamba1_mean|mamba2_mean|mamba1_apply|mamba2_apply|vim_apply) : "${length:=1024}" ;;
  vim_all) : "${length:=197}" ;;
  *) echo "pair_ab.sh: unknown --case '$name' (expected mamba1_mean, mamba2_mean, vim_all, mamba1_apply, mamba2_apply or vim_apply)" >&2; exit 2 ;;
esac
for v in "length=$length" "pairs=$pairs" ${threads:+"threads=$threads"}; do
  [[ "${v#*=}" =~ ^[1-9][0-9]*$ ]] ||
    { echo "pair_ab.sh: --${v%%=*} must be a positive integer, got '${v#*=}'" >&2; exit 2; }
done

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# The include directory of a version: a directory's own, or a revision's exported into $work.
include_of() {
  local spec=$1 dir=$2
  if [ -d "$spec/include/iattn" ]; then
    (cd "$spec/include" && pwd)
  elif git -C "$root" rev-parse --verify -q "$spec^{commit}" > /dev/null; then
    mkdir -p "$dir"
    git -C "$root" archive "$spec" include | tar -x -C "$dir"
    [ -d "$dir/include/iattn" ] || { echo "pair_ab.sh: revision '$spec' has no include/iattn" >&2; return 1; }
    echo "$dir/include"
  else
    echo "pair_ab.sh: '$spec' is neither a directory holding include/iattn nor a revision of $root" >&2
    return 1
  fi
}
inc_a=$(include_of "${specs[0]}" "$work/a") || exit 2
inc_b=$(include_of "${specs[1]}" "$work/b") || exit 2

cxx=${CXX:-g++}
flags=(-O3 -march=native -DNDEBUG -fopenmp -std=gnu++20 -isystem /usr/include/eigen3 -DIATTN_USE_XSIMD=1 ${CXXFLAGS:-})
echo "building a (${specs[0]}) and b (${specs[1]}) ..." >&2
"$cxx" "${flags[@]}" -I"$inc_a" -Diattn=iattn_a -DPAIR_RUN=pair_run_a -c "$here/pair/workload.cpp" -o "$work/a.o" &
pa=$!
"$cxx" "${flags[@]}" -I"$inc_b" -Diattn=iattn_b -DPAIR_RUN=pair_run_b -c "$here/pair/workload.cpp" -o "$work/b.o" &
pb=$!
built=1
wait $pa || built=0
wait $pb || built=0
[ $built = 1 ] || { echo "pair_ab.sh: a side did not compile (the compiler's messages above)" >&2; exit 1; }
"$cxx" -O2 -fopenmp "$here/pair/main.cpp" "$work/a.o" "$work/b.o" -o "$work/pair"
macros=$("$cxx" "${flags[@]}" -dM -E -x c++ /dev/null)  # the ISA the build used
case "$macros" in
  *__AVX512F__*) isa=AVX-512 ;;
  *__AVX2__*) isa=AVX2 ;;
  *) isa="neither AVX2 nor AVX-512" ;;
esac
cpu=$(lscpu | sed -n 's/^Model name: *//p')
echo "a = ${specs[0]}, b = ${specs[1]}; $cpu, $isa build, OMP_NUM_THREADS=${threads:-${OMP_NUM_THREADS:-default}}"
if [ -n "$threads" ]; then export OMP_NUM_THREADS=$threads; fi
"$work/pair" "$name" "$length" "$pairs"
