"""Quantized checkpoints against transformers loading the same files on the CPU (where it dequantizes them):
first strata's dequantized weights equal transformers' bit for bit (the kernels' dequantizer and the ATen one a
GPU runs), then strata-generate's greedy ids equal generate()'s and its logprobs are within tolerance on 1-, 2-
and 3-stage plans (float32; bfloat16 under the margin rule). strata runs the weights packed: decode rows on
kernels/quantized.h, prefill on dequantized blocks."""

from __future__ import annotations

import json

import pytest
import torch

import quantized_checkpoints as Q
import runtime_helpers as H

PROMPTS = [[5, 6, 7, 8, 9, 10, 11], [3, 4], [100, 101, 102, 103, 104, 105, 106, 107, 108, 109, 110, 111, 112], [42],
           [17, 200, 33, 64, 9]]
NEW_TOKENS = 12
# The kernels sum x * code per block and scale the block's sum; transformers multiplies dequantized weights: the
# same products in another order, a few float32 steps apart.
LOGPROB_TOLERANCE = 2e-4
FP8_FAMILIES = ["llama", "qwen3", "qwen3_moe", "phi3", "gemma3"]


@pytest.fixture(scope="module")
def fp8_checkpoint(tmp_path_factory):
    cache = {}

    def get(name, scale_dtype=torch.float32, dense_dtype=torch.float32):
        key = (name, scale_dtype, dense_dtype)
        if key not in cache:
            directory = tmp_path_factory.mktemp(f"fp8-{name}-{str(scale_dtype).split('.')[-1]}")
            cache[key] = Q.make_fp8_checkpoint(directory, name, scale_dtype=scale_dtype, dense_dtype=dense_dtype)
        return cache[key]

    return get


@pytest.fixture(scope="module")
def fp8_reference(fp8_checkpoint):
    cache = {}

    def get(name):
        if name not in cache:
            cache[name] = H.reference_generate(fp8_checkpoint(name), PROMPTS, NEW_TOKENS)
        return cache[name]

    return get


def transformers_weights(checkpoint, dtype):
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(checkpoint, dtype=dtype, device_map={"": "cpu"})
    return model.state_dict()


def layers(name: str) -> int:
    return Q.CONFIGS[name][1]["num_hidden_layers"]


