#!/usr/bin/env bash
# Builds everything (tests, examples, header and consumption checks) and runs the whole suite.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/deps.sh
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release -DIATTN_BUILD_TESTS=ON -DIATTN_BUILD_EXAMPLES=ON
cmake --build build -j2
ctest --test-dir build --output-on-failure -j2
