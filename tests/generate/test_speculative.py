"""Speculative decoding through a real strata-server (issue 44; server/README.md, "Speculative decoding"): n-gram
proposals on a 2-stage plan with micro-batches pipelined give exactly transformers' prompt-lookup ids, streamed token
by token, for concurrent requests too; a request may turn it off; the flags refuse what they cannot take, naming it;
the metrics count proposals and acceptances."""

from __future__ import annotations

import json
import subprocess
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

import generate_helpers as GH
import integration_helpers as IH
import runtime_helpers as RH

# Runs of one token, after which this random model's greedy output repeats itself (runs of one id, short cycles:
# proposals are made and some accepted), and prompts after which it hardly does.
PROMPTS = [[7] * 8, [9] * 6, [100] * 8, [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12], [77]]
NEW_TOKENS = 64
# Proposing whenever acceptance allows: the cost-aware switch follows measured times, which the counts the tests
# compare must not depend on (test_the_cost_aware_switch_changes_no_id runs it).
SPEC_FLAGS = ["--speculative", "ngram", "--num-speculative-tokens", "4", "--ngram-max", "3",
              "--speculative-cost-aware=false"]


@pytest.fixture(scope="module")
def spec_server(server_factory, text_model):
    directory, _ = text_model
    return server_factory(["--model", str(directory), *GH.TWO_STAGE_FLAGS, "--max-batch", "8", "--max-context", "256",
                           "--micro-batches", "2", *SPEC_FLAGS], http=True)


@pytest.fixture(scope="module")
def prompt_lookup_reference(text_model):
    """transformers' generate(prompt_lookup_num_tokens=4, do_sample=False), each prompt alone: its new ids."""
    import transformers

    directory, _ = text_model
    model = transformers.AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32)
    model.eval()
    out = []
    with torch.no_grad():
        for prompt in PROMPTS:
            ids = torch.tensor([prompt])
            seq = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), do_sample=False,
                                 max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS, prompt_lookup_num_tokens=4,
                                 max_matching_ngram_size=3, pad_token_id=0, eos_token_id=None)
            out.append(seq[0, len(prompt):].tolist())
    return out


def test_greedy_ids_equal_transformers_prompt_lookup_and_plain_greedy(stubs, spec_server, text_model,
                                                                      prompt_lookup_reference):
    directory, _ = text_model
    greedy = RH.reference_generate(directory, PROMPTS, NEW_TOKENS)
    before = GH.metric(spec_server.metrics_url, 'strata_spec_accepted_tokens_total{method="ngram"}', default=0)
    for prompt, lookup, plain in zip(PROMPTS, prompt_lookup_reference, greedy):
        got = GH.generate(stubs, spec_server.channel, prompt_ids=prompt, max_new_tokens=NEW_TOKENS)
        assert got["ids"] == lookup, prompt
        assert got["ids"] == plain["ids"], prompt
        assert got["logprobs"] == pytest.approx(plain["logprobs"], abs=1e-4), prompt
        assert got["usage"] == (len(prompt), NEW_TOKENS)
    # The test means something: the server accepted proposals (the metrics are sampled every 250 ms).
    accepted = GH.wait_metric(spec_server.metrics_url, 'strata_spec_accepted_tokens_total{method="ngram"}',
                              lambda v: v >= before + 10)
    assert accepted >= before + 10
    assert GH.metric(spec_server.metrics_url, 'strata_spec_accepted_length_count{method="ngram"}') > 0
    proposed = GH.metric(spec_server.metrics_url, 'strata_spec_proposed_tokens_total{method="ngram"}')
    assert proposed > GH.metric(spec_server.metrics_url, 'strata_spec_accepted_tokens_total{method="ngram"}')


def test_the_cost_aware_switch_changes_no_id(stubs, server_factory, text_model):
    # Whether each step proposes follows measured pass times here (the default): whatever it decides, greedy ids are
    # plain greedy's.
    directory, _ = text_model
    server = server_factory(["--model", str(directory), *GH.TWO_STAGE_FLAGS, "--max-batch", "8", "--max-context",
                             "256", "--speculative", "ngram"])
    greedy = RH.reference_generate(directory, PROMPTS, NEW_TOKENS)
    with ThreadPoolExecutor(len(PROMPTS)) as pool:
        got = list(pool.map(lambda p: GH.generate(stubs, server.channel, prompt_ids=p, max_new_tokens=NEW_TOKENS),
                            PROMPTS))
    assert [g["ids"] for g in got] == [g["ids"] for g in greedy]


