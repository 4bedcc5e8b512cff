#!/usr/bin/env bash
# Fails at once, saying what is needed, when the disk under the repository has too little room for
# what the calling script is about to write: scripts/test.sh runs it before it builds anything,
# scripts/python.sh --test before it installs the bridge's packages. A full disk otherwise fails the
# test command only after its C++ stages (20 minutes in), inside pip's download of torch: CI stop 49
# failed that way.
# Usage: bash scripts/check-disk.sh [--with-builds]
#   The need: the pinned torch + transformers and their CUDA wheels for .venv unless it has them
#   already (5.6 GB installed; 8.6 GB at the peak of pip's install, measured: the 3 GB of wheels
#   it downloads first lie beside what it unpacks); with --with-builds also the
#   four build trees of scripts/test.sh (0.5 GB measured, 0.6 GB counted); and 0.5 GB to spare.
# IATTN_SKIP_DISK_CHECK=1 skips the check (the figures are measured, not guaranteed).
set -euo pipefail
cd "$(dirname "$0")/.."
[ "${IATTN_SKIP_DISK_CHECK:-0}" = "1" ] && exit 0
need_mb=500
what="0.5 GB to spare"
if ! { [ -x .venv/bin/python ] && .venv/bin/python -c \
    "import importlib.util as u, sys; sys.exit(0 if u.find_spec('torch') and u.find_spec('transformers') else 1)" \
    2>/dev/null; }; then
  need_mb=$((need_mb + 8700))
  what="torch and transformers for .venv: 8.6 GB while pip installs them, 5.6 GB after; $what"
fi
if [ "${1:-}" = "--with-builds" ]; then
  need_mb=$((need_mb + 600))
  what="the build trees (0.5 GB), $what"
fi
free_mb=$(df -Pm . | awk 'NR == 2 { print $4 }')
if [ -n "$free_mb" ] && [ "$free_mb" -lt "$need_mb" ]; then
  echo "iattn: not enough disk space under $(pwd): $((free_mb / 100 * 100)) MB free, about $need_mb MB" \
       "needed ($what)." >&2
  echo "iattn: free some space (old build trees, old clones), or set IATTN_SKIP_DISK_CHECK=1 to try anyway." >&2
  exit 1
fi
