#!/usr/bin/env bash
# Runs HERE (the Debian 12 development machine): downloads the Debian packages that planner/,
# checkpoint/, tokenizer/, runtime/ and strata-generate (and their GoogleTest suites) need to BUILD on
# the lent GPU machine, which has PyTorch, CUDA, CMake, ninja and a compiler but no Debian -dev
# libraries and no network. The .debs go into .gpu-bundle/ (ignored by git; the device tool carries it
# with `carry: [".gpu-bundle"]`), where scripts/gpu-check.sh unpacks them into a private prefix.
#
# Not bundled: gRPC, Protobuf and prometheus-cpp (with their -dev dependencies: c-ares, re2, OpenSSL,
# zlib, curl). The server is not built on the GPU machine (-DSTRATA_BUILD_SERVER=OFF); what the GPU
# check needs is the runtime, strata-plan and strata-generate.
#
# Usage: scripts/gpu-bundle.sh [--dir DIR]     (default DIR: .gpu-bundle in the repository root)
set -euo pipefail

usage() {
  cat >&2 <<'EOF'
usage: scripts/gpu-bundle.sh [--dir DIR]
  Downloads the .deb files the GPU machine needs to build strata (no server) into DIR
  (default: .gpu-bundle/ in the repository root), prints its size and the device tool's run command.
EOF
}

here=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
dir=$here/.gpu-bundle
while [[ $# -gt 0 ]]; do
  case $1 in
    --dir)
      [[ $# -ge 2 && -n $2 ]] || { echo "gpu-bundle.sh: --dir needs a folder" >&2; usage; exit 2; }
      dir=$2
      shift 2
      ;;
    -h | --help) usage; exit 0 ;;
    *) echo "gpu-bundle.sh: unknown argument: $1" >&2; usage; exit 2 ;;
  esac
done

# What the build needs (CMakeLists.txt: absl, nlohmann_json, GTest; tokenizer/: pkg-config modules
# oniguruma and libutf8proc; transport/: UCX and OpenSSL's libcrypto), with the run-time libraries their -dev packages depend on (checked with
# `apt-cache depends`). pkg-config is Debian 12's pkgconf; it is used there only if the GPU machine has
# no pkg-config of its own.
packages=(
  libabsl-dev libabsl20220623
  nlohmann-json3-dev
  libonig-dev libonig5
  libutf8proc-dev libutf8proc2
  libhwy-dev libhwy1
  libre2-dev libre2-9
  libucx-dev libucx0 libnuma1 libibverbs1 librdmacm1
  libssl-dev libssl3
  libgtest-dev libgmock-dev googletest
  pkg-config pkgconf pkgconf-bin libpkgconf3
)
# Size budget for the bundle: the working tree travels too, and both together must stay under 64 MiB.
budget_bytes=$((24 * 1024 * 1024))

if [[ $(dpkg --print-architecture) != amd64 ]]; then
  echo "gpu-bundle.sh: this machine is $(dpkg --print-architecture); the GPU machine is amd64 (x86-64)" >&2
  exit 1
fi

mkdir -p "$dir"
rm -f "$dir"/*.deb
(
  cd "$dir"
  if ! apt-get download "${packages[@]}" >"$dir/download.log" 2>&1; then
    cat "$dir/download.log" >&2
    echo "gpu-bundle.sh: apt-get download failed (run 'apt-get update' if a package was not found)" >&2
    exit 1
  fi
)
# The manifest gpu-check.sh prints: exactly what was bundled.
(cd "$dir" && for f in ./*.deb; do
  printf '%s %s\n' "$(dpkg-deb -f "$f" Package)" "$(dpkg-deb -f "$f" Version)"
done) >"$dir/MANIFEST"
rm -f "$dir/download.log"

bundle_bytes=$(du -sb "$dir" | cut -f1)
# What travels besides: tracked files and untracked files git does not ignore.
tree_bytes=$(cd "$here" && { git ls-files -z; git ls-files -z --others --exclude-standard; } |
  xargs -0 -r stat -c %s 2>/dev/null | awk '{s += $1} END {print s + 0}')
mib() { awk -v b="$1" 'BEGIN {printf "%.1f MiB", b / 1048576}'; }

echo "gpu-bundle.sh: $(wc -l <"$dir/MANIFEST") packages in ${dir#"$here"/}/:"
sed 's/^/  /' "$dir/MANIFEST"
echo "bundle: $(mib "$bundle_bytes") ($bundle_bytes bytes); working tree: $(mib "$tree_bytes"); together: $(mib $((bundle_bytes + tree_bytes))) of the 64 MiB the device tool carries"
if ((bundle_bytes > budget_bytes)); then
  echo "gpu-bundle.sh: the bundle is over its $(mib $budget_bytes) budget" >&2
  exit 1
fi
if [[ $dir != "$here/.gpu-bundle" ]]; then
  echo "note: the run command below expects the bundle in .gpu-bundle/ (gpu-check.sh --bundle DIR reads another)"
fi
cat <<'EOF'

Next, with the device tool: two calls made back to back (one command may run 10 minutes; the second
reuses the warm machine's build-gpu/). Results come back from $OUT: summary.md, summary.json,
logs.tar.gz, default_plan.{md,json}, gpu_bench.{md,json}.
  run(kind="nvidia-h100-x1", timeout_s=600, carry=[".gpu-bundle"],
      command="scripts/gpu-check.sh --steps build,gtest,parity,sync,sanitizer $OUT")
  run(timeout_s=600, carry=[".gpu-bundle"],
      command="scripts/gpu-check.sh --steps build,plan,bench $OUT")
EOF
