"""The limits an operator sets (server/README.md, "Limits"): each refusal names the limit and is counted
under its code; a client that does not read cannot hold the server's memory; and admission runs off the
service's lock, so a huge prompt being tokenized does not hold up anyone else's request."""

from __future__ import annotations

import concurrent.futures
import random
import threading
import time

import grpc
import pytest

import generate_helpers as GH

RESOURCE_EXHAUSTED = 'strata_requests_total{code="RESOURCE_EXHAUSTED"}'


@pytest.fixture(scope="module")
def limited(server_factory, text_model):
    directory, _ = text_model
    return server_factory(["--model", str(directory), "--max-message-bytes", "65536", "--max-prompt-bytes", "1000",
                           "--max-prompt-tokens", "8"])


def test_message_above_the_limit_is_resource_exhausted_and_counted(limited, stubs):
    before = GH.metric(limited.metrics_url, RESOURCE_EXHAUSTED, default=0)
    ids = list(range(200, 240)) * 1000  # 2 bytes each: about 80 kB on the wire
    code, details = GH.status_of(lambda: GH.generate(stubs, limited.channel, prompt_ids=ids, max_new_tokens=1))
    assert code == grpc.StatusCode.RESOURCE_EXHAUSTED, (code, details)
    assert "more than the server's limit of 65536 bytes" in details, details
    assert GH.metric(limited.metrics_url, RESOURCE_EXHAUSTED) == before + 1
    # Past twice the limit gRPC's transport drops the message itself (same code; no handler sees it).
    code, details = GH.status_of(lambda: GH.generate(stubs, limited.channel, prompt="x" * 200_000, max_new_tokens=1))
    assert code == grpc.StatusCode.RESOURCE_EXHAUSTED, (code, details)


def test_prompt_bytes_are_checked_before_tokenizing(limited, stubs):
    # 1001 bytes: refused by its size (the message names bytes); it would also be too many tokens.
    code, details = GH.status_of(lambda: GH.generate(stubs, limited.channel, prompt="ab " * 333 + "xy",
                                                     max_new_tokens=1))
    assert code == grpc.StatusCode.INVALID_ARGUMENT, (code, details)
    assert details == "prompt: 1001 bytes, more than the server's limit of 1000 bytes", details


def test_prompt_tokens_are_bounded(limited, stubs):
    out = GH.generate(stubs, limited.channel, prompt_ids=list(range(10, 18)), max_new_tokens=1)
    assert out["finish"] == "LENGTH"
    code, details = GH.status_of(lambda: GH.generate(stubs, limited.channel, prompt_ids=list(range(10, 19)),
                                                     max_new_tokens=1))
    assert code == grpc.StatusCode.INVALID_ARGUMENT, (code, details)
    assert details == "prompt_ids: 9 tokens, more than the server's limit of 8 prompt tokens", details


def _hold_streams(stubs, address, count):
    """`count` Generate calls that stay open by construction, not by timing: they run on a channel of their
    own whose HTTP/2 window stays closed (gRPC grows it only as the application reads, and nothing reads),
    and each asks for messages large enough (20 top logprobs) to fill that window at once. A generation may
    end, but its call cannot: its messages and status wait behind the window. Returns (channel, calls)."""
    channel = grpc.insecure_channel(address, options=[("grpc.http2.lookahead_bytes", 1024), ("grpc.http2.bdp_probe", 0)])
    stub = stubs.strata_grpc.InferenceServiceStub(channel)
    calls = [stub.Generate(stubs.strata.GenerateRequest(prompt_ids=[5, 6], max_new_tokens=200, top_logprobs=20),
                           timeout=120) for _ in range(count)]
    return channel, calls


