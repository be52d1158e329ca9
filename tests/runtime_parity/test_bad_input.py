"""Every bad input of the issue makes strata-generate exit 2 with a message naming the thing. Each test
starts from a valid tiny checkpoint (copied) and breaks one claim."""

from __future__ import annotations

import json
import pathlib
import shutil
import struct

import pytest

import runtime_helpers as H

NAME = "llama_llama3_gqa"


@pytest.fixture
def broken(checkpoint, tmp_path):
    """A private copy of a valid checkpoint, to break."""
    target = tmp_path / "ckpt"
    shutil.copytree(checkpoint(NAME), target)
    return target


def read_safetensors(path: pathlib.Path):
    raw = path.read_bytes()
    (length,) = struct.unpack("<Q", raw[:8])
    return json.loads(raw[8:8 + length]), raw[8 + length:]


def write_safetensors(path: pathlib.Path, header: dict, data: bytes, declared_length: int | None = None):
    text = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(text) if declared_length is None else declared_length) + text + data)


def expect_bad_input(model_dir, *message_parts, prompts=([1, 2, 3],), extra=()):
    proc = H.run_generate(model_dir, list(prompts), 2, "--device-map", '{"": "cpu"}', *extra, check=False)
    assert proc.returncode == 2, f"exit {proc.returncode}: {proc.stderr}"
    for part in message_parts:
        assert part in proc.stderr, proc.stderr
    return proc.stderr


def test_truncated_file(strata_generate, broken):
    f = broken / "model.safetensors"
    f.write_bytes(f.read_bytes()[:-100])
    expect_bad_input(broken, "model.safetensors: tensor ", "data bytes in the file (truncated file?)")


def test_file_shorter_than_its_length_field(strata_generate, broken):
    (broken / "model.safetensors").write_bytes(b"\x01\x02")
    expect_bad_input(broken, "model.safetensors: 2 bytes is too short for a safetensors header")


def test_header_length_past_end_of_file(strata_generate, broken):
    header, data = read_safetensors(broken / "model.safetensors")
    write_safetensors(broken / "model.safetensors", header, data, declared_length=1 << 40)
    expect_bad_input(broken, "model.safetensors: header length 1099511627776 exceeds the file size")


def test_offsets_out_of_range(strata_generate, broken):
    header, data = read_safetensors(broken / "model.safetensors")
    begin, end = header["model.norm.weight"]["data_offsets"]
    header["model.norm.weight"]["data_offsets"] = [len(data) + 8, len(data) + 8 + end - begin]
    write_safetensors(broken / "model.safetensors", header, data)
    expect_bad_input(broken, "tensor model.norm.weight: data_offsets end", "is past the")


def test_overlapping_offsets(strata_generate, broken):
    header, data = read_safetensors(broken / "model.safetensors")
    header["model.layers.1.input_layernorm.weight"]["data_offsets"] = header["model.norm.weight"]["data_offsets"]
    write_safetensors(broken / "model.safetensors", header, data)
    expect_bad_input(broken, "overlap tensor", "model.norm.weight")


def test_unknown_dtype(strata_generate, broken):
    header, data = read_safetensors(broken / "model.safetensors")
    header["model.norm.weight"]["dtype"] = "F4_E2M1X"
    write_safetensors(broken / "model.safetensors", header, data)
    expect_bad_input(broken, "tensor model.norm.weight: unknown safetensors dtype \"F4_E2M1X\"")


def test_dtype_the_runtime_does_not_load(strata_generate, broken):
    header, data = read_safetensors(broken / "model.safetensors")
    header["model.norm.weight"]["dtype"] = "I32"  # same element size: only the dtype is wrong
    write_safetensors(broken / "model.safetensors", header, data)
    expect_bad_input(broken, "tensor model.norm.weight has dtype int32, expected float32, float16 or bfloat16")


def test_missing_tensor(strata_generate, broken):
    header, data = read_safetensors(broken / "model.safetensors")
    del header["model.layers.2.mlp.up_proj.weight"]
    write_safetensors(broken / "model.safetensors", header, data)
    expect_bad_input(broken, "tensor model.layers.2.mlp.up_proj.weight [128, 64] is missing")


