#!/usr/bin/env bash
# The aarch64 lane: kernels/ and tests/kernels alone (cmake/kernels-only), cross-compiled with Debian's
# g++-aarch64-linux-gnu against the arm64 multiarch Highway and GoogleTest (scripts/setup.sh installs them),
# into $STRATA_AARCH64_BUILD_DIR (default build-aarch64/). Highway compiles every kernel for NEON, SVE and
# SVE2 there; tests/cross runs the suite under qemu-aarch64, whose CPU has all three, so each target's code
# is tested on this x86 machine.
#
#   scripts/cross-aarch64.sh          configure (once) and build
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${STRATA_AARCH64_BUILD_DIR:-$here/build-aarch64}

for tool in aarch64-linux-gnu-g++ qemu-aarch64; do
  command -v "$tool" >/dev/null || {
    echo "cross-aarch64: $tool not found (scripts/setup.sh installs the aarch64 lane)" >&2
    exit 1
  }
done
if [[ ! -f "$build/build.ninja" ]]; then
  mkdir -p "$build"
  launcher=()
  command -v ccache >/dev/null && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
  cmake -S "$here/cmake/kernels-only" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DCMAKE_TOOLCHAIN_FILE="$here/cmake/aarch64-linux-gnu.cmake" "${launcher[@]}" >"$build/configure.log" 2>&1 || {
    cat "$build/configure.log" >&2
    exit 1
  }
fi
cmake --build "$build" -j "$(nproc)"