def test_open_streams_above_max_streams_are_resource_exhausted(server_factory, text_model, stubs):
    directory, _ = text_model
    # The held calls' unread messages stay under the stream buffer limit, so neither is cut.
    server = server_factory(["--model", str(directory), "--max-streams", "2", "--max-stream-buffer-bytes", "16777216"])
    channel, calls = _hold_streams(stubs, server.grpc_address, 2)
    assert GH.wait_metric(server.metrics_url, "strata_open_streams", lambda v: v == 2) == 2
    code, details = GH.status_of(lambda: GH.generate(stubs, server.channel, prompt_ids=[5], max_new_tokens=1))
    assert code == grpc.StatusCode.RESOURCE_EXHAUSTED, (code, details)
    assert details == "2 Generate calls are open, the server's limit is 2", details
    assert GH.metric(server.metrics_url, RESOURCE_EXHAUSTED) == 1
    for call in calls:
        call.cancel()
    channel.close()
    assert GH.wait_metric(server.metrics_url, "strata_open_streams", lambda v: v == 0) == 0
    out = GH.generate(stubs, server.channel, prompt_ids=[5], max_new_tokens=1)
    assert out["finish"] == "LENGTH"


def test_streams_per_connection_wait_in_the_client(server_factory, text_model, stubs):
    directory, _ = text_model
    server = server_factory(["--model", str(directory), "--max-streams-per-connection", "2",
                             "--max-stream-buffer-bytes", "16777216"])
    # Six calls on one HTTP/2 connection that nobody reads yet: the server lets two in, and those two stay
    # open (their messages wait behind the closed window), so the other four can only be waiting in the client.
    channel, calls = _hold_streams(stubs, server.grpc_address, 6)
    assert GH.wait_metric(server.metrics_url, "strata_open_streams", lambda v: v == 2) == 2
    seen = []
    stop = threading.Event()

    def watch():
        while not stop.is_set():
            seen.append(GH.metric(server.metrics_url, "strata_open_streams", default=0))
            time.sleep(0.02)

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        time.sleep(0.3)  # the four waiting calls get a chance to be let in (they must not be)
        with concurrent.futures.ThreadPoolExecutor(6) as pool:
            outs = list(pool.map(lambda call: [r for r in call][-1].finish_reason, calls))
    finally:
        stop.set()
        watcher.join()
        channel.close()
    names = [stubs.strata.GenerateResponse.FinishReason.Name(o) for o in outs]
    assert names == ["LENGTH"] * 6  # every call was served, none refused
    assert max(seen) == 2, f"open streams seen: {sorted(set(seen))}"
    assert GH.metric(server.metrics_url, RESOURCE_EXHAUSTED, default=0) == 0


def test_client_that_does_not_read_is_cut_at_the_stream_buffer_limit(server_factory, text_model, stubs):
    directory, _ = text_model
    server = server_factory(["--model", str(directory), "--max-stream-buffer-bytes", "4096"])
    # A client whose HTTP/2 window stays closed: gRPC grows it only as the application reads, and it
    # reads one message.
    channel = grpc.insecure_channel(server.grpc_address,
                                    options=[("grpc.http2.lookahead_bytes", 1024), ("grpc.http2.bdp_probe", 0)])
    stub = stubs.strata_grpc.InferenceServiceStub(channel)
    call = stub.Generate(stubs.strata.GenerateRequest(prompt_ids=[5, 6], max_new_tokens=2000, top_logprobs=20),
                         timeout=120)
    next(call)
    # The generation stops (its KV slot is free) and the call ends, counted RESOURCE_EXHAUSTED.
    assert GH.wait_metric(server.metrics_url, RESOURCE_EXHAUSTED, lambda v: v == 1) == 1
    assert GH.wait_metric(server.metrics_url, "strata_active_sequences", lambda v: v == 0) == 0
    assert GH.wait_metric(server.metrics_url, "strata_open_streams", lambda v: v == 0) == 0
    # The write the client never read cannot carry a status: the call was cancelled.
    with pytest.raises(grpc.RpcError) as error:
        for _ in call:
            pass
    assert error.value.code() == grpc.StatusCode.CANCELLED
    channel.close()
    # A client that reads gets all of the same stream. Without the 20 alternatives per token (about 250 bytes
    # each, so 4 KiB is 16 tokens: a Python client's pause of 8 ms at 2,000 tokens/s overflowed it in 1 of 3
    # idle runs), the buffer holds about 170 tokens of a reader's pause.
    out = GH.generate(stubs, server.channel, prompt_ids=[5, 6], max_new_tokens=2000)
    assert out["finish"] == "LENGTH" and len(out["ids"]) == 2000


