"""Builds strata's Dockerfile with podman and runs the image: shared by tests/image and by any test that
needs the image (e.g. `podman kube play` of deploy/k8s). Use it as

    import image_helpers as IMG
    tag = IMG.strata_image()          # builds once per session (layer cache, the host's ccache, pip cache mount);
                                      # pytest.skip()s, visibly, where podman cannot run at all

Every podman call goes through `podman()`, which sets CONTAINERS_CONF to deploy/podman/containers.conf
(runc, cgroupfs, ulimits, netavark: what these VMs need) without touching the system's configuration.
The base image is a debootstrapped Debian 12 (scripts/make_base_image.sh), since no registry is reachable.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
CONTAINERS_CONF = REPO / "deploy" / "podman" / "containers.conf"
BASE_IMAGE = os.environ.get("STRATA_BASE_IMAGE", "localhost/strata-base:bookworm")
IMAGE_TAG = os.environ.get("STRATA_IMAGE_TAG", "localhost/strata:test")
BUILD_TIMEOUT_S = 45 * 60
# The Dockerfile's CMD: the checkpoint at /model, gRPC, the OpenAI-compatible HTTP API and /metrics on all
# interfaces at the EXPOSEd ports (tests/deploy/test_http_port.py checks it against the Dockerfile).
IMAGE_CMD = ["--model", "/model", "--listen", "0.0.0.0:50051", "--http-listen", "0.0.0.0:8000",
             "--metrics-listen", "0.0.0.0:9464"]

_built: dict[str, object] = {}


def podman_env() -> dict:
    return {**os.environ, "CONTAINERS_CONF": str(CONTAINERS_CONF)}


def podman(*args: str, timeout: float = 120, check: bool = True, **kwargs) -> subprocess.CompletedProcess:
    done = subprocess.run(["podman", *args], capture_output=True, text=True, timeout=timeout, env=podman_env(),
                          **kwargs)
    if check and done.returncode != 0:
        raise AssertionError(f"podman {' '.join(args)} exited {done.returncode}:\n{done.stdout}\n{done.stderr}")
    return done


def podman_unusable() -> str | None:
    """Why podman cannot run containers here, or None when it can."""
    if shutil.which("podman") is None:
        return "podman is not installed (scripts/setup.sh installs it on Debian)"
    if os.geteuid() != 0:
        return "the image test runs rootful podman (it needs root)"
    try:
        info = podman("info", "--format", "json", timeout=60, check=False)
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"podman info failed: {e}"
    if info.returncode != 0:
        return f"podman info failed: {info.stderr.strip()[-500:]}"
    return None


def _log(message: str) -> None:
    # Printed to the terminal even under -q (pytest captures sys.stdout, not the real stderr).
    print(f"[image] {message}", file=sys.__stderr__, flush=True)


def ensure_base_image() -> None:
    if podman("image", "exists", BASE_IMAGE, check=False).returncode == 0:
        return
    _log(f"making {BASE_IMAGE} with debootstrap (about a minute, once)")
    done = subprocess.run([str(REPO / "scripts" / "make_base_image.sh"), BASE_IMAGE], capture_output=True,
                          text=True, timeout=900, env=podman_env())
    assert done.returncode == 0, f"make_base_image.sh failed:\n{done.stdout}\n{done.stderr}"


def image_size_bytes(tag: str) -> int:
    return int(json.loads(podman("image", "inspect", tag).stdout)[0]["Size"])


def host_ccache_dir() -> Path | None:
    """The host's compiler cache (ccache's cache_dir: $CCACHE_DIR or ~/.cache/ccache), where it exists."""
    if shutil.which("ccache") is None:
        return None
    done = subprocess.run(["ccache", "-k", "cache_dir"], capture_output=True, text=True)
    directory = Path(done.stdout.strip()) if done.returncode == 0 and done.stdout.strip() else None
    return directory if directory is not None and directory.is_dir() else None


def host_deps_dir() -> Path | None:
    """Where the host's configure keeps the source tarballs it fetches ($STRATA_DEPS_CACHE or ~/.cache/strata/deps,
    structured/xgrammar.cmake), where it exists."""
    directory = Path(os.environ.get("STRATA_DEPS_CACHE") or Path.home() / ".cache" / "strata" / "deps")
    return directory if directory.is_dir() else None


def build_args() -> list[str]:
    """`podman build`'s arguments besides the target and tag. The image's build stage compiles what the host build
    (scripts/build.sh: RelWithDebInfo against the virtualenv's torch) compiled just before: it builds the same way,
    with the wheel at the host virtualenv's path, and reads and fills the host's compiler cache (mounted at
    /host-ccache for the build only), so the host's objects are reused instead of compiled a second time (issue
    40: the image's build stage was a full second compile on a fresh machine). The same arguments every time:
    the layer cache stays valid between runs."""
    venv = Path(os.environ.get("STRATA_VENV", str(Path.home() / ".cache" / "strata" / "venv")))
    # ccache hashes these variables' values (they change the compiler's messages): the host build's, here too.
    locale = " ".join(f"{k}={os.environ[k]}" for k in ("LANG", "LC_ALL", "LC_CTYPE", "LC_MESSAGES") if os.environ.get(k))
    args = ["--layers", "--build-arg", f"BASE_IMAGE={BASE_IMAGE}", "--build-arg", f"RUNTIME_IMAGE={BASE_IMAGE}",
            "--build-arg", "STRATA_BUILD_TYPE=RelWithDebInfo", "--build-arg", f"STRATA_VENV={venv}",
            "--build-arg", f"STRATA_LOCALE={locale}"]
    ccache = host_ccache_dir()
    if ccache is not None:
        args += ["--volume", f"{ccache}:/host-ccache"]
    # The sources the host's configure fetched (xgrammar's sdist): the image's configure reads them instead of
    # downloading them again.
    deps = host_deps_dir()
    if deps is not None:
        args += ["--volume", f"{deps}:/host-deps"]
    return args


# Below this much free space where podman builds, the previous final image is removed before a build.
MIN_FREE_BYTES = 25 * 2**30


def build_image(tag: str = IMAGE_TAG) -> dict:
    """Builds the Dockerfile at the repository root on the local base; returns tag, seconds, size."""
    ensure_base_image()
    # A build that failed (a full disk, a killed run) leaves its untagged images behind, ~10 GB each: removed
    # before building, so one failure does not make every later build fail for want of space.
    podman("image", "prune", "-f", timeout=600, check=False)
    remove_stale_build_dirs()
    # Committing the final stage's COPY of /opt/strata writes ~3.4 GB twice (a blob in /var/tmp, then the layer);
    # where the disk is short of room for that, the previous final image (whose layer a source change replaces
    # anyway) goes first. The builder stage's tagged layers stay: they are the cache.
    free = min(shutil.disk_usage(path).free for path in ("/var/tmp", "/var/lib/containers") if Path(path).exists())
    if free < MIN_FREE_BYTES and podman("image", "exists", tag, check=False).returncode == 0:
        _log(f"{free / 2**30:.1f} GiB free: removing the previous {tag} before building")
        podman("rmi", tag, timeout=600, check=False)
        podman("image", "prune", "-f", timeout=600, check=False)
    log_path = Path(os.environ.get("STRATA_IMAGE_BUILD_LOG", "/var/tmp/strata-image-build.log"))
    started = time.monotonic()
    with open(log_path, "w") as log:
        done = subprocess.run(
            ["podman", "build", *build_args(), "-t", tag, "-f", str(REPO / "Dockerfile"), str(REPO)],
            stdout=log, stderr=subprocess.STDOUT, timeout=BUILD_TIMEOUT_S, env=podman_env())
    seconds = time.monotonic() - started
    if done.returncode != 0:
        tail = "\n".join(log_path.read_text(errors="replace").splitlines()[-60:])
        raise AssertionError(f"podman build failed ({done.returncode}) after {seconds:.0f}s; {log_path}:\n{tail}")
    keep_only_current_layers(tag)
    size = image_size_bytes(tag)
    _log(f"built {tag} in {seconds:.0f}s, image size {size / 2**30:.2f} GiB ({size} bytes); log: {log_path}")
    return {"tag": tag, "seconds": seconds, "size": size}


def remove_stale_build_dirs(tmp: Path = Path("/var/tmp")) -> None:
    """A build killed or out of room leaves its working folders in /var/tmp (buildahNNN, storageNNN: the final
    stage's ~5 GB blob each, 10 GB a failure); nothing removes them, and a later build then fails for want of
    space (stop 51's CI). Removes those older than a build may run: none of them can belong to a build under way."""
    now = time.time()
    for pattern in ("buildah[0-9]*", "storage[0-9]*"):
        for path in tmp.glob(pattern):
            try:
                if path.is_dir() and not path.is_symlink() and now - path.stat().st_mtime > BUILD_TIMEOUT_S:
                    _log(f"removing {path}, left by an earlier image build")
                    shutil.rmtree(path, ignore_errors=True)
            except OSError:
                pass


def keep_only_current_layers(tag: str) -> None:
    """Each edit of the sources leaves the previous build's images behind (the builder stage alone is
    ~10 GB): tags the builder stage of this build (`--target builder`, all cache hits) so its layers stay
    the cache of the next build, then removes the images nothing tags any more. Keeps the disk from
    filling up over repeated CI runs."""
    podman("build", *build_args(), "--target", "builder", "-t", builder_tag(tag), "-f", str(REPO / "Dockerfile"),
           str(REPO), timeout=600)
    podman("image", "prune", "-f", timeout=600, check=False)


def builder_tag(tag: str) -> str:
    name, _, version = tag.rpartition(":")
    return f"{name}-builder:{version}" if name else f"{tag}-builder"


def strata_image() -> str:
    """The image's tag, built at most once per process; skips (visibly) where podman cannot run."""
    if "skip" in _built:
        pytest.skip(str(_built["skip"]))
    if "build" not in _built:
        reason = podman_unusable()
        if reason:
            _built["skip"] = f"podman cannot run here: {reason}"
            pytest.skip(str(_built["skip"]))
        _built["build"] = build_image()
    return str(_built["build"]["tag"])  # type: ignore[index]


def build_result() -> dict | None:
    return _built.get("build")  # type: ignore[return-value]


def free_port() -> int:
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def readable_by_all(directory: Path) -> Path:
    """The image runs as a non-root user (uid 10001): the mounted checkpoint must be world-readable
    (pytest's tmp directories are 0700)."""
    directory.chmod(0o755)
    for p in directory.rglob("*"):
        p.chmod(0o755 if p.is_dir() else 0o644)
    return directory


class Container:
    """`podman run -d` of the image with the checkpoint at /model (read-only) and the gRPC and metrics
    ports published on loopback; `args` replace the image's CMD (None keeps it)."""

    def __init__(self, image: str, model_dir: Path, args: list[str] | None = None):
        self.image = image
        self.model_dir = readable_by_all(model_dir)
        self.args = args
        self.name = f"strata-test-{uuid.uuid4().hex[:10]}"
        self.grpc_port = free_port()
        self.metrics_port = free_port()
        self.grpc_address = f"127.0.0.1:{self.grpc_port}"
        self.metrics_url = f"http://127.0.0.1:{self.metrics_port}/metrics"
        self.channel = None

    def start(self, stubs, timeout_s: float = 120) -> "Container":
        import grpc

        podman("run", "-d", "--name", self.name, "-p", f"{self.grpc_address}:50051",
               "-p", f"127.0.0.1:{self.metrics_port}:9464", "-v", f"{self.model_dir}:/model:ro", self.image,
               *(self.args or []))
        self.channel = grpc.insecure_channel(self.grpc_address)
        health = stubs.health_grpc.HealthStub(self.channel)
        request = stubs.health.HealthCheckRequest(service="strata.v1.InferenceService")
        deadline = time.monotonic() + timeout_s
        while True:
            if not self.running():
                raise AssertionError(f"the container exited with {self.exit_code()}\n{self.logs()}")
            try:
                if health.Check(request, timeout=1.0).status == stubs.health.HealthCheckResponse.SERVING:
                    return self
            except grpc.RpcError:
                pass
            if time.monotonic() > deadline:
                raise AssertionError(f"not SERVING after {timeout_s}s\n{self.logs()}")
            time.sleep(0.2)

    def state(self) -> dict:
        return json.loads(podman("inspect", self.name).stdout)[0]["State"]

    def running(self) -> bool:
        return bool(self.state()["Running"])

    def exit_code(self) -> int:
        return int(self.state()["ExitCode"])

    def logs(self) -> str:
        done = podman("logs", self.name, check=False)
        return f"podman logs {self.name}:\n{done.stdout}{done.stderr}"

    def stop(self, timeout_s: int = 30) -> int:
        """`podman stop -t timeout_s` (SIGTERM, then SIGKILL after timeout_s); returns the exit code."""
        podman("stop", "-t", str(timeout_s), self.name, timeout=timeout_s + 60)
        return self.exit_code()

    def remove(self) -> None:
        if self.channel is not None:
            self.channel.close()
        podman("rm", "-f", "-t", "0", self.name, check=False)
