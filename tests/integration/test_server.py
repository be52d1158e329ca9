"""strata-server end to end: a real process on loopback ports, called over real gRPC and HTTP.

The plan the server serves must be exactly what strata-plan --json prints for the same flags (the
planner's own parity with transformers is tested in tests/parity/).
"""

from __future__ import annotations

import json
import re
import os
import signal
import socket
import subprocess
import urllib.request
from pathlib import Path

import grpc
import pytest

from integration_helpers import ServerProcess, free_port, run_plan

SERVICE = "strata.v1.InferenceService"

# Budgets that make balanced_low_0 use both GPUs and the cpu for the small Llama.
TWO_GPU_FLAGS = ["--max-memory", "0=600KB,1=400KB,cpu=10MB"]


def model_flags(llama_dir: Path) -> list[str]:
    return ["--model", str(llama_dir)]


def get_device_map(server: ServerProcess, stubs):
    stub = stubs.strata_grpc.InferenceServiceStub(server.channel)
    return stub.GetDeviceMap(stubs.strata.GetDeviceMapRequest(), timeout=10)


def assert_matches_plan(response, plan: dict) -> None:
    # hf_device_map JSON holds GPU indices as integers; the proto carries every device as a string.
    assert dict(response.device_map) == {name: str(device) for name, device in plan["device_map"].items()}
    assert response.strategy == plan["strategy"]
    assert [d.device for d in response.devices] == [d["device"] for d in plan["devices"]]
    for got, want in zip(response.devices, plan["devices"]):
        assert got.budget_bytes == pytest.approx(want["budget_bytes"], rel=1e-12), got.device
        assert got.planned_bytes == want["planned_bytes"], got.device
        assert got.kv_cache_bytes == want["kv_cache_bytes"], got.device
    assert [(s.device, list(s.modules)) for s in response.stages] == [
        (s["device"], s["modules"]) for s in plan["stages"]
    ]


@pytest.fixture
def two_gpu_server(start_server, llama_dir):
    return start_server(model_flags(llama_dir) + TWO_GPU_FLAGS)


def test_get_device_map_matches_strata_plan(two_gpu_server, stubs, plan_bin, llama_dir):
    response = get_device_map(two_gpu_server, stubs)
    plan = run_plan(plan_bin, model_flags(llama_dir) + TWO_GPU_FLAGS)
    assert_matches_plan(response, plan)
    assert response.strategy == "balanced_low_0"
    assert {"0", "1"} <= set(response.device_map.values()), "the budgets are meant to use both GPUs"
    assert response.architecture == "LlamaForCausalLM"
    assert response.dtype == "float32"
    assert response.kv_cache_tokens == 0


@pytest.mark.parametrize(
    "extra",
    [
        pytest.param(["--device-map", "sequential", "--max-memory", "0=400KB,1=400KB,cpu=10MB"], id="sequential"),
        pytest.param(["--device-map", "balanced", "--max-memory", "0=1MB,1=1MB", "--dtype", "float16"], id="balanced-fp16"),
        pytest.param(["--device-map", "auto", "--max-memory", "0=500KB,cpu=400KB,disk=10MB"], id="auto-disk"),
        pytest.param(["--max-memory", "0=2MB,1=2MB,cpu=10MB", "--kv-cache-tokens", "512"], id="kv-cache"),
        pytest.param(
            ["--device-map", '{"model.embed_tokens": 0, "model.layers": 1, "model.norm": 1, "lm_head": "cpu", '
             '"model.rotary_emb": 1}', "--max-memory", "0=10MB,1=10MB,cpu=10MB"],
            id="manual-json",
        ),
    ],
)
def test_flags_give_the_plan_strata_plan_gives(extra, start_server, stubs, plan_bin, llama_dir):
    flags = model_flags(llama_dir) + extra
    server = start_server(flags)
    assert_matches_plan(get_device_map(server, stubs), run_plan(plan_bin, flags))


