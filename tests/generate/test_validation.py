"""Every Generate request the server refuses, with its status code and the field named: validation at the
edge (INVALID_ARGUMENT), a full queue (RESOURCE_EXHAUSTED), a model still loading (UNAVAILABLE) and a
server that only plans (FAILED_PRECONDITION)."""

from __future__ import annotations

import json
import math
import time

import grpc
import pytest

import generate_helpers as GH
import integration_helpers as IH

GENERATE = "/strata.v1.InferenceService/Generate"

# (case, request fields, the field the message must start with)
INVALID = [
    ("empty prompt", dict(max_new_tokens=4), "prompt"),
    ("prompt and prompt_ids", dict(prompt="Hello", prompt_ids=[1, 2], max_new_tokens=4), "prompt"),
    ("prompt too long", dict(prompt_ids=[7] * 1000, max_new_tokens=100), "prompt_ids"),
    ("text prompt too long", dict(prompt="Hello, world! " * 400, max_new_tokens=4), "prompt"),
    ("token id >= vocab", dict(prompt_ids=[1, 320], max_new_tokens=4), "prompt_ids[1]"),
    ("negative token id", dict(prompt_ids=[-1], max_new_tokens=4), "prompt_ids[0]"),
    ("temperature < 0", dict(prompt_ids=[1], max_new_tokens=4, temperature=-0.5), "temperature"),
    ("top_p 0", dict(prompt_ids=[1], max_new_tokens=4, top_p=0.0), "top_p"),
    ("top_p > 1", dict(prompt_ids=[1], max_new_tokens=4, top_p=1.5), "top_p"),
    ("max_new_tokens 0", dict(prompt_ids=[1]), "max_new_tokens"),
    ("max_new_tokens above the limit", dict(prompt_ids=[1], max_new_tokens=1001), "max_new_tokens"),
    ("too many stop strings", dict(prompt_ids=[1], max_new_tokens=4, stop=["x"] * 17), "stop"),
    ("empty stop string", dict(prompt_ids=[1], max_new_tokens=4, stop=["ok", ""]), "stop[1]"),
    ("repetition_penalty 0", dict(prompt_ids=[1], max_new_tokens=4, repetition_penalty=0.0), "repetition_penalty"),
    ("top_logprobs above the limit", dict(prompt_ids=[1], max_new_tokens=4, top_logprobs=21), "top_logprobs"),
    ("request_id above 256 bytes", dict(prompt_ids=[1], max_new_tokens=4, request_id="r" * 257), "request_id"),
]


@pytest.mark.parametrize("case,fields,field", INVALID, ids=[c[0] for c in INVALID])
def test_invalid_request_names_the_field(stubs, two_stage_server, case, fields, field):
    code, details = GH.status_of(lambda: GH.generate(stubs, two_stage_server.channel, **fields))
    assert code == grpc.StatusCode.INVALID_ARGUMENT, (case, details)
    assert details.startswith(f"{field}: "), (case, details)


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte, n = n & 0x7F, n >> 7
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _string_field(number: int, raw: bytes) -> bytes:
    return _varint(number << 3 | 2) + _varint(len(raw)) + raw


@pytest.mark.parametrize("wire,field", [
    (_string_field(1, b"Hello \xff\xfe world") + _varint(3 << 3) + _varint(4), "prompt"),
    (_varint(2 << 3) + _varint(5) + _varint(3 << 3) + _varint(4) + _string_field(9, b"fine")
     + _string_field(9, b"bad \xc3"), "stop[1]"),
], ids=["prompt", "stop"])
def test_invalid_utf8_names_the_field(two_stage_server, wire, field):
    # Python's protobuf cannot build such a message (str is always valid Unicode): the bytes are sent raw.
    call = two_stage_server.channel.unary_stream(GENERATE, request_serializer=lambda b: b,
                                                 response_deserializer=lambda b: b)
    code, details = GH.status_of(lambda: list(call(wire, timeout=10)))
    assert code == grpc.StatusCode.INVALID_ARGUMENT, details
    assert details.startswith(f"{field}: invalid UTF-8"), details


def test_invalid_utf8_is_logged_once_a_minute(server_factory, text_model):
    # libprotobuf writes an ERROR line for each string field with invalid UTF-8 it parses: rate-limited.
    directory, _ = text_model
    server = server_factory(["--model", str(directory), *GH.TWO_STAGE_FLAGS])
    call = server.channel.unary_stream(GENERATE, request_serializer=lambda b: b, response_deserializer=lambda b: b)
    wire = _string_field(1, b"Hello \xff world") + _varint(3 << 3) + _varint(4)
    for _ in range(50):
        code, _details = GH.status_of(lambda: list(call(wire, timeout=10)))
        assert code == grpc.StatusCode.INVALID_ARGUMENT
    lines = [line for line in server.output().splitlines() if "invalid UTF-8" in line and "libprotobuf" in line]
    assert len(lines) == 1, lines


def test_full_queue_is_resource_exhausted(stubs, server_factory, text_model):
    directory, _ = text_model
    server = server_factory(["--model", str(directory), *GH.TWO_STAGE_FLAGS, "--max-batch", "1",
                             "--max-queue", "1", "--max-context", "1024"])
    stub = stubs.strata_grpc.InferenceServiceStub(server.channel)
    long = stubs.strata.GenerateRequest(prompt_ids=[1, 2, 3], max_new_tokens=1000, temperature=1.0)
    running = stub.Generate(long, timeout=60)
    next(running)  # admitted: it holds the only slot
    waiting = stub.Generate(long, timeout=60)  # the one request the queue holds
    deadline = time.monotonic() + 10
    while GH.metric(server.metrics_url, "strata_queue_depth") < 1:
        assert time.monotonic() < deadline, "the second request never queued"
        time.sleep(0.005)
    code, details = GH.status_of(lambda: GH.generate(stubs, server.channel, prompt_ids=[1], max_new_tokens=2))
    running.cancel()
    waiting.cancel()
    assert code == grpc.StatusCode.RESOURCE_EXHAUSTED, details
    assert "--max-queue 1" in details


