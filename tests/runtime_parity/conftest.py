"""Fixtures of the runtime parity tests: the strata-generate binary (missing = failure, not a skip) and
tiny random checkpoints saved by transformers, made once per session."""

from __future__ import annotations

import pathlib
import sys

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))
import runtime_helpers as H  # noqa: E402
from case_counts import CaseCounts  # noqa: E402

# nodeid fragment -> its line in the session summary (every family of runtime_helpers.CONFIGS)
COUNTS = CaseCounts({
    "test_generate_parity.py::test_greedy_matches_transformers":
        "generate() parity, float32, 1/2/4-stage and offload plans: {passed}/{total} family x plan cases with "
        "identical greedy ids and logprobs within 1e-4",
    "::test_three_stage_plan": "3-stage plans (Qwen3, Qwen3-MoE, Mixtral, Gemma 2/3, Phi-3, DeepSeek-V3, GLM-4.5, "
                               "MiniMax-M2): {passed}/{total} identical",
    "::test_experts_apart_from_their_layer": "experts apart from their layer (cpu, another GPU): {passed}/{total} identical",
    "::test_bfloat16_agrees_where_the_margin_exceeds_bf16_noise": "bfloat16 under the margin rule: {passed}/{total} cases",
    "::test_bad_config_exits_2_naming_the_field": "bad configs of the new families: {passed}/{total} exit 2 naming the field",
    "test_quantized_parity.py::test_fp8_dequantized_weights_equal_transformers":
        "FP8 dequantized weights bit for bit with transformers (kernels and ATen paths): {passed}/{total}",
    "test_quantized_parity.py::test_fp8_greedy_matches_transformers":
        "FP8 generate() parity (Llama, Qwen3, Qwen3-MoE, Phi-3, Gemma 3 x 1/2/3 stages): {passed}/{total}",
    "test_mxfp4_parity.py::test_mxfp4_dequantized_experts_equal_transformers":
        "MXFP4 dequantized experts bit for bit with transformers' convert_moe_packed_tensors (kernels and ATen paths, "
        "bfloat16 and float32): {passed}/{total}",
    "test_quantized_parity.py::test_ct_dequantized_weights_equal_the_references":
        "compressed-tensors dequantized weights bit for bit with transformers and the library: {passed}/{total}",
    "test_quantized_parity.py::test_ct_greedy_matches_the_decompressed_model":
        "compressed-tensors generation parity (families x schemes x 1/2 stages): {passed}/{total}",
    "test_quantized_int_parity.py::test_greedy_matches_the_reader_weights_dense":
        "AWQ/GPTQ generation parity (variants x Llama, Qwen3, Qwen3-MoE x 1/2 stages): {passed}/{total}",
    "::test_fp8_bad_checkpoint_exits_2_naming_what_is_wrong": "bad FP8 checkpoints: {passed}/{total} exit 2 naming it",
    "test_glm4_moe_minimax_parity.py::test_block_fp8_checkpoints":
        "GLM-4.5 and MiniMax-M2 block-FP8 generation parity (1 and 2 stages): {passed}/{total}",
    "test_glm4_moe_minimax_parity.py::test_glm_mtp_layer":
        "GLM's MTP layer in the checkpoint ignored and counted: {passed}/{total}",
})


def pytest_runtest_logreport(report):
    COUNTS.record(report)


def pytest_terminal_summary(terminalreporter):
    COUNTS.write(terminalreporter, "strata runtime parity")


@pytest.fixture(scope="session")
def strata_generate() -> pathlib.Path:
    path = H.generate_path()
    if not path.is_file():
        pytest.fail(f"strata-generate is not built: {path} does not exist (build the project first, "
                    f"or point STRATA_BUILD_DIR at the build folder)", pytrace=False)
    return path


@pytest.fixture(scope="session")
def checkpoint(tmp_path_factory):
    """checkpoint(name, dtype=float32) -> a directory with config.json and safetensors."""
    import torch

    made: dict = {}

    def get(name: str, dtype=torch.float32) -> pathlib.Path:
        key = (name, dtype)
        if key not in made:
            made[key] = H.make_checkpoint(tmp_path_factory.mktemp(f"{name}_{str(dtype).split('.')[-1]}"), name, dtype)
        return made[key]

    return get
