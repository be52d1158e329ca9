"""deploy/k8s/components/tls on the CPU overlay: the server gets --tls-cert/--tls-key and --api-key-file
from files mounted read-only from the Secrets the component names, the probes move to the plaintext
--health-listen port (Kubernetes' gRPC probes speak no TLS), the Service's gRPC port no longer claims
h2c, and the result validates strictly. tests/auth runs a server with these flags."""

import pathlib
import posixpath
import shutil
import subprocess

import pytest
import yaml

from manifest_checks import GRPC_PORT_NAME, K8S, container_port, flag, kubectl, one, server_container
from test_manifests import KUBERNETES_VERSIONS, kubernetes_validate

SECRETS = {"tls-cert": "strata-tls", "tls-key": "strata-tls", "api-key-file": "strata-api-keys"}


@pytest.fixture(scope="module")
def rendered_tls(tmp_path_factory) -> pathlib.Path:
    # kustomize takes no absolute paths: an overlay beside the real ones, in a copy of the tree.
    tree = tmp_path_factory.mktemp("k8s") / "k8s"
    shutil.copytree(K8S, tree)
    overlay = tree / "overlays" / "cpu-tls"
    overlay.mkdir()
    (overlay / "kustomization.yaml").write_text(
        "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources:\n  - ../cpu\n"
        "components:\n  - ../../components/tls\n")
    run = subprocess.run([kubectl(), "kustomize", str(overlay)], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    out = overlay / "rendered.yaml"
    out.write_text(run.stdout)
    return out


@pytest.fixture(scope="module")
def objects(rendered_tls) -> list[dict]:
    return [d for d in yaml.safe_load_all(rendered_tls.read_text()) if d]


def test_files_come_from_the_secrets_read_only(objects):
    pod = one(objects, "Deployment")["spec"]["template"]["spec"]
    container = server_container(one(objects, "Deployment"))
    mounts = {m["mountPath"]: m for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    for name, secret in SECRETS.items():
        path = flag(container, name)
        assert path is not None, f"--{name} is not set"
        mount = mounts[posixpath.dirname(path)]
        assert mount.get("readOnly") is True
        assert volumes[mount["name"]]["secret"]["secretName"] == secret
        # The container runs as a non-root user; Secret files belong to root.
        assert volumes[mount["name"]]["secret"]["defaultMode"] & 0o004


def test_probes_use_the_plaintext_health_port(objects):
    container = server_container(one(objects, "Deployment"))
    health_port = int(flag(container, "health-listen").rsplit(":", 1)[1])
    assert container_port(container, "health") == health_port != container_port(container, GRPC_PORT_NAME)
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert container[probe]["grpc"]["port"] == health_port, probe
    service = next(o for o in objects if o["kind"] == "Service" and o["metadata"]["name"] == "strata")
    grpc_port = next(p for p in service["spec"]["ports"] if p["name"] == GRPC_PORT_NAME)
    assert "appProtocol" not in grpc_port


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_validates_strictly(rendered_tls, version):
    run = subprocess.run([kubernetes_validate(), "--strict", "-k", version, str(rendered_tls)], capture_output=True,
                         text=True, timeout=60)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "WARN" not in run.stdout + run.stderr and "ERROR" not in run.stdout + run.stderr
