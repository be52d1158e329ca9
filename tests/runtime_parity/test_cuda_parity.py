"""strata-generate on CUDA against transformers generate(do_sample=False) on the same GPU, same
checkpoint: one stage on cuda:0; 2 and 4 logical stages on one GPU (`--physical-devices
0=cuda:0,1=cuda:0,...`: separate streams, events between them); a map with "cpu" entries (weights in
pinned host memory, copied to the GPU before use) and one with "disk" entries (paged in from the
checkpoint). float32: ids identical, logprobs close; bfloat16: the margin rule of
test_generate_parity.py (ids compared up to the first step where transformers' own top-1/top-2 margin
is within bf16 noise).

Every case skips, saying so, where torch sees no CUDA device; scripts/gpu-check.sh runs them on the GPU
machine with STRATA_BUILD_DIR pointing at its build.
"""

from __future__ import annotations

import pytest
import torch

import runtime_helpers as H

pytestmark = pytest.mark.skipif(
    not torch.cuda.is_available(),
    reason="no CUDA device here: the CUDA parity cases run on a GPU machine (scripts/gpu-check.sh)")

PROMPTS = [[5, 6, 7, 8, 9, 10, 11], [3, 4], [100, 101, 102, 103, 104, 105, 106, 107, 108, 109, 110, 111, 112], [42],
           [17, 200, 33, 64, 9]]
NEW_TOKENS = 16
# Same GPU, but other kernels (and another summation order) than transformers' eager path; TF32 is off
# on both sides (the default of PyTorch and of LibTorch).
FLOAT32_LOGPROB_TOLERANCE = 1e-3
MEMORY = "0=8GiB,1=8GiB,2=8GiB,3=8GiB,cpu=8GiB,disk=8GiB"


def plan_args(name: str, plan: str) -> list[str]:
    n = H.CONFIGS[name][1]["num_hidden_layers"]
    if plan == "one_gpu":
        return ["--device-map", '{"": 0}', "--physical-devices", "0=cuda:0", "--max-memory", MEMORY]
    if plan == "two_stages_one_gpu":
        devices = [0 if i < n // 2 else 1 for i in range(n)]
        return ["--device-map", H.layer_device_map(name, devices, 1), "--physical-devices", "0=cuda:0,1=cuda:0",
                "--max-memory", MEMORY]
    if plan == "four_stages_one_gpu":
        devices = [min(3, i * 4 // n) for i in range(n)]
        return ["--device-map", H.layer_device_map(name, devices, 3), "--physical-devices",
                "0=cuda:0,1=cuda:0,2=cuda:0,3=cuda:0", "--max-memory", MEMORY]
    if plan == "cpu_entries":
        devices = [0] + ["cpu"] * (n - 2) + [0]
        return ["--device-map", H.layer_device_map(name, devices, 0), "--physical-devices", "0=cuda:0", "--max-memory", MEMORY]
    if plan == "disk_entries":
        devices = [0, "disk"] + [0] * (n - 2)
        return ["--device-map", H.layer_device_map(name, devices, 0), "--physical-devices", "0=cuda:0", "--max-memory", MEMORY]
    raise ValueError(plan)


PLANS = ["one_gpu", "two_stages_one_gpu", "four_stages_one_gpu", "cpu_entries", "disk_entries"]


@pytest.fixture(scope="module")
def cuda_references(checkpoint):
    cache = {}

    def get(name, dtype):
        if (name, dtype) not in cache:
            cache[(name, dtype)] = H.reference_generate(checkpoint(name, dtype), PROMPTS, NEW_TOKENS, dtype,
                                                         device="cuda:0")
        return cache[(name, dtype)]

    return get


def _check_load(got, dtype_name):
    assert got["load"]["dtype"] == dtype_name
    assert "cuda:0" in got["load"]["stages"], got["load"]["stages"]


@pytest.mark.parametrize("plan", PLANS)
@pytest.mark.parametrize("name", list(H.CONFIGS))
def test_cuda_float32_matches_transformers_on_the_same_gpu(strata_generate, checkpoint, cuda_references, name, plan):
    reference = cuda_references(name, torch.float32)
    got = H.run_generate(checkpoint(name), PROMPTS, NEW_TOKENS, "--dtype", "float32", *plan_args(name, plan))
    _check_load(got, "float32")
    assert len(got["results"]) == len(reference)
    for i, (ref, res) in enumerate(zip(reference, got["results"])):
        assert res["ids"] == ref["ids"], f"prompt {i}: ids differ"
        worst = max(abs(a - b) for a, b in zip(ref["logprobs"], res["logprobs"]))
        assert worst <= FLOAT32_LOGPROB_TOLERANCE, f"prompt {i}: logprob differs by {worst}"


@pytest.mark.parametrize("plan", PLANS)
@pytest.mark.parametrize("name", ["llama_llama3_gqa", "qwen2_bias_tied", "mistral_sliding"])
def test_cuda_bfloat16_agrees_where_the_margin_exceeds_bf16_noise(strata_generate, checkpoint, cuda_references,
                                                                  name, plan):
    """bfloat16 on the GPU, ids compared where transformers' margin exceeds bf16 noise
    (runtime_helpers.compare_bfloat16_by_margin)."""
    reference = cuda_references(name, torch.bfloat16)
    got = H.run_generate(checkpoint(name, torch.bfloat16), PROMPTS, NEW_TOKENS, "--dtype", "bfloat16",
                         *plan_args(name, plan))
    _check_load(got, "bfloat16")
    compared = H.compare_bfloat16_by_margin(reference, got["results"], NEW_TOKENS)
    print(f"bfloat16 {name} {plan}: {compared} of {NEW_TOKENS * len(PROMPTS)} steps above the noise margin, "
          f"all identical")
