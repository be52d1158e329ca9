"""strata-generate's OpenAI sampling features against transformers' logits on the same tiny random
checkpoint: presence / frequency penalties and logit_bias (greedy, so deterministic) against a reference
that applies OpenAI's formula (as vLLM's apply_penalties does) to transformers' logits step by step;
min_tokens (the EOS id cannot be chosen before it); prompt log-probabilities against log_softmax of
transformers' model(input_ids).logits, within 1e-4 in float32, with chunked prefill and with a prompt whose
prefix an earlier request left in the prefix cache."""

from __future__ import annotations

import pytest
import torch

import runtime_helpers as H

NAME = "llama_llama3_gqa"
PROMPTS = [[5, 6, 7, 8, 9, 10, 11], [3, 4], [100, 101, 102, 103, 104, 105, 106, 107, 108, 109, 110, 111, 112], [42]]
TOLERANCE = 1e-4


@pytest.fixture(scope="module")
def model(checkpoint):
    import transformers

    directory = checkpoint(NAME)
    m = transformers.AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32, device_map={"": "cpu"})
    m.eval()
    return directory, m


def _next_logits(m, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return m(torch.tensor([ids])).logits[0, -1].float()


def reference_greedy(m, prompt: list[int], new_tokens: int, *, presence=0.0, frequency=0.0, repetition=1.0,
                     bias=None, eos=None, min_tokens=0):
    """Greedy decoding on transformers' logits with vLLM's processing order: logit_bias (min_tokens bans the
    EOS id), transformers' repetition penalty over prompt + output, then OpenAI's frequency and presence
    penalties over the output alone: l[j] -= frequency * count[j] + presence * (count[j] > 0). Logprobs
    are log_softmax of the raw logits."""
    ids = list(prompt)
    out, logprobs, finish = [], [], "length"
    for _ in range(new_tokens):
        raw = _next_logits(m, ids)
        scores = raw.clone()
        for j, b in (bias or {}).items():
            scores[j] += b
        if eos is not None and len(out) < min_tokens:
            scores[eos] = -float("inf")
        if repetition != 1.0:
            seen = torch.tensor(sorted(set(ids)))
            picked = scores[seen]
            scores[seen] = torch.where(picked < 0, picked * repetition, picked / repetition)
        counts = torch.zeros_like(scores)
        for t in out:
            counts[t] += 1
        scores = scores - frequency * counts - presence * (counts > 0).float()
        token = int(torch.argmax(scores))
        out.append(token)
        logprobs.append(float(torch.log_softmax(raw, -1)[token]))
        ids.append(token)
        if eos is not None and token == eos:
            finish = "eos"
            break
    return out, logprobs, finish


def assert_same(reference, result, prompt_index):
    ids, logprobs, finish = reference
    assert result["ids"] == ids, f"prompt {prompt_index}: ids differ"
    worst = max((abs(a - b) for a, b in zip(logprobs, result["logprobs"])), default=0.0)
    assert worst <= TOLERANCE, f"prompt {prompt_index}: logprob differs by {worst}"
    assert result["finish"] == finish


PENALTY_CASES = {
    "presence_frequency": dict(presence=0.7, frequency=0.9),
    "negative_frequency": dict(frequency=-0.8),
    "logit_bias": dict(bias={5: 2.5, 17: -100.0, 200: 1.5}),
    "all_with_repetition": dict(presence=1.5, frequency=0.4, repetition=1.3, bias={9: 3.0}),
}


def _flags(case: dict) -> list[str]:
    args = []
    if "presence" in case:
        args += ["--presence-penalty", str(case["presence"])]
    if "frequency" in case:
        args += ["--frequency-penalty", str(case["frequency"])]
    if "repetition" in case:
        args += ["--repetition-penalty", str(case["repetition"])]
    if "bias" in case:
        args += ["--logit-bias", ",".join(f"{j}={b}" for j, b in case["bias"].items())]
    return args


@pytest.mark.parametrize("case", list(PENALTY_CASES))
def test_penalties_and_logit_bias_match_the_openai_formula(strata_generate, model, case):
    directory, m = model
    new_tokens = 12
    got = H.run_generate(directory, PROMPTS, new_tokens, *_flags(PENALTY_CASES[case]))
    changed = 0
    for i, prompt in enumerate(PROMPTS):
        reference = reference_greedy(m, prompt, new_tokens, **PENALTY_CASES[case])
        assert_same(reference, got["results"][i], i)
        changed += reference[0] != reference_greedy(m, prompt, new_tokens)[0]
    assert changed > 0, "the case changes no prompt's greedy output: it tests nothing"


def test_min_tokens_keeps_eos_from_being_chosen(strata_generate, model):
    directory, m = model
    prompt = PROMPTS[0]
    eos = reference_greedy(m, prompt, 1)[0][0]  # greedy's first choice ends the sequence at once
    plain = H.run_generate(directory, [prompt], 8, "--eos-ids", str(eos))
    assert plain["results"][0]["ids"] == [eos] and plain["results"][0]["finish"] == "eos"
    for min_tokens in (1, 4):
        got = H.run_generate(directory, [prompt], 8, "--eos-ids", str(eos), "--min-tokens", str(min_tokens))
        reference = reference_greedy(m, prompt, 8, eos=eos, min_tokens=min_tokens)
        assert len(reference[0]) > min_tokens and eos not in reference[0][:min_tokens]
        assert_same(reference, got["results"][0], 0)


def reference_prompt_logprobs(m, prompt: list[int], top: int):
    with torch.no_grad():
        logprobs = torch.log_softmax(m(torch.tensor([prompt])).logits[0].float(), -1)
    scored, tops = [None], [None]
    for i in range(1, len(prompt)):
        scored.append(float(logprobs[i - 1, prompt[i]]))
        values, ids = torch.topk(logprobs[i - 1], top)
        tops.append(list(zip(ids.tolist(), values.tolist())))
    return scored, tops


def assert_prompt_logprobs(m, prompt, result, top):
    scored, tops = reference_prompt_logprobs(m, prompt, top)
    got, got_top = result["prompt_logprobs"], result["prompt_top_logprobs"]
    assert len(got) == len(prompt) and got[0] is None and got_top[0] is None
    for i in range(1, len(prompt)):
        assert abs(got[i] - scored[i]) <= TOLERANCE, f"position {i}: {got[i]} vs {scored[i]}"
        assert [t[0] for t in got_top[i]] == [t[0] for t in tops[i]], f"position {i}: top ids differ"
        assert max(abs(a[1] - b[1]) for a, b in zip(got_top[i], tops[i])) <= TOLERANCE


LONG = [(7 * i + 3) % 256 for i in range(45)]


@pytest.mark.parametrize("new_tokens", [0, 2])
def test_prompt_logprobs_match_log_softmax_of_the_logits(strata_generate, model, new_tokens):
    directory, m = model
    prompts = PROMPTS + [LONG]
    # Chunks of 8: the long prompt is prefilled in 6 micro-batches, the 13-token one in 2.
    got = H.run_generate(directory, prompts, new_tokens, "--prompt-logprobs", "3", "--prefill-chunk", "8")
    for i, prompt in enumerate(prompts):
        result = got["results"][i]
        assert_prompt_logprobs(m, prompt, result, 3)
        assert len(result["ids"]) == new_tokens and result["finish"] == "length"
        if new_tokens:
            assert_same(reference_greedy(m, prompt, new_tokens), result, i)


def test_prompt_logprobs_of_a_prompt_whose_prefix_is_cached(strata_generate, model):
    directory, m = model
    # One sequence at a time: the second prompt starts after the first ended and left its first two
    # 16-token blocks in the prefix cache.
    second = LONG[:34] + [1, 2, 3, 4, 5]
    args = ["--prefix-cache", "--max-batch", "1", "--max-context", "64", "--prefill-chunk", "16"]
    control = H.run_generate(directory, [LONG, second], 2, *args)
    assert control["engine"]["prefix_hit_tokens"] >= 32, "the second prompt does not reuse the first's blocks"
    got = H.run_generate(directory, [LONG, second], 2, *args, "--prompt-logprobs", "2")
    assert got["engine"]["prefix_hit_tokens"] == 0
    for i, prompt in enumerate([LONG, second]):
        assert_prompt_logprobs(m, prompt, got["results"][i], 2)
        assert got["results"][i]["ids"] == control["results"][i]["ids"]


@pytest.mark.parametrize("flags,message", [
    (["--logit-bias", "5"], '--logit-bias: "5" is not ID=BIAS'),
    (["--logit-bias", "256=1"], "--logit-bias: token id 256 is outside the vocabulary [0, 256)"),
    (["--prompt-logprobs", "257"], "--prompt-logprobs: 257 is not in [0, 256]"),
    (["--min-tokens", "-1"], "--min-tokens: not a count"),
    (["--eos-ids", "1,x"], '--eos-ids: "x" is not a token id'),
    (["--repetition-penalty", "0"], "--repetition-penalty: must be positive"),
])
def test_bad_sampling_flags_exit_2_naming_the_flag(strata_generate, checkpoint, flags, message):
    proc = H.run_generate(checkpoint(NAME), [[1, 2, 3]], 2, *flags, check=False)
    assert proc.returncode == 2, f"exit {proc.returncode}: {proc.stderr}"
    assert message in proc.stderr, proc.stderr
