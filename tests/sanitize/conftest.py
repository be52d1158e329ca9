"""Fixtures of the sanitizer lanes: the Python stubs of the wire contract and a tiny Llama with a trained
byte-level tokenizer.json (as tests/generate makes them), served by the lanes' strata-server."""

from __future__ import annotations

import pathlib
import sys
import types

import pytest

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "integration"))
sys.path.insert(0, str(HERE.parent / "runtime_parity"))
sys.path.insert(0, str(HERE.parent / "generate"))
sys.path.insert(0, str(HERE))
import integration_helpers as IH  # noqa: E402
import runtime_helpers as RH  # noqa: E402


@pytest.fixture(scope="session")
def stubs(tmp_path_factory) -> types.SimpleNamespace:
    return IH.generate_stubs(tmp_path_factory.mktemp("proto_src"), tmp_path_factory.mktemp("proto_py"))


@pytest.fixture(scope="session")
def text_model(tmp_path_factory) -> pathlib.Path:
    """The llama_text checkpoint (vocab 320, 4 layers, no EOS) with its tokenizer.json."""
    directory = RH.make_checkpoint(tmp_path_factory.mktemp("llama_text"), "llama_text")
    RH.train_tokenizer(vocab_size=300).save(str(directory / "tokenizer.json"))
    return directory
