"""scripts/gpu-check.sh --dry-run (issue 25, item 8) on this machine: the preflight runs for real and passes
here (what only the GPU machine needs is listed apart), every other step prints what it would run and its time
budget, and the summary (summary.md, summary.json, logs.tar.gz) is written with one row per step; bad arguments exit
2 naming them. What the steps do on a GPU only a GPU machine can show."""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys
import tarfile

REPO = pathlib.Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "gpu-check.sh"
STEPS = ["preflight", "build", "gtest", "parity", "sync", "sanitizer", "plan", "bench", "multi"]


def _run(*args, timeout=120):
    return subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True, timeout=timeout, cwd=REPO)


def test_dry_run_passes_the_preflight_and_prints_every_step(tmp_path):
    done = _run("--dry-run", "--python", sys.executable, str(tmp_path / "out"))
    assert done.returncode == 0, done.stdout + done.stderr
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert [s["step"] for s in summary["steps"]] == STEPS
    assert summary["steps"][0]["result"] == "pass"
    assert all(s["result"] == "dry run" for s in summary["steps"][1:]), summary
    for step in STEPS[1:]:
        assert f"gpu-check: {step} (dry run: would run at most" in done.stdout, step
        assert f"step_{step} ()" in done.stdout, step
    # Only what the steps run is built.
    assert "--target strata-plan strata-generate strata_runtime_tests strata_dequantize_probe" in done.stdout
    table = (tmp_path / "out" / "summary.md").read_text()
    assert "| preflight | pass |" in table and "| multi | dry run |" in table, table
    with tarfile.open(tmp_path / "out" / "logs.tar.gz") as logs:
        preflight = logs.extractfile("./preflight.log").read().decode()
    for module in ("torch", "transformers", "accelerate", "safetensors", "pytest"):
        assert module in preflight, preflight
    assert "preflight: everything the steps need here is here" in preflight, preflight


def test_a_subset_of_steps_runs_the_preflight_first(tmp_path):
    done = _run("--dry-run", "--steps", "sync,multi", "--python", sys.executable, str(tmp_path / "out"))
    assert done.returncode == 0, done.stdout + done.stderr
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert [s["step"] for s in summary["steps"]] == ["preflight", "sync", "multi"]


def test_a_missing_python_module_fails_the_preflight_naming_it(tmp_path):
    # A Python without site-packages (no torch): the preflight names what is missing and the steps that need it.
    python = tmp_path / "python"
    python.write_text(f'#!/bin/sh\nexec "{sys.executable}" -S "$@"\n')
    python.chmod(0o755)
    done = _run("--dry-run", "--python", str(python), str(tmp_path / "out"))
    assert done.returncode == 1, done.stdout + done.stderr
    with tarfile.open(tmp_path / "out" / "logs.tar.gz") as logs:
        preflight = logs.extractfile("./preflight.log").read().decode()
    assert "torch         MISSING" in preflight and "missing: python modules" in preflight, preflight


def test_bad_arguments_exit_2_naming_them(tmp_path):
    for args, says in [(["--steps", "build,warp"], "unknown step 'warp'"), (["--deadline", "soon"], "'soon'"),
                       (["--frobnicate"], "unknown option: --frobnicate"), ([], "OUTDIR is required")]:
        done = _run(*args, *([str(tmp_path / "out")] if args else []))
        assert done.returncode == 2 and says in done.stderr, (args, done.stderr)
