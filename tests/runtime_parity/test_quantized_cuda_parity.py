"""Quantized checkpoints on CUDA: the packed weights on the GPU (blocks dequantized there with ATen ops into
the GEMM, no host synchronisation), on one GPU, two logical stages of one GPU, and with "cpu" entries (packed
weights in pinned host memory, copied to the GPU before use), against transformers' generate() on the same
GPU (its dequantized FP8 model). The integer layouts' ATen unpacking, which the GPU runs, is checked bit for bit
against the kernels on the CPU (tests/runtime quantized_linear_test, test_quantized_parity's "aten" probe path):
the GPU machine's Python has transformers but not compressed-tensors.

Every case skips, saying so, where torch sees no CUDA device; scripts/gpu-check.sh runs them (its parity step)
on the GPU machine with STRATA_BUILD_DIR pointing at its build."""

from __future__ import annotations

import json

import pytest
import torch

import quantized_checkpoints as Q
import runtime_helpers as H

pytestmark = pytest.mark.skipif(
    not torch.cuda.is_available(),
    reason="no CUDA device here: the quantized CUDA cases run on a GPU machine (scripts/gpu-check.sh)")

PROMPTS = [[5, 6, 7, 8, 9, 10, 11], [3, 4], [100, 101, 102, 103, 104, 105, 106, 107, 108, 109, 110, 111, 112]]
NEW_TOKENS = 12
FLOAT32_LOGPROB_TOLERANCE = 1e-3  # other kernels than transformers' on the same GPU, TF32 off on both
MEMORY = "0=8GiB,1=8GiB,cpu=8GiB"


def plan_args(plan: str) -> list[str]:
    n = Q.CONFIGS["llama"][1]["num_hidden_layers"]
    entries = {"model.embed_tokens": 0, "model.norm": 0, "model.rotary_emb": 0, "lm_head": 0}
    if plan == "one_gpu":
        return ["--device-map", '{"": 0}', "--physical-devices", "0=cuda:0", "--max-memory", MEMORY]
    if plan == "two_stages_one_gpu":
        entries.update({f"model.layers.{i}": 0 if i < n // 2 else 1 for i in range(n)})
        entries.update({"model.norm": 1, "model.rotary_emb": 1, "lm_head": 1})
        return ["--device-map", json.dumps(entries), "--physical-devices", "0=cuda:0,1=cuda:0", "--max-memory",
                MEMORY]
    if plan == "cpu_entries":
        entries.update({f"model.layers.{i}": "cpu" if 0 < i < n - 1 else 0 for i in range(n)})
        return ["--device-map", json.dumps(entries), "--physical-devices", "0=cuda:0", "--max-memory", MEMORY]
    raise ValueError(plan)


@pytest.fixture(scope="module")
def fp8_checkpoint(tmp_path_factory):
    return Q.make_fp8_checkpoint(tmp_path_factory.mktemp("fp8") / "ckpt", "llama")


@pytest.mark.parametrize("plan", ["one_gpu", "two_stages_one_gpu", "cpu_entries"])
def test_fp8_on_cuda_matches_transformers(strata_generate, fp8_checkpoint, plan):
    checkpoint = fp8_checkpoint
    reference = H.reference_generate(checkpoint, PROMPTS, NEW_TOKENS, device="cuda")
    got = H.run_generate(checkpoint, PROMPTS, NEW_TOKENS, "--dtype", "float32", *plan_args(plan))
    assert got["load"]["packed_tensors"] > 0
    Q.assert_same_greedy(reference, got["results"], FLOAT32_LOGPROB_TOLERANCE)