def plan_args(name: str, stages: int) -> list[str]:
    if stages == 1:
        return ["--device-map", '{"": "cpu"}']
    n = layers(name)
    devices = [min(stages - 1, i * stages // n) for i in range(n)]
    head = stages - 1
    tied = Q.CONFIGS[name][1].get("tie_word_embeddings")
    entries = {"model.embed_tokens": devices[0]}
    entries.update({f"model.layers.{i}": d for i, d in enumerate(devices)})
    entries.update({"model.norm": head, "model.rotary_emb": head, "lm_head": devices[0] if tied else head})
    physical = ",".join(f"{i}=cpu" for i in range(stages))
    memory = ",".join(f"{i}=1GiB" for i in range(stages)) + ",cpu=1GiB"
    return ["--device-map", json.dumps(entries), "--physical-devices", physical, "--max-memory", memory]


@pytest.mark.parametrize("serving", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("scale_dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("name", ["llama", "qwen3"])
def test_fp8_dequantized_weights_equal_transformers(fp8_checkpoint, name, scale_dtype, serving):
    checkpoint = fp8_checkpoint(name, scale_dtype)
    reference = transformers_weights(checkpoint, serving)
    dtype = "float32" if serving == torch.float32 else "bfloat16"
    for path in ("kernels", "aten"):
        ours = Q.strata_dequantized(checkpoint, dtype, path)
        assert ours, "the probe dequantized nothing"
        for key, value in ours.items():
            assert key in reference, key
            assert reference[key].dtype == value.dtype, key
            assert torch.equal(reference[key], value), f"{path}: {key} differs"


@pytest.mark.parametrize("stages", [1, 2, 3])
@pytest.mark.parametrize("name", FP8_FAMILIES)
def test_fp8_greedy_matches_transformers(strata_generate, fp8_checkpoint, fp8_reference, name, stages):
    got = H.run_generate(fp8_checkpoint(name), PROMPTS, NEW_TOKENS, *plan_args(name, stages))
    assert got["load"]["packed_tensors"] > 0, got["load"]
    assert len(got["load"]["stages"].splitlines()) >= stages
    Q.assert_same_greedy(fp8_reference(name), got["results"], LOGPROB_TOLERANCE)


def test_fp8_ragged_blocks_match_the_quantizers_math(strata_generate, tmp_path):
    """Dimensions that are not whole 128 x 128 blocks (the last blocks partial), which Fp8Quantize leaves
    dense and transformers' loader dequantizes with blocks derived from the grid: checked against the quantizer's
    own block math (_dequantize_fp8_weight), weights bit for bit, then generation on 1 and 2 stages."""
    from safetensors.torch import load_file

    checkpoint = Q.make_fp8_checkpoint(tmp_path / "ragged", "llama_ragged")
    dense = Q.fp8_dense_reference(checkpoint, "llama_ragged", tmp_path / "dense")
    reference_weights = load_file(dense / "model.safetensors")
    ours = Q.strata_dequantized(checkpoint, "float32")
    assert any(v.shape[0] % 128 or v.shape[1] % 128 for v in ours.values())
    for key, value in ours.items():
        assert torch.equal(reference_weights[key], value), key
    reference = H.reference_generate(dense, PROMPTS, NEW_TOKENS)
    for stages in (1, 2):
        got = H.run_generate(checkpoint, PROMPTS, NEW_TOKENS, *plan_args("llama_ragged", stages))
        Q.assert_same_greedy(reference, got["results"], LOGPROB_TOLERANCE, f"{stages} stages, ")


@pytest.mark.parametrize("variant", ["quantized_lm_head", "ue8m0"])
def test_fp8_variants_match_transformers(strata_generate, tmp_path, variant):
    """lm_head quantized too (no modules_to_not_convert: FP8 has no default skips), and ue8m0 scales (powers of
    two, DeepSeek-V3.1's scale_fmt)."""
    if variant == "quantized_lm_head":
        checkpoint = Q.make_fp8_checkpoint(tmp_path / variant, "llama", skip=())
    else:
        checkpoint = Q.make_fp8_checkpoint(tmp_path / variant, "llama", scale_fmt="ue8m0")
    reference_weights = transformers_weights(checkpoint, torch.float32)
    for key, value in Q.strata_dequantized(checkpoint, "float32").items():
        assert torch.equal(reference_weights[key], value), key
    if variant == "quantized_lm_head":
        assert "lm_head.weight" in Q.strata_dequantized(checkpoint, "float32")
    reference = H.reference_generate(checkpoint, PROMPTS, NEW_TOKENS)
    got = H.run_generate(checkpoint, PROMPTS, NEW_TOKENS, "--device-map", '{"": "cpu"}')
    Q.assert_same_greedy(reference, got["results"], LOGPROB_TOLERANCE)


@pytest.mark.parametrize("name", ["llama", "qwen3"])
def test_fp8_bfloat16_agrees_where_the_margin_exceeds_bf16_noise(strata_generate, fp8_checkpoint, name):
    checkpoint = fp8_checkpoint(name, torch.bfloat16, torch.bfloat16)
    reference = H.reference_generate(checkpoint, PROMPTS, NEW_TOKENS, dtype=torch.bfloat16)
    got = H.run_generate(checkpoint, PROMPTS, NEW_TOKENS, "--device-map", '{"": "cpu"}', "--dtype", "bfloat16")
    H.compare_bfloat16_by_margin(reference, got["results"], NEW_TOKENS)


def _broken_copy(source, directory, edit_tensors=None, edit_config=None):
    """A copy of checkpoint `source` with its tensors or its quantization_config changed."""
    import shutil

    from safetensors.torch import load_file, save_file

    shutil.copytree(source, directory)
    if edit_tensors:
        tensors = load_file(directory / "model.safetensors")
        edit_tensors(tensors)
        save_file(tensors, directory / "model.safetensors", metadata={"format": "pt"})
    if edit_config:
        config = json.loads((directory / "config.json").read_text())
        edit_config(config["quantization_config"])
        (directory / "config.json").write_text(json.dumps(config))
    return directory


SCALE = "model.layers.1.self_attn.q_proj.weight_scale_inv"
WEIGHT = "model.layers.1.self_attn.q_proj.weight"


def _set(key, value):
    def edit(t):
        t[key] = value(t[key])
    return edit


def _nan_at(index):
    def change(s):
        s = s.clone()
        s.view(-1)[index] = float("nan")
        return s
    return change


def _fp8_nan_at(index, code):
    def change(w):
        raw = w.view(torch.uint8).clone()
        raw.view(-1)[index] = code
        return raw.view(torch.float8_e4m3fn)
    return change


BAD_FP8 = {
    "nan_scale": (dict(edit_tensors=_set(SCALE, _nan_at(1))), [SCALE, "non-finite"]),
    "inf_scale": (dict(edit_tensors=_set(SCALE, lambda s: s * float("inf"))), [SCALE, "non-finite"]),
    # Finite, but 448 x 3e38 overflows: loaded, it failed every request with "logits not finite".
    "huge_scale": (dict(edit_tensors=_set(SCALE, lambda s: torch.full_like(s, 3e38))), [SCALE, "overflows bfloat16"]),
    # e4m3fn's NaN codes (0x7f, 0xff): loaded, every logit was NaN.
    "nan_weight": (dict(edit_tensors=_set(WEIGHT, _fp8_nan_at(5, 0x7F))), [WEIGHT, "NaN byte", "element 5"]),
    "negative_nan_weight": (dict(edit_tensors=_set(WEIGHT, _fp8_nan_at(0, 0xFF))), [WEIGHT, "NaN byte", "element 0"]),
    "scale_grid": (dict(edit_tensors=_set(SCALE, lambda s: s[:1])), [SCALE, "shape"]),
    "weight_dtype": (dict(edit_tensors=_set(WEIGHT, lambda w: w.to(torch.bfloat16))), [WEIGHT, "dtype"]),
    "missing_scale": (dict(edit_tensors=lambda t: t.pop(SCALE)), [SCALE]),
    "unknown_method": (dict(edit_config=lambda c: c.update(quant_method="fp9")), ["quant_method", "fp9"]),
    "zero_block": (dict(edit_config=lambda c: c.update(weight_block_size=[128, 0])), ["weight_block_size"]),
    "static_activations": (dict(edit_config=lambda c: c.update(activation_scheme="static")), ["activation_scheme"]),
}


@pytest.mark.parametrize("case", list(BAD_FP8))
def test_fp8_bad_checkpoint_exits_2_naming_what_is_wrong(strata_generate, fp8_checkpoint, tmp_path, case):
    edits, names = BAD_FP8[case]
    directory = _broken_copy(fp8_checkpoint("llama"), tmp_path / case, **edits)
    proc = H.run_generate(directory, PROMPTS[:1], 2, "--device-map", '{"": "cpu"}', check=False)
    assert proc.returncode == 2, (proc.returncode, proc.stderr)
    for name in names:
        assert name in proc.stderr, proc.stderr


@pytest.mark.parametrize("case", ["bad_value", "not_fp8_blocks", "no_gpu"])
def test_fp8_matmul_scaled_mm_refused_where_it_cannot_run(strata_generate, fp8_checkpoint, ct_checkpoint, case):
    """--fp8-matmul scaled_mm (W8A8 on a GPU, off by default) is refused up front, exit 2 naming the flag: an unknown
    value, a checkpoint without FP8 layers of 128 x 128 blocks, a plan that puts none on a GPU."""
    checkpoint, value, names = {
        "bad_value": (fp8_checkpoint("llama"), "w8a8", ['--fp8-matmul: "w8a8" is not dequantize or scaled_mm']),
        "not_fp8_blocks": (ct_checkpoint("llama", "w4a16_g128"), "scaled_mm",
                           ["--fp8-matmul scaled_mm", "no FP8 layer of 128 x 128 blocks"]),
        "no_gpu": (fp8_checkpoint("llama"), "scaled_mm", ["--fp8-matmul scaled_mm: no layer runs W8A8", "on a GPU"]),
    }[case]
    proc = H.run_generate(checkpoint, PROMPTS[:1], 2, "--device-map", '{"": "cpu"}', "--fp8-matmul", value,
                          check=False)
    assert proc.returncode == 2, (proc.returncode, proc.stderr)
    for name in names:
        assert name in proc.stderr, proc.stderr


# compressed-tensors: the schemes RedHatAI's W4A16 / W8A16 / FP8-dynamic checkpoints use, and the others strata
# reads; each made by the library's own compressor (quantized_checkpoints.make_ct_checkpoint).
_FP8_TOKEN = {"dynamic": True, "num_bits": 8, "observer": None, "strategy": "token", "symmetric": True,
              "type": "float"}
CT_SCHEMES = {
    "w4a16_g128": Q.ct_config({"group_size": 128}, "pack-quantized"),
    "w4a16_g32": Q.ct_config({"group_size": 32}, "pack-quantized"),
    "w4a16_asym_g64": Q.ct_config({"group_size": 64, "symmetric": False}, "pack-quantized"),
    "w8a16_channel": Q.ct_config({"num_bits": 8, "strategy": "channel"}, "pack-quantized"),
    "fp8_dynamic": Q.ct_config({"num_bits": 8, "type": "float", "strategy": "channel"}, "float-quantized",
                               input_activations=_FP8_TOKEN),
    "fp8_tensor": Q.ct_config({"num_bits": 8, "type": "float", "strategy": "tensor"}, "float-quantized",
                              input_activations=_FP8_TOKEN),
}


@pytest.fixture(scope="module")
def ct_checkpoint(tmp_path_factory):
    cache = {}

    def get(name, scheme):
        if (name, scheme) not in cache:
            directory = tmp_path_factory.mktemp(f"ct-{name}-{scheme}")
            cache[(name, scheme)] = Q.make_ct_checkpoint(directory, name, CT_SCHEMES[scheme])
        return cache[(name, scheme)]

    return get


def ct_transformers(checkpoint, dtype=torch.float32):
    """transformers' compressed-tensors quantizer with dequantize=True (its CPU path)."""
    import transformers

    return transformers.AutoModelForCausalLM.from_pretrained(
        checkpoint, dtype=dtype, device_map={"": "cpu"},
        quantization_config=transformers.CompressedTensorsConfig(run_compressed=False))


# transformers 5.23 cannot load packed asymmetric zero points (it expects them unpacked, [N, groups]): those
# schemes are checked against compressed-tensors' own decompression only.
TRANSFORMERS_LOADS = {s for s in CT_SCHEMES if "asym" not in s}


# Every scheme on Llama; Qwen3-MoE's per-expert projections (as the published MoE checkpoints store them) with two.
CT_WEIGHT_CASES = [("llama", s) for s in CT_SCHEMES] + [("qwen3_moe", s) for s in ("w4a16_asym_g64", "fp8_dynamic")]


@pytest.mark.parametrize(("name", "scheme"), CT_WEIGHT_CASES)
def test_ct_dequantized_weights_equal_the_references(ct_checkpoint, name, scheme):
    from safetensors.torch import load_file

    checkpoint = ct_checkpoint(name, scheme)
    library = load_file(Q.ct_dense_reference(checkpoint) / "model.safetensors")
    references = [library]
    if scheme in TRANSFORMERS_LOADS and name == "llama":
        references.append(ct_transformers(checkpoint).state_dict())
    for path in ("kernels", "aten"):
        ours = Q.strata_dequantized(checkpoint, "float32", path)
        assert ours
        assert name != "qwen3_moe" or any(".experts.3.down_proj." in k for k in ours), sorted(ours)
        for reference in references:
            for key, value in ours.items():
                assert torch.equal(reference[key], value), f"{path}: {key} differs"


# Every scheme on Llama; the other families (which share the layer) with three of them.
CT_CASES = [("llama", s) for s in CT_SCHEMES] + [
    (n, s) for n in ("qwen3", "qwen3_moe", "phi3", "gemma3") for s in ("w4a16_g128", "w4a16_asym_g64", "fp8_dynamic")]


@pytest.mark.parametrize("stages", [1, 2])
@pytest.mark.parametrize(("name", "scheme"), CT_CASES)
def test_ct_greedy_matches_the_decompressed_model(strata_generate, ct_checkpoint, name, scheme, stages):
    """Weight-only: strata computes with unquantized activations (FP8-dynamic's per-token FP8 activations are the
    GPU W8A8 path's), so the reference is transformers' generate() on the dense model of the decompressed
    weights (equal to strata's and transformers' own dequantization, test above)."""
    checkpoint = ct_checkpoint(name, scheme)
    reference = H.reference_generate(Q.ct_dense_reference(checkpoint), PROMPTS, NEW_TOKENS)
    got = H.run_generate(checkpoint, PROMPTS, NEW_TOKENS, *plan_args(name, stages))
    assert got["load"]["packed_tensors"] > 0
    Q.assert_same_greedy(reference, got["results"], LOGPROB_TOLERANCE)


@pytest.mark.parametrize("scheme", ["w4a16_g128", "w8a16_channel"])
def test_ct_bfloat16_agrees_where_the_margin_exceeds_bf16_noise(strata_generate, tmp_path, scheme):
    """A bfloat16 checkpoint (bfloat16 scales, as llm-compressor writes from a bfloat16 model) served in
    bfloat16, against the library's decompression in a bfloat16 dense model, under the margin rule."""
    checkpoint = Q.make_ct_checkpoint(tmp_path / scheme, "llama", CT_SCHEMES[scheme], dense_dtype=torch.bfloat16)
    reference = H.reference_generate(Q.ct_dense_reference(checkpoint), PROMPTS, NEW_TOKENS, dtype=torch.bfloat16)
    got = H.run_generate(checkpoint, PROMPTS, NEW_TOKENS, "--device-map", '{"": "cpu"}', "--dtype", "bfloat16")
    assert got["load"]["packed_tensors"] > 0
    H.compare_bfloat16_by_margin(reference, got["results"], NEW_TOKENS)
