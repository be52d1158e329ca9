"""The paged KV cache through a real strata-server (issue 11): requests of 1-300 tokens, some sharing a
prefix, arriving at different times on a cache too small for all of them at once (so that some are
preempted and recomputed), each give exactly the ids transformers' generate() gives that request alone,
on 1-, 2- and 3-stage plans; a prefix-cache hit gives the tokens of a miss; no block is left in use after
a cancellation storm; a request larger than the whole cache is refused naming the limits; the KV metrics
and GetDeviceMap's capacity in tokens."""

from __future__ import annotations

import json
import random
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import grpc
import pytest

import generate_helpers as GH
import runtime_helpers as RH

THREE_STAGE_MAP = {"model.embed_tokens": 0, "model.layers.0": 0, "model.layers.1": 1, "model.layers.2": 1,
                   "model.layers.3": 2, "model.norm": 2, "model.rotary_emb": 2, "lm_head": 2}
THREE_STAGE_FLAGS = ["--device-map", json.dumps(THREE_STAGE_MAP), "--physical-devices", "0=cpu,1=cpu,2=cpu",
                     "--max-memory", "0=1GiB,1=1GiB,2=1GiB,cpu=1GiB"]
PLANS = {"1-stage": [], "2-stage": GH.TWO_STAGE_FLAGS, "3-stage": THREE_STAGE_FLAGS}
# 24 blocks of 16 tokens: a third of what the mix below asks for at once.
SMALL_CACHE = ["--kv-cache-tokens", "384", "--kv-block-tokens", "16", "--max-batch", "16", "--max-context", "512",
               "--prefill-chunk", "32"]
SHARED = [(k * 7 + 3) % 320 for k in range(48)]  # three full blocks


def _mix() -> list[dict]:
    """Prompts of 1-300 tokens (a third start with SHARED), new tokens 8-56, arrival delays 0-0.6 s."""
    rng = random.Random(11)
    lengths = [1, 3, 17, 31, 48, 64, 90, 120, 160, 200, 250, 300]
    requests = []
    for i, length in enumerate(lengths):
        prompt = [rng.randrange(320) for _ in range(length)]
        if i % 3 == 1 and length > len(SHARED):
            prompt = SHARED + prompt[len(SHARED):]
        requests.append(dict(prompt=prompt, new=rng.randint(8, 40), delay=rng.uniform(0, 0.6)))
    # Eight short prompts arriving at once, admitted at once (a block each), that grow to 5 blocks each:
    # 40 blocks of a 24-block cache, so that some must be preempted whatever the timing.
    for i in range(8):
        requests.append(dict(prompt=[rng.randrange(320) for _ in range(rng.randint(10, 16))], new=56, delay=0.0))
    return requests


@pytest.fixture(scope="module")
def mix_reference(text_model):
    directory, _ = text_model
    requests = _mix()
    # Each request alone (no padding beside it), as many tokens as it asks for.
    return requests, [RH.reference_generate(directory, [r["prompt"]], r["new"])[0]["ids"] for r in requests]


def _run_at_their_times(stubs, channel, requests):
    start = time.monotonic()

    def one(r):
        time.sleep(max(0.0, r["delay"] - (time.monotonic() - start)))
        return GH.generate(stubs, channel, prompt_ids=r["prompt"], max_new_tokens=r["new"], timeout=300)

    with ThreadPoolExecutor(len(requests)) as pool:
        return list(pool.map(one, requests))


@pytest.mark.parametrize("plan", list(PLANS))
def test_a_mixed_batch_on_a_small_cache_equals_each_request_alone(plan, server_factory, text_model, stubs,
                                                                 mix_reference):
    directory, _ = text_model
    requests, expected = mix_reference
    server = server_factory(["--model", str(directory), *PLANS[plan], *SMALL_CACHE])
    outs = _run_at_their_times(stubs, server.channel, requests)
    for r, want, got in zip(requests, expected, outs):
        assert got["finish"] == "LENGTH", (len(r["prompt"]), got)
        assert got["ids"] == want, f"prompt of {len(r['prompt'])} tokens"
    url = server.metrics_url
    # Some were preempted and recomputed, some found SHARED cached, and all are still equal. (/metrics
    # samples the engine every 250 ms.)
    assert GH.wait_metric(url, "strata_preemptions_total", lambda v: v > 0) > 0
    assert GH.wait_metric(url, "strata_prefix_cache_hits_total", lambda v: v >= 32) >= 32
    assert GH.wait_metric(url, "strata_requests_running", lambda v: v == 0) == 0
    for device in {"1-stage": ["cpu"], "2-stage": ["0", "1"], "3-stage": ["0", "1", "2"]}[plan]:
        assert GH.metric(url, f'strata_kv_cache_blocks{{device="{device}",state="used"}}') == 0
        free = GH.metric(url, f'strata_kv_cache_blocks{{device="{device}",state="free"}}')
        cached = GH.metric(url, f'strata_kv_cache_blocks{{device="{device}",state="cached"}}')
        assert free + cached == 24
        assert GH.metric(url, f'strata_kv_cache_capacity_tokens{{device="{device}"}}') == 384
        assert GH.metric(url, f'strata_kv_cache_usage_ratio{{device="{device}"}}') == 0


@pytest.fixture(scope="module")
def small_cache_server(server_factory, text_model):
    directory, _ = text_model
    return server_factory(["--model", str(directory), *GH.TWO_STAGE_FLAGS, *SMALL_CACHE, "--micro-batches", "2"])


