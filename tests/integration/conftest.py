"""Fixtures for the integration tests: real strata-server processes on loopback ports, and Python
stubs generated at test time from proto/strata/v1/strata.proto (plus the public health and reflection
protos, written by the test because grpcio-health-checking and grpcio-reflection are not installed).
"""

from __future__ import annotations

import json
import types
from pathlib import Path

import pytest

from integration_helpers import (
    PLAN_BIN,
    SERVER_BIN,
    SMALL_LLAMA_CONFIG,
    generate_stubs,
    require_binary,
    started_servers,
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
    return generate_stubs(tmp_path_factory.mktemp("proto_src"), tmp_path_factory.mktemp("proto_py"))


@pytest.fixture(scope="session")
def llama_dir(tmp_path_factory) -> Path:
    """A checkpoint directory holding only config.json (the planner needs no weights)."""
    model = tmp_path_factory.mktemp("small_llama")
    (model / "config.json").write_text(json.dumps(SMALL_LLAMA_CONFIG, indent=1))
    return model


@pytest.fixture
def start_server(server_bin, stubs, tmp_path):
    """start_server(flags, env=None) -> a SERVING ServerProcess, stopped (SIGTERM) at the end of the test."""
    yield from started_servers(server_bin, stubs, lambda i: tmp_path / f"server{i}")
