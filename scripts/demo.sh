#!/usr/bin/env bash
# Builds and runs the main demo: every model in the zoo, exactness and timing table, and a gallery of
# heatmaps (one channel, channel mean, 4-layer rollout) in out/, shown by out/index.html; then the
# trained associative-recall models' maps from their checkpoints (examples/12_recall.cpp, out/recall/).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/deps.sh
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release -DIATTN_BUILD_TESTS=OFF -DIATTN_BUILD_EXAMPLES=ON >/dev/null
cmake --build build -j2 --target iattn_demo 12_recall
./build/examples/iattn_demo out
# the trained associative-recall models (models/, tools/train): what the query reads, from their checkpoints
mkdir -p out/recall
./build/examples/12_recall models out/recall
