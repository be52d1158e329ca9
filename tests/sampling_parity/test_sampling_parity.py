"""strata's device sampler against transformers, live.

1. Random micro-batches (vocabularies from 7 to 32000 tokens; rows with exact ties, very peaked rows,
   masked (-inf) logits; random mixes of greedy and sampled rows, temperature, top_k, top_p, repetition
   penalty over a random context, uniforms including 0 and the largest double below 1) go through
   strata_sampler_probe. Per row: softmax of strata's processed scores equals softmax of transformers'
   processors applied in generate's order (RepetitionPenaltyLogitsProcessor, then with do_sample
   TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper, each added under generate's own
   conditions) within 1e-5, the same tokens are removed, and the id is the inverse-CDF choice made here
   from transformers' distribution with the same uniform (argmax for greedy rows); logprobs and top
   logprobs are those of log_softmax of the raw logits.
2. Greedy Generate with repetition_penalty on a real strata-server (2-stage pipelined plan) equals
   transformers' generate(do_sample=False, repetition_penalty=1.3) on the same tiny random Llama.
"""

from __future__ import annotations

import json
import math
import random
import subprocess

import pytest
import torch
from transformers.generation.logits_process import (RepetitionPenaltyLogitsProcessor, TemperatureLogitsWarper,
                                                    TopKLogitsWarper, TopPLogitsWarper)

import numpy as np

ALMOST_ONE = math.nextafter(1.0, 0.0)
STEP_SLACK = 1e-6  # a uniform this close to a CDF step may fall either side of it
CASES = [(vocab, seed) for vocab in (7, 50, 1000, 32000) for seed in range(3)] + [(32003, 3), (128, 4), (2, 5)]


def f32(x: float) -> float:
    """RowSampling holds float32 parameters: give transformers the same values."""
    return float(np.float32(x))


