"""strata-generate --prompt: text in, text out, equal to transformers with the same tokenizer.

The tokenizer is trained by the test (runtime_helpers.train_tokenizer) on text the test writes, and saved
beside a tiny random checkpoint as tokenizer.json."""

from __future__ import annotations

import json
import subprocess

import pytest
import torch

import runtime_helpers as H

PROMPTS = ["The quick brown fox", "Hello, world!", "Ünïcödé and emoji 🚀 test", "a"]


@pytest.fixture(scope="module")
def model_with_tokenizer(checkpoint):
    directory = checkpoint("llama_text")
    tok = H.train_tokenizer(vocab_size=300)
    assert 258 < tok.get_vocab_size() <= 320  # merges exist, and every id is in the model's vocab
    tok.save(str(directory / "tokenizer.json"))
    return directory, tok


def test_text_prompts_equal_transformers(strata_generate, model_with_tokenizer):
    directory, tok = model_with_tokenizer
    from transformers import PreTrainedTokenizerFast

    hf_tok = PreTrainedTokenizerFast(tokenizer_object=tok)
    prompt_ids = [hf_tok(p).input_ids for p in PROMPTS]
    expected = H.reference_generate(directory, prompt_ids, 12)
    args = [str(strata_generate), "--model", str(directory), "--max-new-tokens", "12", "--json"]
    for p in PROMPTS:
        args += ["--prompt", p]
    proc = subprocess.run(args, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    results = json.loads(proc.stdout)["results"]
    for prompt, want, got in zip(PROMPTS, expected, results):
        assert got["ids"] == want["ids"], prompt
        assert got["text"] == hf_tok.decode(want["ids"], skip_special_tokens=True), prompt


def test_text_and_id_prompts_mix_in_order(strata_generate, model_with_tokenizer):
    directory, tok = model_with_tokenizer
    ids = tok.encode("Hello, world!").ids
    by_text = H.run_generate(directory, [], 6, "--prompt", "Hello, world!")
    by_ids = H.run_generate(directory, [[5, 6, 7], ids], 6, "--prompt", "Hello, world!")
    assert by_ids["results"][1]["ids"] == by_text["results"][0]["ids"]
    assert by_ids["results"][2]["ids"] == by_text["results"][0]["ids"]


def test_no_special_tokens_drops_bos(strata_generate, model_with_tokenizer):
    directory, tok = model_with_tokenizer
    ids = tok.encode("Hello, world!", add_special_tokens=False).ids
    plain = H.run_generate(directory, [ids], 6)
    no_bos = H.run_generate(directory, [], 6, "--prompt", "Hello, world!", "--no-special-tokens")
    assert no_bos["results"][0]["ids"] == plain["results"][0]["ids"]


def test_prompt_without_tokenizer_is_an_error(strata_generate, checkpoint):
    directory = checkpoint("mistral_sliding")
    assert not (directory / "tokenizer.json").exists()
    proc = H.run_generate(directory, [], 4, "--prompt", "hi", check=False)
    assert proc.returncode == 2
    assert "has no tokenizer.json" in proc.stderr


def test_invalid_utf8_prompt_is_an_error(strata_generate, model_with_tokenizer):
    directory, _ = model_with_tokenizer
    proc = subprocess.run([str(strata_generate), "--model", str(directory), "--prompt", b"bad \xff byte",
                           "--max-new-tokens", "2"], capture_output=True, timeout=120)
    assert proc.returncode == 2
    assert b"--prompt (prompt 0)" in proc.stderr and b"UTF-8" in proc.stderr
