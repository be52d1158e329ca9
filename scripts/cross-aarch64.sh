#!/usr/bin/env bash
# The aarch64 lane: kernels/ and tests/kernels alone (cmake/kernels-only), cross-compiled with Debian's
# g++-aarch64-linux-gnu against the arm64 multiarch Highway and GoogleTest, into $STRATA_AARCH64_BUILD_DIR (default build-aarch64/). Highway compiles every kernel for NEON, SVE and
# SVE2 there; tests/cross runs the suite under qemu-aarch64, whose CPU has all three, so each target's code
# is tested on this x86 machine.
#
#   scripts/cross-aarch64.sh          install what is missing (once), configure (once) and build
#
# What it installs (Debian, only what is missing; scripts/test.sh runs it, scripts/serve.sh does not):
# g++-aarch64-linux-gnu, qemu-user, and libhwy-dev, libgtest-dev, libgmock-dev for arm64 (multiarch).
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${STRATA_AARCH64_BUILD_DIR:-$here/build-aarch64}

packages=(g++-aarch64-linux-gnu qemu-user libhwy-dev:arm64 libgtest-dev:arm64 libgmock-dev:arm64)
missing=()
for p in "${packages[@]}"; do
  status=$(dpkg-query -W -f='${db:Status-Abbrev}' "$p" 2>/dev/null || true)
  [[ "$status" == ii* ]] || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "cross-aarch64: installing ${missing[*]}" >&2
  sudo_cmd=()
  [[ $(id -u) -eq 0 ]] || sudo_cmd=(sudo)
  dpkg --print-foreign-architectures | grep -qx arm64 || "${sudo_cmd[@]}" dpkg --add-architecture arm64
  "${sudo_cmd[@]}" apt-get update -q
  DEBIAN_FRONTEND=noninteractive "${sudo_cmd[@]}" apt-get install -y -q --no-install-recommends "${missing[@]}"
fi
if [[ ! -f "$build/build.ninja" ]]; then
  mkdir -p "$build"
  launcher=()
  # As the top-level CMakeLists.txt does: keys relative to the clone, so that a fresh clone hits the cache.
  command -v ccache >/dev/null && launcher=("-DCMAKE_CXX_COMPILER_LAUNCHER=env;CCACHE_BASEDIR=$here;CCACHE_NOHASHDIR=1;ccache")
  cmake -S "$here/cmake/kernels-only" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DCMAKE_TOOLCHAIN_FILE="$here/cmake/aarch64-linux-gnu.cmake" "${launcher[@]}" >"$build/configure.log" 2>&1 || {
    cat "$build/configure.log" >&2
    exit 1
  }
fi
cmake --build "$build" -j "$(nproc)"
