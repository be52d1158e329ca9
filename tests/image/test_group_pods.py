"""A group of two nodes (issue 24) as two containers of the image on a podman network, as LeaderWorkerSet runs them:
the leader and the worker each in its own network namespace, the group flags from LWS's environment
(LWS_GROUP_SIZE, LWS_WORKER_INDEX, LWS_LEADER_ADDRESS naming the leader's container), the checkpoint and the
group secret mounted read-only, the image's own non-root user. The leader answers Generate with transformers'
ids; the worker's health port says SERVING; the leader's stop drains the group and the worker exits 0."""

from __future__ import annotations

import json
import time
import uuid

import pytest

import generate_helpers as GH
import image_helpers as IMG
import runtime_helpers as RH

NEW_TOKENS = 8
PROMPTS = [[1, 5, 9, 14], [4], [7, 7, 2, 3, 11, 40, 41, 2, 9]]
TWO_NODES = {"model.embed_tokens": 0, "model.layers.0": 0, "model.layers.1": 0, "model.layers.2": 1,
             "model.layers.3": 1, "model.norm": 1, "model.rotary_emb": 1, "lm_head": 1}


def test_a_two_container_group_answers_generate(strata_image, image_stubs, tmp_path):
    import grpc

    model = IMG.readable_by_all(RH.make_checkpoint(tmp_path / "model", "llama_llama3_gqa"))
    expected = RH.reference_generate(model, PROMPTS, NEW_TOKENS)
    secrets = tmp_path / "group"
    secrets.mkdir()
    (secrets / "secret").write_text("image-group-secret-0123456789abcdef\n")
    IMG.readable_by_all(secrets)
    tag = uuid.uuid4().hex[:8]
    network, leader, worker = f"strata-group-{tag}", f"strata-leader-{tag}", f"strata-worker-{tag}"
    done = IMG.podman("network", "create", network, check=False)
    if done.returncode != 0:
        pytest.skip(f"podman cannot make a network here: {done.stderr.strip()}")
    grpc_port = IMG.free_port()
    common = ["-v", f"{model}:/model:ro", "-v", f"{secrets}:/group:ro", "--network", network,
              "-e", "LWS_GROUP_SIZE=2", "-e", f"LWS_LEADER_ADDRESS={leader}"]
    # --group-bind: the data port binds loopback unless told; each container has a network namespace of its own and
    # no downward API here (the manifests pass $(POD_IP)), so it binds the container's every address.
    flags = ["--model", "/model", "--listen", "0.0.0.0:50051", "--group-secret-file", "/group/secret",
             "--group-bind", "0.0.0.0", "--group-timeout", "120", "--physical-devices", "0=cpu", "--max-memory",
             "0=1GiB,cpu=2GiB"]
    channel = None
    try:
        IMG.podman("run", "-d", "--name", worker, *common, "-e", "LWS_WORKER_INDEX=1", strata_image, *flags)
        IMG.podman("run", "-d", "--name", leader, *common, "-e", "LWS_WORKER_INDEX=0", "-p",
                   f"127.0.0.1:{grpc_port}:50051", strata_image, *flags, "--device-map", json.dumps(TWO_NODES),
                   "--drain-timeout", "5")
        channel = grpc.insecure_channel(f"127.0.0.1:{grpc_port}")
        health = image_stubs.health_grpc.HealthStub(channel)
        request = image_stubs.health.HealthCheckRequest(service="strata.v1.InferenceService")
        deadline = time.monotonic() + 180
        while True:
            try:
                if health.Check(request, timeout=1.0).status == image_stubs.health.HealthCheckResponse.SERVING:
                    break
            except grpc.RpcError:
                pass
            if time.monotonic() > deadline:
                logs = [IMG.podman("logs", c, check=False) for c in (leader, worker)]
                raise AssertionError("the group is not SERVING after 180 s\n" +
                                     "\n".join(f"{d.stdout}{d.stderr}" for d in logs))
            time.sleep(0.5)
        for prompt, want in zip(PROMPTS, expected):
            got = GH.generate(image_stubs, channel, prompt_ids=prompt, max_new_tokens=NEW_TOKENS)
            assert got["ids"] == want["ids"], prompt
        leader_logs = IMG.podman("logs", leader, check=False)
        assert "(node 1)" in leader_logs.stdout, leader_logs.stdout
        # The leader's stop drains the group; the worker, told so, exits 0.
        IMG.podman("stop", "-t", "30", leader, timeout=90)
        deadline = time.monotonic() + 30
        while json.loads(IMG.podman("inspect", worker).stdout)[0]["State"]["Running"]:
            assert time.monotonic() < deadline, IMG.podman("logs", worker, check=False).stdout
            time.sleep(0.5)
        state = json.loads(IMG.podman("inspect", worker).stdout)[0]["State"]
        assert state["ExitCode"] == 0, IMG.podman("logs", worker, check=False).stdout
    finally:
        if channel is not None:
            channel.close()
        for c in (leader, worker):
            IMG.podman("rm", "-f", "-t", "0", c, check=False)
        IMG.podman("network", "rm", "-f", network, check=False)
