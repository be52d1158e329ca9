"""strata-client (C++) against a real server: generate prints what the stream carries, device-map the
plan; bad input exits 2."""

from __future__ import annotations

import subprocess

import generate_helpers as GH
import integration_helpers as IH

CLIENT_BIN = IH.BUILD_DIR / "clients" / "cpp" / "strata-client"


def _client(server, *args):
    return subprocess.run([str(IH.require_binary(CLIENT_BIN)), "--server", server.grpc_address, *args],
                          capture_output=True, text=True, timeout=60)


def test_generate_prints_the_streamed_text(stubs, two_stage_server):
    want = GH.generate(stubs, two_stage_server.channel, prompt="Hello, world!", add_special_tokens=True,
                       max_new_tokens=10)
    done = _client(two_stage_server, "generate", "--prompt", "Hello, world!", "--max-new-tokens", "10", "--ids")
    assert done.returncode == 0, done.stderr
    assert done.stdout == want["text"] + "\n"
    assert f"ids: {','.join(map(str, want['ids']))}" in done.stderr
    assert "[LENGTH: " in done.stderr and "10 generated]" in done.stderr


def test_generate_with_ids_and_sampling_flags(stubs, two_stage_server):
    want = GH.generate(stubs, two_stage_server.channel, prompt_ids=[4, 5, 6], max_new_tokens=8, temperature=0.8,
                       top_p=0.9, top_k=20, repetition_penalty=1.2, seed=42)
    done = _client(two_stage_server, "generate", "--prompt-ids", "4,5,6", "--max-new-tokens", "8", "--temperature",
                   "0.8", "--top-p", "0.9", "--top-k", "20", "--repetition-penalty", "1.2", "--seed", "42", "--ids")
    assert done.returncode == 0, done.stderr
    assert f"ids: {','.join(map(str, want['ids']))}" in done.stderr


def test_device_map_prints_the_stages(two_stage_server):
    done = _client(two_stage_server, "device-map")
    assert done.returncode == 0, done.stderr
    assert "LlamaForCausalLM" in done.stdout
    assert "model.embed_tokens, model.layers.0, model.layers.1" in done.stdout
    assert "model.layers.2, model.layers.3" in done.stdout


def test_bad_input_exits_2(two_stage_server):
    refused = _client(two_stage_server, "generate", "--prompt-ids", "1", "--max-new-tokens", "0")
    assert refused.returncode == 2 and "max_new_tokens: must be at least 1" in refused.stderr
    bad_flag = _client(two_stage_server, "generate", "--prompt-ids", "1", "--top-x", "3")
    assert bad_flag.returncode == 2 and "--top-x" in bad_flag.stderr
    no_command = _client(two_stage_server)
    assert no_command.returncode == 2


def test_unreachable_server_exits_1(tmp_path):
    done = subprocess.run([str(IH.require_binary(CLIENT_BIN)), "--server", f"127.0.0.1:{IH.free_port()}",
                           "device-map"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 1 and "UNAVAILABLE" not in done.stdout and "GetDeviceMap failed" in done.stderr
