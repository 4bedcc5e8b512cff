#!/usr/bin/env python3
"""Turns iattn_models_bench's JSON output into the tables of docs/performance.md.

    iattn_models_bench --benchmark_out=models.json --benchmark_out_format=json
    python3 bench/report.py models.json

Fractions of the machine's peak use the probes of the same run: BM_peak_fma (flops/s of
independent FMA chains on every thread) and BM_peak_store (bytes/s of streaming stores).
"""
import json
import re
import sys


def main():
    runs = json.load(open(sys.argv[1]))["benchmarks"]
    by = {}
    for r in runs:
        if r.get("run_type") == "aggregate":
            continue
        by[r["name"]] = r
    fma = next(r for n, r in by.items() if n.startswith("BM_peak_fma"))["flops"]
    store = next(r for n, r in by.items() if n.startswith("BM_peak_store"))["bytes_per_second"]
    print(f"Peaks of this run: FMA {fma / 1e9:.1f} GFLOP/s, streaming stores {store / 1e9:.1f} GB/s.\n")
    table = {}
    for name, r in by.items():
        m = re.match(r"BM_(apply|row|materialize_mean|materialize)<(\w+)>/(\d+)", name)
        if not m:
            continue
        kind, model, L = m.group(1), m.group(2), int(m.group(3))
        ms = r["real_time"] if r["time_unit"] == "ms" else r["real_time"] / 1e6
        cell = f"{ms:.3g} ms"
        if kind in ("apply", "row"):
            cell += f" ({r['items_per_second'] / 1e9:.2f} G/s)"
        elif kind == "materialize":
            cell += f" ({r['bytes_per_second'] / store:.0%} of store peak)"
        else:
            cell += f" ({r['flops'] / 1e9:.0f} GFLOP/s, {r['flops'] / fma:.0%} of FMA peak)"
        table.setdefault(model, {}).setdefault(L, {})[kind] = cell
    kinds = ["apply", "row", "materialize", "materialize_mean"]
    for model, rows in table.items():
        print(f"**{model}**\n")
        print("| L | " + " | ".join(kinds) + " |")
        print("| --- |" + " --- |" * len(kinds))
        for L in sorted(rows):
            print(f"| {L} | " + " | ".join(rows[L].get(k, "–") for k in kinds) + " |")
        print()


if __name__ == "__main__":
    main()
