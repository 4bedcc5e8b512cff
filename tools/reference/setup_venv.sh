#!/usr/bin/env bash
# tools/reference/setup_venv.sh: creates the project venv .venv (repository root) with the pinned
# reference packages of tools/reference/requirements.txt (torch, transformers, fla), for
# tools/reference/make_fixtures.py, which regenerates the committed fixtures in tests/data/reference/.
#
# Downloads about 3 GB: the only Linux x86-64 torch on PyPI is the CUDA build, whose nvidia-* runtime
# wheels must be installed even on a machine without a GPU (torch's C extension links them); the
# venv takes about 5.5 GB. CI never runs this script: the C++ test reads the committed .npy files.
#
# After installing it uninstalls triton: with triton present, transformers' modeling modules swap
# their torch functions (torch_chunk_gated_delta_rule, chunk_kimi_delta_attention) for fla's Triton
# kernels at import, and every fla kernel fails on CPU tensors ("0 active drivers"). torch itself
# does not need triton (only `pip check` then complains). make_fixtures.py also unwraps those
# functions, so it works either way; the venv is kept free of the trap.
#
# fla's *layer* modules (RWKV7Attention, GatedDeltaProduct) import triton at the top, although
# make_fixtures.py runs none of their kernels (it swaps in fla's torch references). So the same
# triton (TRITON_PIN, the version torch 2.15.0 requires) is installed, without dependencies, into
# .venv/triton-import-only/, outside site-packages: nothing imports it unless it is put on sys.path,
# which make_fixtures.py does only for the fla-layer cases, after the transformers cases.
#
# Idempotent: when .venv already has exactly the pinned versions (and no triton), it only prints them.
# Usage: bash tools/reference/setup_venv.sh        (PYTHON=python3.11 to choose the interpreter)
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
req="$root/tools/reference/requirements.txt"
venv="$root/.venv"
py="${PYTHON:-python3}"
TRITON_PIN="triton==3.9.0"   # for .venv/triton-import-only (see above); recorded in versions.json
triton_dir="$venv/triton-import-only"

# Exit 0 when every "name==version" line of requirements.txt is installed at that version.
pins_ok() {
  "$venv/bin/python" - "$req" <<'PY'
import sys, importlib.metadata as md
ok = True
for line in open(sys.argv[1]):
    line = line.split("#", 1)[0].strip()
    if not line:
        continue
    name, want = line.split("==")
    try:
        have = md.version(name)
    except md.PackageNotFoundError:
        have = None
    if have is None or have.split("+")[0] != want:   # torch from PyPI reports 2.15.0+cu132
        print(f"  {name}: want {want}, have {have}")
        ok = False
sys.exit(0 if ok else 1)
PY
}

has_triton() { "$venv/bin/python" -c "import importlib.util, sys; sys.exit(0 if importlib.util.find_spec('triton') else 1)"; }

if [[ ! -x "$venv/bin/python" ]]; then
  echo "creating $venv with $("$py" --version 2>&1)"
  "$py" -m venv "$venv"
fi

if pins_ok >/dev/null 2>&1; then
  echo "$venv already has the pinned versions; nothing to install"
else
  echo "installing the pinned reference packages into $venv (about 3 GB to download)"
  "$venv/bin/python" -m pip install --upgrade pip
  "$venv/bin/python" -m pip install -r "$req"
  pins_ok
fi

if has_triton; then
  echo "uninstalling triton (see the header of this script)"
  "$venv/bin/python" -m pip uninstall -y triton
fi

triton_ok() {
  "$venv/bin/python" - "$triton_dir" "${TRITON_PIN#triton==}" <<'PY'
import sys, importlib.metadata as md
dists = [d for d in md.distributions(path=[sys.argv[1]]) if d.metadata["Name"] == "triton"]
sys.exit(0 if dists and dists[0].version == sys.argv[2] else 1)
PY
}
if triton_ok; then
  echo "$triton_dir has $TRITON_PIN"
else
  echo "installing $TRITON_PIN into $triton_dir (imported only by make_fixtures.py's fla-layer cases)"
  rm -rf "$triton_dir"
  "$venv/bin/python" -m pip install --no-deps --target "$triton_dir" "$TRITON_PIN"
  triton_ok
fi

"$venv/bin/python" - <<'PY'
import importlib.metadata as md, platform
print("python", platform.python_version())
for p in ["torch", "transformers", "flash-linear-attention", "fla-core", "einops", "numpy"]:
    print(f"{p:24s} {md.version(p)}")
import torch
print("torch imports; cuda available:", torch.cuda.is_available())
PY
echo "next: $venv/bin/python tools/reference/make_fixtures.py"
