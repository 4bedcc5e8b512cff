#!/usr/bin/env python3
"""Tests of bench/pair_ab.sh and bench/pair/main.cpp, standard library only: the driver compiled
against two fake sides (scripted times, the order of the calls recorded), and the script's refusal
of bad arguments before it builds anything."""
import os
import shutil
import subprocess
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(HERE, "pair_ab.sh")
MAIN = os.path.join(HERE, "pair", "main.cpp")

# Side a takes 2 ms per call and side b 1 ms, but b's third counted call takes 4 ms; every call is
# logged (a or b) in order.
FAKE = r"""
#include <cstdio>
#include <string>
static int calls_b = 0;
static void log(const char* s) { FILE* f = std::fopen(LOG, "a"); std::fputs(s, f); std::fclose(f); }
double pair_run_a(const char* name, long L) {
  if (std::string(name) != "case_x" || L != 7) throw 1;
  log("a");
  return 2.0;
}
double pair_run_b(const char*, long) {
  log("b");
  return ++calls_b == 4 ? 4.0 : 1.0;  // the uncounted call is the first
}
"""


@unittest.skipIf(shutil.which("g++") is None, "g++ is needed")
class Driver(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp()
        self.log = os.path.join(self.dir, "calls.txt")
        fake = os.path.join(self.dir, "fake.cpp")
        with open(fake, "w") as f:
            f.write(FAKE)
        self.exe = os.path.join(self.dir, "pair")
        subprocess.run(["g++", "-O1", "-std=c++20", f'-DLOG="{self.log}"', MAIN, fake, "-o", self.exe], check=True)

    def tearDown(self):
        shutil.rmtree(self.dir)

    def test_alternation_medians_and_ratio(self):
        done = subprocess.run([self.exe, "case_x", "7", "4"], capture_output=True, text=True, check=True)
        with open(self.log) as f:
            # one uncounted call each, then a b, b a, a b, b a
            self.assertEqual(f.read(), "ab" + "ab" + "ba" + "ab" + "ba")
        out = done.stdout
        self.assertIn("case case_x L=7 pairs=4", out)
        self.assertIn("a: median 2.000 ms, min 2.000 ms", out)
        self.assertIn("b: median 1.000 ms, min 1.000 ms", out)  # 1, 1, 4, 1: median of four is 1
        # ratios 2, 2, 0.5, 2: median 2, range 0.5 .. 2
        self.assertIn("a/b: median 2.000 (pairs 0.500 .. 2.000)", out)

    def test_bad_arguments(self):
        for args in (["case_x", "7"], ["case_x", "0", "3"], ["case_x", "7", "-1"]):
            done = subprocess.run([self.exe] + args, capture_output=True, text=True)
            self.assertEqual(done.returncode, 2, args)
            self.assertTrue(done.stderr.strip(), args)


class Script(unittest.TestCase):
    def run_script(self, *args):
        return subprocess.run(["bash", SCRIPT] + list(args), capture_output=True, text=True)

    def test_rejects_bad_arguments_before_building(self):
        cases = [
            (["--case", "mamba3_mean", "HEAD", "HEAD"], "unknown --case 'mamba3_mean'"),
            (["--pairs", "x", "HEAD", "HEAD"], "--pairs must be a positive integer, got 'x'"),
            (["--length", "0", "HEAD", "HEAD"], "--length must be a positive integer, got '0'"),
            (["--threads", "2.5", "HEAD", "HEAD"], "--threads must be a positive integer, got '2.5'"),
            (["HEAD"], "expected two versions A and B, got 1"),
            (["--bogus", "HEAD", "HEAD"], "unknown option '--bogus'"),
            (["no-such-revision-xyz", "HEAD"], "'no-such-revision-xyz' is neither a directory"),
        ]
        for args, message in cases:
            done = self.run_script(*args)
            self.assertEqual(done.returncode, 2, (args, done.stderr))
            self.assertIn(message, done.stderr, args)
            self.assertNotIn("building", done.stderr, args)


if __name__ == "__main__":
    unittest.main()
