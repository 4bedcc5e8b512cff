#!/usr/bin/env bash
# Builds and installs the Python package iattn into the project venv .venv (created when missing,
# with the pinned build and test packages of python/requirements.txt), then, with --test, runs its
# tests. The build directory build-python/ is kept: a second run recompiles only what changed.
# With --test it also installs torch and transformers (python/requirements-hf.txt) for iattn.hf's tests.
# With --deps it only creates the venv and installs the pinned packages of both requirement files
# (scripts/test.sh runs that in the background, so the torch download overlaps the C++ build).
# Usage: bash scripts/python.sh [--test | --deps]  (PYTHON=python3.12 to choose the interpreter)
set -euo pipefail
cd "$(dirname "$0")/.."
[[ "${1:-}" == "--deps" ]] || bash scripts/deps.sh --python
venv=.venv
py="${PYTHON:-python3}"
if [[ ! -x "$venv/bin/python" ]]; then
  echo "iattn: creating $venv with $("$py" --version 2>&1)"
  "$py" -m venv "$venv"
fi
"$venv/bin/python" -m pip install -q --disable-pip-version-check -r python/requirements.txt
if [[ "${1:-}" == "--deps" ]]; then
  "$venv/bin/python" -m pip install -q --disable-pip-version-check -r python/requirements-hf.txt
  exit 0
fi
# No build isolation: the pinned nanobind and scikit-build-core of the venv build it.
"$venv/bin/python" -m pip install -q --disable-pip-version-check --no-build-isolation .
"$venv/bin/python" -c "import iattn; print('iattn', iattn.__version__, 'installed in $venv (SIMD:', iattn._iattn.simd, ')')"
if [[ "${1:-}" == "--test" ]]; then
  # the bridge's tests need torch and transformers (pinned; about 3 GB to download the first time,
  # 5.6 GB installed)
  bash scripts/check-disk.sh
  "$venv/bin/python" -m pip install -q --disable-pip-version-check -r python/requirements-hf.txt
  # torch pulls in triton; with flash-linear-attention also in the venv (tools/reference), transformers
  # would swap its delta-rule functions for fla's Triton kernels, which fail on the CPU (see
  # tools/reference/setup_venv.sh): triton goes again there
  if "$venv/bin/python" -c "import importlib.util as u, sys; sys.exit(0 if u.find_spec('fla') and u.find_spec('triton') else 1)"; then
    "$venv/bin/python" -m pip uninstall -q -y triton
  fi
  export IATTN_REQUIRE_HF=1  # test_hf.py fails instead of skipping without them
  # from the repository root, pytest would import ./python/iattn (no extension) only if it were on
  # sys.path; rootdir-relative testpaths keep the installed package in use
  "$venv/bin/python" -m pytest -q python/tests
fi
