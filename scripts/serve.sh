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
build=${STRATA_BUILD_DIR:-$here/build}

"$here/scripts/setup.sh"

"$here/scripts/build.sh" strata-server >&2

if (($# == 0)); then
  set -- --model "$here/server/example_model" \
    --max-memory 0=100MiB,1=150MiB,cpu=1GiB \
    --listen 127.0.0.1:50051 --metrics-listen 127.0.0.1:9464
fi
exec "$build/server/strata-server" "$@"
