"""Speculative decoding with a draft model through a real strata-server and strata-generate (issue 44; server/README.md,
"Speculative decoding"): the target with its weights perturbed as the draft, planned beside it, on a 2-stage plan with micro-batches pipelined: greedy ids are transformers' assisted generation's
(generate(assistant_model=...)) and plain greedy's; seeded sampled requests are reproducible, concurrent or alone;
the metrics count the draft's proposals; a draft that cannot serve (another vocabulary, no folder, the wrong
method) stops the start naming --draft-model. The sampler's rejection rule itself is tested on synthetic p and q
(tests/runtime/sampler_test.cc, chi-squared)."""

from __future__ import annotations

import json
import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

import generate_helpers as GH
import integration_helpers as IH
import runtime_helpers as RH

PROMPTS = [[7] * 8, [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12], [77], [40, 41, 42, 40, 41]]
NEW_TOKENS = 48
DRAFT_NOISE = 0.1


@pytest.fixture(scope="module")
def draft_model(text_model, tmp_path_factory):
    """The target with every weight perturbed by DRAFT_NOISE of its own scale, and its tokenizer: a draft that agrees
    with it often but not always. (A random model's first layers alone, self-speculation's layer skipping, agree with
    it hardly ever: each of its random layers moves the logits as much as the others.)"""
    import transformers

    directory, _ = text_model
    model = transformers.AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32)
    torch.manual_seed(3)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * p.std() * DRAFT_NOISE if p.numel() > 1 else 0)
    draft = tmp_path_factory.mktemp("llama_text_draft")
    model.save_pretrained(draft, safe_serialization=True)
    shutil.copy(directory / "tokenizer.json", draft / "tokenizer.json")
    return draft


@pytest.fixture(scope="module")
def draft_server(server_factory, text_model, draft_model):
    directory, _ = text_model
    return server_factory(["--model", str(directory), *GH.TWO_STAGE_FLAGS, "--max-batch", "8", "--max-context", "256",
                           "--micro-batches", "2", "--draft-model", str(draft_model), "--num-speculative-tokens", "3",
                           "--speculative-cost-aware=false"],
                          http=True)


@pytest.fixture(scope="module")
def assisted_reference(text_model, draft_model):
    """transformers' generate(assistant_model=draft, do_sample=False), each prompt alone: its new ids."""
    import transformers

    directory, _ = text_model
    model = transformers.AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32).eval()
    assistant = transformers.AutoModelForCausalLM.from_pretrained(draft_model, dtype=torch.float32).eval()
    out = []
    with torch.no_grad():
        for prompt in PROMPTS:
            ids = torch.tensor([prompt])
            seq = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), do_sample=False,
                                 max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS, assistant_model=assistant,
                                 pad_token_id=0, eos_token_id=None)
            out.append(seq[0, len(prompt):].tolist())
    return out


def test_greedy_ids_equal_transformers_assisted_generation_and_plain_greedy(stubs, draft_server, text_model,
                                                                            assisted_reference):
    directory, _ = text_model
    greedy = RH.reference_generate(directory, PROMPTS, NEW_TOKENS)
    for prompt, assisted, plain in zip(PROMPTS, assisted_reference, greedy):
        got = GH.generate(stubs, draft_server.channel, prompt_ids=prompt, max_new_tokens=NEW_TOKENS)
        assert got["ids"] == assisted, prompt
        assert got["ids"] == plain["ids"], prompt
        assert got["logprobs"] == pytest.approx(plain["logprobs"], abs=1e-4), prompt
    # The test means something: the draft proposed, and the target kept some proposals and not others.
    url = draft_server.metrics_url
    accepted = GH.wait_metric(url, 'strata_spec_accepted_tokens_total{method="draft"}', lambda v: v >= 10)
    assert accepted >= 10
    assert GH.metric(url, 'strata_spec_proposed_tokens_total{method="draft"}') > accepted


