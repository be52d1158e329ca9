#!/usr/bin/env bash
# libFuzzer campaigns on strata's input parsers (tests/fuzz/README.md).
#
#   scripts/fuzz.sh build                      configure and build the harnesses (clang, ASan+UBSan)
#   scripts/fuzz.sh NAME SECONDS [ARGS...]     fuzz one harness for SECONDS; ARGS go to libFuzzer
#   scripts/fuzz.sh list                       the harness names
#
# NAME: safetensors_header, config, tokenizer, device_map, generate_request, chat_template, tool_calls,
# group_message, group_handshake (the raw bytes on a group's port), and the rest listed by `list`.
# The harnesses build into $STRATA_FUZZ_BUILD_DIR (default build-fuzz/, a clang build of the torch-free
# libraries only). Each run regenerates the seed corpus (tests/fuzz/make_seeds.py) into the work dir
# $STRATA_FUZZ_WORK (default ~/.cache/strata/fuzz, outside the checkout) and grows NAME's corpus there, so
# a campaign goes on where the last one stopped. A crash, leak, timeout or out-of-memory input is written
# to $STRATA_FUZZ_WORK/NAME/artifacts/; the script then prints its path and the command that replays it,
# and exits 1. The last lines are the run's executions per second and corpus size.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
venv=${STRATA_VENV:-$HOME/.cache/strata/venv}
build=${STRATA_FUZZ_BUILD_DIR:-$here/build-fuzz}
work=${STRATA_FUZZ_WORK:-$HOME/.cache/strata/fuzz}
harnesses=(safetensors_header config tokenizer device_map generate_request http_request http_head chat_template tool_calls
           group_message group_handshake structured)

# Per harness: the largest input worth trying (a few times the largest seed). -len_control=0 below lets
# mutations use it from the start: libFuzzer otherwise grows its length limit slowly from small inputs and
# cuts the 20-35 KB tokenizer seeds into invalid JSON for the first minutes.
max_len() {
  case "$1" in
    tokenizer) echo 65536 ;;
    chat_template) echo 32768 ;;  # the largest real template is 15 KB
    config | safetensors_header) echo 16384 ;;
    tool_calls) echo 16384 ;;  # a few times the largest seed (several calls with nested arguments)
    *) echo 4096 ;;
  esac
}

usage() {
  echo "usage: scripts/fuzz.sh build | list | NAME SECONDS [libFuzzer args...]   (NAME: ${harnesses[*]})" >&2
  exit 2
}

build_harnesses() {
  if [[ ! -f "$build/build.ninja" ]]; then
    mkdir -p "$build"
    CC=clang CXX=clang++ cmake -S "$here" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DSTRATA_FUZZ=ON \
      >"$build/configure.log" 2>&1 || {
      cat "$build/configure.log" >&2
      exit 1
    }
  fi
  local targets=()
  for h in "${harnesses[@]}"; do targets+=(--target "fuzz_$h"); done
  cmake --build "$build" -j "$(nproc)" "${targets[@]}"
}

[[ $# -ge 1 ]] || usage
case "$1" in
  build)
    build_harnesses
    exit 0
    ;;
  list)
    printf '%s\n' "${harnesses[@]}"
    exit 0
    ;;
esac
[[ $# -ge 2 ]] || usage
name=$1 seconds=$2
shift 2
[[ " ${harnesses[*]} " == *" $name "* ]] || usage
[[ "$seconds" =~ ^[0-9]+$ ]] || usage

build_harnesses >&2
binary="$build/fuzz/fuzz_$name"
dir="$work/$name"
mkdir -p "$dir/corpus" "$dir/artifacts"
rm -rf "$dir/seeds"
"$venv/bin/python" "$here/tests/fuzz/make_seeds.py" "$name" "$dir/seeds"
dict=()
[[ -f "$here/tests/fuzz/$name.dict" ]] && dict=("-dict=$here/tests/fuzz/$name.dict")

# The artifacts of this run only: older ones stay for the record but are not reported again.
before=$(mktemp)
trap 'rm -f "$before"' EXIT
ls "$dir/artifacts" >"$before"
log="$dir/last-run.log"
set +e
ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1} UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1} \
  "$binary" "$dir/corpus" "$dir/seeds" -max_total_time="$seconds" -max_len="$(max_len "$name")" -timeout=10 \
  -rss_limit_mb=2048 -malloc_limit_mb=2048 -len_control=0 -print_final_stats=1 -artifact_prefix="$dir/artifacts/" "${dict[@]}" "$@" \
  >"$log" 2>&1
rc=$?
set -e

runs=$(sed -nE 's/^stat::number_of_executed_units: *([0-9]+).*/\1/p' "$log" | tail -n 1)
took=$(sed -nE 's/^Done [0-9]+ runs in ([0-9]+) second.*/\1/p' "$log" | tail -n 1)
corpus_files=$(find "$dir/corpus" -type f | wc -l)
corpus_bytes=$(du -sb "$dir/corpus" | cut -f1)
new=$(ls "$dir/artifacts" | grep -vxFf "$before" || true)
if [[ $rc -ne 0 || -n "$new" ]]; then
  tail -n 60 "$log"
  echo "fuzz $name: FAILED (libFuzzer exit $rc); full log: $log"
  for f in $new; do
    echo "fuzz $name: reproducer $dir/artifacts/$f"
    echo "fuzz $name: replay with: $binary $dir/artifacts/$f"
  done
  exit 1
fi
rate=$(awk -v r="${runs:-0}" -v t="${took:-$seconds}" 'BEGIN { printf "%d", (t > 0 ? r / t : r) }')
echo "fuzz $name: ${runs:-0} runs in ${took:-$seconds} s = $rate execs/s; corpus $corpus_files files, $corpus_bytes bytes; no crash"
