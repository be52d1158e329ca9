"""A Gemma 2 and a Phi-3 checkpoint served end to end: strata-server on a 2-stage logical plan (chunked prefill,
pipelined micro-batches) answers Generate with transformers' greedy ids and logprobs, for id prompts and
a text prompt through its tokenizer.json."""

from __future__ import annotations

import json

import pytest

import generate_helpers as GH
import runtime_helpers as RH

PROMPTS = [[5, 9, 200, 31], [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21], [77]]
NEW_TOKENS = 12


@pytest.fixture(scope="module")
def gemma_model(tmp_path_factory):
    """A tiny Gemma 2 (vocab 320, soft-caps on, window 5 < the prompts) with a trained tokenizer.json."""
    import transformers

    directory = tmp_path_factory.mktemp("gemma2_text")
    kwargs = dict(RH.CONFIGS["gemma2_softcap"][1], vocab_size=320)
    config = transformers.Gemma2Config(**kwargs)
    RH.save_random_model(directory, config, seed=0)
    tok = RH.train_tokenizer(vocab_size=300)
    tok.save(str(directory / "tokenizer.json"))
    return directory, tok


@pytest.fixture(scope="module")
def gemma_server(server_factory, gemma_model):
    directory, _ = gemma_model
    # Tied head: lm_head shares the embedding's device (logical GPU 0); layers 2-3 and the norm on GPU 1.
    flags = ["--device-map", RH.layer_device_map("gemma2_softcap", [0, 0, 1, 1], 1),
             "--physical-devices", "0=cpu,1=cpu", "--max-memory", "0=1GiB,1=1GiB,cpu=1GiB"]
    return server_factory(["--model", str(directory), *flags, "--max-batch", "4",
                           "--max-context", "256", "--max-new-tokens", "64", "--micro-batches", "2",
                           "--prefill-chunk", "8"])


def test_gemma_greedy_equals_transformers_through_the_server(stubs, gemma_server, gemma_model):
    directory, _ = gemma_model
    assert json.loads((directory / "config.json").read_text())["architectures"] == ["Gemma2ForCausalLM"]
    expected = RH.reference_generate(directory, PROMPTS, NEW_TOKENS)
    for prompt, want in zip(PROMPTS, expected):
        got = GH.generate(stubs, gemma_server.channel, prompt_ids=prompt, max_new_tokens=NEW_TOKENS)
        assert got["ids"] == want["ids"], prompt
        assert got["logprobs"] == pytest.approx(want["logprobs"], abs=1e-4), prompt
        assert got["finish"] == "LENGTH"


def test_gemma_text_prompt_equals_transformers(stubs, gemma_server, gemma_model):
    directory, tok = gemma_model
    from transformers import PreTrainedTokenizerFast

    hf_tok = PreTrainedTokenizerFast(tokenizer_object=tok)
    ids = hf_tok("The quick brown fox").input_ids
    want = RH.reference_generate(directory, [ids], NEW_TOKENS)[0]
    got = GH.generate(stubs, gemma_server.channel, prompt="The quick brown fox", add_special_tokens=True,
                      max_new_tokens=NEW_TOKENS)
    assert got["ids"] == want["ids"]
    assert got["text"] == hf_tok.decode(want["ids"], skip_special_tokens=True)


@pytest.fixture(scope="module")
def phi3_model(tmp_path_factory):
    """A tiny Phi-3 with longrope whose original_max_position_embeddings is 4: served prompts cross it
    while decoding (the scheduler recomputes their cache, as generate() does) or start past it and are
    prefilled in chunks of 8 with the long factors throughout."""
    import transformers

    directory = tmp_path_factory.mktemp("phi3_text")
    kwargs = dict(RH.CONFIGS["phi3_longrope"][1], vocab_size=320, original_max_position_embeddings=4)
    config = transformers.Phi3Config(**kwargs)
    RH.save_random_model(directory, config, seed=0, vectors=False)
    RH.train_tokenizer(vocab_size=300).save(str(directory / "tokenizer.json"))
    return directory


def test_phi3_longrope_through_the_server(server_factory, stubs, phi3_model):
    server = server_factory(["--model", str(phi3_model), *GH.TWO_STAGE_FLAGS, "--max-batch", "4",
                             "--max-context", "256", "--max-new-tokens", "64", "--micro-batches", "2",
                             "--prefill-chunk", "8"])
    for prompt in [[5, 9], [7], PROMPTS[1]]:
        want = RH.reference_generate(phi3_model, [prompt], NEW_TOKENS)[0]
        got = GH.generate(stubs, server.channel, prompt_ids=prompt, max_new_tokens=NEW_TOKENS)
        assert got["ids"] == want["ids"], prompt
        assert got["logprobs"] == pytest.approx(want["logprobs"], abs=1e-4), prompt