def test_module_tree_and_device_map_file(start_server, stubs, plan_bin, llama_dir, tmp_path):
    """--module-tree FILE and --device-map @FILE, with the tree strata-plan exports."""
    tree = subprocess.run(
        [str(plan_bin), *model_flags(llama_dir), "--print-module-tree"], capture_output=True, text=True, check=True
    ).stdout
    tree_file = tmp_path / "tree.json"
    tree_file.write_text(tree)
    map_file = tmp_path / "map.json"
    map_file.write_text(json.dumps({"model": 0, "lm_head": 1}))
    flags = ["--module-tree", str(tree_file), "--device-map", f"@{map_file}", "--max-memory", "0=10MB,1=10MB"]
    server = start_server(flags)
    response = get_device_map(server, stubs)
    assert_matches_plan(response, run_plan(plan_bin, flags))
    assert response.strategy == "manual"
    assert dict(response.device_map) == {"model": "0", "lm_head": "1"}


def test_health_is_serving(two_gpu_server, stubs):
    health = stubs.health_grpc.HealthStub(two_gpu_server.channel)
    for service in ["", SERVICE]:
        reply = health.Check(stubs.health.HealthCheckRequest(service=service), timeout=5)
        assert reply.status == stubs.health.HealthCheckResponse.SERVING, service
    with pytest.raises(grpc.RpcError) as error:
        health.Check(stubs.health.HealthCheckRequest(service="no.such.Service"), timeout=5)
    assert error.value.code() == grpc.StatusCode.NOT_FOUND


def test_reflection_lists_and_describes_the_service(two_gpu_server, stubs):
    from google.protobuf import descriptor_pb2

    reflection = stubs.reflection_grpc.ServerReflectionStub(two_gpu_server.channel)
    requests = [
        stubs.reflection.ServerReflectionRequest(list_services=""),
        stubs.reflection.ServerReflectionRequest(file_containing_symbol=SERVICE),
    ]
    listed, described = list(reflection.ServerReflectionInfo(iter(requests), timeout=10))
    assert SERVICE in [s.name for s in listed.list_services_response.service]
    files = [descriptor_pb2.FileDescriptorProto.FromString(b)
             for b in described.file_descriptor_response.file_descriptor_proto]
    strata_file = next(f for f in files if f.package == "strata.v1")
    service = next(s for s in strata_file.service if s.name == "InferenceService")
    assert [m.name for m in service.method] == ["GetDeviceMap", "Generate"]


def test_reflection_describes_the_health_service_it_lists(two_gpu_server, stubs):
    """grpcurl describes and calls grpc.health.v1.Health without a local proto: reflection resolves it (the
    binary before listed it but answered file_containing_symbol NOT_FOUND)."""
    from google.protobuf import descriptor_pb2

    reflection = stubs.reflection_grpc.ServerReflectionStub(two_gpu_server.channel)
    requests = [stubs.reflection.ServerReflectionRequest(list_services=""),
                stubs.reflection.ServerReflectionRequest(file_containing_symbol="grpc.health.v1.Health"),
                stubs.reflection.ServerReflectionRequest(file_containing_symbol="grpc.health.v1.HealthCheckResponse")]
    listed, service, message = list(reflection.ServerReflectionInfo(iter(requests), timeout=10))
    names = [s.name for s in listed.list_services_response.service]
    assert "grpc.health.v1.Health" in names
    for reply in (service, message):
        assert not reply.HasField("error_response"), reply.error_response
        files = [descriptor_pb2.FileDescriptorProto.FromString(b)
                 for b in reply.file_descriptor_response.file_descriptor_proto]
        health = next(f for f in files if f.package == "grpc.health.v1")
        assert [m.name for m in health.service[0].method] == ["Check", "Watch"]
        assert [m.name for m in health.message_type] == ["HealthCheckRequest", "HealthCheckResponse"]
    # Every service reflection lists resolves.
    for name in names:
        (reply,) = list(reflection.ServerReflectionInfo(
            iter([stubs.reflection.ServerReflectionRequest(file_containing_symbol=name)]), timeout=10))
        assert not reply.HasField("error_response"), (name, reply.error_response)


METRIC_LINE = re.compile(r'^(strata_device_\w+)\{device="([^"]+)"\} (\S+)$')


def scrape(url: str) -> dict[tuple[str, str], float]:
    with urllib.request.urlopen(url, timeout=10) as reply:
        assert reply.status == 200
        text = reply.read().decode()
    values = {}
    for line in text.splitlines():
        if match := METRIC_LINE.match(line):
            values[(match[1], match[2])] = float(match[3])
    return values