def test_extra_tensor(strata_generate, broken):
    header, data = read_safetensors(broken / "model.safetensors")
    header["model.layers.0.mlp.extra.weight"] = {"dtype": "F32", "shape": [2], "data_offsets": [len(data), len(data) + 8]}
    write_safetensors(broken / "model.safetensors", header, data + bytes(8))
    expect_bad_input(broken, "unexpected tensor model.layers.0.mlp.extra.weight")


def test_mis_shaped_tensor(strata_generate, broken):
    header, data = read_safetensors(broken / "model.safetensors")
    begin, _ = header["model.norm.weight"]["data_offsets"]
    header["model.norm.weight"]["shape"] = [32]
    header["model.norm.weight"]["data_offsets"] = [begin, begin + 128]
    write_safetensors(broken / "model.safetensors", header, data)
    expect_bad_input(broken, "tensor model.norm.weight has shape [32]", "expected [64]")


def test_unsupported_rope_type(strata_generate, broken):
    config = json.loads((broken / "config.json").read_text())
    config["rope_parameters"] = {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 2.0}
    (broken / "config.json").write_text(json.dumps(config))
    expect_bad_input(broken, "rope_parameters.rope_type", "\"yarn\" is not supported by the runtime")


def test_prompt_longer_than_max_context(strata_generate, checkpoint):
    expect_bad_input(checkpoint(NAME), "prompt 1: 6 tokens + 2 new tokens = 8, more than --max-context 5",
                     prompts=([1, 2], [1, 2, 3, 4, 5, 6]), extra=("--max-context", "5"))


def test_token_id_at_vocab_size(strata_generate, checkpoint):
    expect_bad_input(checkpoint(NAME), "prompt 0: token id 256 at position 1 is outside the vocabulary [0, 256)",
                     prompts=([1, 256],))


def test_plan_that_does_not_fit(strata_generate, checkpoint):
    proc = H.run_generate(checkpoint(NAME), [[1, 2]], 2, "--device-map", '{"": 0}', "--max-memory", "0=100KB",
                          "--physical-devices", "0=cpu", check=False)
    assert proc.returncode == 2, proc.stderr
    assert "device 0 is over its max_memory" in proc.stderr


def test_gpu_plan_without_a_gpu_names_the_device(strata_generate, checkpoint):
    import torch

    if torch.cuda.is_available():
        pytest.skip("a CUDA device is visible here: the plan's GPU 0 exists")
    proc = H.run_generate(checkpoint(NAME), [[1, 2]], 2, "--device-map", '{"": 0}', "--max-memory", "0=1GiB",
                          check=False)
    assert proc.returncode == 2, proc.stderr
    assert "device 0 of the plan runs on cuda:0, but no CUDA device is visible" in proc.stderr


def test_bad_physical_devices(strata_generate, checkpoint):
    proc = H.run_generate(checkpoint(NAME), [[1, 2]], 2, "--physical-devices", "0=tpu", check=False)
    assert proc.returncode == 2
    assert "--physical-devices: \"0=tpu\": the device is neither cpu nor cuda:N" in proc.stderr


def test_warmup_runs_are_dropped_and_bounded(strata_generate, checkpoint):
    # --warmup N runs the batch N times first (for benchmarks: a warm process's timings); what is reported
    # is the run after them, identical to a cold run's results.
    cold = H.run_generate(checkpoint(NAME), [[1, 2, 3], [7]], 6, "--device-map", '{"": "cpu"}')
    warm = H.run_generate(checkpoint(NAME), [[1, 2, 3], [7]], 6, "--device-map", '{"": "cpu"}', "--warmup", "2")
    assert [r["ids"] for r in warm["results"]] == [r["ids"] for r in cold["results"]]
    assert [r["logprobs"] for r in warm["results"]] == [r["logprobs"] for r in cold["results"]]
    assert warm["timing"]["decode_steps"] == cold["timing"]["decode_steps"]
    expect_bad_input(checkpoint(NAME), "--warmup: at most 100 runs", extra=("--warmup", "101"))
    expect_bad_input(checkpoint(NAME), "--warmup: \"-1\" is not a non-negative integer", extra=("--warmup", "-1"))
