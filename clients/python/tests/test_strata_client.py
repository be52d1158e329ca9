"""strata_client against a real strata-server serving a tiny random Llama with a trained tokenizer."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import grpc
import pytest

import integration_helpers as IH
import runtime_helpers as RH
from strata_client import Client

EXAMPLE = Path(__file__).resolve().parents[1] / "example.py"


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    directory = RH.make_checkpoint(tmp_path_factory.mktemp("model"), "llama_text")
    RH.train_tokenizer(vocab_size=300).save(str(directory / "tokenizer.json"))
    stubs = IH.generate_stubs(tmp_path_factory.mktemp("src"), tmp_path_factory.mktemp("py"))
    server = IH.ServerProcess(IH.require_binary(IH.SERVER_BIN), ["--model", str(directory), "--device-map",
                              '{"": "cpu"}', "--max-batch", "4", "--max-context", "128"],
                              tmp_path_factory.mktemp("logs"))
    server.start(stubs)
    yield directory, server
    server.stop()


def test_generate_equals_transformers(served):
    directory, server = served
    want = RH.reference_generate(directory, [[5, 6, 7, 8]], 10)[0]
    with Client(server.grpc_address) as client:
        got = client.generate([5, 6, 7, 8], max_new_tokens=10)
    assert got.token_ids == want["ids"]
    assert got.logprobs == pytest.approx(want["logprobs"], abs=1e-4)
    assert (got.finish_reason, got.prompt_tokens, got.completion_tokens) == ("LENGTH", 4, 10)


def test_stream_pieces_add_up_to_the_text(served):
    _, server = served
    with Client(server.grpc_address) as client:
        chunks = list(client.generate_stream("Hello, world!", max_new_tokens=12, add_special_tokens=True))
        whole = client.generate("Hello, world!", max_new_tokens=12, add_special_tokens=True)
    assert len(chunks) > 1 and chunks[-1].finish_reason == "LENGTH"
    assert "".join(c.text for c in chunks) == whole.text
    assert sum((c.token_ids for c in chunks), []) == whole.token_ids


def test_errors_carry_the_status(served):
    _, server = served
    with Client(server.grpc_address) as client, pytest.raises(grpc.RpcError) as error:
        client.generate([1], max_new_tokens=0)
    assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert error.value.details().startswith("max_new_tokens:")


def test_structured_output_constraints(served):
    # The checkpoint has no EOS: each output runs to max_new_tokens, every token within its constraint.
    _, server = served
    with Client(server.grpc_address) as client:
        letters = client.generate("Hello", max_new_tokens=6, regex="[ab]+")
        obj = client.generate("Hello", max_new_tokens=6, json_schema={"type": "object"})
        with pytest.raises(grpc.RpcError) as error:
            client.generate("Hello", max_new_tokens=6, choice=[])
    assert letters.text and re.fullmatch("[ab]+", letters.text), letters.text
    assert obj.text.startswith("{"), obj.text
    assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert error.value.details().startswith("choice:")


def test_device_map(served):
    _, server = served
    with Client(server.grpc_address) as client:
        plan = client.device_map()
    assert plan["device_map"] == {"": "cpu"} and plan["stages"][0][0] == "cpu"


def test_example_streams(served):
    _, server = served
    done = subprocess.run([sys.executable, str(EXAMPLE), "--server", server.grpc_address, "--max-new-tokens", "6",
                           "Hello"], capture_output=True, text=True, timeout=120, env=dict(os.environ))
    assert done.returncode == 0, done.stderr
    assert done.stdout.rstrip().endswith("[LENGTH: 6 tokens]")
