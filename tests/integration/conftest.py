"""Fixtures for the integration tests: real strata-server processes on loopback ports, and Python
stubs generated at test time from proto/strata/v1/strata.proto (plus the public health and reflection
protos, written by the test because grpcio-health-checking and grpcio-reflection are not installed).
"""

from __future__ import annotations

import contextlib
import importlib
import json
import sys
import types
from pathlib import Path

import pytest

from integration_helpers import (
    HEALTH_PROTO,
    PLAN_BIN,
    REFLECTION_PROTO,
    REPO,
    SERVER_BIN,
    SMALL_LLAMA_CONFIG,
    ServerProcess,
    require_binary,
)


@pytest.fixture(scope="session")
def server_bin() -> Path:
    return require_binary(SERVER_BIN)


@pytest.fixture(scope="session")
def plan_bin() -> Path:
    return require_binary(PLAN_BIN)


@pytest.fixture(scope="session")
def stubs(tmp_path_factory) -> types.SimpleNamespace:
    """strata_pb2/_grpc, health_pb2/_grpc and reflection_pb2/_grpc, generated into a tmp dir."""
    from grpc_tools import protoc

    src = tmp_path_factory.mktemp("proto_src")
    out = tmp_path_factory.mktemp("proto_py")
    (src / "strata_health.proto").write_text(HEALTH_PROTO)
    (src / "strata_reflection.proto").write_text(REFLECTION_PROTO)
    jobs = [
        (REPO / "proto", "strata/v1/strata.proto"),
        (src, "strata_health.proto"),
        (src, "strata_reflection.proto"),
    ]
    for include, proto in jobs:
        rc = protoc.main(
            ["protoc", f"-I{include}", f"--python_out={out}", f"--grpc_python_out={out}", str(include / proto)]
        )
        assert rc == 0, f"grpc_tools.protoc failed on {proto}"
    sys.path.insert(0, str(out))
    try:
        return types.SimpleNamespace(
            strata=importlib.import_module("strata.v1.strata_pb2"),
            strata_grpc=importlib.import_module("strata.v1.strata_pb2_grpc"),
            health=importlib.import_module("strata_health_pb2"),
            health_grpc=importlib.import_module("strata_health_pb2_grpc"),
            reflection=importlib.import_module("strata_reflection_pb2"),
            reflection_grpc=importlib.import_module("strata_reflection_pb2_grpc"),
        )
    finally:
        sys.path.remove(str(out))


@pytest.fixture(scope="session")
def llama_dir(tmp_path_factory) -> Path:
    """A checkpoint directory holding only config.json (the planner needs no weights)."""
    model = tmp_path_factory.mktemp("small_llama")
    (model / "config.json").write_text(json.dumps(SMALL_LLAMA_CONFIG, indent=1))
    return model


@pytest.fixture
def start_server(server_bin, stubs, tmp_path):
    """start_server(flags) -> a SERVING ServerProcess, stopped (SIGTERM) at the end of the test."""
    started: list[ServerProcess] = []

    def start(flags: list[str], env: dict | None = None) -> ServerProcess:
        server = ServerProcess(server_bin, flags, tmp_path / f"server{len(started)}", env=env)
        started.append(server)
        return server.start(stubs)

    yield start
    for server in started:
        with contextlib.suppress(Exception):
            server.stop()
