#!/usr/bin/env python3
"""Turns iattn_models_bench's JSON output into the tables of docs/performance.md.

    iattn_models_bench --benchmark_repetitions=3 --benchmark_out=models.json --benchmark_out_format=json
    python3 bench/report.py models.json

Every figure is the median over the repetitions of one benchmark (Google Benchmark's own
aggregates are ignored; the medians are taken here from the individual runs, so a file written
with or without --benchmark_report_aggregates_only=false gives the same table). Fractions of the
machine's peak use the probes of the same run: BM_peak_fma (flops/s of independent FMA chains on
every thread) and BM_peak_store (bytes/s of plain vector stores). A benchmark that reports no flop
count (RWKV-4's mean: its exps are not multiply-adds) gets its time only, never "0 GFLOP/s".
"""
import json
import re
import statistics
import sys

_UNIT = {"ns": 1e-6, "us": 1e-3, "ms": 1.0, "s": 1e3}


def medians(runs):
    """{run_name: {"ms": median real time, counter: median value}} over the iteration runs."""
    groups = {}
    for r in runs:
        if r.get("run_type") == "aggregate":
            continue
        name = r.get("run_name", r["name"])
        groups.setdefault(name, []).append(r)
    out = {}
    for name, rs in groups.items():
        row = {"ms": statistics.median(r["real_time"] * _UNIT[r.get("time_unit", "ns")] for r in rs),
               "repetitions": len(rs)}
        for key in ("items_per_second", "bytes_per_second", "flops"):
            values = [r[key] for r in rs if isinstance(r.get(key), (int, float))]
            if values:
                row[key] = statistics.median(values)
        out[name] = row
    return out


def peak(by, prefix, key):
    for name, row in by.items():
        if name.startswith(prefix) and row.get(key, 0) > 0:
            return row[key]
    return None


def cell(kind, row, fma, store):
    text = f"{row['ms']:.3g} ms" if row["ms"] < 1000 else f"{row['ms']:.0f} ms"
    if kind in ("apply", "row") and row.get("items_per_second", 0) > 0:
        text += f" ({row['items_per_second'] / 1e9:.2f} G/s)"
    elif kind == "materialize" and row.get("bytes_per_second", 0) > 0 and store:
        text += f" ({row['bytes_per_second'] / store:.0%} of store peak)"
    elif kind == "materialize_mean" and row.get("flops", 0) > 0:
        text += f" ({row['flops'] / 1e9:.0f} GFLOP/s"
        text += f", {row['flops'] / fma:.0%} of FMA peak)" if fma else ")"
    return text


def report(data):
    """The report as a string, from the parsed JSON."""
    by = medians(data["benchmarks"])
    fma = peak(by, "BM_peak_fma", "flops")
    store = peak(by, "BM_peak_store", "bytes_per_second")
    reps = sorted({row["repetitions"] for row in by.values()})
    lines = []
    if fma and store:
        lines.append(f"Peaks of this run: FMA {fma / 1e9:.1f} GFLOP/s, vector stores {store / 1e9:.1f} GB/s.")
    else:
        lines.append("Peaks of this run: not measured (run BM_peak_fma and BM_peak_store for the fractions).")
    lines.append(f"Medians of {'/'.join(map(str, reps))} repetitions.\n")
    table = {}
    for name, row in by.items():
        m = re.match(r"BM_(apply|row|materialize_mean|materialize)<(\w+)>/(\d+)", name)
        if not m:
            continue
        kind, model, L = m.group(1), m.group(2), int(m.group(3))
        table.setdefault(model, {}).setdefault(L, {})[kind] = cell(kind, row, fma, store)
    kinds = ["apply", "row", "materialize", "materialize_mean"]
    for model, rows in table.items():
        lines.append(f"**{model}**\n")
        lines.append("| L | " + " | ".join(kinds) + " |")
        lines.append("| --- |" + " --- |" * len(kinds))
        for L in sorted(rows):
            lines.append(f"| {L} | " + " | ".join(rows[L].get(k, "–") for k in kinds) + " |")
        lines.append("")
    return "\n".join(lines)


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: report.py BENCHMARK_JSON")
    with open(sys.argv[1]) as f:
        print(report(json.load(f)))


if __name__ == "__main__":
    main()