def test_a_prefix_cache_hit_gives_the_tokens_of_a_miss(small_cache_server, stubs, text_model):
    directory, _ = text_model
    url = small_cache_server.metrics_url
    prompt = [(k * 13 + 5) % 320 for k in range(100)]
    hits = GH.metric(url, "strata_prefix_cache_hits_total", default=0)
    miss = GH.generate(stubs, small_cache_server.channel, prompt_ids=prompt, max_new_tokens=12, top_logprobs=2)
    hit = GH.generate(stubs, small_cache_server.channel, prompt_ids=prompt, max_new_tokens=12, top_logprobs=2)
    # The second found the first's six full prompt blocks (96 tokens) and fed only the last 4. (/metrics
    # samples the engine every 250 ms.)
    assert GH.wait_metric(url, "strata_prefix_cache_hits_total", lambda v: v - hits >= 96) - hits == 96
    assert hit["ids"] == miss["ids"]
    assert hit["logprobs"] == pytest.approx(miss["logprobs"], abs=1e-5)
    assert hit["ids"] == RH.reference_generate(directory, [prompt], 12)[0]["ids"]


def test_no_block_stays_in_use_after_a_cancellation_storm(small_cache_server, stubs):
    rng = random.Random(5)
    calls = []
    for i in range(60):
        prompt = [rng.randrange(320) for _ in range(rng.randint(1, 120))]
        call = stubs.strata_grpc.InferenceServiceStub(small_cache_server.channel).Generate(
            stubs.strata.GenerateRequest(prompt_ids=prompt, max_new_tokens=rng.randint(5, 60)), timeout=120)
        calls.append(call)

    def cancel_later(call, delay):
        time.sleep(delay)
        call.cancel()

    threads = [threading.Thread(target=cancel_later, args=(c, rng.uniform(0, 1.5))) for c in calls[::2]]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for call in calls[1::2]:  # the others run to their end
        assert [r for r in call][-1].finish_reason == stubs.strata.GenerateResponse.FinishReason.Value("LENGTH")
    url = small_cache_server.metrics_url
    assert GH.wait_metric(url, "strata_requests_running", lambda v: v == 0) == 0
    assert GH.wait_metric(url, "strata_requests_waiting", lambda v: v == 0) == 0
    for device in ("0", "1"):
        assert GH.wait_metric(url, f'strata_kv_cache_blocks{{device="{device}",state="used"}}', lambda v: v == 0) == 0


def test_a_request_larger_than_the_whole_cache_is_refused(server_factory, text_model, stubs):
    directory, _ = text_model
    server = server_factory(["--model", str(directory), "--kv-cache-tokens", "64", "--max-context", "512"])
    code, details = GH.status_of(lambda: GH.generate(stubs, server.channel, prompt_ids=list(range(60)),
                                                     max_new_tokens=10))
    assert code == grpc.StatusCode.INVALID_ARGUMENT, (code, details)
    assert details == ("prompt_ids: 60 tokens and max_new_tokens 10 need 69 positions of KV cache, more than the "
                       "whole cache holds (64 tokens, --kv-cache-tokens)"), details
    # What fits runs.
    assert GH.generate(stubs, server.channel, prompt_ids=list(range(60)), max_new_tokens=5)["finish"] == "LENGTH"


def test_device_map_reports_the_kv_capacity_in_tokens(small_cache_server, stubs):
    stub = stubs.strata_grpc.InferenceServiceStub(small_cache_server.channel)
    response = stub.GetDeviceMap(stubs.strata.GetDeviceMapRequest(), timeout=10)
    assert response.kv_cache_blocks == 24
    assert response.kv_block_tokens == 16
    assert response.kv_cache_tokens == 384
    capacity = {d.device: d.kv_cache_capacity_tokens for d in response.devices}
    assert capacity["0"] == 384 and capacity["1"] == 384, capacity
    assert capacity.get("cpu", 0) == 0


def test_without_the_prefix_cache_nothing_is_looked_up(server_factory, text_model, stubs):
    directory, _ = text_model
    server = server_factory(["--model", str(directory), *SMALL_CACHE, "--prefix-cache=false"])
    prompt = [(k * 13 + 5) % 320 for k in range(40)]
    first = GH.generate(stubs, server.channel, prompt_ids=prompt, max_new_tokens=6)
    second = GH.generate(stubs, server.channel, prompt_ids=prompt, max_new_tokens=6)
    assert first["ids"] == second["ids"]
    assert GH.metric(server.metrics_url, "strata_prefix_cache_queries_total") == 0
    assert GH.metric(server.metrics_url, "strata_prefix_cache_hits_total") == 0
    assert GH.metric(server.metrics_url, 'strata_kv_cache_blocks{device="cpu",state="cached"}') == 0


@pytest.mark.parametrize("flags, message", [
    (["--kv-cache-tokens", "99999999999999"], "--kv-cache-tokens: 6250000000000 blocks of 16 tokens, more than the "
                                              "2^30 a KV pool may have"),
    (["--kv-block-tokens", "0"], "--kv-block-tokens"),
])
def test_a_kv_pool_that_cannot_be_is_refused_at_start(flags, message, server_bin, text_model):
    import subprocess

    directory, _ = text_model
    done = subprocess.run([str(server_bin), "--model", str(directory), "--listen", "127.0.0.1:0", *flags],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr
    assert message in done.stderr, done.stderr
