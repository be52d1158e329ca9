#!/usr/bin/env bash
# Configures and builds strata into build/ (RelWithDebInfo, Ninja, ccache), against the LibTorch of
# the virtualenv's torch wheel. Run scripts/setup.sh first (serve.sh and test.sh do).
# Arguments, if any, are the targets to build (default: everything).
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
venv=${STRATA_VENV:-$HOME/.cache/strata/venv}
build=${STRATA_BUILD_DIR:-$here/build}

torch_prefix=$("$venv/bin/python" -c 'import torch.utils; print(torch.utils.cmake_prefix_path)')
if [[ ! -f "$build/build.ninja" ]]; then
  mkdir -p "$build"
  cmake -S "$here" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_PREFIX_PATH="$torch_prefix" \
    -DPython3_EXECUTABLE="$venv/bin/python" >"$build/configure.log" 2>&1 || {
    cat "$build/configure.log" >&2
    exit 1
  }
fi
targets=()
for t in "$@"; do targets+=(--target "$t"); done
cmake --build "$build" -j "$(nproc)" "${targets[@]}"