def test_huge_prompt_being_tokenized_does_not_hold_up_a_small_request(server_factory, text_model, stubs):
    directory, _ = text_model
    # One intra-op thread: on a loaded 2-core host an OpenMP pool's barriers, not admission, would decide.
    server = server_factory(["--model", str(directory), "--max-message-bytes", str(8 << 20),
                             "--max-prompt-bytes", str(8 << 20), "--intra-op-threads", "1"])
    words = ["the", "quick", "brown", "fox", "jumps", "over", "lazy", "dog", "hello", "world"]
    rng = random.Random(0)
    huge = " ".join(rng.choice(words) for _ in range(800_000))[: 4 << 20]  # 4 MiB of text

    def small():
        start = time.monotonic()
        GH.generate(stubs, server.channel, prompt_ids=[5, 6, 7], max_new_tokens=1)
        return time.monotonic() - start

    alone = min(small() for _ in range(3))
    done = {}

    def big():
        GH.status_of(lambda: GH.generate(stubs, server.channel, prompt=huge, max_new_tokens=1))
        done["big"] = time.monotonic()

    thread = threading.Thread(target=big)
    started = time.monotonic()
    thread.start()
    time.sleep(0.1)  # the 4 MiB request is being tokenized
    during = small()
    done["small"] = time.monotonic()
    thread.join()
    big_s = done["big"] - started
    print(f"small request alone {alone * 1000:.1f} ms, during the huge prompt's tokenization {during * 1000:.1f} ms; "
          f"huge prompt refused after {big_s:.2f} s")
    # The small request finished while the huge one was still being tokenized: it did not wait for it.
    assert done["small"] < done["big"], (during, big_s)


def test_a_flood_of_large_prompts_does_not_hold_up_health_checks_or_small_requests(server_factory, text_model, stubs):
    # 16 clients sending 1 MiB prompts back to back (each tokenized, then refused: too many tokens) keep
    # the admission pool busy; health checks and small requests are served on gRPC's threads meanwhile.
    directory, _ = text_model
    server = server_factory(["--model", str(directory), "--intra-op-threads", "1"])
    words = ["the", "quick", "brown", "fox", "jumps", "over", "lazy", "dog", "hello", "world"]
    rng = random.Random(1)
    large = " ".join(rng.choice(words) for _ in range(250_000))[: 1 << 20]
    stop = threading.Event()
    large_s = []

    def flood():
        channel = grpc.insecure_channel(server.grpc_address)
        while not stop.is_set():
            start = time.monotonic()
            code, _ = GH.status_of(lambda: GH.generate(stubs, channel, prompt=large, max_new_tokens=1))
            assert code == grpc.StatusCode.INVALID_ARGUMENT
            large_s.append(time.monotonic() - start)
        channel.close()

    health = stubs.health_grpc.HealthStub(server.channel)
    check = stubs.health.HealthCheckRequest(service="strata.v1.InferenceService")

    def timed(call):
        start = time.monotonic()
        call()
        return time.monotonic() - start

    clients = [threading.Thread(target=flood) for _ in range(16)]
    for client in clients:
        client.start()
    try:
        time.sleep(1.0)
        health_s = sorted(timed(lambda: health.Check(check, timeout=30)) for _ in range(20))
        small_s = sorted(timed(lambda: GH.generate(stubs, server.channel, prompt_ids=[5, 6], max_new_tokens=1))
                         for _ in range(10))
    finally:
        stop.set()
        for client in clients:
            client.join()
    large_median = sorted(large_s)[len(large_s) // 2]
    print(f"under 16 clients of 1 MiB prompts: large request median {large_median * 1000:.0f} ms, health check "
          f"median {health_s[10] * 1000:.1f} ms, small Generate median {small_s[5] * 1000:.1f} ms")
    # Served beside the flood, not behind it (with tokenization on gRPC's threads, both waited ~1 s).
    assert health_s[10] < large_median / 4, (health_s, large_median)
    assert small_s[5] < large_median / 4, (small_s, large_median)
