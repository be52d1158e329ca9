"""LibTorch's CUDA half (libtorch_cuda.so, cuBLAS(Lt), cuDNN, NCCL, ...) is loaded at run time, only where an
NVIDIA driver is (runtime/executor/cuda_loader.h): a CPU-only strata-server does not carry its ~250 MB of
resident pages. STRATA_CUDA=1 loads it regardless, and it then registers with LibTorch as when linked;
STRATA_CUDA=0 never loads it. The answers are the same either way."""

from __future__ import annotations

import ctypes
import os
import subprocess

import pytest

import generate_helpers as GH
import integration_helpers as IH
import runtime_helpers as RH


def driver_present() -> bool:
    try:
        ctypes.CDLL("libcuda.so.1")
        return True
    except OSError:
        return False


def mapped_libraries(pid: int) -> set[str]:
    with open(f"/proc/{pid}/maps") as maps:
        return {os.path.basename(line.split()[-1]) for line in maps if "/" in line}


def serve(server_bin, stubs, tmp_path, directory, strata_cuda: str | None):
    env = dict(os.environ)
    env.pop("STRATA_CUDA", None)
    if strata_cuda is not None:
        env["STRATA_CUDA"] = strata_cuda
    server = IH.ServerProcess(server_bin, ["--model", str(directory), "--device-map", '{"": "cpu"}'],
                              tmp_path / f"cuda-{strata_cuda}", env=env)
    return server.start(stubs)


def test_the_cuda_half_loads_only_where_a_driver_is(server_bin, stubs, text_model, tmp_path):
    directory, _ = text_model
    answers = {}
    for strata_cuda in (None, "1", "0"):
        server = serve(server_bin, stubs, tmp_path, directory, strata_cuda)
        try:
            libraries = mapped_libraries(server.process.pid)
            assert "libtorch_cpu.so" in libraries
            loaded = "libtorch_cuda.so" in libraries
            expected = {None: driver_present(), "1": True, "0": False}[strata_cuda]
            assert loaded == expected, (strata_cuda, sorted(lib for lib in libraries if "cu" in lib))
            if not loaded:
                assert not any(lib.startswith(("libcublas", "libcudnn", "libnccl")) for lib in libraries)
            answers[strata_cuda] = GH.generate(stubs, server.channel, prompt_ids=[5, 6, 7], max_new_tokens=6)["ids"]
        finally:
            assert server.stop() == 0
    assert answers[None] == answers["1"] == answers["0"] and len(answers[None]) == 6


def test_a_gpu_plan_without_a_device_says_what_cuda_did(text_model):
    """Without a driver the error names it; with STRATA_CUDA=1 the CUDA half is loaded and still finds no
    device (it asks the driver, as when linked)."""
    if driver_present():
        pytest.skip("this host has an NVIDIA driver: the GPU tests cover it")
    directory, _ = text_model
    for strata_cuda, says in ((None, "CUDA: not loaded: no NVIDIA driver (libcuda.so.1"),
                              ("1", "CUDA: loaded libtorch_cuda.so")):
        env = {k: v for k, v in os.environ.items() if k != "STRATA_CUDA"}
        if strata_cuda is not None:
            env["STRATA_CUDA"] = strata_cuda
        proc = subprocess.run([str(RH.generate_path()), "--model", str(directory), "--device-map", '{"": 0}',
                               "--prompt-ids", "5,6", "--max-new-tokens", "2"],
                              capture_output=True, text=True, timeout=120, env=env)
        assert proc.returncode != 0
        assert "device 0 of the plan runs on cuda:0, but no CUDA device is visible" in proc.stderr, proc.stderr
        assert says in proc.stderr, proc.stderr
