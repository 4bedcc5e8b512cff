#!/usr/bin/env bash
# Builds and runs the main demo: the Mamba-1 holistic implicit attention as an iattn expression.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/deps.sh
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release -DIATTN_BUILD_TESTS=OFF -DIATTN_BUILD_EXAMPLES=ON >/dev/null
cmake --build build -j2 --target 01_mamba1_attention
./build/examples/01_mamba1_attention
