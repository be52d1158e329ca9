"""Quantized checkpoints served end to end: strata-server loads an FP8 (transformers' Fp8Quantize) and a
compressed-tensors W4A16 checkpoint (the library's compressor) on a 2-stage logical plan, and Generate over
gRPC streams the reference's greedy ids and logprobs."""

from __future__ import annotations

import pytest

import generate_helpers as GH
import quantized_checkpoints as Q
import runtime_helpers as RH

PROMPTS = [[5, 9, 200, 31], [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11], [77]]
NEW_TOKENS = 10
TWO_STAGE = ["--device-map", '{"model.embed_tokens": 0, "model.layers.0": 0, "model.layers.1": 0, '
             '"model.layers.2": 1, "model.layers.3": 1, "model.norm": 1, "model.rotary_emb": 1, "lm_head": 1}',
             "--physical-devices", "0=cpu,1=cpu", "--max-memory", "0=1GiB,1=1GiB,cpu=1GiB"]


@pytest.fixture(scope="module")
def quantized(tmp_path_factory):
    """{format: (checkpoint, reference directory)}: the reference is what transformers dequantizes (FP8) or the
    dense model of compressed-tensors' own decompression (W4A16)."""
    fp8 = Q.make_fp8_checkpoint(tmp_path_factory.mktemp("fp8") / "ckpt", "llama")
    ct = Q.make_ct_checkpoint(tmp_path_factory.mktemp("ct") / "ckpt", "llama",
                              Q.ct_config({"group_size": 32}, "pack-quantized"))
    return {"fp8": (fp8, fp8), "w4a16": (ct, Q.ct_dense_reference(ct))}


@pytest.mark.parametrize("fmt", ["fp8", "w4a16"])
def test_a_quantized_checkpoint_serves_transformers_greedy_ids(server_factory, stubs, quantized, fmt):
    checkpoint, reference_dir = quantized[fmt]
    server = server_factory(["--model", str(checkpoint), *TWO_STAGE, "--max-batch", "4"])
    expected = RH.reference_generate(reference_dir, PROMPTS, NEW_TOKENS)
    for prompt, want in zip(PROMPTS, expected):
        got = GH.generate(stubs, server.channel, prompt_ids=prompt, max_new_tokens=NEW_TOKENS)
        assert got["ids"] == want["ids"], prompt
        assert got["logprobs"] == pytest.approx(want["logprobs"], abs=2e-4), prompt
