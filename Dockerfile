# syntax=docker/dockerfile:1
# strata's image: strata-server (ENTRYPOINT), strata-client and strata-plan, built from source.
#
#   docker build -t strata .                                   # GPU hosts (CUDA base images below)
#   podman build --build-arg BASE_IMAGE=localhost/strata-base:bookworm \
#                --build-arg RUNTIME_IMAGE=localhost/strata-base:bookworm -t strata .
#   docker run --gpus all -v /models/x:/model:ro -p 50051:50051 -p 8000:8000 -p 9464:9464 strata
#
# Two stages. The builder installs Debian's/Ubuntu's -dev packages (gRPC, Protobuf, Abseil,
# prometheus-cpp, nlohmann-json, Oniguruma, utf8proc), the PyPI torch wheel pinned in
# scripts/requirements.txt (its LibTorch is what strata links; PyPI's Linux wheel is the CUDA build and
# brings its CUDA libraries as nvidia-* wheels) and builds with CMake + Ninja + ccache. The runtime stage
# gets the binaries, the wheel's shared libraries the binaries load (ldd's closure, plus the ones torch
# dlopens: cuDNN's engines, NVRTC's builtins) in /opt/strata/lib, and the distribution packages that own
# the other libraries ldd names, found by dpkg in the builder. No Python, no compiler, no torch/include.
#
# Base images: the torch wheel carries its own CUDA runtime, so the CUDA image only needs to be a
# matching Ubuntu with the NVIDIA container hooks' labels and NVIDIA_REQUIRE_CUDA (the host driver must
# support CUDA 13); the -base flavour (no cuBLAS/cuDNN of its own) is enough for both stages. Any Debian
# 12 or Ubuntu 24.04 image works (the tests use a debootstrapped Debian 12: scripts/make_base_image.sh).
ARG BASE_IMAGE=docker.io/nvidia/cuda:13.0.2-base-ubuntu24.04
ARG RUNTIME_IMAGE=docker.io/nvidia/cuda:13.0.2-base-ubuntu24.04

FROM ${BASE_IMAGE} AS builder
ARG DEBIAN_FRONTEND=noninteractive
RUN apt-get update -q && apt-get install -y -q --no-install-recommends \
      build-essential cmake ninja-build pkg-config ccache ca-certificates python3 python3-venv binutils \
      libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler libabsl-dev prometheus-cpp-dev libmicrohttpd-dev libgnutls28-dev libssl-dev \
      nlohmann-json3-dev libonig-dev libutf8proc-dev libre2-dev libucx-dev \
    && rm -rf /var/lib/apt/lists/*

# torch, at the version scripts/requirements.txt pins (TORCH_SPEC overrides: e.g. a CPU wheel from
# --build-arg TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu). Only torch: the test oracles in
# requirements.txt are not needed to build.
ARG TORCH_SPEC=
ARG TORCH_INDEX_URL=
# Where the wheel goes. The image test (tests/image) names the host's own virtualenv path, as it names the host
# build's type (STRATA_BUILD_TYPE below): the compile commands are then the host build's, torch's header paths
# included, and the host's compiler cache answers them (the build step below).
ARG STRATA_VENV=/opt/venv
COPY scripts/requirements.txt /tmp/requirements.txt
RUN --mount=type=cache,target=/root/.cache/pip \
    python3 -m venv "$STRATA_VENV" \
    && spec=${TORCH_SPEC:-$(grep -E '^torch==' /tmp/requirements.txt)} \
    && "$STRATA_VENV"/bin/pip install -q --disable-pip-version-check --cache-dir /root/.cache/pip --no-compile ${TORCH_INDEX_URL:+--index-url "$TORCH_INDEX_URL"} "$spec"

# The wheel's CMake config (Caffe2's cuda.cmake) wants a CUDA toolkit even though strata compiles no CUDA:
# nvcc (enable_language(CUDA)), headers, and link names for cudart, cuBLAS, cuRAND, ... NVIDIA's PyPI
# wheels at the version of the wheel's own CUDA runtime install into the same nvidia/cu13 prefix, so that
# prefix becomes the toolkit (/usr/local/cuda), on any base image. libcuda.so is a link-time stub only
# (strata does not link the driver; the NVIDIA container runtime mounts the real one). A CPU wheel
# (TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu) needs none of this.
RUN --mount=type=cache,target=/root/.cache/pip \
    v=$("$STRATA_VENV"/bin/pip show nvidia-cuda-runtime 2>/dev/null | sed -n 's/^Version: //p'); [ -n "$v" ] || exit 0 \
    && cuda=$(echo "$STRATA_VENV"/lib/python3*/site-packages/nvidia/cu[0-9]*) \
    && "$STRATA_VENV"/bin/pip install -q --disable-pip-version-check --cache-dir /root/.cache/pip --no-compile "nvidia-cuda-nvcc==$v" "nvidia-cuda-crt==$v" \
         "nvidia-nvvm==$v" "nvidia-curand~=10.4" \
    && for lib in "$cuda"/lib/lib*.so.*; do \
         base=${lib%%.so.*}.so; [ -e "$base" ] || ln -s "$(basename "$lib")" "$base"; done \
    && mkdir -p "$cuda/lib/stubs" && ln -sfn lib "$cuda/lib64" \
    && gcc -shared -o "$cuda/lib/stubs/libcuda.so" -Wl,-soname,libcuda.so.1 -x c /dev/null \
    && ln -sfn "$cuda" /usr/local/cuda
ENV PATH=/usr/local/cuda/bin:$PATH CUDA_HOME=/usr/local/cuda

