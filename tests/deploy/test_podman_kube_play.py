"""`podman kube play` of the CPU overlay's rendered Deployment, with the strata image the image test
builds: the pod starts under the manifest's own args, user and read-only root, and answers gRPC
health, the HTTP API's /health and /metrics. podman ignores probes, GPUs and CRDs, so only the
Deployment is played; the checkpoint PVC becomes a hostPath onto a plan-only model (config.json, no
weights: health is SERVING once the plan is made), and hostPorts publish the three ports on loopback."""

import shutil
import subprocess
import sys
import time
import urllib.request

import pytest
import yaml

from manifest_checks import (GRPC_PORT_NAME, HTTP_PORT_NAME, METRICS_PORT_NAME, REPO, container_port, one,
                             server_container)

sys.path.insert(0, str(REPO / "tests" / "integration"))
from integration_helpers import free_port, generate_stubs  # noqa: E402

import image_helpers as IMG  # noqa: E402  (tests/image, on sys.path from conftest.py)


def podman(args: list[str], timeout: float = 120) -> subprocess.CompletedProcess:
    return IMG.podman(*args, timeout=timeout, check=False)


def playable_deployment(deployment: dict, image: str, model_dir, host_ports: dict[str, int]) -> dict:
    played = yaml.safe_load(yaml.safe_dump(deployment))
    played["metadata"].pop("namespace", None)
    pod = played["spec"]["template"]["spec"]
    container = server_container(played)
    container["image"] = image
    for port in container["ports"]:
        port["hostIP"] = "127.0.0.1"
        port["hostPort"] = host_ports[port["name"]]
    for volume in pod["volumes"]:
        if "persistentVolumeClaim" in volume:
            del volume["persistentVolumeClaim"]
            volume["hostPath"] = {"path": str(model_dir), "type": "Directory"}
    return played


def health_status(stubs, channel, service: str) -> int | None:
    try:
        return stubs.health_grpc.HealthStub(channel).Check(
            stubs.health.HealthCheckRequest(service=service), timeout=1.0).status
    except Exception:  # noqa: BLE001 - not up yet
        return None


def test_cpu_deployment_runs_under_podman_kube_play(docs, strata_image, tmp_path):
    import grpc

    # A plan-only model, readable by the manifest's non-root user through the hostPath.
    model_dir = tmp_path / "model"
    model_dir.mkdir()
    shutil.copy(REPO / "server" / "example_model" / "config.json", model_dir / "config.json")
    for path in (tmp_path, model_dir):
        path.chmod(0o755)
    (model_dir / "config.json").chmod(0o644)

    deployment = one(docs["cpu"], "Deployment")
    host_ports = {GRPC_PORT_NAME: free_port(), HTTP_PORT_NAME: free_port(), METRICS_PORT_NAME: free_port()}
    grpc_host_port, metrics_host_port = host_ports[GRPC_PORT_NAME], host_ports[METRICS_PORT_NAME]
    played = playable_deployment(deployment, strata_image, model_dir, host_ports)
    manifest = tmp_path / "strata.yaml"
    manifest.write_text(yaml.safe_dump(played))

    play = podman(["kube", "play", "--replace", str(manifest)], timeout=300)
    assert play.returncode == 0, play.stdout + play.stderr
    try:
        (tmp_path / "proto").mkdir()
        (tmp_path / "stubs").mkdir()
        stubs = generate_stubs(tmp_path / "proto", tmp_path / "stubs")
        channel = grpc.insecure_channel(f"127.0.0.1:{grpc_host_port}")
        serving = stubs.health.HealthCheckResponse.SERVING
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if health_status(stubs, channel, "strata.v1.InferenceService") == serving:
                break
            time.sleep(0.5)
        # podman names the pod NAME-pod-0 (4.3) or NAME-pod, and the container POD-CONTAINER.
        containers = podman(["ps", "-a", "--format", "{{.Names}}"]).stdout.split()
        name = [c for c in containers if c.startswith(played["metadata"]["name"] + "-pod") and c.endswith("-strata")][0]
        logs = podman(["logs", name]).stderr
        assert health_status(stubs, channel, "strata.v1.InferenceService") == serving, logs
        assert health_status(stubs, channel, "") == serving, logs
        with urllib.request.urlopen(f"http://127.0.0.1:{metrics_host_port}/metrics", timeout=5) as reply:
            assert "strata_device_budget_bytes" in reply.read().decode()
        # The OpenAI-compatible API on the port named http: 200 once SERVING.
        with urllib.request.urlopen(f"http://127.0.0.1:{host_ports[HTTP_PORT_NAME]}/health", timeout=5) as reply:
            assert reply.status == 200, logs

        # The container runs as the manifest says: its args, a non-root user, a read-only root.
        inspect = yaml.safe_load(podman(["inspect", name, "--format", "json"]).stdout)[0]
        config = server_container(deployment)
        assert inspect["Config"]["User"].split(":")[0] == str(deployment["spec"]["template"]["spec"]
                                                             ["securityContext"]["runAsUser"])
        assert inspect["HostConfig"]["ReadonlyRootfs"] is True
        assert all(arg in inspect["Args"] for arg in config["args"])
        assert container_port(config, GRPC_PORT_NAME) == 50051
        assert container_port(config, HTTP_PORT_NAME) == 8000
        channel.close()
    finally:
        podman(["kube", "down", str(manifest)], timeout=120)
