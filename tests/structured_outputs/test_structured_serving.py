"""Structured requests among free ones, under the serving machinery: concurrency (threads), preemption by
recomputation (a KV pool too small for the batch: the matcher is rebuilt from the sequence's tokens), prefix-cache
hits, --jump-forward, a 2-stage plan (two logical CPU devices) and a 2-node group (two processes over UCX on loopback). Greedy
requests and seeded samples give the same text as on the 1-stage server alone (a seed fixes a request's tokens
whatever else runs), and every constrained output is valid."""

from __future__ import annotations

import json
import re

import pytest

import generate_helpers as GH
import group_helpers as G
import runtime_helpers as RH
import schema_corpus as SC
import structured_helpers as H

ORDER = SC.CORPUS_BY_NAME["petstore_order"].schema
WEATHER = SC.CORPUS_BY_NAME["bfcl_get_current_weather"].schema
POD = SC.CORPUS_BY_NAME["k8s_pod"].schema


def check_json(schema):
    def check(finish: str, text: str):
        if finish == "stop":
            assert H.schema_errors(json.loads(text), schema) == [], text
        else:
            assert finish == "length" and H.json_prefix_error(text) is None, text
    return check


def check_regex(regex):
    def check(finish: str, text: str):
        assert finish == "stop" and re.fullmatch(regex, text), (finish, text)
    return check


def no_check(finish: str, text: str):
    assert finish in ("stop", "length")


# (body of /v1/completions, check): constrained and free, greedy and seeded, short and long.
MIXED = [
    ({"prompt": "An order:", "structured_outputs": {"json": ORDER}, "temperature": 0}, check_json(ORDER)),
    ({"prompt": "A pod:", "structured_outputs": {"json": POD}, "temperature": 1.0, "seed": 1}, check_json(POD)),
    ({"prompt": "Free text one", "temperature": 0, "ignore_eos": True}, no_check),
    ({"prompt": "Weather:", "json_schema": WEATHER, "temperature": 1.0, "seed": 2}, check_json(WEATHER)),
    ({"prompt": "Letters:", "structured_outputs": {"regex": "[a-z]{60}"}, "temperature": 1.0, "seed": 3},
     check_regex("[a-z]{60}")),
    ({"prompt": "Free text two, sampled", "temperature": 1.0, "seed": 4, "ignore_eos": True}, no_check),
    ({"prompt": "Pick:", "structured_outputs": {"choice": ["alpha", "beta", "gamma"]}, "temperature": 1.0, "seed": 5},
     lambda finish, text: text in ("alpha", "beta", "gamma")),
    ({"prompt": "Sum:", "structured_outputs": {"grammar": H.ARITHMETIC_EBNF}, "temperature": 1.0, "seed": 6},
     lambda finish, text: finish == "length" or H.arithmetic_error(text) is None),
    ({"prompt": "A pod, greedy:", "structured_outputs": {"json": POD}, "temperature": 0}, check_json(POD)),
    ({"prompt": "Free text three", "temperature": 0}, no_check),
    ({"prompt": "An object:", "structured_outputs": {"json_object": True}, "temperature": 1.0, "seed": 7},
     lambda finish, text: finish == "length" or isinstance(json.loads(text), dict)),
    ({"prompt": "Words:", "grammar": H.WORD_LIST_GBNF, "temperature": 1.0, "seed": 8},
     check_regex(H.WORD_LIST_RE.pattern)),
]
MAX_TOKENS = 160


def run_mixed(url: str, bodies=MIXED, workers: int = 16) -> list[tuple[str, str]]:
    def one(body):
        reply = H.post_ok(f"{url}/v1/completions", {"model": H.MODEL_NAME, "max_tokens": MAX_TOKENS, **body})
        return reply["choices"][0]["finish_reason"], reply["choices"][0]["text"]
    return H.run_all([lambda b=b: one(b) for b, _ in bodies], workers=workers)


@pytest.fixture(scope="module")
def alone(main) -> list[tuple[str, str]]:
    """Each MIXED request alone on the 1-stage server, one after the other: the reference."""
    results = run_mixed(main.url, workers=1)
    for (_, check), (finish, text) in zip(MIXED, results):
        check(finish, text)
    return results