def test_concurrent_seeded_and_greedy_requests_equal_their_runs_alone(stubs, spec_server):
    requests = [dict(prompt_ids=p, max_new_tokens=NEW_TOKENS) for p in PROMPTS]
    requests += [dict(prompt_ids=p, max_new_tokens=NEW_TOKENS, temperature=0.8, top_k=40, seed=11 + i)
                 for i, p in enumerate(PROMPTS)]
    alone = [GH.generate(stubs, spec_server.channel, **r)["ids"] for r in requests]
    with ThreadPoolExecutor(len(requests)) as pool:
        together = list(pool.map(lambda r: GH.generate(stubs, spec_server.channel, **r)["ids"], requests))
    assert together == alone
    # Seeded sampling gives the ids of decoding without speculation: the same request with it off.
    for r, ids in zip(requests[len(PROMPTS):], alone[len(PROMPTS):]):
        assert GH.generate(stubs, spec_server.channel, speculative=False, **r)["ids"] == ids


def test_a_request_can_turn_it_off(stubs, spec_server, text_model):
    url = spec_server.metrics_url
    sample = 'strata_spec_proposed_tokens_total{method="ngram"}'
    time.sleep(0.6)  # the engine's counters reach /metrics every 250 ms: the earlier tests' are all there now
    before = GH.metric(url, sample)
    off = GH.generate(stubs, spec_server.channel, prompt_ids=PROMPTS[0], max_new_tokens=NEW_TOKENS, speculative=False)
    body = json.dumps({"model": str(text_model[0]), "prompt": PROMPTS[0], "max_tokens": NEW_TOKENS,
                       "temperature": 0, "speculative": False}).encode()
    http = json.load(urllib.request.urlopen(urllib.request.Request(
        spec_server.http_url + "/v1/completions", body, {"Content-Type": "application/json"}), timeout=60))
    assert http["usage"]["completion_tokens"] == NEW_TOKENS
    assert off["usage"] == (len(PROMPTS[0]), NEW_TOKENS)
    time.sleep(0.6)  # two metric samples
    assert GH.metric(url, sample) == before