def test_metrics_match_the_plan(two_gpu_server, stubs):
    response = get_device_map(two_gpu_server, stubs)
    metrics = scrape(two_gpu_server.metrics_url)
    assert response.devices, "the plan lists its devices"
    for device in response.devices:
        assert metrics[("strata_device_budget_bytes", device.device)] == pytest.approx(device.budget_bytes, rel=1e-12)
        assert metrics[("strata_device_planned_bytes", device.device)] == device.planned_bytes
        assert metrics[("strata_device_kv_cache_bytes", device.device)] == device.kv_cache_bytes
    assert {d for _, d in metrics} == {d.device for d in response.devices}


def test_metrics_serve_with_cuda_libraries_loaded(start_server, llama_dir, stubs):
    """The torch wheel's cuBLASLt has ~94 KiB of static TLS, more than civetweb's (prometheus-cpp's
    Exposer) 100 KiB thread stacks can hold beside the rest: /metrics must still serve once the CUDA
    libraries are in the process (as they are when the server links the runtime)."""
    import glob
    import torch

    site = Path(torch.__file__).resolve().parents[1]
    libs = sorted(glob.glob(str(site / "nvidia" / "*" / "lib" / "libcublasLt.so*")))
    if not libs:
        pytest.skip("this torch wheel ships no cuBLASLt (a CPU-only wheel)")
    server = start_server(model_flags(llama_dir), env=dict(os.environ, LD_PRELOAD=libs[0]))
    metrics = scrape(server.metrics_url)
    assert any(name == "strata_device_planned_bytes" for name, _ in metrics), server.output()


def test_prints_one_serving_line(two_gpu_server):
    lines = [l for l in two_gpu_server.stdout_path.read_text().splitlines() if "serving GetDeviceMap" in l]
    assert lines == [
        f"strata-server: serving GetDeviceMap on {two_gpu_server.grpc_address}, "
        f"metrics on 127.0.0.1:{two_gpu_server.metrics_port}/metrics"
    ]


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_signal_shuts_down_cleanly(sig, start_server, llama_dir):
    server = start_server(model_flags(llama_dir))
    assert server.stop(sig) == 0, server.output()


def run_bad(server_bin: Path, flags: list[str]) -> subprocess.CompletedProcess:
    # Listen on free ports so that a start-up that wrongly succeeds fails the test instead of hanging.
    for flag in ["--listen", "--metrics-listen"]:
        if flag not in flags:
            flags = flags + [flag, f"127.0.0.1:{free_port()}"]
    try:
        return subprocess.run([str(server_bin), *flags], capture_output=True, text=True, timeout=20)
    except subprocess.TimeoutExpired:
        pytest.fail(f"strata-server {flags} started instead of failing")


@pytest.mark.parametrize(
    "flags, named",
    [
        pytest.param(["--device-map", "balanced_high"], "balanced_high", id="unknown-strategy"),
        pytest.param(["--max-memory", "0=20XB"], "20XB", id="bad-max-memory"),
        pytest.param(["--max-memory", "gpu7=1GiB"], "gpu7", id="bad-max-memory-device"),
        pytest.param(["--dtype", "float13"], "float13", id="bad-dtype"),
        pytest.param(["--kv-cache-tokens", "-5"], "--kv-cache-tokens", id="bad-kv-cache-tokens"),
        pytest.param(["--listen", "127.0.0.1:99999"], "127.0.0.1:99999", id="bad-listen"),
        pytest.param(["--drain-timeout", "-1"], "--drain-timeout", id="negative-drain-timeout"),
        pytest.param(["--drain-timeout", "soon"], "--drain-timeout", id="bad-drain-timeout"),
        pytest.param(["--no-such-flag", "1"], "--no-such-flag", id="unknown-flag"),
        pytest.param(["--tool-call-parser", "mistral"], "hermes, llama3_json, deepseek_v3, kimi_k2",
                     id="unknown-tool-call-parser"),
        pytest.param(["--reasoning-parser", "granite"], "--reasoning-parser: reasoning parser: unknown \"granite\" "
                     "(valid: deepseek_r1, qwen3, glm45, gpt_oss)", id="unknown-reasoning-parser"),
        pytest.param(
            ["--device-map", '{"model.embed_tokens": 0, "model.layers": 0, "model.norm": 0, "model.rotary_emb": 0}'],
            "lm_head",
            id="manual-map-misses-a-module",
        ),
    ],
)
def test_bad_startup_exits_2_naming_it(flags, named, server_bin, llama_dir):
    done = run_bad(server_bin, model_flags(llama_dir) + flags)
    assert done.returncode == 2, done.stderr
    assert named in done.stderr