def test_concurrent_mixed_requests_equal_their_runs_alone(main, alone):
    for _ in range(2):
        together = run_mixed(main.url)
        for i, ((body, check), got, want) in enumerate(zip(MIXED, together, alone)):
            check(*got)
            assert got == want, f"request {i} {json.dumps(body)[:200]}"


def test_preemption_rebuilds_the_matcher(serve, alone):
    # 12 sequences of up to ~10 + 160 tokens in a pool of 256 positions (blocks of 8): sequences are preempted and
    # recomputed; a matcher rebuilt from the sequence's tokens gives the same text as the run alone.
    small = serve("byte_level", "--kv-cache-tokens", "256", "--kv-block-tokens", "8", "--prefill-chunk", "16")
    together = run_mixed(small.url)
    for i, ((body, check), got, want) in enumerate(zip(MIXED, together, alone)):
        check(*got)
        assert got == want, f"request {i} {json.dumps(body)[:200]}\n{small.server.output()[-3000:]}"
    preemptions = GH.wait_metric(small.server.metrics_url, "strata_preemptions_total", lambda v: v > 0)
    assert preemptions > 0, "the pool was meant to be too small for every sequence at once"


def test_prefix_cache_hits_keep_outputs(main):
    before = GH.metric(main.server.metrics_url, "strata_prefix_cache_hits_total", default=0)
    prompt = "A long shared prefix that fills several KV blocks of sixteen positions each, " * 3
    bodies = [({"prompt": prompt + "then an order:", "structured_outputs": {"json": ORDER}, "temperature": 0},
               check_json(ORDER)),
              ({"prompt": prompt + "then free text", "temperature": 0}, no_check),
              ({"prompt": prompt + "then a pod:", "structured_outputs": {"json": POD}, "temperature": 1.0, "seed": 9},
               check_json(POD))]
    first = run_mixed(main.url, bodies, workers=1)
    second = run_mixed(main.url, bodies, workers=1)
    assert first == second
    for (_, check), got in zip(bodies, second):
        check(*got)
    hits = GH.wait_metric(main.server.metrics_url, "strata_prefix_cache_hits_total", lambda v: v > before)
    assert hits > before


def test_two_stage_plan_equals_one_stage(serve, alone):
    device_map = RH.layer_device_map("llama_text", [0, 0, 1, 1], 1)  # layers 0-1 on device 0, 2-3 and head on 1
    staged = serve("byte_level", "--device-map", device_map, "--physical-devices", "0=cpu,1=cpu",
                   "--max-memory", "0=1GiB,1=1GiB,cpu=1GiB")
    together = run_mixed(staged.url)
    for i, ((body, check), got, want) in enumerate(zip(MIXED, together, alone)):
        check(*got)
        assert got == want, f"request {i} {json.dumps(body)[:200]}"


def test_jump_forward_gives_the_same_ids(serve, alone):
    # --jump-forward appends the one token a grammar allows without a forward pass of its own: exact, so greedy and
    # seeded requests give the texts they give without it.
    jumping = serve("byte_level", "--jump-forward")
    together = run_mixed(jumping.url)
    for i, ((body, check), got, want) in enumerate(zip(MIXED, together, alone)):
        check(*got)
        assert got == want, f"request {i} {json.dumps(body)[:200]}"
    forced = GH.wait_metric(jumping.server.metrics_url, "strata_grammar_forced_tokens_total", lambda v: v > 0)
    assert forced > 0, "no token was appended by jump-forward"


SPEC_FLAGS = ("--num-speculative-tokens", "4", "--speculative-cost-aware=false")


def test_speculation_gives_the_same_ids(serve, alone):
    # Each verified position has the grammar's mask after the proposals before it, and a proposal ends after the first
    # token the grammar refuses: n-gram proposals give the texts of decoding without them, greedy and seeded.
    speculating = serve("byte_level", "--speculative", "ngram", *SPEC_FLAGS)
    together = run_mixed(speculating.url)
    for i, ((body, check), got, want) in enumerate(zip(MIXED, together, alone)):
        check(*got)
        assert got == want, f"request {i} {json.dumps(body)[:200]}"
    accepted = GH.wait_metric(speculating.server.metrics_url, 'strata_spec_accepted_tokens_total{method="ngram"}',
                              lambda v: v > 0)
    assert accepted > 0, "no proposal was kept"


