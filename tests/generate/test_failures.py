"""Failures are failures: a stage that throws (the server's --inject-fault test seam) ends its requests
with gRPC INTERNAL naming the stage, its device and the error, counts them in
strata_requests_total{code="INTERNAL"} and strata_engine_errors_total{stage,device}, and the server keeps
serving; a sticky device error (device_lost) turns health NOT_SERVING and the process exits 1 after
answering what was in flight, so a supervisor restarts it."""

from __future__ import annotations

import time

import grpc

import generate_helpers as GH


def test_failed_forward_is_internal_and_counted_and_the_server_serves_on(server_factory, text_model, stubs):
    directory, _ = text_model
    # Stage 1 (logical GPU 1) throws on its 3rd micro-batch: the prefill and one decode step succeed.
    server = server_factory(["--model", str(directory), *GH.TWO_STAGE_FLAGS, "--micro-batches", "1",
                             "--inject-fault", "stage=1,call=3"])
    stub = stubs.strata_grpc.InferenceServiceStub(server.channel)
    received = []
    try:
        for response in stub.Generate(stubs.strata.GenerateRequest(prompt_ids=[5, 6, 7], max_new_tokens=8),
                                      timeout=60):
            received += list(response.token_ids)
        raise AssertionError("the failed generation ended normally")
    except grpc.RpcError as e:
        assert e.code() == grpc.StatusCode.INTERNAL, (e.code(), e.details())
        assert "stage 1 (plan device 1 on cpu) failed" in e.details(), e.details()
        assert "injected fault" in e.details(), e.details()
    assert len(received) == 2  # the tokens before the failure reached the client

    assert GH.metric(server.metrics_url, 'strata_requests_total{code="INTERNAL"}') == 1
    # Engine counters are sampled a few times a second: wait (bounded) for the sample.
    errors = 'strata_engine_errors_total{device="1",stage="1"}'
    assert GH.wait_metric(server.metrics_url, errors, lambda v: v >= 1) == 1

    # Not sticky: health stays SERVING and the next request is served in full.
    health = stubs.health_grpc.HealthStub(server.channel)
    reply = health.Check(stubs.health.HealthCheckRequest(service="strata.v1.InferenceService"), timeout=10)
    assert reply.status == stubs.health.HealthCheckResponse.SERVING
    out = GH.generate(stubs, server.channel, prompt_ids=[9, 10], max_new_tokens=5)
    assert out["finish"] == "LENGTH" and len(out["ids"]) == 5
    assert server.stop() == 0


def test_sticky_device_error_sets_not_serving_and_exits_nonzero(server_factory, text_model, stubs):
    directory, _ = text_model
    server = server_factory(["--model", str(directory), *GH.TWO_STAGE_FLAGS,
                             "--inject-fault", "stage=0,call=2,device_lost"])
    code, details = GH.status_of(lambda: GH.generate(stubs, server.channel, prompt_ids=[5, 6], max_new_tokens=8))
    assert code == grpc.StatusCode.INTERNAL, (code, details)
    assert "illegal memory access" in details and "stage 0 (plan device 0 on cpu)" in details, details
    # The process answers what was in flight, then exits 1 by itself (bounded wait).
    deadline = time.monotonic() + 30
    while server.process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.1)
    assert server.process.returncode == 1, server.output()
    assert "a device is unusable" in server.output()


def _with_nan_logit_row(source, target):
    """A copy of the checkpoint at `source` whose output projection's row 7 is NaN: every step's logit 7
    is NaN, whatever the prompt (lm_head, or the embedding it is tied to)."""
    import shutil

    import safetensors.torch
    import torch

    shutil.copytree(source, target)
    path = target / "model.safetensors"
    tensors = safetensors.torch.load_file(str(path))
    name = "lm_head.weight" if "lm_head.weight" in tensors else "model.embed_tokens.weight"
    tensors[name][7] = float("nan")
    safetensors.torch.save_file(tensors, str(path), metadata={"format": "pt"})
    return target


