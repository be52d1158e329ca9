"""Fixtures of the HTTP API tests: the tiny random Llama of the Generate tests (tests/runtime_parity) with a
byte-level BPE tokenizer trained by the test and Qwen3's chat template (committed in
tests/chat_template_parity/templates, which names its source), served by a real strata-server with
--http-listen on loopback; transformers on the same checkpoint is the reference."""

from __future__ import annotations

import pathlib
import shutil
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
from http_api_helpers import TEMPLATE  # noqa: E402

MODEL_NAME = "tiny-llama"


@pytest.fixture(scope="session")
def server_bin() -> pathlib.Path:
    return IH.require_binary(IH.SERVER_BIN)


@pytest.fixture(scope="session")
def stubs(tmp_path_factory) -> types.SimpleNamespace:
    return IH.generate_stubs(tmp_path_factory.mktemp("proto_src"), tmp_path_factory.mktemp("proto_py"))


@pytest.fixture(scope="session")
def chat_model(tmp_path_factory) -> pathlib.Path:
    """The llama_text checkpoint (vocab 320, 4 layers, no EOS: every generation runs to its length) with its
    tokenizer.json and chat_template.jinja."""
    directory = RH.make_checkpoint(tmp_path_factory.mktemp("chat_model"), "llama_text")
    RH.train_tokenizer(vocab_size=300).save(str(directory / "tokenizer.json"))
    shutil.copy(TEMPLATE, directory / "chat_template.jinja")
    return directory


@pytest.fixture(scope="session")
def server_factory(server_bin, stubs, tmp_path_factory):
    """server_factory(flags, **kwargs) -> a SERVING ServerProcess with the HTTP API, stopped at the session's
    end."""
    yield from IH.started_servers(server_bin, stubs, lambda i: tmp_path_factory.mktemp(f"server{i}"), http=True)


@pytest.fixture(scope="session")
def http_server(server_factory, chat_model):
    return server_factory(["--model", str(chat_model), "--served-model-name", MODEL_NAME, "--max-context", "512",
                           "--max-batch", "8"])


@pytest.fixture(scope="session")
def client(http_server):
    import openai
    return openai.OpenAI(base_url=f"{http_server.http_url}/v1", api_key="unused", max_retries=0, timeout=60)


@pytest.fixture(scope="session")
def reference(chat_model):
    """transformers on the same checkpoint and tokenizer: greedy ids and the raw logits' log-softmax."""
    import torch
    from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast

    model = AutoModelForCausalLM.from_pretrained(chat_model, dtype=torch.float32).eval()
    tokenizer = PreTrainedTokenizerFast(tokenizer_file=str(chat_model / "tokenizer.json"))
    tokenizer.chat_template = TEMPLATE.read_text()

    def generate(ids: list[int], new_tokens: int) -> dict:
        with torch.no_grad():
            # An explicit mask: the trained tokenizer's id 0 would otherwise be taken for padding.
            out = model.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                                 max_new_tokens=new_tokens, do_sample=False, output_logits=True,
                                 return_dict_in_generate=True, pad_token_id=0)
        new = out.sequences[0, len(ids):].tolist()
        logprobs = [torch.log_softmax(step[0].double(), -1) for step in out.logits]
        return {"ids": new, "text": tokenizer.decode(new), "logprobs": logprobs}

    return types.SimpleNamespace(model=model, tokenizer=tokenizer, generate=generate)
