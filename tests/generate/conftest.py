"""Fixtures of the Generate tests: a tiny random Llama (transformers' save_pretrained, weights scaled as
in tests/runtime_parity) with a byte-level BPE tokenizer.json trained by the test beside it, served by
real strata-server processes on loopback ports; Python stubs generated from proto/ at test time."""

from __future__ import annotations

import pathlib
import sys
import types

import pytest

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "integration"))
sys.path.insert(0, str(HERE.parent / "runtime_parity"))
sys.path.insert(0, str(HERE.parent))  # tests/: compressed_tensors_config
sys.path.insert(0, str(HERE))
import integration_helpers as IH  # noqa: E402
import runtime_helpers as RH  # noqa: E402
import generate_helpers as GH  # noqa: E402


@pytest.fixture(scope="session")
def server_bin() -> pathlib.Path:
    return IH.require_binary(IH.SERVER_BIN)


@pytest.fixture(scope="session")
def stubs(tmp_path_factory) -> types.SimpleNamespace:
    return IH.generate_stubs(tmp_path_factory.mktemp("proto_src"), tmp_path_factory.mktemp("proto_py"))


@pytest.fixture(scope="session")
def text_model(tmp_path_factory):
    """(directory, tokenizers.Tokenizer): the llama_text checkpoint (vocab 320, 4 layers, no EOS) and
    its tokenizer.json."""
    directory = RH.make_checkpoint(tmp_path_factory.mktemp("llama_text"), "llama_text")
    tok = RH.train_tokenizer(vocab_size=300)
    tok.save(str(directory / "tokenizer.json"))
    return directory, tok


@pytest.fixture(scope="session")
def server_factory(server_bin, stubs, tmp_path_factory):
    """server_factory(flags) -> a SERVING ServerProcess, stopped (SIGTERM) at the end of the session."""
    yield from IH.started_servers(server_bin, stubs, lambda i: tmp_path_factory.mktemp(f"server{i}"))


@pytest.fixture(scope="session")
def two_stage_server(server_factory, text_model):
    """The checkpoint on a 2-stage plan over logical GPUs 0 and 1, both on the CPU, with 16 KV slots,
    micro-batches pipelined and prompts prefilled in chunks of 8 tokens."""
    directory, _ = text_model
    return server_factory(["--model", str(directory), *GH.TWO_STAGE_FLAGS, "--max-batch", "16",
                           "--max-context", "1024", "--max-new-tokens", "1000", "--micro-batches", "2",
                           "--prefill-chunk", "8"])