def test_a_draft_model_proposes_under_the_grammar(serve, main, alone):
    # The model as its own draft chooses each proposal under the grammar's mask there: it is always right, and greedy
    # texts are those of decoding without it (a sampled draft is verified by rejection: other draws, valid texts).
    drafting = serve("byte_level", "--draft-model", str(main.directory), *SPEC_FLAGS)
    together = run_mixed(drafting.url)
    for i, ((body, check), got, want) in enumerate(zip(MIXED, together, alone)):
        check(*got)
        if body.get("temperature") == 0:
            assert got == want, f"request {i} {json.dumps(body)[:200]}"
    metrics = drafting.server.metrics_url
    accepted = GH.wait_metric(metrics, 'strata_spec_accepted_tokens_total{method="draft"}', lambda v: v > 0)
    assert accepted == GH.metric(metrics, 'strata_spec_proposed_tokens_total{method="draft"}')


# gRPC requests for the group: (GenerateRequest fields, check).
def grpc_mixed(stubs) -> list[tuple[dict, object]]:
    return [
        ({"prompt": "An order:", "temperature": 0, **H.grpc_constraint(stubs, "json_schema", ORDER)}, check_json(ORDER)),
        ({"prompt": "A pod:", "temperature": 1.0, "seed": 1, **H.grpc_constraint(stubs, "json_schema", POD)},
         check_json(POD)),
        ({"prompt": "Free text one", "temperature": 0}, no_check),
        ({"prompt": "Letters:", "temperature": 1.0, "seed": 3, **H.grpc_constraint(stubs, "regex", "[a-z]{60}")},
         check_regex("[a-z]{60}")),
        ({"prompt": "Pick:", "temperature": 1.0, "seed": 5,
          **H.grpc_constraint(stubs, "choice", ["alpha", "beta", "gamma"])},
         lambda finish, text: text in ("alpha", "beta", "gamma")),
        ({"prompt": "Free text two, sampled", "temperature": 1.0, "seed": 4}, no_check),
        ({"prompt": "Sum:", "temperature": 1.0, "seed": 6, **H.grpc_constraint(stubs, "grammar", H.ARITHMETIC_EBNF)},
         lambda finish, text: finish == "length" or H.arithmetic_error(text) is None),
        ({"prompt": "An object:", "temperature": 1.0, "seed": 7, **H.grpc_constraint(stubs, "json_object", True)},
         lambda finish, text: finish == "length" or isinstance(json.loads(text), dict)),
    ]


def run_grpc(stubs, channel, requests, workers: int = 16) -> list[tuple[str, str]]:
    def one(fields):
        got = GH.generate(stubs, channel, timeout=120, max_new_tokens=MAX_TOKENS, **fields)
        return {"EOS": "stop", "STOP": "stop", "LENGTH": "length"}.get(got["finish"], got["finish"]), got["text"]
    return H.run_all([lambda f=f: one(f) for f, _ in requests], workers=workers)


@pytest.mark.parametrize("extra", [(), ("--speculative", "ngram", *SPEC_FLAGS)], ids=["plain", "ngram"])
def test_two_node_group_equals_one_node(main, stubs, server_bin, tmp_path_factory, extra):
    # With n-gram proposals, each verified position's mask travels with the micro-batch to the node that samples.
    requests = grpc_mixed(stubs)
    want = run_grpc(stubs, main.channel, requests, workers=1)
    secret = tmp_path_factory.mktemp("secret") / "group-secret"
    secret.write_text("4f1d2c7e9a0b3c5d6e7f8091a2b3c4d5\n")
    group = G.Group(server_bin, stubs, tmp_path_factory.mktemp("group"), main.directory, secret, gpus=[1, 1],
                    map_json=G.layer_map(4, [0, 1]), common=[*H.SERVER_FLAGS, *extra])
    try:
        got = run_grpc(stubs, group.leader.channel, requests)
        for i, ((fields, check), g, w) in enumerate(zip(requests, got, want)):
            check(*g)
            assert g == w, f"request {i} {str(fields)[:200]}\n{group.output()[-3000:]}"
        if extra:
            accepted = GH.wait_metric(group.leader.metrics_url, 'strata_spec_accepted_tokens_total{method="ngram"}',
                                      lambda v: v > 0)
            assert accepted > 0, "no proposal was kept"
    finally:
        codes = group.stop()
    assert codes == [0, 0], group.output()
