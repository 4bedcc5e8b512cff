#!/usr/bin/env bash
# Installs the Debian packages iattn needs when they are missing (Debian 12 names).
# Usage: scripts/deps.sh [--bench] [--sanitize]
set -euo pipefail
pkgs=(g++ cmake make libeigen3-dev libxsimd-dev catch2 libstb-dev nlohmann-json3-dev)
for a in "$@"; do
  [ "$a" = "--bench" ] && pkgs+=(libbenchmark-dev python3-torch libopenblas0-pthread)
  [ "$a" = "--sanitize" ] && pkgs+=(clang libclang-rt-14-dev libomp-14-dev)  # the sanitizer stages
  if [ "$a" = "--python" ]; then  # scripts/python.sh: venv and headers, unless python3 has them already
    python3 - <<'PY' 2>/dev/null || pkgs+=(python3 python3-venv python3-dev)
import ensurepip, os, sysconfig, venv
assert os.path.exists(os.path.join(sysconfig.get_paths()["include"], "Python.h"))
PY
  fi
done
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0
echo "iattn: installing ${missing[*]}"
sudo_cmd=()
[ "$(id -u)" -ne 0 ] && sudo_cmd=(sudo)
export DEBIAN_FRONTEND=noninteractive
"${sudo_cmd[@]}" apt-get update -q
"${sudo_cmd[@]}" apt-get install -y -q --no-install-recommends "${missing[@]}"
