#!/bin/sh
# Used by the Dockerfile's builder stage: collect_runtime.sh BUILD_DIR VENV OUT
# Puts into OUT what the runtime stage copies: bin/ (strata-server, strata-client, strata-plan,
# stripped), lib/ (every shared library of the torch wheel and its nvidia-* wheels that ldd resolves for
# those binaries and for libtorch_cuda.so, which they load with dlopen on GPU hosts, plus the ones torch loads with dlopen: cuDNN's engine libraries, NVRTC's builtins and
# torch's NVRTC shim), and runtime-packages.txt (the distribution packages owning every other library
# ldd names: gRPC, Protobuf, Abseil, prometheus-cpp, Oniguruma, utf8proc, ...).
set -eu
build=$1 venv=$2 out=$3
mkdir -p "$out/bin" "$out/lib"
for b in server/strata-server clients/cpp/strata-client planner/strata-plan; do
  cp "$build/$b" "$out/bin/"
  strip --strip-unneeded "$out/bin/$(basename "$b")"
done
site=$(echo "$venv"/lib/python3*/site-packages)
# LibTorch's CUDA half is dlopen'ed where a driver is (runtime/executor/cuda_loader.h): it and what it links
# come too, so that the image runs on GPU nodes.
cuda_half=""
[ -e "$site/torch/lib/libtorch_cuda.so" ] && cuda_half="$site/torch/lib/libtorch_cuda.so"
{ ldd "$out"/bin/* $cuda_half | awk '$2 == "=>" && $3 ~ /^\// {print $3}'; [ -z "$cuda_half" ] || echo "$cuda_half"; } \
  | sort -u >/tmp/libs.txt
grep -F "$site/" /tmp/libs.txt | while read -r lib; do cp -L "$lib" "$out/lib/"; done
# dlopen'ed, so invisible to ldd (present only in the CUDA wheels).
for pattern in "nvidia/cudnn/lib/libcudnn*.so.*" "nvidia/*/lib/libnvrtc-builtins*.so*" "torch/lib/libcaffe2_nvrtc.so"; do
  for lib in $site/$pattern; do
    [ -e "$lib" ] && cp -L "$lib" "$out/lib/"
  done
done
grep -vF "$site/" /tmp/libs.txt | while read -r lib; do
  dpkg -S "$(readlink -f "$lib")" 2>/dev/null || dpkg -S "*/$(basename "$lib")"
done | cut -d: -f1 | sort -u >"$out/runtime-packages.txt"
# The binaries must resolve every library with only OUT/lib and the system's (as in the runtime stage).
missing=$(LD_LIBRARY_PATH="$out/lib" ldd "$out"/bin/* ${cuda_half:+"$out/lib/libtorch_cuda.so"} | grep 'not found' || true)
[ -z "$missing" ] || { echo "collect_runtime: unresolved: $missing" >&2; exit 1; }
echo "collect_runtime: $(ls "$out/lib" | wc -l) libraries, $(du -sh "$out/lib" | cut -f1); packages: $(tr '\n' ' ' <"$out/runtime-packages.txt")"