def test_unavailable_and_not_serving_until_loaded(stubs, server_bin, tmp_path):
    server = GH.start_loading_server(server_bin, tmp_path)
    deadline = time.monotonic() + 60
    try:
        channel = grpc.insecure_channel(server.grpc_address)
        health = stubs.health_grpc.HealthStub(channel)
        check = stubs.health.HealthCheckRequest(service="strata.v1.InferenceService")
        # Until the load ends: health NOT_SERVING and Generate UNAVAILABLE; a Generate that succeeds ends it.
        seen_not_serving, seen_unavailable = False, False
        while True:
            assert server.process.poll() is None and time.monotonic() < deadline, server.output()
            try:
                if health.Check(check, timeout=5).status == stubs.health.HealthCheckResponse.NOT_SERVING:
                    seen_not_serving = True
            except grpc.RpcError as e:
                # The instant between the port opening and the server's first status: gRPC's default health
                # service does not know the service yet (NOT_FOUND), which a probe takes as not ready too.
                assert e.code() == grpc.StatusCode.NOT_FOUND, (e.code(), e.details())
            try:
                GH.generate(stubs, channel, prompt_ids=[1], max_new_tokens=1)
                break
            except grpc.RpcError as e:
                assert (e.code(), e.details()) == (grpc.StatusCode.UNAVAILABLE, "the model is still loading")
                seen_unavailable = True
        assert seen_not_serving and seen_unavailable, "the load ended before the port answered"
        assert health.Check(check, timeout=5).status == stubs.health.HealthCheckResponse.SERVING
        got = GH.generate(stubs, channel, prompt_ids=[1, 2], max_new_tokens=2)
        assert got["finish"] == "LENGTH" and len(got["ids"]) == 2
        channel.close()
    finally:
        server.stop()


def test_plan_only_server_refuses_generate(stubs, server_factory, tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(IH.SMALL_LLAMA_CONFIG))
    server = server_factory(["--model", str(tmp_path)])
    code, details = GH.status_of(lambda: GH.generate(stubs, server.channel, prompt_ids=[1], max_new_tokens=2))
    assert code == grpc.StatusCode.FAILED_PRECONDITION, details
    assert "no safetensors weights" in details


def test_start_up_warns_of_a_context_past_training_and_says_how_kv_tokens_were_rounded(server_factory, text_model):
    """--max-context past config.json's max_position_embeddings (512 here) is a start-up WARNING naming both;
    --kv-cache-tokens that is not whole blocks is rounded up, and start-up says so (the binary before said
    neither)."""
    directory, _ = text_model
    server = server_factory(["--model", str(directory), *GH.TWO_STAGE_FLAGS, "--max-context", "100000",
                             "--kv-cache-tokens", "50", "--kv-block-tokens", "16"])
    output = server.output()
    assert ("strata-server: WARNING: --max-context 100000 is more than the 512 positions the model was trained for "
            "(config.json max_position_embeddings)") in output, output
    assert "strata-server: --kv-cache-tokens 50 rounded up to 64: whole blocks of --kv-block-tokens 16" in output
    assert server.stop() == 0


def test_max_context_counts_the_prompt_and_every_new_token(server_factory, text_model, stubs):
    """prompt + max_new_tokens must fit --max-context, as the proto and server/README.md say (the binary
    before let one more through: the last new token is never fed back)."""
    directory, _ = text_model
    server = server_factory(["--model", str(directory), *GH.TWO_STAGE_FLAGS, "--max-context", "32"])
    out = GH.generate(stubs, server.channel, prompt_ids=[5], max_new_tokens=31)
    assert out["finish"] == "LENGTH" and len(out["ids"]) == 31
    code, details = GH.status_of(lambda: GH.generate(stubs, server.channel, prompt_ids=[5], max_new_tokens=32))
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    assert details == "prompt_ids: 1 token + max_new_tokens 32 = 33, more than the server's --max-context 32"
    assert server.stop() == 0


def test_tiny_temperatures_and_penalties_never_emit_an_unsupported_token(two_stage_server, stubs):
    """Temperatures below 1e-5 are greedy; a penalty that overflows the scores takes their argmax. The binary
    before emitted token 0 six times, log-probability about -12, for temperature 1e-39 whatever the seed."""
    prompt = dict(prompt="hi", max_new_tokens=6)
    greedy = GH.generate(stubs, two_stage_server.channel, **prompt)
    for temperature in (1e-39, 1e-38, 1e-30, 9e-6):
        for seed in (1, 2):
            out = GH.generate(stubs, two_stage_server.channel, temperature=temperature, seed=seed, **prompt)
            assert out["ids"] == greedy["ids"], (temperature, seed, out["ids"], greedy["ids"])
    for seed in (1, 2, 3):
        out = GH.generate(stubs, two_stage_server.channel, temperature=1.0, repetition_penalty=1e-40, seed=seed,
                          **prompt)
        assert len(out["ids"]) == 6 and all(math.isfinite(lp) for lp in out["logprobs"]), out
        assert out["ids"] != [0] * 6, out