def test_penalised_and_min_tokens_requests_propose_and_keep_their_text(spec_server, text_model):
    # Each verified position's penalties count the proposals before it; before min_tokens a proposal stops where the
    # EOS ban ends: the texts are those of the same requests with speculation off, and proposals were verified.
    url = spec_server.metrics_url
    sample = 'strata_spec_proposed_tokens_total{method="ngram"}'

    def complete(extra: dict) -> dict:
        body = json.dumps({"model": str(text_model[0]), "prompt": PROMPTS[0], "max_tokens": NEW_TOKENS,
                           "temperature": 0, **extra}).encode()
        return json.load(urllib.request.urlopen(urllib.request.Request(
            spec_server.http_url + "/v1/completions", body, {"Content-Type": "application/json"}), timeout=60))

    plain = complete({})
    # Penalties mild enough that this model's output still repeats itself (something to propose).
    for extra in ({"frequency_penalty": 0.05, "presence_penalty": 0.05, "repetition_penalty": 1.02},
                  {"repetition_penalty": 1.02, "min_tokens": NEW_TOKENS // 2}):
        time.sleep(0.6)  # the engine's counters reach /metrics every 250 ms
        before = GH.metric(url, sample, default=0)
        on = complete(extra)
        proposed = GH.wait_metric(url, sample, lambda v: v > before)
        off = complete({**extra, "speculative": False})
        assert on["choices"][0]["text"] == off["choices"][0]["text"], extra
        assert on["usage"] == off["usage"], extra
        assert proposed > before, f"{extra}: nothing was proposed"
        # The penalties change what the model says (the comparison can fail).
        assert on["choices"][0]["text"] != plain["choices"][0]["text"], extra


def test_the_http_field_must_be_a_boolean(spec_server, text_model):
    body = json.dumps({"model": str(text_model[0]), "prompt": [1, 2], "max_tokens": 2,
                       "speculative": "no"}).encode()
    with pytest.raises(urllib.error.HTTPError) as err:
        urllib.request.urlopen(urllib.request.Request(spec_server.http_url + "/v1/completions", body,
                                                      {"Content-Type": "application/json"}), timeout=30)
    assert err.value.code == 400
    assert json.load(err.value)["error"]["param"] == "speculative"


@pytest.mark.parametrize("flags, named", [
    (["--speculative", "eagle"], '--speculative: unknown method "eagle"'),
    (["--speculative", "ngram", "--num-speculative-tokens", "0"], "--num-speculative-tokens: 0 is not in [1, 64]"),
    (["--speculative", "ngram", "--ngram-min", "0"], "--ngram-min: 0 is below 1"),
    (["--speculative", "ngram", "--ngram-min", "3", "--ngram-max", "2"], "--ngram-max: 2 is not in"),
])
def test_bad_flags_exit_2_naming_the_flag(server_bin, text_model, flags, named):
    directory, _ = text_model
    proc = subprocess.run([str(server_bin), "--model", str(directory), *flags], capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 2, proc.stderr
    assert named in proc.stderr


def test_strata_generate_takes_the_same_flags(text_model):
    directory, _ = text_model
    binary = IH.require_binary(IH.BUILD_DIR / "runtime" / "strata-generate")
    out = {}
    for name, flags in (("plain", []), ("spec", SPEC_FLAGS)):
        proc = subprocess.run([str(binary), "--model", str(directory), "--prompt-ids", ",".join(map(str, PROMPTS[0])),
                               "--max-new-tokens", str(NEW_TOKENS), "--max-context", "128", "--json", *flags],
                              capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, proc.stderr
        out[name] = json.loads(proc.stdout)
    assert out["spec"]["results"][0]["ids"] == out["plain"]["results"][0]["ids"]
    assert out["spec"]["engine"]["spec_accepted_tokens"] > 0
    assert out["plain"]["engine"]["spec_proposed_tokens"] == 0
    proc = subprocess.run([str(binary), "--model", str(directory), "--prompt-ids", "1", "--speculative", "eagle"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and '--speculative: unknown method "eagle"' in proc.stderr


def test_a_deepseek_mtp_layer_proposes_through_the_server(stubs, server_factory, tmp_path_factory):
    """--speculative mtp through strata-server: the plan keeps the checkpoint's multi-token-prediction layer (the tiny
    DeepSeek-V3 of tests/runtime_parity with one added, mostly predicting its own continuations), greedy ids are
    transformers' without it, concurrent requests too, seeded sampled ones those of the same request with speculation
    off, and the metrics count its proposals and acceptances
    (tests/runtime_parity/test_mtp.py checks each proposal against a reference)."""
    name, prompts, new_tokens = "deepseek_v3_yarn", [[5, 6, 7, 8, 9, 10, 11], [3, 4], [42]], 24
    base = RH.make_checkpoint(tmp_path_factory.mktemp("deepseek"), name)
    reference = RH.reference_generate(base, prompts, new_tokens)
    bigram = {}
    for prompt, result in zip(prompts, reference):
        sequence = prompt + result["ids"]
        bigram.update(zip(sequence[:-1], sequence[1:]))
    directory = RH.add_mtp_layer(base, tmp_path_factory.mktemp("deepseek_mtp") / "model", bigram)
    server = server_factory(["--model", str(directory), "--device-map", '{"": "cpu"}', "--max-batch", "4",
                             "--max-context", "128", "--speculative", "mtp", "--speculative-cost-aware=false"])
    with ThreadPoolExecutor(len(prompts)) as pool:
        got = list(pool.map(lambda p: GH.generate(stubs, server.channel, prompt_ids=p, max_new_tokens=new_tokens),
                            prompts))
    assert [g["ids"] for g in got] == [r["ids"] for r in reference]
    for prompt, ref in zip(prompts, reference):
        assert GH.generate(stubs, server.channel, prompt_ids=prompt, max_new_tokens=new_tokens)["ids"] == ref["ids"]
    # Seeded sampling: the ids of the same request with speculation off.
    for i, prompt in enumerate(prompts):
        r = dict(prompt_ids=prompt, max_new_tokens=new_tokens, temperature=0.8, top_k=40, seed=5 + i)
        on = GH.generate(stubs, server.channel, **r)["ids"]
        assert on == GH.generate(stubs, server.channel, speculative=False, **r)["ids"], prompt
    accepted = GH.wait_metric(server.metrics_url, 'strata_spec_accepted_tokens_total{method="mtp"}', lambda v: v >= 5)
    assert accepted >= 5
    assert GH.metric(server.metrics_url, 'strata_spec_proposed_tokens_total{method="mtp"}') > accepted