def test_get_device_map_shows_the_draft_planned_beside_the_model(stubs, draft_server):
    reply = stubs.strata_grpc.InferenceServiceStub(draft_server.channel).GetDeviceMap(
        stubs.strata.GetDeviceMapRequest(), timeout=10)
    assert reply.HasField("draft")
    draft = reply.draft
    assert draft.strategy == "sequential"
    assert draft.architecture == "LlamaForCausalLM"
    assert set(draft.device_map.values()) <= {"0", "1", "cpu"}
    assert [m for s in draft.stages for m in s.modules]
    # Its KV pools have the model's blocks, so that a sequence's draft cache lives in the same block ids.
    assert (draft.kv_cache_blocks, draft.kv_block_tokens) == (reply.kv_cache_blocks, reply.kv_block_tokens)
    assert not draft.HasField("draft")


def test_seeded_sampling_is_reproducible_concurrent_or_alone(stubs, draft_server):
    requests = [dict(prompt_ids=p, max_new_tokens=NEW_TOKENS, temperature=0.8, top_k=40, seed=21 + i)
                for i, p in enumerate(PROMPTS)]
    alone = [GH.generate(stubs, draft_server.channel, **r)["ids"] for r in requests]
    with ThreadPoolExecutor(len(requests)) as pool:
        together = list(pool.map(lambda r: GH.generate(stubs, draft_server.channel, **r)["ids"], requests))
    assert together == alone
    assert all(len(ids) == NEW_TOKENS for ids in alone)
    reseeded = GH.generate(stubs, draft_server.channel, **{**requests[0], "seed": 99})["ids"]
    assert reseeded != alone[0]


def test_strata_generate_takes_the_draft_model(text_model, draft_model):
    directory, _ = text_model
    binary = IH.require_binary(IH.BUILD_DIR / "runtime" / "strata-generate")
    out = {}
    for name, flags in (("plain", []), ("draft", ["--draft-model", str(draft_model)])):
        proc = subprocess.run([str(binary), "--model", str(directory), "--prompt-ids", ",".join(map(str, PROMPTS[1])),
                               "--max-new-tokens", str(NEW_TOKENS), "--max-context", "128", "--json",
                               "--speculative-cost-aware=false", *flags],
                              capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, proc.stderr
        out[name] = json.loads(proc.stdout)
    assert out["draft"]["results"][0]["ids"] == out["plain"]["results"][0]["ids"]
    assert out["draft"]["engine"]["spec_method"] == "draft"
    assert out["draft"]["engine"]["spec_accepted_tokens"] > 0


@pytest.fixture(scope="module")
def foreign_draft(draft_model, tmp_path_factory):
    """The draft with a tokenizer whose vocabulary gives two tokens each other's ids."""
    foreign = tmp_path_factory.mktemp("foreign_draft")
    for name in ("config.json", "model.safetensors"):
        shutil.copy(draft_model / name, foreign / name)
    tokenizer = json.loads((draft_model / "tokenizer.json").read_text())
    vocab = tokenizer["model"]["vocab"]
    a, b = sorted(vocab, key=vocab.get)[260:262]
    vocab[a], vocab[b] = vocab[b], vocab[a]
    (foreign / "tokenizer.json").write_text(json.dumps(tokenizer))
    return foreign


@pytest.mark.parametrize("case", ["other vocabulary", "no folder", "ngram with a draft", "draft without one"])
def test_a_draft_that_cannot_serve_stops_the_start_naming_the_flag(server_bin, text_model, draft_model, foreign_draft,
                                                                   tmp_path, case):
    directory, _ = text_model
    flags, named = {
        "other vocabulary": (["--draft-model", str(foreign_draft)], "its tokenizer's id"),
        "no folder": (["--draft-model", str(tmp_path / "missing")], "--draft-model"),
        "ngram with a draft": (["--speculative", "ngram", "--draft-model", str(draft_model)],
                               "--draft-model: given with --speculative ngram"),
        "draft without one": (["--speculative", "draft"], "--speculative draft: no --draft-model was given"),
    }[case]
    proc = subprocess.run([str(server_bin), "--model", str(directory), *flags], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert named in proc.stderr
