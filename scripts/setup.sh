#!/usr/bin/env bash
# Installs what strata needs to build and test, and only what is missing. Idempotent and quick
# (a few seconds) when everything is already there.
#
#   Debian packages: the C++ toolchain's libraries (gRPC, Protobuf, Abseil, prometheus-cpp,
#                    libmicrohttpd, nlohmann-json, Oniguruma, GoogleTest), ccache, clang with its
#                    sanitizer and libFuzzer runtimes (libclang-rt-14-dev, only a recommendation of clang:
#                    the fuzz build, tests/fuzz), prometheus (prometheus and
#                    promtool: tests/observe, tests/image), kubectl (kustomize; where an apt source
#                    offers it) and, for the image test (tests/image): podman, buildah, runc, catatonit,
#                    netavark, aardvark-dns, iptables, debootstrap. (The aarch64 lane installs its own:
#                    scripts/cross-aarch64.sh.)
#   PyPI (a virtualenv): torch (its LibTorch is the project's LibTorch) and the test oracles
#                    (transformers, accelerate, tokenizers, tiktoken, safetensors, grpcio, pytest), and
#                    kubernetes-validate for the manifests.
#
# The virtualenv lives outside the checkout (STRATA_VENV, default ~/.cache/strata/venv) so that
# fresh clones, CI included, share the multi-gigabyte torch install.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
venv=${STRATA_VENV:-$HOME/.cache/strata/venv}
requirements="$here/scripts/requirements.txt"

debian_packages=(
  build-essential cmake ninja-build pkg-config ccache clang clang-format libclang-rt-14-dev
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  libabsl-dev prometheus-cpp-dev libmicrohttpd-dev libgnutls28-dev nlohmann-json3-dev libonig-dev libutf8proc-dev libgtest-dev libgmock-dev
  libhwy-dev libre2-dev libucx-dev
  libssl-dev openssl
  prometheus podman buildah runc catatonit netavark aardvark-dns iptables debootstrap
)

log() { printf 'setup: %s\n' "$*" >&2; }

missing=()
for p in "${debian_packages[@]}"; do
  status=$(dpkg-query -W -f='${db:Status-Abbrev}' "$p" 2>/dev/null || true)
  [[ "$status" == ii* ]] || missing+=("$p")
done
if ((${#missing[@]})); then
  log "installing Debian packages: ${missing[*]}"
  sudo_cmd=()
  [[ $(id -u) -eq 0 ]] || sudo_cmd=(sudo)
  "${sudo_cmd[@]}" apt-get update -q
  DEBIAN_FRONTEND=noninteractive "${sudo_cmd[@]}" apt-get install -y -q --no-install-recommends "${missing[@]}"
fi

# kubectl (kustomize v5) for tests/deploy: the apt package `kubectl` (Google Cloud's or Kubernetes'
# apt repository). Debian's own kubernetes-client is 1.20, too old for kustomize components, so only
# `kubectl` is installed, where an apt source offers it; without it tests/deploy skips and says so.
if ! command -v kubectl >/dev/null; then
  if apt-cache policy kubectl 2>/dev/null | grep -q 'Candidate: [0-9]'; then
    log "installing kubectl"
    sudo_cmd=()
    [[ $(id -u) -eq 0 ]] || sudo_cmd=(sudo)
    DEBIAN_FRONTEND=noninteractive "${sudo_cmd[@]}" apt-get install -y -q --no-install-recommends kubectl
  else
    log "kubectl: no apt source offers it (add packages.cloud.google.com or pkgs.k8s.io); tests/deploy will skip"
  fi
fi

# The virtualenv is current when its stamp records the hash of requirements.txt.
stamp="$venv/.strata-requirements.sha256"
want=$(sha256sum "$requirements" | cut -d' ' -f1)
if [[ ! -x "$venv/bin/python" || ! -f "$stamp" || "$(cat "$stamp")" != "$want" ]]; then
  python=${STRATA_PYTHON:-python3}
  if [[ ! -x "$venv/bin/python" ]]; then
    log "creating virtualenv $venv"
    mkdir -p "$(dirname "$venv")"
    "$python" -m venv "$venv"
    "$venv/bin/pip" install -q --upgrade pip
  fi
  log "installing Python packages from scripts/requirements.txt (torch is large: minutes the first time)"
  "$venv/bin/pip" install -q -r "$requirements"
  echo "$want" >"$stamp"
fi
