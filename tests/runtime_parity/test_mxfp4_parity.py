"""MXFP4 (gpt-oss's experts) against transformers' own dequantization, bit for bit: random E2M1 codes and E8M0 scales
written by this test with torch (not by strata's code) in gpt-oss's layout (`*_blocks` uint8 [E, N, K / 32, 16],
`*_scales` uint8 [E, N, K / 32]), dequantized by transformers' `convert_moe_packed_tensors` (what its MXFP4 quantizer
runs on a CPU, in bfloat16; and in float32) and by strata (runtime::Mxfp4Linear per expert, then Dequantize: the
kernels' dequantizer and the ATen one a GPU runs, through tests/runtime/strata_dequantize_probe's mxfp4 mode)."""

from __future__ import annotations

import pathlib

import pytest
import torch

import quantized_checkpoints as Q

GATE_UP = "model.layers.0.mlp.experts.gate_up_proj"
DOWN = "model.layers.1.mlp.experts.down_proj"


def write_experts(directory: pathlib.Path, experts: dict[str, tuple[torch.Tensor, torch.Tensor]]) -> pathlib.Path:
    """A safetensors file of `name_blocks` and `name_scales` per projection, as gpt-oss checkpoints store them."""
    from safetensors.torch import save_file

    directory.mkdir(parents=True)
    tensors = {}
    for name, (blocks, scales) in experts.items():
        tensors[f"{name}_blocks"] = blocks.contiguous()
        tensors[f"{name}_scales"] = scales.contiguous()
    save_file(tensors, directory / "model.safetensors", metadata={"format": "pt"})
    return directory


def random_experts(generator, experts: int, rows: int, cols: int, scale_bytes) -> tuple[torch.Tensor, torch.Tensor]:
    """Random codes (every byte value) and scales drawn from `scale_bytes`, each of them at least once."""
    blocks = torch.randint(0, 256, (experts, rows, cols // 32, 16), dtype=torch.uint8, generator=generator)
    choices = torch.tensor(list(scale_bytes), dtype=torch.uint8)
    scales = choices[torch.randint(0, len(choices), (experts, rows, cols // 32), generator=generator)]
    assert scales.numel() >= len(choices)
    scales.view(-1)[torch.randperm(scales.numel(), generator=generator)[: len(choices)]] = choices
    return blocks, scales


def transformers_dequantized(blocks: torch.Tensor, scales: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """transformers' dequantization of one projection's experts, as strata lays a weight out: [E, N, K]
    (convert_moe_packed_tensors returns [E, K, N], the layout gpt-oss's experts multiply by)."""
    from transformers.integrations.mxfp4 import convert_moe_packed_tensors

    return convert_moe_packed_tensors(blocks.clone(), scales.clone(), dtype=dtype).transpose(1, 2)


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bit for bit, -0 included (torch.equal takes -0 for 0)."""
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    ints = torch.int32 if a.element_size() == 4 else torch.int16
    return torch.equal(a.view(ints), b.view(ints))


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """gate_up [E, 2I, H] at gpt-oss's hidden size (90 blocks) with gpt-oss's range of scales, and down [E, H, I] of
    an odd count of blocks (3) with every scale byte strata accepts (0-252)."""
    generator = torch.Generator().manual_seed(42)
    experts = {
        GATE_UP: random_experts(generator, 4, 192, 2880, range(112, 131)),
        DOWN: random_experts(generator, 4, 2880, 96, range(0, 253)),
    }
    return write_experts(tmp_path_factory.mktemp("mxfp4") / "experts", experts), experts


@pytest.mark.parametrize("path", ["kernels", "aten"])
@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_mxfp4_dequantized_experts_equal_transformers(checkpoint, dtype, path):
    directory, experts = checkpoint
    ours = Q.strata_mxfp4_dequantized(directory, dtype, path)
    assert sorted(ours) == sorted(experts)
    for name, (blocks, scales) in experts.items():
        reference = transformers_dequantized(blocks, scales, getattr(torch, dtype))
        assert ours[name].dtype == reference.dtype, name
        assert same_bits(ours[name], reference.contiguous()), f"{path}: {name} differs"
        assert (ours[name].view(-1) == 0).any() and ours[name].signbit().logical_and(ours[name] == 0).any()


@pytest.mark.parametrize("path", ["kernels", "aten"])
def test_mxfp4_scales_past_the_range_match_transformers_unchecked(tmp_path, path):
    """Scale bytes 253-255, which Mxfp4Linear refuses (weights past bfloat16's range; 255 is E8M0's NaN), built
    without its check: transformers' ldexp scales exactly (0.5 x 2^128 is 2^127, 0 x 2^128 is 0, 1 x 2^128
    infinite), and so does strata."""
    generator = torch.Generator().manual_seed(7)
    experts = {DOWN: random_experts(generator, 2, 64, 64, range(250, 256))}
    directory = write_experts(tmp_path / "experts", experts)
    for dtype in ("bfloat16", "float32"):
        ours = Q.strata_mxfp4_dequantized(directory, dtype, path, unchecked=True)[DOWN]
        reference = transformers_dequantized(*experts[DOWN], getattr(torch, dtype))
        assert ours.isinf().any() and not ours.isnan().any() and (ours == 2.0**127).any()
        assert same_bits(ours, reference.contiguous()), dtype


def _refused(tmp_path, experts, *says):
    directory = write_experts(tmp_path / "experts", experts)
    proc = Q.strata_mxfp4_dequantized(directory, "bfloat16", check=False)
    assert proc.returncode == 2, (proc.returncode, proc.stderr)
    for say in says:
        assert say in proc.stderr, proc.stderr


@pytest.mark.parametrize("scale", [253, 255])
def test_mxfp4_scales_past_252_are_refused_naming_the_expert(tmp_path, scale):
    blocks, scales = random_experts(torch.Generator().manual_seed(1), 3, 8, 64, range(120, 128))
    scales[2, 5, 1] = scale
    _refused(tmp_path, {DOWN: (blocks, scales)}, f"{DOWN}[2]", f"scale {scale} at element 11", "bfloat16")


@pytest.mark.parametrize("case", ["scales_of_another_width", "blocks_of_15_bytes", "int8_blocks"])
def test_mxfp4_bad_shapes_are_refused_naming_the_expert(tmp_path, case):
    blocks, scales = random_experts(torch.Generator().manual_seed(2), 2, 8, 64, range(120, 128))
    if case == "scales_of_another_width":
        experts, says = {GATE_UP: (blocks, scales[..., :1])}, ("scales of shape [8, 1]", "expected [8, 2]")
    elif case == "blocks_of_15_bytes":
        experts, says = {GATE_UP: (blocks[..., :15], scales)}, ("blocks of shape [8, 2, 15]",)
    else:
        experts, says = {GATE_UP: (blocks.view(torch.int8), scales)}, ("blocks of dtype",)
    _refused(tmp_path, experts, f"{GATE_UP}[0]", *says)