def test_missing_model_dir_exits_2(server_bin, tmp_path):
    missing = tmp_path / "no_such_model"
    done = run_bad(server_bin, ["--model", str(missing)])
    assert done.returncode == 2, done.stderr
    assert str(missing) in done.stderr


def test_no_model_exits_2(server_bin):
    done = run_bad(server_bin, [])
    assert done.returncode == 2
    assert "--model" in done.stderr


def test_port_in_use_exits_1(server_bin, llama_dir):
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        for flag in ["--listen", "--metrics-listen"]:
            other = "--metrics-listen" if flag == "--listen" else "--listen"
            flags = model_flags(llama_dir) + [flag, f"127.0.0.1:{port}", other, f"127.0.0.1:{free_port()}"]
            done = subprocess.run([str(server_bin), *flags], capture_output=True, text=True, timeout=20)
            assert done.returncode == 1, (flag, done.stderr)
            assert f"127.0.0.1:{port}" in done.stderr, flag


def test_help_exits_0(server_bin):
    done = subprocess.run([str(server_bin), "--help"], capture_output=True, text=True, timeout=10)
    assert done.returncode == 0
    for flag in ["--model", "--module-tree", "--device-map", "--max-memory", "--dtype", "--kv-cache-tokens",
                 "--listen", "--metrics-listen"]:
        assert flag in done.stdout


def test_default_plan_shows_the_discovered_machine(start_server, stubs, plan_bin, llama_dir):
    """No --max-memory: the server discovers the machine once (GPUs through the CUDA driver, the host's
    MemAvailable), plans with transformers' default budgets for it, and shows what it planned with."""
    server = start_server(model_flags(llama_dir))
    response = get_device_map(server, stubs)
    inventory = {d.device: d for d in response.inventory}
    assert "cpu" in inventory and inventory["cpu"].free_bytes > 0
    gpus = sorted(k for k in inventory if k != "cpu")
    assert gpus == [str(i) for i in range(len(gpus))]
    for gpu in gpus:
        assert 0 < inventory[gpu].free_bytes <= inventory[gpu].total_bytes
    # The same machine given to strata-plan by hand plans the same map (the host's available memory moves
    # a little between the two reads, which these small budgets never feel).
    spec = ",".join([f"{g}={inventory[g].free_bytes}" for g in gpus] + [f"cpu={inventory['cpu'].free_bytes}"])
    plan = run_plan(plan_bin, model_flags(llama_dir) + ["--inventory", spec])
    assert dict(response.device_map) == {name: str(device) for name, device in plan["device_map"].items()}
    assert "strata-server: machine: " in server.stdout_path.read_text()
    text = urllib.request.urlopen(server.metrics_url, timeout=10).read().decode()
    match = re.search(r'^strata_device_inventory_free_bytes\{device="cpu"\} (\S+)$', text, re.M)
    assert match and float(match.group(1)) == inventory["cpu"].free_bytes
    assert re.search(r"^strata_plan_warnings 0$", text, re.M)


def test_plan_that_leaves_the_gpus_empty_is_a_loud_warning(start_server, stubs, llama_dir):
    """Budgets that name GPUs but whose KV reserve leaves no decoder layer on them: served from the CPU,
    and said so at start-up, in GetDeviceMap and on /metrics."""
    server = start_server(model_flags(llama_dir) + ["--max-memory", "0=300KB,1=300KB,cpu=1GB",
                                                    "--kv-cache-tokens", "100000"])
    response = get_device_map(server, stubs)
    layers = {name: device for name, device in response.device_map.items() if name.startswith("model.layers")}
    assert layers and all(device in ("cpu", "disk") for device in layers.values()), layers
    assert list(response.inventory) == []  # --max-memory: no machine was consulted
    assert len(response.warnings) == 1, response
    assert "no decoder layer is on a GPU" in response.warnings[0] and "KV reserve" in response.warnings[0]
    assert "WARNING" in server.stderr_path.read_text()
    text = urllib.request.urlopen(server.metrics_url, timeout=10).read().decode()
    assert re.search(rf"^strata_plan_warnings {len(response.warnings)}$", text, re.M)
