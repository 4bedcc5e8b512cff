#!/usr/bin/env python3
"""Tests of bench/ab.py: the table from synthetic rounds, and whole runs of two fake benchmark
binaries (scripts that print Google Benchmark JSON), standard library only."""
import contextlib
import io
import json
import os
import stat
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ab  # noqa: E402

FAKE = """#!{python}
import json, sys
with open({log!r}, "a") as f:
    f.write({tag!r} + "\\n")
filt = [a for a in sys.argv if a.startswith("--benchmark_filter=")]
assert filt == ["--benchmark_filter=BM_x|BM_y"], sys.argv
assert "--benchmark_repetitions=3" in sys.argv and "--benchmark_format=json" in sys.argv, sys.argv
runs = []
for name, times in {times!r}.items():
    for i, ms in enumerate(times):
        runs.append({{"name": name, "run_name": name, "run_type": "iteration", "repetition_index": i,
                     "real_time": ms, "time_unit": "ms"}})
    runs.append({{"name": name + "_median", "run_name": name, "run_type": "aggregate",
                 "aggregate_name": "median", "real_time": 999.0, "time_unit": "ms"}})
print(json.dumps({{"context": {{}}, "benchmarks": runs}}))
"""


class TableTest(unittest.TestCase):
    def test_rows_ratio_and_missing(self):
        ra = [{"BM_x": 10.0, "BM_y": 4.0}, {"BM_x": 12.0, "BM_y": 4.0}, {"BM_x": 11.0, "BM_y": 4.0}]
        rb = [{"BM_x": 5.0}, {"BM_x": 5.5}, {"BM_x": 6.0}]
        text = ab.table(ra, rb).splitlines()
        self.assertEqual(len(text), 4)
        self.assertEqual(text[2], "| `BM_x` | 10, 12, 11 | 5, 5.5, 6 | 11 → 5.5 | 2.00× |")
        self.assertEqual(text[3], "| `BM_y` | 4, 4, 4 | — | 4 → — | — |")

    def test_alternates(self):
        calls = []

        def runner(binary, *_):
            calls.append(binary)
            return {"BM_x": 1.0}

        ra, rb = ab.rounds("A", "B", 3, "BM_x", runner=runner)
        self.assertEqual(calls, ["A", "B", "A", "B", "A", "B"])
        self.assertEqual((len(ra), len(rb)), (3, 3))

    def test_bad_counts(self):
        with self.assertRaisesRegex(ValueError, "rounds must be at least 1, got 0"):
            ab.rounds("A", "B", 0, "BM_x", runner=lambda *a: {})
        with self.assertRaisesRegex(ValueError, "repetitions must be at least 1, got 0"):
            ab.rounds("A", "B", 1, "BM_x", repetitions=0, runner=lambda *a: {})


class RunTest(unittest.TestCase):
    def fake(self, d, tag, times, log):
        path = os.path.join(d, tag)
        with open(path, "w", encoding="utf-8") as f:
            f.write(FAKE.format(python=sys.executable, log=log, tag=tag, times=times))
        os.chmod(path, os.stat(path).st_mode | stat.S_IXUSR)
        return path

    def test_two_binaries(self):
        with tempfile.TemporaryDirectory() as d:
            log = os.path.join(d, "log")
            old = self.fake(d, "old", {"BM_x": [9.0, 8.0, 30.0], "BM_y": [1.0, 1.0, 1.0]}, log)
            new = self.fake(d, "new", {"BM_x": [4.0, 4.0, 1.0], "BM_y": [2.0, 2.0, 2.0]}, log)
            out = io.StringIO()
            with contextlib.redirect_stdout(out):
                rc = ab.main([old, new, "--rounds", "2", "--filter", "BM_x|BM_y", "--json", os.path.join(d, "r.json")])
            self.assertEqual(rc, 0)
            with open(log, encoding="utf-8") as f:
                self.assertEqual(f.read().split(), ["old", "new", "old", "new"])
            rows = out.getvalue().splitlines()
            # medians over the repetitions (9), not the aggregate the binary printed (999)
            self.assertIn("| `BM_x` | 9, 9 | 4, 4 | 9 → 4 | 2.25× |", rows)
            self.assertIn("| `BM_y` | 1, 1 | 2, 2 | 1 → 2 | 0.50× |", rows)
            with open(os.path.join(d, "r.json"), encoding="utf-8") as f:
                saved = json.load(f)
            self.assertEqual(saved["rounds_new"], [{"BM_x": 4.0, "BM_y": 2.0}] * 2)

    def test_not_executable(self):
        with tempfile.TemporaryDirectory() as d:
            missing = os.path.join(d, "nope")
            err = io.StringIO()
            with contextlib.redirect_stderr(err):
                rc = ab.main([missing, missing, "--rounds", "1"])
            self.assertEqual(rc, 2)
            self.assertIn(f"binary {missing!r} is not an executable file", err.getvalue())

    def test_failing_binary(self):
        with tempfile.TemporaryDirectory() as d:
            bad = os.path.join(d, "bad")
            with open(bad, "w", encoding="utf-8") as f:
                f.write(f"#!{sys.executable}\nimport sys\nsys.stderr.write('boom')\nsys.exit(3)\n")
            os.chmod(bad, 0o755)
            err = io.StringIO()
            with contextlib.redirect_stderr(err):
                rc = ab.main([bad, bad, "--rounds", "1"])
            self.assertEqual(rc, 2)
            self.assertIn("exited with 3: boom", err.getvalue())


if __name__ == "__main__":
    unittest.main()
