#!/usr/bin/env python3
"""Tests of bench/report.py on synthetic Google Benchmark JSON (standard library only)."""
import os
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import report  # noqa: E402


def run(name, ms, rep, **counters):
    r = {"name": name, "run_name": name, "run_type": "iteration", "repetition_index": rep,
         "real_time": ms * 1e6, "time_unit": "ns"}
    r.update(counters)
    return r


def aggregate(name, kind, ms, **counters):
    r = {"name": f"{name}_{kind}", "run_name": name, "run_type": "aggregate", "aggregate_name": kind,
         "real_time": ms, "time_unit": "ms"}
    r.update(counters)
    return r


class ReportTest(unittest.TestCase):
    def data(self):
        b = [run("BM_peak_fma", 1.0, i, flops=f) for i, f in enumerate([100e9, 300e9, 200e9])]
        b += [run("BM_peak_store", 1.0, i, bytes_per_second=v) for i, v in enumerate([10e9, 20e9, 30e9])]
        # apply: the last repetition is the slowest, the median the middle one.
        b += [run("BM_apply<mamba1>/1024", ms, i, items_per_second=ips)
              for i, (ms, ips) in enumerate([(2.0, 5e9), (1.0, 6e9), (9.0, 1e9)])]
        b += [aggregate("BM_apply<mamba1>/1024", "mean", 4.0, items_per_second=4e9)]
        b += [run("BM_materialize_mean<mamba1>/1024", ms, i, flops=f)
              for i, (ms, f) in enumerate([(10.0, 100e9), (12.0, 80e9), (11.0, 90e9)])]
        # No flop count: RWKV-4's mean reports 0.
        b += [run("BM_materialize_mean<rwkv4>/1024", ms, i, flops=0.0) for i, ms in enumerate([5.0, 6.0, 7.0])]
        b += [run("BM_materialize<mamba1>/1024", 3.0, 0, bytes_per_second=5e9)]
        return {"benchmarks": b}

    def test_medians_not_last_repetition(self):
        by = report.medians(self.data()["benchmarks"])
        self.assertAlmostEqual(by["BM_apply<mamba1>/1024"]["ms"], 2.0)
        self.assertAlmostEqual(by["BM_apply<mamba1>/1024"]["items_per_second"], 5e9)
        self.assertEqual(by["BM_apply<mamba1>/1024"]["repetitions"], 3)
        self.assertAlmostEqual(by["BM_peak_fma"]["flops"], 200e9)

    def test_table(self):
        text = report.report(self.data())
        self.assertIn("FMA 200.0 GFLOP/s, vector stores 20.0 GB/s", text)
        self.assertIn("2 ms (5.00 G/s)", text)
        self.assertIn("11 ms (90 GFLOP/s, 45% of FMA peak)", text)
        self.assertIn("3 ms (25% of store peak)", text)
        self.assertNotIn("0 GFLOP/s", text.replace("200.0 GFLOP/s", "").replace("90 GFLOP/s", ""))
        rwkv = [line for line in text.splitlines() if line.startswith("| 1024 |") and "6 ms" in line]
        self.assertEqual(len(rwkv), 1)
        self.assertNotIn("GFLOP", rwkv[0])

    def test_time_units(self):
        b = [dict(run("BM_apply<x>/8", 0, 0), real_time=1.5, time_unit="s"),
             dict(run("BM_row<x>/8", 0, 0), real_time=250.0, time_unit="us")]
        by = report.medians(b)
        self.assertAlmostEqual(by["BM_apply<x>/8"]["ms"], 1500.0)
        self.assertAlmostEqual(by["BM_row<x>/8"]["ms"], 0.25)

    def test_long_times_in_plain_ms(self):
        text = report.report({"benchmarks": [run("BM_materialize_mean<m>/4096", 2708.4, 0, flops=1e9)]})
        self.assertIn("| 4096 | – | – | – | 2708 ms (1 GFLOP/s) |", text)

    def test_no_peaks(self):
        text = report.report({"benchmarks": [run("BM_materialize_mean<m>/64", 1.0, 0, flops=1e9)]})
        self.assertIn("not measured", text)
        self.assertIn("1 ms (1 GFLOP/s)", text)


if __name__ == "__main__":
    unittest.main()