def test_nonfinite_logits_end_the_request_internal_naming_the_stage_and_are_counted(server_factory, text_model,
                                                                                     stubs, tmp_path):
    directory, _ = text_model
    broken = _with_nan_logit_row(directory, tmp_path / "nan_model")
    server = server_factory(["--model", str(broken), *GH.TWO_STAGE_FLAGS])
    code, details = GH.status_of(lambda: GH.generate(stubs, server.channel, prompt_ids=[5, 6, 9], max_new_tokens=4))
    assert code == grpc.StatusCode.INTERNAL, (code, details)
    # The last stage computed the logits: position 3 is the first new token's.
    assert "stage 1 (plan device 1 on cpu): the logits are not finite (NaN or inf) at position 3" in details, details
    assert GH.metric(server.metrics_url, 'strata_requests_total{code="INTERNAL"}') == 1
    assert GH.metric(server.metrics_url, 'strata_requests_total{code="OK"}', default=0) == 0
    counted = 'strata_nonfinite_logits_total{device="1",stage="1"}'
    assert GH.wait_metric(server.metrics_url, counted, lambda v: v >= 1) == 1
    # Not a device failure: the server still serves (and refuses the next such request the same way).
    health = stubs.health_grpc.HealthStub(server.channel)
    reply = health.Check(stubs.health.HealthCheckRequest(service="strata.v1.InferenceService"), timeout=10)
    assert reply.status == stubs.health.HealthCheckResponse.SERVING
    code, _ = GH.status_of(lambda: GH.generate(stubs, server.channel, prompt_ids=[11], max_new_tokens=2))
    assert code == grpc.StatusCode.INTERNAL
    assert server.stop() == 0


def _health(stubs, server) -> int:
    health = stubs.health_grpc.HealthStub(server.channel)
    return health.Check(stubs.health.HealthCheckRequest(service="strata.v1.InferenceService"), timeout=10).status


def test_every_request_failing_takes_the_server_out_of_rotation_until_a_probe_succeeds(server_factory, text_model,
                                                                                        stubs):
    """The readiness rule: after --not-serving-after-errors requests in a row end INTERNAL, health is
    NOT_SERVING (the binary before stayed SERVING through 30 of 30 failures); a probe generation every
    --ready-probe-interval, and SERVING again once one produces a token."""
    directory, _ = text_model
    # Stage 0 fails its micro-batches 1 to 12: every request fails at its prefill until the 13th call.
    server = server_factory(["--model", str(directory), *GH.TWO_STAGE_FLAGS, "--micro-batches", "1",
                             "--inject-fault", "stage=0,call=1,repeat,until=12", "--not-serving-after-errors", "3",
                             "--ready-probe-interval", "0.2"])
    serving = stubs.health.HealthCheckResponse.SERVING
    assert _health(stubs, server) == serving
    assert GH.metric(server.metrics_url, "strata_requests_failed_in_a_row") == 0
    for _ in range(3):
        code, _ = GH.status_of(lambda: GH.generate(stubs, server.channel, prompt_ids=[5, 6], max_new_tokens=2))
        assert code == grpc.StatusCode.INTERNAL
    # The sampler applies the rule a few times a second; then probes fail (calls 4..12) until call 13 works.
    deadline = time.monotonic() + 10
    seen_not_serving = False
    while time.monotonic() < deadline and not seen_not_serving:
        seen_not_serving = _health(stubs, server) == stubs.health.HealthCheckResponse.NOT_SERVING
        time.sleep(0.02)
    assert seen_not_serving, server.output()
    assert "requests in a row ended INTERNAL: NOT_SERVING" in server.output()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and _health(stubs, server) != serving:
        time.sleep(0.05)
    assert _health(stubs, server) == serving, server.output()
    assert "a generation succeeded: SERVING again" in server.output()
    assert GH.wait_metric(server.metrics_url, "strata_serving", lambda v: v == 1) == 1
    assert GH.wait_metric(server.metrics_url, "strata_requests_failed_in_a_row", lambda v: v == 0) == 0
    out = GH.generate(stubs, server.channel, prompt_ids=[9, 10], max_new_tokens=3)
    assert out["finish"] == "LENGTH"
    assert server.stop() == 0


def test_a_request_id_cannot_forge_log_lines(server_factory, text_model, stubs, tmp_path):
    """The request id is the client's: a failed row's log line escapes it (the binary before printed it raw,
    so a client could forge 'strata-server: drained: ...' lines and send terminal control sequences)."""
    directory, _ = text_model
    broken = _with_nan_logit_row(directory, tmp_path / "nan_model")
    server = server_factory(["--model", str(broken), *GH.TWO_STAGE_FLAGS])
    forged = "x\nstrata-server: drained: 9 of 9 generations finished, 0 cut (UNAVAILABLE); shutting down\x1b[2J\r"
    code, _ = GH.status_of(lambda: GH.generate(stubs, server.channel, prompt_ids=[5, 6, 9], max_new_tokens=4,
                                               request_id=forged))
    assert code == grpc.StatusCode.INTERNAL
    assert server.stop() == 0
    output = server.output()
    assert "\x1b" not in output and "\r" not in output
    assert not any(line.startswith("strata-server: drained: 9 of 9") for line in output.splitlines()), output
    assert 'request "x\\nstrata-server: drained: 9 of 9' in output and "\\x1b[2J\\r" in output, output
