"""Fixtures of the TLS, mTLS and API key tests: certificates made by openssl at test time, two API keys,
and real strata-server processes serving the tiny random Llama of tests/generate."""

from __future__ import annotations

import pathlib
import secrets
import sys

import pytest

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "integration"))
sys.path.insert(0, str(HERE.parent / "runtime_parity"))
sys.path.insert(0, str(HERE.parent / "generate"))
sys.path.insert(0, str(HERE))
import auth_helpers as AH  # noqa: E402
import integration_helpers as IH  # noqa: E402
import runtime_helpers as RH  # noqa: E402


@pytest.fixture(scope="session")
def server_bin() -> pathlib.Path:
    return IH.require_binary(IH.SERVER_BIN)


@pytest.fixture(scope="session")
def client_bin() -> pathlib.Path:
    return IH.require_binary(IH.BUILD_DIR / "clients" / "cpp" / "strata-client")


@pytest.fixture(scope="session")
def stubs(tmp_path_factory):
    return IH.generate_stubs(tmp_path_factory.mktemp("proto_src"), tmp_path_factory.mktemp("proto_py"))


@pytest.fixture(scope="session")
def pki(tmp_path_factory):
    return AH.make_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture(scope="session")
def api_keys(tmp_path_factory):
    """(file, [key1, key2]): a key file with a comment, blank lines and two keys."""
    keys = [secrets.token_hex(16), secrets.token_hex(24)]
    path = tmp_path_factory.mktemp("keys") / "api_keys"
    path.write_text(f"# strata API keys\n\n{keys[0]}\n   \n  {keys[1]}  \r\n")
    return path, keys


@pytest.fixture(scope="session")
def model(tmp_path_factory) -> pathlib.Path:
    directory = RH.make_checkpoint(tmp_path_factory.mktemp("llama_text"), "llama_text")
    RH.train_tokenizer(vocab_size=300).save(str(directory / "tokenizer.json"))
    return directory


@pytest.fixture(scope="session")
def serve(server_bin, stubs, model, tmp_path_factory):
    """serve(extra_flags, credentials=None, http=False) -> a SERVING ServerProcess on `model` (with the HTTP API
    on a free port when `http`), stopped at the end."""
    yield from IH.started_servers(server_bin, stubs, lambda i: tmp_path_factory.mktemp(f"server{i}"),
                                  ["--model", str(model), "--device-map", '{"": "cpu"}', "--max-batch", "4",
                                   "--max-context", "128"])
