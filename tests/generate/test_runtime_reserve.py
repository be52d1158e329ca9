"""--runtime-reserve (issue 25, item 4) through the binaries: the GPU memory kept for what serving allocates besides
weights and KV cache, shown in GetDeviceMap, /metrics and strata-plan's JSON; auto (the serving default) sized from
the serving limits, none for plan GPUs that run on the CPU; bad values refused with exit 2 naming the flag. The
terms themselves are unit-tested in tests/planner/runtime_reserve_test.cc and measured against the runtime's
allocations in tests/runtime/runtime_reserve_test.cc."""

from __future__ import annotations

import json
import subprocess

import pytest

import generate_helpers as GH
import integration_helpers as IH

MIB = 1 << 20


@pytest.fixture(scope="module")
def plan_bin():
    return IH.require_binary(IH.PLAN_BIN)


def _devices(stubs, server) -> dict:
    stub = stubs.strata_grpc.InferenceServiceStub(server.channel)
    reply = stub.GetDeviceMap(stubs.strata.GetDeviceMapRequest(), timeout=10)
    return {d.device: d for d in reply.devices}


def test_a_fixed_reserve_is_kept_on_every_gpu_that_runs_a_stage(server_factory, text_model, stubs):
    directory, _ = text_model
    server = server_factory(["--model", str(directory), *GH.TWO_STAGE_FLAGS, "--runtime-reserve", "3MiB"])
    devices = _devices(stubs, server)
    for gpu in ("0", "1"):
        assert devices[gpu].runtime_reserve_bytes == 3 * MIB, devices[gpu]
        assert devices[gpu].runtime_reserve == "3.0 MiB (fixed 3.0 MiB)", devices[gpu].runtime_reserve
        # The budget the placement ran with is the one given less the reserve and the KV cache.
        assert devices[gpu].budget_bytes == (1 << 30) - 3 * MIB - devices[gpu].kv_cache_bytes
        assert GH.metric(server.metrics_url, f'strata_device_runtime_reserve_bytes{{device="{gpu}"}}') == 3 * MIB
    assert devices["cpu"].runtime_reserve_bytes == 0
    assert GH.generate(stubs, server.channel, prompt_ids=[1, 2, 3], max_new_tokens=4)["finish"] == "LENGTH"


def test_auto_keeps_nothing_for_plan_gpus_that_run_on_the_cpu(two_stage_server, stubs):
    devices = _devices(stubs, two_stage_server)
    assert all(d.runtime_reserve_bytes == 0 and d.runtime_reserve == "" for d in devices.values()), devices
    assert GH.metric(two_stage_server.metrics_url, 'strata_device_runtime_reserve_bytes{device="0"}') == 0


def test_strata_plan_shows_a_fixed_reserve_and_refuses_auto(plan_bin, text_model):
    directory, _ = text_model
    flags = ["--model", str(directory), "--max-memory", "0=200MiB,1=200MiB,cpu=1GiB", "--device-map", "sequential"]
    plain = IH.run_plan(plan_bin, flags)
    kept = IH.run_plan(plan_bin, flags + ["--runtime-reserve", "150MiB"])
    assert [d["runtime_reserve_bytes"] for d in plain["devices"]] == [0, 0, 0]
    # Sequential fills GPU 0 alone: the reserve is kept there, and its budget is what is left.
    gpu0 = kept["devices"][0]
    assert gpu0["runtime_reserve_bytes"] == 150 * MIB and gpu0["budget_bytes"] == 50 * MIB, gpu0
    assert kept["device_map"] == plain["device_map"]
    table = subprocess.run([str(plan_bin), *flags, "--runtime-reserve", "150MiB"], capture_output=True, text=True,
                           timeout=60)
    assert table.returncode == 0 and "runtime" in table.stdout.splitlines()[1], table.stdout
    for value, says in [("auto", "auto is sized from serving limits"), ("lots", '"lots" is not auto, none or a size'),
                        ("-2GiB", "--runtime-reserve")]:
        done = subprocess.run([str(plan_bin), *flags, f"--runtime-reserve={value}"], capture_output=True, text=True,
                              timeout=60)
        assert done.returncode == 2 and "--runtime-reserve" in done.stderr and says in done.stderr, done.stderr


def test_the_server_refuses_a_bad_reserve_naming_the_flag(server_bin, text_model):
    directory, _ = text_model
    done = subprocess.run([str(server_bin), "--model", str(directory), "--runtime-reserve", "half"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done.stderr
    assert '--runtime-reserve: "half" is not auto, none or a size' in done.stderr, done.stderr


def test_strata_plan_json_is_unchanged_without_the_flag(plan_bin, text_model):
    """Parity suites compare strata-plan with transformers: without --runtime-reserve the budgets are theirs."""
    directory, _ = text_model
    flags = ["--model", str(directory), "--max-memory", "0=300KB,1=300KB,cpu=10MB"]
    plan = IH.run_plan(plan_bin, flags)
    explicit = IH.run_plan(plan_bin, flags + ["--runtime-reserve", "none"])
    assert plan == explicit
    assert json.dumps(plan).count('"runtime_reserve_bytes": 0') == len(plan["devices"])
