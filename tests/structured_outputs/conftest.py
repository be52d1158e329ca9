"""Fixtures of the structured-output tests (issue 41): real strata-server processes on loopback (HTTP and gRPC) over a
tiny random Llama whose config names its tokenizer's EOS, one checkpoint per kind of tokenizer strata reads
(byte-level BPE, byte-fallback BPE, tiktoken), all made by the tests (structured_helpers). One server per
checkpoint and configuration per session; the session summary prints, per tokenizer and route, how many samples
ended with `stop` within max_tokens (each of them validated)."""

from __future__ import annotations

import pathlib
import sys
import types

import pytest

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))
import structured_helpers as H  # noqa: E402  (puts integration/, runtime_parity/, ... on sys.path)
import integration_helpers as IH  # noqa: E402
from parity_counts import ParityCounts  # noqa: E402

_shares = ParityCounts("structured outputs: samples that ended with stop within max_tokens (each one valid)",
                       " samples")
stop_share = _shares.fixture()
pytest_terminal_summary = _shares.terminal_summary

@pytest.fixture(scope="session")
def server_bin() -> pathlib.Path:
    return IH.require_binary(IH.SERVER_BIN)


@pytest.fixture(scope="session")
def stubs(tmp_path_factory) -> types.SimpleNamespace:
    return IH.generate_stubs(tmp_path_factory.mktemp("proto_src"), tmp_path_factory.mktemp("proto_py"))


@pytest.fixture(scope="session")
def checkpoint(tmp_path_factory):
    """checkpoint(kind) -> (directory, Vocabulary): the jsonish Llama beside a `kind` tokenizer, made once."""
    made: dict[str, tuple] = {}
    train: list[str] = []

    def get(kind: str):
        if kind not in made:
            if not train:
                train.extend(H.training_text())
            directory = tmp_path_factory.mktemp(f"jsonish_{kind}")
            made[kind] = (directory, H.jsonish_checkpoint(directory, kind, train))
        return made[kind]

    return get


@pytest.fixture(scope="session")
def server_factory(server_bin, stubs, tmp_path_factory):
    """server_factory(flags) -> a SERVING ServerProcess with the HTTP API, stopped at the session's end."""
    yield from IH.started_servers(server_bin, stubs, lambda i: tmp_path_factory.mktemp(f"server{i}"), http=True)


@pytest.fixture(scope="session")
def serve(server_factory, checkpoint):
    """serve(kind, *extra_flags) -> types.SimpleNamespace(server, url, vocab, directory, kind): one server per
    (kind, flags) per session."""
    started: dict[tuple, types.SimpleNamespace] = {}

    def get(kind: str, *extra: str):
        key = (kind, *extra)
        if key not in started:
            directory, vocab = checkpoint(kind)
            server = server_factory(["--model", str(directory), *H.SERVER_FLAGS, *extra])
            started[key] = types.SimpleNamespace(server=server, url=server.http_url, vocab=vocab, directory=directory,
                                                 kind=kind, channel=server.channel)
        return started[key]

    return get


@pytest.fixture(scope="session")
def main(serve):
    """The byte-level server most tests share."""
    return serve("byte_level")


@pytest.fixture(scope="session")
def client(main):
    import openai
    return openai.OpenAI(base_url=f"{main.url}/v1", api_key="unused", max_retries=0, timeout=120)
