"""Token ids: strata's rendering (strata-chat-template) tokenized by strata-tokenize equals transformers'
apply_chat_template(..., tokenize=True), which encodes the rendering without adding special tokens, on
tokenizers of the families strata runs (trained here by tests/tokenizer_parity/tokenizer_fixtures.py, each
with its family's special tokens as added tokens) and their real templates, over every conversation. This
is what a server does with a chat request: render, then tokenize."""

from __future__ import annotations

import pathlib
import sys

import pytest

from chat_template_helpers import TEMPLATE_DIR, run_batch
from conversations import CONVERSATIONS

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "tokenizer_parity"))
import tokenizer_fixtures as F  # noqa: E402

# family tokenizer -> (its special tokens as the template sees them, the real templates rendered with it)
PAIRS = {
    "llama3": ({"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"},
               ["meta-llama-Llama-3.2-3B-Instruct.jinja", "meta-llama-Llama-3.3-70B-Instruct.jinja"]),
    "qwen2": ({"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"},
              ["Qwen-Qwen3-0.6B.jinja", "Qwen-QwQ-32B.jinja", "NousResearch-Hermes-3-Llama-3.1-8B-tool_use.jinja"]),
    "mistral": ({"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"},
                ["mistralai-Mixtral-8x7B-Instruct-v0.1.jinja", "mistralai-Mistral-7B-Instruct-v0.1.jinja",
                 "mistralai-Mistral-Nemo-Instruct-2407.jinja"]),
    "llama2": ({"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"},
               ["microsoft-Phi-3.5-mini-instruct.jinja", "google-gemma-2-2b-it.jinja"]),
}


@pytest.fixture(scope="module")
def family_tokenizers(tmp_path_factory):
    return F.build_all(tmp_path_factory.mktemp("tokenizers"))


def _transformers_ids(tokenizer, template: str, context: dict):
    kwargs = dict(context)
    messages = kwargs.pop("messages")
    try:
        out = tokenizer.apply_chat_template(messages, tokenize=True, chat_template=template, **kwargs)
    except Exception as e:  # noqa: BLE001 - any refusal counts as an error, as strata's does
        return {"error": f"{type(e).__name__}: {e}"}
    ids = out["input_ids"] if hasattr(out, "keys") else out
    return {"ids": list(ids)}


@pytest.mark.parametrize("family", list(PAIRS))
def test_rendered_and_tokenized_ids_equal_transformers(strata_chat_template, family_tokenizers, family, record):
    from transformers import PreTrainedTokenizerFast

    specials, templates = PAIRS[family]
    directory, _ = family_tokenizers[family]
    tokenizer = PreTrainedTokenizerFast(tokenizer_file=str(directory / "tokenizer.json"), **specials)
    strata_tokenize = F.strata_tokenize_path()
    assert strata_tokenize.is_file(), f"strata-tokenize is not built: {strata_tokenize}"
    names = list(CONVERSATIONS)
    compared = mismatches = 0
    report = []
    for template in templates:
        source = (TEMPLATE_DIR / template).read_text(encoding="utf-8")
        contexts = [dict(CONVERSATIONS[n]) for n in names]
        want = [_transformers_ids(tokenizer, source, c) for c in contexts]
        rendered = run_batch(strata_chat_template, ["--template-file", str(TEMPLATE_DIR / template)],
                             [{**specials, **c} for c in contexts])
        texts = [r["text"] for r in rendered if "text" in r]
        ids = iter(F.run_cli(strata_tokenize, directory, texts) if texts else [])
        for name, w, r in zip(names, want, rendered):
            got = {"ids": next(ids)} if "text" in r else {"error": r["error"]}
            if "error" in w and "error" in got:
                continue
            compared += 1
            if got != w:
                mismatches += 1
                report.append(f"  {template} / {name}: transformers {str(w)[:300]}\n    strata {str(got)[:300]}")
    record("rendered + tokenized ids identical (family tokenizer x template x conversation)", compared - mismatches,
           compared)
    assert compared > 0
    if report:
        pytest.fail(f"{mismatches}/{compared} differ from apply_chat_template(tokenize=True):\n" + "\n".join(report),
                    pytrace=False)
