#!/usr/bin/env bash
# Builds strata-server and runs it. With no arguments it serves the built-in example
# (server/example_model: SmolLM-135M's config, no weights needed to plan) as a two-GPU
# balanced_low_0 plan with a small cpu spill, so that GetDeviceMap and /metrics show several devices:
#
#   scripts/serve.sh
#   grpcurl -plaintext 127.0.0.1:50051 strata.v1.InferenceService/GetDeviceMap
#   curl -s 127.0.0.1:9464/metrics | grep strata_
#
# With arguments, they are strata-server's flags (see `scripts/serve.sh --help`).
# STRATA_VENV picks the virtualenv (default ~/.cache/strata/venv), STRATA_BUILD_DIR the build
# directory (default build/).
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
venv=${STRATA_VENV:-$HOME/.cache/strata/venv}
build=${STRATA_BUILD_DIR:-$here/build}

"$here/scripts/setup.sh"

# The configuration scripts/build.sh (and so scripts/test.sh) uses, so that all share one build
# directory; only strata-server and what it needs are built here.
torch_prefix=$("$venv/bin/python" -c 'import torch.utils; print(torch.utils.cmake_prefix_path)')
if [[ ! -f "$build/build.ninja" ]]; then
  mkdir -p "$build"
  cmake -S "$here" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_PREFIX_PATH="$torch_prefix" \
    -DPython3_EXECUTABLE="$venv/bin/python" >"$build/configure.log" 2>&1 || {
    cat "$build/configure.log" >&2
    exit 1
  }
fi
cmake --build "$build" --target strata-server >&2

if (($# == 0)); then
  set -- --model "$here/server/example_model" \
    --max-memory 0=100MiB,1=150MiB,cpu=1GiB \
    --listen 127.0.0.1:50051 --metrics-listen 127.0.0.1:9464
fi
exec "$build/server/strata-server" "$@"
