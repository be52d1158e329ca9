"""Fixtures of the group tests (issue 24): a group of strata-server processes on this machine, one per node, the
leader serving gRPC and the workers their stages; checkpoints from tests/runtime_parity, stubs from proto/."""

from __future__ import annotations

import pathlib
import sys
import types

import pytest

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "integration"))
sys.path.insert(0, str(HERE.parent / "runtime_parity"))
sys.path.insert(0, str(HERE.parent / "generate"))
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))
import integration_helpers as IH  # noqa: E402


@pytest.fixture(scope="session")
def server_bin() -> pathlib.Path:
    return IH.require_binary(IH.SERVER_BIN)


@pytest.fixture(scope="session")
def stubs(tmp_path_factory) -> types.SimpleNamespace:
    return IH.generate_stubs(tmp_path_factory.mktemp("proto_src"), tmp_path_factory.mktemp("proto_py"))


@pytest.fixture(scope="session")
def secret_file(tmp_path_factory) -> pathlib.Path:
    path = tmp_path_factory.mktemp("secret") / "group-secret"
    path.write_text("4f1d2c7e9a0b3c5d6e7f8091a2b3c4d5\n")
    return path
