#!/usr/bin/env python3
"""Compares two builds of a Google Benchmark binary by running them alternately.

    python3 bench/ab.py OLD NEW --rounds 3 --filter 'BM_peak_fma|BM_all_vim_reused' [--threads 2]

The development VMs drift by up to 10 % between sittings and share their caches with other tenants,
so a figure from one run and a figure from a later run do not compare. This runs OLD, NEW, OLD,
NEW, ... (--rounds of each), every call with --benchmark_repetitions (default 3), and prints one
Markdown row per benchmark: the median of every round for each binary, the median of those rounds,
and old / new (above 1: the new binary is faster). Medians per round are taken over the
repetitions as bench/report.py takes them. With --json FILE the rounds are written out too.
Standard library only.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import report  # noqa: E402


def run_once(binary, bench_filter, repetitions, threads, extra):
    """{benchmark: median real time in ms} of one call of binary."""
    if not (os.path.isfile(binary) and os.access(binary, os.X_OK)):
        raise ValueError(f"binary {binary!r} is not an executable file")
    cmd = [binary, f"--benchmark_filter={bench_filter}", f"--benchmark_repetitions={repetitions}",
           "--benchmark_format=json"] + list(extra)
    env = dict(os.environ)
    if threads is not None:
        env["OMP_NUM_THREADS"] = str(threads)
    done = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"{binary} exited with {done.returncode}: {done.stderr.strip()[-500:]}")
    try:
        data = json.loads(done.stdout)
    except json.JSONDecodeError as e:
        raise RuntimeError(f"{binary} did not print Google Benchmark JSON ({e})") from None
    return {name: row["ms"] for name, row in report.medians(data.get("benchmarks", [])).items()}


def rounds(a, b, n, bench_filter, repetitions=3, threads=None, extra=(), runner=run_once):
    """n rounds of a then b: ([{name: ms} per round of a], [... of b])."""
    if n < 1:
        raise ValueError(f"rounds must be at least 1, got {n}")
    if repetitions < 1:
        raise ValueError(f"repetitions must be at least 1, got {repetitions}")
    ra, rb = [], []
    for _ in range(n):
        ra.append(runner(a, bench_filter, repetitions, threads, extra))
        rb.append(runner(b, bench_filter, repetitions, threads, extra))
    return ra, rb


def fmt(ms):
    return f"{ms:.3g}" if ms < 1000 else f"{ms:.0f}"


def table(ra, rb, label_a="old", label_b="new"):
    """The Markdown comparison of the rounds (benchmarks in the order the first round gave them)."""
    names = []
    for r in ra + rb:
        names += [n for n in r if n not in names]
    lines = [f"| benchmark | {label_a}: rounds (ms) | {label_b}: rounds (ms) | median {label_a} → {label_b} | "
             f"{label_a} / {label_b} |",
             "| --- | --- | --- | --- | --- |"]
    for name in names:
        xa = [r[name] for r in ra if name in r]
        xb = [r[name] for r in rb if name in r]
        ma = statistics.median(xa) if xa else None
        mb = statistics.median(xb) if xb else None
        ratio = f"{ma / mb:.2f}×" if ma and mb else "—"
        cells = [", ".join(fmt(x) for x in xs) if xs else "—" for xs in (xa, xb)]
        change = f"{fmt(ma) if ma else '—'} → {fmt(mb) if mb else '—'}"
        lines.append(f"| `{name}` | {cells[0]} | {cells[1]} | {change} | {ratio} |")
    return "\n".join(lines)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("old", help="the baseline binary")
    p.add_argument("new", help="the binary compared with it")
    p.add_argument("--rounds", type=int, default=3, help="calls of each binary, alternately (default 3)")
    p.add_argument("--filter", default=".", help="--benchmark_filter for both (default: every benchmark)")
    p.add_argument("--repetitions", type=int, default=3, help="--benchmark_repetitions per call (default 3)")
    p.add_argument("--threads", type=int, help="OMP_NUM_THREADS for both (default: inherited)")
    p.add_argument("--json", help="also write the rounds to this file")
    p.add_argument("extra", nargs="*", help="further arguments for both binaries (after --)")
    args = p.parse_args(argv)
    try:
        ra, rb = rounds(args.old, args.new, args.rounds, args.filter, args.repetitions, args.threads, args.extra)
    except (ValueError, RuntimeError) as e:
        print(f"ab.py: {e}", file=sys.stderr)
        return 2
    print(table(ra, rb))
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump({"old": args.old, "new": args.new, "rounds_old": ra, "rounds_new": rb}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
