"""The image built from ./Dockerfile, run with podman on a tiny checkpoint mounted read-only, checked over
its published ports: health, Generate parity with transformers, /metrics under promtool, and
`podman stop` while streams are in flight (graceful drain, exit 0)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import threading
import time
import urllib.request

import grpc
import pytest

import generate_helpers as GH
import image_helpers as IMG
import runtime_helpers as RH

PROMPTS = [[1, 2, 3, 4, 5], [7, 11], [300, 299, 12, 0, 19, 42, 5]]
NEW_TOKENS = 12


def test_image_runs_strata_as_non_root_under_an_init(strata_image):
    config = json.loads(IMG.podman("image", "inspect", strata_image).stdout)[0]["Config"]
    assert config["Entrypoint"] == ["catatonit", "--", "strata-server"]
    assert config["Cmd"] == IMG.IMAGE_CMD
    assert set(config["ExposedPorts"]) == {"50051/tcp", "8000/tcp", "9464/tcp"}
    assert config["User"] == "10001:10001"
    built = IMG.build_result()
    size = IMG.image_size_bytes(strata_image)
    print(f"image {strata_image}: {size / 2**30:.2f} GiB"
          + (f", built in {built['seconds']:.0f}s" if built else ""))
    # The torch wheel's CUDA libraries dominate; a runtime stage that leaked the build (compiler, Python,
    # torch's headers, the whole wheel) would be far larger.
    assert size < 5 * 2**30, f"the image is {size / 2**30:.2f} GiB"


def test_health_is_serving_on_the_published_port(container, image_stubs):
    health = image_stubs.health_grpc.HealthStub(container.channel)
    for service in ("", "strata.v1.InferenceService"):
        reply = health.Check(image_stubs.health.HealthCheckRequest(service=service), timeout=10)
        assert reply.status == image_stubs.health.HealthCheckResponse.SERVING, service


def test_generate_greedy_equals_transformers(container, image_stubs, image_model):
    directory, tok = image_model
    expected = RH.reference_generate(directory, PROMPTS, NEW_TOKENS)
    for prompt, want in zip(PROMPTS, expected):
        got = GH.generate(image_stubs, container.channel, prompt_ids=prompt, max_new_tokens=NEW_TOKENS)
        assert got["ids"] == want["ids"], f"prompt {prompt}"
        assert got["finish"] == "LENGTH"
    # A text prompt goes through the image's tokenizer (tokenizer.json on the read-only mount); with its
    # special tokens (<bos>), as tokenizers' encode() adds them.
    text = "Hello, world! The quick brown fox"
    ids = tok.encode(text).ids
    want = RH.reference_generate(directory, [ids], NEW_TOKENS)[0]
    got = GH.generate(image_stubs, container.channel, prompt=text, add_special_tokens=True,
                      max_new_tokens=NEW_TOKENS)
    assert got["ids"] == want["ids"], f"prompt {text!r} -> {ids}"
    assert got["usage"] == (len(ids), NEW_TOKENS)


def test_metrics_pass_promtool(container, image_stubs):
    GH.generate(image_stubs, container.channel, prompt_ids=[1, 2, 3], max_new_tokens=4)
    text = urllib.request.urlopen(container.metrics_url, timeout=10).read()
    assert b"strata_requests_total" in text
    promtool = shutil.which("promtool")
    assert promtool, "promtool is missing: scripts/setup.sh installs Debian's prometheus package"
    done = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True, timeout=60)
    assert done.returncode == 0 and not done.stdout.strip() and not done.stderr.strip(), \
        f"promtool check metrics ({done.returncode}):\n{done.stdout.decode()}{done.stderr.decode()}"


def _has_drain(image: str) -> bool:
    """Whether the image's strata-server drains on SIGTERM (issue 9 part 3 adds --drain-timeout)."""
    done = IMG.podman("run", "--rm", "--entrypoint", "strata-server", image, "--help", check=False)
    return "--drain-timeout" in done.stdout + done.stderr


def test_podman_stop_lets_in_flight_streams_finish(strata_image, image_stubs, image_model, serve_args):
    drain = _has_drain(strata_image)
    c = IMG.Container(strata_image, image_model[0],
                      [*serve_args, "--max-new-tokens", "2000"]).start(image_stubs)
    try:
        stub = image_stubs.strata_grpc.InferenceServiceStub(c.channel)
        streams = [{"tokens": 0, "finish": None, "code": None, "last": 0.0, "first": threading.Event()}
                   for _ in range(4)]

        def read(i: int) -> None:
            s = streams[i]
            request = image_stubs.strata.GenerateRequest(prompt_ids=[1 + i, 2, 3], max_new_tokens=2000)
            try:
                for response in stub.Generate(request, timeout=120):
                    s["tokens"] += len(response.token_ids)
                    s["last"] = time.monotonic()
                    s["first"].set()
                    if response.finish_reason:
                        s["finish"] = image_stubs.strata.GenerateResponse.FinishReason.Name(response.finish_reason)
            except grpc.RpcError as e:
                s["code"] = e.code().name
            finally:
                s["first"].set()

        threads = [threading.Thread(target=read, args=(i,)) for i in range(len(streams))]
        for t in threads:
            t.start()
        for s in streams:
            assert s["first"].wait(60)
        stop_sent = time.monotonic()
        exit_code = c.stop(timeout_s=30)  # SIGTERM to catatonit, forwarded to strata-server
        stopped_after = time.monotonic() - stop_sent
        for t in threads:
            t.join(60)
        summary = [{k: s[k] for k in ("tokens", "finish", "code")} for s in streams]
        print(f"podman stop took {stopped_after:.1f}s; streams: {summary}")
        assert exit_code == 0, f"exit code {exit_code}\n{c.logs()}"
        assert stopped_after < 30, "strata-server did not exit before podman's SIGKILL"
        # The streams were in flight: each still received tokens after the SIGTERM was sent.
        in_flight = sum(s["last"] > stop_sent for s in streams)
        if not drain:
            pytest.xfail("graceful drain (issue 9 part 3, --drain-timeout) is not in this strata-server: "
                         f"SIGTERM ends in-flight streams ({summary})")
        assert in_flight == len(streams), f"only {in_flight} streams were still running at SIGTERM: {summary}"
        assert all(s["finish"] == "LENGTH" and s["tokens"] == 2000 and s["code"] is None for s in streams), \
            f"{summary}\n{c.logs()}"
    finally:
        c.remove()


def test_a_failed_build_s_working_folders_are_removed_before_the_next(tmp_path):
    old = time.time() - IMG.BUILD_TIMEOUT_S - 60
    for name in ("buildah43481171", "storage3550790372"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "1").write_bytes(b"blob")
        os.utime(tmp_path / name, (old, old))
    (tmp_path / "buildah999").mkdir()  # a build under way: recent
    (tmp_path / "storage-notes").mkdir()  # not podman's
    os.utime(tmp_path / "storage-notes", (old, old))
    IMG.remove_stale_build_dirs(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["buildah999", "storage-notes"]
