"""Each libFuzzer harness runs for a short, bounded time (STRATA_FUZZ_SECONDS, default 30) from its
generated seed corpus: a crash, leak, timeout or out-of-memory input fails the test, which prints the
reproducer and the command that replays it. Longer campaigns: scripts/fuzz.sh NAME SECONDS.

The harnesses build into $STRATA_FUZZ_BUILD_DIR (default build-fuzz/), a clang build separate from
build/ (scripts/test.sh builds it before pytest; here it is built if missing)."""

from __future__ import annotations

import os
import pathlib
import subprocess

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]
FUZZ = REPO / "scripts" / "fuzz.sh"
HARNESSES = ["safetensors_header", "config", "tokenizer", "device_map", "generate_request", "http_request", "http_head",
             "chat_template",
             "tool_calls", "group_message", "group_handshake", "structured"]
SECONDS = int(os.environ.get("STRATA_FUZZ_SECONDS", "30"))


@pytest.fixture(scope="session")
def fuzz_build():
    proc = subprocess.run([str(FUZZ), "build"], cwd=REPO, capture_output=True, text=True, timeout=3600)
    assert proc.returncode == 0, f"scripts/fuzz.sh build failed:\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"


@pytest.mark.parametrize("harness", HARNESSES)
def test_fuzzer_finds_nothing_in_a_short_run(fuzz_build, harness, tmp_path, record):
    # A work dir of its own: each run starts from the seeds alone, so a CI failure is this tree's.
    env = dict(os.environ, STRATA_FUZZ_WORK=str(tmp_path))
    proc = subprocess.run([str(FUZZ), harness, str(SECONDS)], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=SECONDS + 600)
    lines = proc.stdout.strip().splitlines()
    record(harness, lines[-1] if lines else f"fuzz {harness}: no output (exit {proc.returncode})")
    assert proc.returncode == 0, f"fuzz_{harness} found a problem:\n{proc.stdout[-8000:]}\n{proc.stderr[-2000:]}"
    assert "execs/s" in proc.stdout, proc.stdout[-2000:]
