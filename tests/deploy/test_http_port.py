"""The OpenAI-compatible HTTP API's port, named `http` (8000, vLLM's) everywhere it is written: the
Dockerfile's EXPOSE and CMD (and tests/image's copy of the CMD), compose.yaml's command and published
ports, and every overlay's container port, --http-listen, Service port and (components/gateway) the
InferencePool's targetPorts. Bound to 0.0.0.0 like --listen and --metrics-listen: a container's
loopback is unreachable from outside it."""

import json
import re

import image_helpers as IMG  # tests/image, on sys.path from conftest.py
import pytest
import yaml

from manifest_checks import (GRPC_PORT_NAME, HTTP_PORT_NAME, METRICS_PORT_NAME, OVERLAYS, REPO, container_port,
                             flag, one, server_container)

HTTP_PORT = 8000
DOCKERFILE = REPO / "Dockerfile"
COMPOSE = REPO / "deploy" / "compose.yaml"


def listen_port(address: str | None) -> int:
    assert address, "flag not set"
    host, _, port = address.rpartition(":")
    assert host == "0.0.0.0", f"{address}: not bound to every interface"
    return int(port)


def runtime_stage(text: str) -> str:
    """The Dockerfile's last stage (the image): EXPOSE and CMD of the builder do not count."""
    return re.split(r"(?m)^FROM ", text)[-1]


def cmd_flags(args: list[str]) -> dict[str, str | None]:
    """The three listen addresses of an argument list (--name VALUE or --name=VALUE)."""
    return {name: flag({"args": args}, name) for name in ("listen", "http-listen", "metrics-listen")}


def test_image_exposes_and_listens_on_the_http_port():
    stage = runtime_stage(DOCKERFILE.read_text())
    exposed = {int(p.split("/")[0]) for line in re.findall(r"(?m)^EXPOSE\s+(.+)$", stage) for p in line.split()}
    (cmd_line,) = re.findall(r"(?m)^CMD\s+(\[.*\])\s*$", stage)
    cmd = json.loads(cmd_line)
    flags = cmd_flags(cmd)
    ports = {name: listen_port(flags[name]) for name in ("listen", "http-listen", "metrics-listen")}
    assert ports["http-listen"] == HTTP_PORT
    # Every port the server listens on is exposed, and nothing else.
    assert exposed == set(ports.values()), (exposed, ports)
    # tests/image runs the image with this CMD (and checks the built image's Cmd against it).
    assert IMG.IMAGE_CMD == cmd


def test_compose_publishes_the_http_port():
    strata = yaml.safe_load(COMPOSE.read_text())["services"]["strata"]
    flags = cmd_flags(strata["command"])
    port = listen_port(flags["http-listen"])
    assert port == HTTP_PORT
    published = [p.rsplit(":", 2) for p in strata["ports"]]
    assert ["127.0.0.1", str(port), str(port)] in published, published


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_deployment_service_and_flag_agree(docs, overlay):
    objects = docs[overlay]
    container = server_container(one(objects, "Deployment"))
    port = container_port(container, HTTP_PORT_NAME)
    assert port == HTTP_PORT
    assert listen_port(flag(container, "http-listen")) == port
    assert len({container_port(container, n) for n in (GRPC_PORT_NAME, HTTP_PORT_NAME, METRICS_PORT_NAME)}) == 3
    service = next(o for o in objects if o["kind"] == "Service" and o["metadata"]["name"] == "strata")
    (http,) = [p for p in service["spec"]["ports"] if p["name"] == HTTP_PORT_NAME]
    assert http["targetPort"] == HTTP_PORT_NAME and http["port"] == port
    # The probes stay native gRPC ones (test_manifests checks them); the HTTP port carries none.
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert "grpc" in container[probe], probe