def random_batch(vocab: int, seed: int) -> tuple[torch.Tensor, list[dict]]:
    rng = random.Random(seed * 1000 + vocab)
    gen = torch.Generator().manual_seed(seed * 1000 + vocab)
    rows = 4 if vocab > 10000 else 8
    logits = torch.randn((rows, vocab), generator=gen) * rng.choice([1.0, 3.0, 8.0])
    for r in range(rows):
        kind = r % 4
        if kind == 1 and vocab > 3:  # exact ties, some at the top
            top = logits[r].max().item()
            for i in rng.sample(range(vocab), min(vocab, 6)):
                logits[r, i] = top
            for i in rng.sample(range(vocab), min(vocab, 20)):
                logits[r, i] = logits[r, 0]
        elif kind == 2:  # very peaked: the rest has probability 0 in float32
            logits[r, rng.randrange(vocab)] = 120.0
        elif kind == 3 and vocab > 3:  # coarse values (many ties) and a masked part of the vocabulary
            logits[r] = torch.round(logits[r] * 2) / 2
            for i in rng.sample(range(vocab), vocab // 10):
                logits[r, i] = -math.inf
    params = []
    for r in range(rows):
        temperature = rng.choice([0.0, 0.0, 0.3, 0.7, 1.0, 1.0, 1.6])
        params.append({
            "temperature": f32(temperature),
            "top_k": rng.choice([0, 0, 1, 3, 40, vocab, vocab + 5]),
            "top_p": f32(rng.choice([1.0, 1.0, 0.95, 0.9, 0.5, 1e-6])),
            "repetition_penalty": f32(rng.choice([1.0, 1.0, 1.3, 0.8, 2.0])),
            "uniform": rng.choice([rng.random(), rng.random(), rng.random(), 0.0, ALMOST_ONE]),
            "top_logprobs": rng.choice([0, 1, 5]),
            "context": [rng.randrange(vocab) for _ in range(rng.randrange(0, 30))],
        })
    return logits, params


def run_probe(probe, logits: torch.Tensor, rows: list[dict]) -> dict:
    values = [[None if math.isinf(v) else v for v in row] for row in logits.tolist()]
    done = subprocess.run([str(probe)], input=json.dumps({"logits": values, "rows": rows}), capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def transformers_scores(logits_row: torch.Tensor, p: dict) -> torch.Tensor:
    """transformers' processors for one row, in generate's order and under its conditions."""
    input_ids = torch.tensor([p["context"]], dtype=torch.long)
    scores = logits_row.unsqueeze(0).clone()
    if p["repetition_penalty"] != 1.0:
        scores = RepetitionPenaltyLogitsProcessor(p["repetition_penalty"])(input_ids, scores)
    if p["temperature"] > 0:  # do_sample
        if p["temperature"] != 1.0:
            scores = TemperatureLogitsWarper(p["temperature"])(input_ids, scores)
        if p["top_k"] != 0:
            scores = TopKLogitsWarper(top_k=p["top_k"], min_tokens_to_keep=1)(input_ids, scores)
        if p["top_p"] < 1.0:
            scores = TopPLogitsWarper(top_p=p["top_p"], min_tokens_to_keep=1)(input_ids, scores)
    return scores[0]


def inverse_cdf(scores: torch.Tensor, uniform: float) -> tuple[int, torch.Tensor, float]:
    """The first token whose cumulative probability (float64, vocabulary order) exceeds uniform x total,
    never one of probability zero."""
    probs = torch.softmax(scores.double(), -1)
    cdf = torch.cumsum(probs, -1)
    target = uniform * cdf[-1].item()
    index = min(int(torch.searchsorted(cdf, torch.tensor([target], dtype=torch.float64), right=True)), len(cdf) - 1)
    while index > 0 and probs[index] == 0:
        index -= 1
    while probs[index] == 0:
        index += 1
    return index, cdf, target


@pytest.mark.parametrize("vocab,seed", CASES, ids=[f"vocab{v}-seed{s}" for v, s in CASES])
def test_sampler_matches_transformers_processors(probe, stats, vocab, seed):
    logits, rows = random_batch(vocab, seed)
    out = run_probe(probe, logits, rows)
    raw_logprobs = torch.log_softmax(logits, -1)
    for r, p in enumerate(rows):
        where = f"row {r} {dict(p, context=len(p['context']))}"
        want = transformers_scores(logits[r], p)
        got = torch.tensor([-math.inf if v is None else v for v in out["scores"][r]], dtype=torch.float32)
        assert torch.equal(torch.isinf(got) & (got < 0), torch.isinf(want) & (want < 0)), \
            f"{where}: removed tokens differ"
        diff = (torch.softmax(got.double(), -1) - torch.softmax(want.double(), -1)).abs().max().item()
        assert diff <= 1e-5, f"{where}: processed distributions differ by {diff}"
        stats["rows"] += 1
        got_id = out["ids"][r]
        if p["temperature"] > 0:
            stats["sampled"] += 1
            expected, cdf, target = inverse_cdf(want, p["uniform"])
            if got_id != expected:
                near = min(abs(cdf[i].item() - target) for i in {expected, max(expected - 1, 0), got_id,
                                                                 max(got_id - 1, 0)})
                assert near <= STEP_SLACK, f"{where}: id {got_id}, transformers' inverse CDF {expected}"
                stats["near_step"] += 1
            assert not math.isinf(want[got_id].item()), f"{where}: chose removed token {got_id}"
        else:
            assert got_id == int(torch.argmax(want)), f"{where}: greedy id"
        assert out["logprobs"][r] == pytest.approx(raw_logprobs[r, got_id].item(), abs=1e-5), where
        top = out["top"][r]
        assert len(top) == min(p["top_logprobs"], vocab), where
        if top:
            values = torch.topk(raw_logprobs[r], len(top)).values.tolist()
            assert [lp for _, lp in top] == pytest.approx(values, abs=1e-5), where
            for token, lp in top:
                assert lp == pytest.approx(raw_logprobs[r, token].item(), abs=1e-5), where


def test_probe_rejects_bad_input(probe):
    done = subprocess.run([str(probe)], input='{"logits": [[1, 2]], "rows": []}', capture_output=True, text=True)
    assert done.returncode == 2 and "rows" in done.stderr


PENALTY_PROMPTS = [[5, 9, 200, 31], [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12], [77],
                   [300, 12, 0, 45, 45, 45, 8, 19, 250, 3, 100]]
PENALTY_TOKENS = 16


def reference_penalised_generate(directory, prompt: list[int], penalty: float) -> dict:
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32,
                                                              device_map={"": "cpu"})
    model.eval()
    with torch.no_grad():
        out = model.generate(input_ids=torch.tensor([prompt]), attention_mask=torch.ones((1, len(prompt)),
                             dtype=torch.long), do_sample=False, repetition_penalty=penalty,
                             max_new_tokens=PENALTY_TOKENS, min_new_tokens=PENALTY_TOKENS, output_logits=True,
                             return_dict_in_generate=True, pad_token_id=0, eos_token_id=None)
    ids = out.sequences[0, len(prompt):].tolist()
    logprobs = [torch.log_softmax(step[0].float(), -1)[i].item() for step, i in zip(out.logits, ids)]
    plain = model.generate(input_ids=torch.tensor([prompt]), attention_mask=torch.ones((1, len(prompt)),
                           dtype=torch.long), do_sample=False, max_new_tokens=PENALTY_TOKENS,
                           min_new_tokens=PENALTY_TOKENS, pad_token_id=0, eos_token_id=None)
    return {"ids": ids, "logprobs": logprobs, "unpenalised": plain[0, len(prompt):].tolist()}


@pytest.mark.parametrize("prompt", PENALTY_PROMPTS, ids=[f"prompt{i}" for i in range(len(PENALTY_PROMPTS))])
def test_greedy_repetition_penalty_equals_generate(stubs, two_stage_server, text_model, prompt):
    import generate_helpers as GH

    want = reference_penalised_generate(text_model, prompt, 1.3)
    got = GH.generate(stubs, two_stage_server.channel, prompt_ids=prompt, max_new_tokens=PENALTY_TOKENS,
                      repetition_penalty=1.3)
    assert got["ids"] == want["ids"]
    # log_softmax of the raw logits, as transformers' output_logits
    assert got["logprobs"] == pytest.approx(want["logprobs"], abs=1e-4)
    assert got["finish"] == "LENGTH"


def test_the_penalty_changes_some_greedy_generation(text_model):
    """Guards the test above: on these prompts the penalty really changes transformers' greedy choice."""
    changed = [p for p in PENALTY_PROMPTS
               if (lambda r: r["ids"] != r["unpenalised"])(reference_penalised_generate(text_model, p, 1.3))]
    assert changed, "repetition_penalty=1.3 changes no generation: the parity test proves nothing"
