#!/usr/bin/env bash
# Sets up, builds strata-server and strata-client, and serves a model over gRPC (Generate,
# GetDeviceMap) and /metrics.
#
#   scripts/serve.sh                 # the demo checkpoint: a tiny Llama with RANDOM weights (its text is
#                                    # gibberish) and a tokenizer trained on this repo's docs, made once by
#                                    # scripts/make_demo_model.py into ~/.cache/strata/demo-model
#   scripts/serve.sh --model DIR     # a Hugging Face checkpoint directory (config.json, *.safetensors,
#                                    # tokenizer.json); any other strata-server flags may follow
#
# Without a CUDA GPU the demo runs as a 2-stage plan on two logical GPUs that are both the CPU
# (--physical-devices 0=cpu,1=cpu): layers 0-2 on one, 3-5 and the head on the other, so the
# pipeline across stages is what runs.
# STRATA_VENV picks the virtualenv (default ~/.cache/strata/venv), STRATA_BUILD_DIR the build
# directory (default build/), STRATA_DEMO_MODEL the demo's directory.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${STRATA_BUILD_DIR:-$here/build}
venv=${STRATA_VENV:-$HOME/.cache/strata/venv}

"$here/scripts/setup.sh"

"$here/scripts/build.sh" strata-server strata-client >&2

listen=127.0.0.1:50051
if (($# == 0)); then
  demo=${STRATA_DEMO_MODEL:-$HOME/.cache/strata/demo-model}
  "$venv/bin/python" "$here/scripts/make_demo_model.py" "$demo" >&2
  set -- --model "$demo" --listen "$listen" --metrics-listen 127.0.0.1:9464 --http-listen 127.0.0.1:8000 \
    --served-model-name demo --chat-template "$here/scripts/demo-chat-template.jinja" --max-batch 16 --max-context 1024
  if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L >/dev/null 2>&1; then
    map='{"model.embed_tokens": 0, "model.layers.0": 0, "model.layers.1": 0, "model.layers.2": 0,
      "model.layers.3": 1, "model.layers.4": 1, "model.layers.5": 1, "model.norm": 1, "model.rotary_emb": 1,
      "lm_head": 1}'
    set -- "$@" --device-map "$map" --physical-devices 0=cpu,1=cpu --max-memory 0=1GiB,1=1GiB,cpu=1GiB
  fi
  echo "strata: serving the demo model (random weights: expect gibberish). Once it says serving, try:" >&2
  echo "  $build/clients/cpp/strata-client --server $listen generate --prompt 'The server streams' --max-new-tokens 32" >&2
  echo "  $build/clients/cpp/strata-client --server $listen device-map" >&2
  echo "  curl -s 127.0.0.1:8000/v1/chat/completions -d '{\"model\": \"demo\", \"messages\": [{\"role\": \"user\", \"content\": \"Hi\"}], \"max_tokens\": 16}'" >&2
  echo "  $venv/bin/python -c 'import openai; print(openai.OpenAI(base_url=\"http://127.0.0.1:8000/v1\", api_key=\"-\").completions.create(model=\"demo\", prompt=\"The server\", max_tokens=16).choices[0].text)'" >&2
else
  for ((i = 1; i <= $#; i++)); do
    if [[ ${!i} == --listen ]]; then
      j=$((i + 1))
      listen=${!j}
    fi
  done
  echo "strata: once it says serving, try: $build/clients/cpp/strata-client --server ${listen/0.0.0.0/127.0.0.1} generate --prompt 'Hello' --max-new-tokens 32" >&2
fi
exec "$build/server/strata-server" "$@"
