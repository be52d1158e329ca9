#!/usr/bin/env bash
# Configures and builds the sanitizer lanes (tests/sanitize/README.md): build-asan/ (ASan + UBSan) and
# build-tsan/ (TSan), each with only the targets its lane runs. Run scripts/setup.sh first (test.sh does).
#
#   scripts/sanitize.sh [asan|tsan ...]     build the named lanes (default: both)
#
# STRATA_SANITIZE_JOBS sets the parallel jobs (default: nproc). The directories can be moved with
# STRATA_ASAN_BUILD_DIR / STRATA_TSAN_BUILD_DIR.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
venv=${STRATA_VENV:-$HOME/.cache/strata/venv}
jobs=${STRATA_SANITIZE_JOBS:-$(nproc)}

# The lanes' targets (tests/sanitize/sanitize_helpers.py runs them): every C++ test suite and
# strata-server for ASan + UBSan; for TSan the suites whose code runs on several threads (the engine, its output
# thread, the stage workers; the tokenizer the admission threads share; structured/'s compile threads and cache) and
# strata-server, which the serving
# scenario drives from many threads.
asan_targets=(strata_base_tests strata_checkpoint_tests strata_cli_tests strata_planner_tests strata_tokenizer_tests
              strata_chat_template_tests strata_structured_tests strata_kernels_tests strata_runtime_tests
              strata_transport_tests strata_server_tests strata-server)
tsan_targets=(strata_runtime_tests strata_transport_tests strata_tokenizer_tests strata_structured_tests strata-server)

torch_prefix=$("$venv/bin/python" -c 'import torch.utils; print(torch.utils.cmake_prefix_path)')

lane() {
  local name=$1 sanitizers=$2 build=$3
  shift 3
  if [[ ! -f "$build/build.ninja" ]]; then
    mkdir -p "$build"
    # -O1 (the sanitizers' advice: fast enough, whole stacks) and -g1 (line tables: file:line in every
    # report, without the full debug information of LibTorch's templates, which doubles compile times).
    cmake -S "$here" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_PREFIX_PATH="$torch_prefix" \
      -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g1 -DNDEBUG" -DCMAKE_C_FLAGS_RELWITHDEBINFO="-O1 -g1 -DNDEBUG" \
      -DPython3_EXECUTABLE="$venv/bin/python" -DSTRATA_SANITIZE="$sanitizers" >"$build/configure.log" 2>&1 || {
      cat "$build/configure.log" >&2
      exit 1
    }
  fi
  local targets=()
  for t in "$@"; do targets+=(--target "$t"); done
  # gtest_discover_tests runs each suite at build time to list its tests: under the lane's options too.
  # shellcheck source=tests/sanitize/sanitize_env.sh
  source "$here/tests/sanitize/sanitize_env.sh"
  cmake --build "$build" -j "$jobs" "${targets[@]}"
  echo "sanitize: $name built in $build"
}

lanes=("$@")
((${#lanes[@]})) || lanes=(asan tsan)
for l in "${lanes[@]}"; do
  case $l in
    asan) lane asan address,undefined "${STRATA_ASAN_BUILD_DIR:-$here/build-asan}" "${asan_targets[@]}" ;;
    tsan) lane tsan thread "${STRATA_TSAN_BUILD_DIR:-$here/build-tsan}" "${tsan_targets[@]}" ;;
    *) echo "sanitize.sh: unknown lane \"$l\" (asan or tsan)" >&2; exit 2 ;;
  esac
done