# Google Highway for kernels/ (a layer of its own, after the toolkit: adding it did not invalidate the
# torch and CUDA layers above).
RUN apt-get update -q && apt-get install -y -q --no-install-recommends libhwy-dev && rm -rf /var/lib/apt/lists/*

# Sources only (tests/, docs/, bench/ stay out, so editing them does not rebuild).
WORKDIR /src
COPY CMakeLists.txt ./
COPY cmake cmake
COPY base base
COPY cli cli
COPY checkpoint checkpoint
COPY planner planner
COPY tokenizer tokenizer
COPY chat_template chat_template
COPY structured structured
COPY kernels kernels
COPY transport transport
COPY runtime runtime
COPY proto proto
COPY server server
COPY clients/cpp clients/cpp
# -O2 without debug information (Release): the optimisation the tests run (RelWithDebInfo), a smaller binary
# (collect_runtime.sh strips the binaries either way).
# TORCH_CUDA_ARCH_LIST only answers the wheel's CMake config (strata compiles no CUDA code).
ARG TORCH_CUDA_ARCH_LIST=9.0
ARG STRATA_BUILD_TYPE=Release
# Locale variables ccache puts in its keys ("LANG=C.UTF-8 ..."): the image test passes the host's.
ARG STRATA_LOCALE=
# The compiler cache: a cache mount of its own, or the host's when the build mounts it at /host-ccache
# (`podman build --volume ~/.cache/ccache:/host-ccache`: the image test does, after the host build filled it).
# The build folder is /src/build as the host's is <clone>/build, so that under CCACHE_BASEDIR (the root
# CMakeLists.txt sets it to the source folder, with CCACHE_NOHASHDIR) the relative paths are the host's; the host's
# cache keeps its own settings (compiler_check mtime: Debian's compiler has the same mtime in both).
# Sources fetched at configure time (xgrammar's sdist, structured/xgrammar.cmake) are kept in a cache mount of their
# own, or read from the host's cache when the build mounts it at /host-deps (the image test does): no download then.
ENV CCACHE_DIR=/root/.cache/ccache CCACHE_BASEDIR=/src CCACHE_COMPILERCHECK=content CCACHE_MAXSIZE=2G \
    STRATA_DEPS_CACHE=/root/.cache/strata/deps
RUN --mount=type=cache,target=/root/.cache/ccache --mount=type=cache,target=/root/.cache/strata/deps \
    if [ -d /host-ccache ]; then export CCACHE_DIR=/host-ccache; unset CCACHE_COMPILERCHECK CCACHE_MAXSIZE; fi \
    && if [ -d /host-deps ]; then export STRATA_DEPS_CACHE=/host-deps; fi \
    && { [ -z "$STRATA_LOCALE" ] || export $STRATA_LOCALE; } \
    && cmake -S /src -B /src/build -G Ninja -DCMAKE_BUILD_TYPE="$STRATA_BUILD_TYPE" \
      -DCMAKE_CXX_FLAGS_RELEASE="-O2 -DNDEBUG" -DCMAKE_C_FLAGS_RELEASE="-O2 -DNDEBUG" \
      -DSTRATA_BUILD_TESTS=OFF -DSTRATA_BUILD_BENCH=OFF \
      -DCMAKE_PREFIX_PATH="$("$STRATA_VENV"/bin/python -c 'import torch.utils; print(torch.utils.cmake_prefix_path)')" \
      -DPython3_EXECUTABLE="$STRATA_VENV"/bin/python >/tmp/configure.log 2>&1 || { cat /tmp/configure.log; exit 1; } \
    && stats() { ccache --print-stats | awk '$1 ~ /^(direct_cache_hit|preprocessed_cache_hit|cache_miss)$/ { n += $2 } \
         $1 == "cache_miss" { m = $2 } END { print n - m, m }'; } && before=$(stats) \
    && cmake --build /src/build --target strata-server strata-client strata-plan \
    && set -- $before $(stats) && echo "ccache ($CCACHE_DIR): $(($3 - $1)) hits, $(($4 - $2)) misses" \
    && find /src/build \( -name '*.o' -o -name '*.a' \) -delete

# (The objects and archives are deleted: the binaries are linked, and the compiler cache, not the layer, is what
# makes the next build quick; a RelWithDebInfo build's objects and archives are 0.85 GB.)

# What the runtime stage needs: the binaries (stripped), the wheel's libraries they load, and the
# distribution packages that own every other library ldd names.
COPY scripts/collect_runtime.sh /tmp/collect_runtime.sh
RUN sh /tmp/collect_runtime.sh /src/build "$STRATA_VENV" /opt/strata

FROM ${RUNTIME_IMAGE}
ARG DEBIAN_FRONTEND=noninteractive
COPY --from=builder /opt/strata/runtime-packages.txt /tmp/runtime-packages.txt
RUN apt-get update -q \
    && apt-get install -y -q --no-install-recommends catatonit libucx0 $(cat /tmp/runtime-packages.txt) \
    && rm -rf /var/lib/apt/lists/* /var/cache/apt/archives/*.deb /tmp/runtime-packages.txt \
    && useradd --system --uid 10001 --user-group --home-dir /nonexistent --shell /usr/sbin/nologin strata
COPY --from=builder /opt/strata /opt/strata
ENV PATH=/opt/strata/bin:$PATH LD_LIBRARY_PATH=/opt/strata/lib
USER 10001:10001
# gRPC, the OpenAI-compatible HTTP API (vLLM's port), /metrics.
EXPOSE 50051 8000 9464
# catatonit as PID 1 forwards SIGTERM/SIGINT to strata-server (which drains) and reaps.
ENTRYPOINT ["catatonit", "--", "strata-server"]
CMD ["--model", "/model", "--listen", "0.0.0.0:50051", "--http-listen", "0.0.0.0:8000", "--metrics-listen", "0.0.0.0:9464"]
