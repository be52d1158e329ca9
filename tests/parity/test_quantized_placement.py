"""Quantized checkpoints: strata-plan --quantized-sizing transformers places them exactly as transformers'
from_pretrained does (its quantizer's replacement modules, skip lists and machine dependence), for each format
x family x strategy x memory layout, and its module tree is the quantized model transformers builds.

The reference is quantized_helpers' (the quantizer as get_hf_quantizer builds it, preprocess_model on the meta
model, _get_device_map with the quantizer). FP8's `dequantize` is forced either way: transformers keeps FP8
weights only on a GPU of compute capability >= 8.9, which strata-plan is told with --inventory 0=...@9.0 (and
@8.6 for the dequantized branch). Layouts are relative to the quantized model's size as transformers counts it.
"""

from __future__ import annotations

import itertools
import json

import pytest

import parity_helpers as H
from compressed_tensors_config import ct_config
import quantized_helpers as Q
import test_family_plan_parity_gemma as GEMMA
import test_family_plan_parity_moe as MOE

DTYPE = "bfloat16"
KEEPS_FP8 = "0=80GiB@9.0,cpu=1TiB"  # GPU 0 of compute capability 9.0: transformers keeps FP8
DEQUANTIZES = "0=80GiB@8.6,cpu=1TiB"  # 8.6: transformers dequantizes to the serving dtype

# Qwen's released FP8 checkpoints (Qwen3-8B-FP8, Qwen3-30B-A3B-FP8) carry this quantization_config.
FP8 = {"quant_method": "fp8", "activation_scheme": "dynamic", "fmt": "e4m3", "weight_block_size": [128, 128]}

FAMILIES = {
    "Llama-3-8B": H.CONFIGS["Llama-3-8B"],
    "Llama-3.2-1B": H.CONFIGS["Llama-3.2-1B"],  # tied embeddings
    "Mistral-7B-v0.1": H.CONFIGS["Mistral-7B-v0.1"],
    "Qwen2-7B": H.CONFIGS["Qwen2-7B"],  # q/k/v biases
    "Qwen3-8B": MOE.CONFIGS["Qwen3-8B"],
    "Qwen3-30B-A3B": MOE.CONFIGS["Qwen3-30B-A3B"],
    "Mixtral-8x7B-v0.1": MOE.CONFIGS["Mixtral-8x7B-v0.1"],
    "Gemma-2-9B": GEMMA.FAMILY_CONFIGS["Gemma-2-9B"],
    "Gemma-3-12B": GEMMA.FAMILY_CONFIGS["Gemma-3-12B"],
    "Phi-3-mini-4k": GEMMA.FAMILY_CONFIGS["Phi-3-mini-4k"],
    # DeepSeek-V3's widths (its FP8 release's format is `fp8` above, with weight_block_size 128 x 128) over 6 layers:
    # the 671B model's 14,848 expert modules would make each reference minutes long.
    "DeepSeek-V3-6-layers": dict(MOE.CONFIGS["DeepSeek-V3"], num_hidden_layers=6),
}

# FP8 variants on some families: the skip lists (an explicit list replaces the default lm_head skip; Mixtral's
# names are the checkpoint's block_sparse_moe ones, renamed by transformers), ue8m0 scales, other blocks.
VARIANTS = {
    "fp8-skip-none": dict(FP8, modules_to_not_convert=[]),
    "fp8-skip-some": dict(FP8, modules_to_not_convert=["lm_head", "model.layers.0", "model.layers.*.self_attn.o_proj",
                                                       "down_proj"]),
    "fp8-ue8m0-64x32": dict(FP8, scale_fmt="ue8m0", weight_block_size=[64, 32]),
}
VARIANT_FAMILIES = ["Llama-3.2-1B", "Qwen3-30B-A3B", "Mixtral-8x7B-v0.1", "Phi-3-mini-4k"]
MIXTRAL_SKIP = dict(FP8, modules_to_not_convert=["lm_head", "model.layers.1.block_sparse_moe.experts",
                                                 "model.layers.2.block_sparse_moe"])


# compressed-tensors: the schemes RedHatAI's W4A16 and FP8-dynamic checkpoints use (one config group targeting
# Linear, lm_head and the MoE routers ignored), and the other strategies strata reads.
def _ct(weights: dict, fmt: str, input_activations=None, ignore=("lm_head", "re:.*mlp.gate$")) -> dict:
    return ct_config(weights, fmt, ignore=ignore, input_activations=input_activations)


_FP8_TOKEN = {"dynamic": True, "num_bits": 8, "observer": None, "strategy": "token", "symmetric": True, "type": "float"}
CT_W4A16 = _ct({"group_size": 128}, "pack-quantized")
CT_FP8_DYNAMIC = _ct({"num_bits": 8, "type": "float", "strategy": "channel"}, "float-quantized", _FP8_TOKEN)
CT_VARIANTS = {
    "ct-w4a16-asym-g64": _ct({"group_size": 64, "symmetric": False}, "pack-quantized"),
    "ct-w8a16-channel": _ct({"num_bits": 8, "strategy": "channel"}, "pack-quantized"),
    "ct-fp8-tensor": _ct({"num_bits": 8, "type": "float", "strategy": "tensor"}, "float-quantized", _FP8_TOKEN),
    "ct-fp8-block": _ct({"num_bits": 8, "type": "float", "strategy": "block", "block_structure": [128, 128]},
                        "float-quantized", _FP8_TOKEN),
    "ct-w4a16-ignore-regex": _ct({"group_size": 128}, "pack-quantized",
                                 ignore=["lm_head", "re:.*mlp.gate$", "re:model.layers.1[.]", "model.layers.0.mlp.up_proj"]),
}

# AWQ (AutoAWQ's GEMM checkpoints) and GPTQ v1 (AutoGPTQ / GPTQModel's). transformers' quantizers for them need
# gptqmodel, which does not install here: gptqmodel_stub stands in for its QuantLinear buffers only.
AWQ = {"quant_method": "awq", "bits": 4, "group_size": 128, "zero_point": True, "version": "gemm",
       "modules_to_not_convert": None}
GPTQ = {"quant_method": "gptq", "bits": 4, "group_size": 128, "desc_act": False, "sym": True,
        "checkpoint_format": "gptq", "damp_percent": 0.01, "true_sequential": True}
INT_VARIANTS = {
    "awq-skip-some": dict(AWQ, modules_to_not_convert=["model.layers.0.mlp", "o_proj"]),
    "gptq-desc-act-g-1-int8": dict(GPTQ, desc_act=True, group_size=-1, bits=8),
    "gptq-some-modules": dict(GPTQ, modules_in_block_to_quantize=[["self_attn.k_proj", "self_attn.v_proj"],
                                                                   ["mlp.down_proj"]]),
}

QUANT_CONFIGS = {"fp8": FP8, "awq": AWQ, "gptq": GPTQ, **INT_VARIANTS, "ct-w4a16": CT_W4A16, "ct-fp8-dynamic": CT_FP8_DYNAMIC, **VARIANTS,
                 "fp8-mixtral-skip-renamed": MIXTRAL_SKIP, **CT_VARIANTS}
# The layouts the variants run with (the main formats run with every layout of the plan parity suite).
VARIANT_LAYOUTS = ["uneven_4gpu", "cpu_offload", "disk_offload"]


def cases():
    """(family, variant, layouts)."""
    out = [(f, v, list(H.LAYOUTS)) for f in FAMILIES for v in ("fp8", "ct-w4a16", "ct-fp8-dynamic")]
    out += [(f, v, VARIANT_LAYOUTS) for f in FAMILIES for v in ("awq", "gptq")]
    out += [(f, v, VARIANT_LAYOUTS) for f in VARIANT_FAMILIES
            for v in list(VARIANTS) + list(CT_VARIANTS) + list(INT_VARIANTS)]
    out.append(("Mixtral-8x7B-v0.1", "fp8-mixtral-skip-renamed", VARIANT_LAYOUTS))
    return out


def is_fp8(variant: str) -> bool:
    return variant.startswith("fp8")


def model_config(family: str, variant: str, dequantize: bool) -> dict:
    """The config.json strata reads. compressed-tensors' dequantize is the user's choice (from_pretrained's
    quantization_config), written into the config here; FP8's is the machine's, given by --inventory."""
    q = dict(QUANT_CONFIGS[variant])
    if dequantize and variant.startswith("ct"):
        q["dequantize"] = True
    return dict(FAMILIES[family], quantization_config=q)


def machine_args(variant: str, dequantize: bool) -> list:
    return ["--inventory", DEQUANTIZES if dequantize and is_fp8(variant) else KEEPS_FP8]


@pytest.fixture(scope="module")
def quantized_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("quantized_configs")
    made = {}

    def get(config: dict):
        key = json.dumps(config, sort_keys=True)
        if key not in made:
            made[key] = H.write_checkpoint_dir(root / f"c{len(made)}", config)
        return made[key]

    return get


def branches(variant: str) -> tuple:
    """The main formats run both branches of `dequantize`; a variant's dequantized model is the dense one."""
    return (False, True) if variant in ("fp8", "ct-w4a16", "ct-fp8-dynamic") else (False,)


MAP_CASES = [pytest.param(f, v, d, l, s, id=f"{f}-{v}-{'dequantized' if d else 'quantized'}-{l}-{s}")
             for f, v, layouts in cases() for d in branches(v) for l in layouts for s in H.STRATEGIES]


@pytest.mark.parametrize("family,variant,dequantize,layout,strategy", MAP_CASES)
def test_quantized_device_map_matches_transformers(strata_plan, quantized_dir, family, variant, dequantize, layout,
                                                   strategy):
    config = model_config(family, variant, dequantize)
    model, quantizer = Q.cached_quantized_model(config, DTYPE, dequantize)
    max_memory = Q.quantized_layout(model, quantizer, layout)
    expected = Q.reference_quantized_device_map(model, quantizer, strategy, max_memory)
    out = H.strata_plan_json(strata_plan, "--model", quantized_dir(config), "--device-map", strategy,
                             "--max-memory", H.max_memory_arg(max_memory), "--dtype", DTYPE,
                             "--quantized-sizing", "transformers", *machine_args(variant, dequantize))
    assert out["quantization"]["planned_dense"] == dequantize
    assert out["device_map"] == expected, (
        f"{family} {variant} dequantize={dequantize} {layout} {strategy}: max_memory={H.max_memory_arg(max_memory)}\n"
        f"strata differs from transformers:\n{H.map_diff(expected, out['device_map'])}")


TREE_CASES = [pytest.param(f, v, d, id=f"{f}-{v}-{'dequantized' if d else 'quantized'}")
              for f, v, _ in cases() for d in ((False, True) if is_fp8(v) or v.startswith("ct") else (False,))]


@pytest.mark.parametrize("family,variant,dequantize", TREE_CASES)
def test_quantized_module_tree_matches_transformers(strata_plan, quantized_dir, family, variant, dequantize):
    """Every parameter and buffer transformers' quantized model registers, with strata's shape and dtype."""
    config = model_config(family, variant, dequantize)
    model, _ = Q.cached_quantized_model(config, DTYPE, dequantize)
    proc = H.run_strata_plan(strata_plan, "--model", quantized_dir(config), "--print-module-tree", "--dtype", DTYPE,
                             "--quantized-sizing", "transformers", *machine_args(variant, dequantize))
    expected, actual = Q.module_tree_of(model), Q.strata_tree(json.loads(proc.stdout))
    diff = [f"  {k}: transformers {expected.get(k)} != strata {actual.get(k)}"
            for k in sorted(set(expected) | set(actual)) if expected.get(k) != actual.get(k)]
    assert not diff, f"{family} {variant}:\n" + "\n".join(diff[:30])


def test_this_machine_decides_without_an_inventory(strata_plan, quantized_dir):
    """No --inventory: strata-plan asks the CUDA driver, as transformers asks torch; on a machine without a GPU of
    compute capability 8.9 both plan the dense model (validate_environment's own verdict, not forced)."""
    config = model_config("Llama-3-8B", "fp8", False)
    model, quantizer = Q.cached_quantized_model(config, DTYPE, None)
    max_memory = Q.quantized_layout(model, quantizer, "cpu_offload")
    expected = Q.reference_quantized_device_map(model, quantizer, "auto", max_memory)
    out = H.strata_plan_json(strata_plan, "--model", quantized_dir(config), "--device-map", "auto", "--max-memory",
                             H.max_memory_arg(max_memory), "--dtype", DTYPE, "--quantized-sizing", "transformers")
    assert out["quantization"]["planned_dense"] == bool(quantizer.quantization_config.dequantize)
    assert out["device_map"] == expected


def test_dequantize_in_the_config_plans_dense(strata_plan, quantized_dir):
    config = dict(FAMILIES["Qwen3-8B"], quantization_config=dict(FP8, dequantize=True))
    model, quantizer = Q.cached_quantized_model(config, DTYPE, None)
    max_memory = Q.quantized_layout(model, quantizer, "cpu_offload")
    expected = Q.reference_quantized_device_map(model, quantizer, "balanced", max_memory)
    out = H.strata_plan_json(strata_plan, "--model", quantized_dir(config), "--device-map", "balanced",
                             "--max-memory", H.max_memory_arg(max_memory), "--dtype", DTYPE,
                             "--quantized-sizing", "transformers", "--inventory", KEEPS_FP8)
    assert out["quantization"]["planned_dense"] is True
    assert out["device_map"] == expected


@pytest.mark.parametrize("variant", ["fp8", "ct-w4a16", "ct-fp8-dynamic"])
def test_packed_sizing_is_the_default_and_counts_the_files(strata_plan, quantized_dir, variant):
    """Without --quantized-sizing the plan counts the packed bytes, whatever the machine. For these dense-layer
    formats the bytes the files hold are what transformers' quantized modules hold (FP8 kept)."""
    config = model_config("Llama-3-8B", variant, False)
    model, quantizer = Q.cached_quantized_model(config, DTYPE, False)
    size = Q.quantized_model_size(model, quantizer)  # the FP8 model: what the files hold, here
    out = H.strata_plan_json(strata_plan, "--model", quantized_dir(config), "--device-map", "sequential",
                             "--max-memory", f"0={size * 2},cpu={size * 2}", "--inventory", DEQUANTIZES)
    assert out["quantization"]["sizing"] == "packed"
    assert out["quantization"]["planned_dense"] is False
    assert sum(d["planned_bytes"] for d in out["devices"]) == size


_TINY = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 256, "intermediate_size": 320,
         "num_hidden_layers": 1, "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 1000,
         "torch_dtype": "bfloat16"}
BAD_CONFIGS = {
    "unknown-method": ({"quant_method": "bitsandbytes"}, "quantization_config.quant_method: \"bitsandbytes\""),
    "fp8-static": (dict(FP8, activation_scheme="static"), "quantization_config.activation_scheme"),
    "gptq-3-bits": (dict(GPTQ, bits=3), "quantization_config.bits: \"3\""),
    "awq-gemv": (dict(AWQ, version="gemv"), "quantization_config.version: \"gemv\""),
    "ct-static-input": (_ct({"num_bits": 8, "type": "float", "strategy": "channel"}, "float-quantized",
                            dict(_FP8_TOKEN, dynamic=False)),
                        "quantization_config.config_groups.group_0.input_activations.dynamic"),
}


@pytest.mark.parametrize("name", list(BAD_CONFIGS))
def test_bad_quantization_config_exits_2_naming_the_field(strata_plan, quantized_dir, name):
    q, field = BAD_CONFIGS[name]
    proc = H.run_strata_plan(strata_plan, "--model", quantized_dir(dict(_TINY, quantization_config=q)),
                             "--max-memory", "cpu=1GiB", expect_rc=2)
    assert field in proc.stderr, proc.stderr


def _write_safetensors(path, tensors: dict):
    """A safetensors file of zeros: {name: (dtype, shape)}."""
    sizes = {"F8_E4M3": 1, "BF16": 2, "F32": 4, "I32": 4, "I64": 8, "F16": 2, "U8": 1}
    header, offset = {}, 0
    for name, (dtype, shape) in tensors.items():
        n = sizes[dtype]
        for d in shape:
            n *= d
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [offset, offset + n]}
        offset += n
    text = json.dumps(header).encode()
    path.write_bytes(len(text).to_bytes(8, "little") + text + b"\0" * offset)


def test_checkpoint_header_mismatch_exits_2_naming_the_tensor(strata_plan, tmp_path):
    """An FP8 checkpoint whose scale grid does not match its weight: the header check names the tensor."""
    config = dict(_TINY, quantization_config=FP8)
    tensors = {"model.embed_tokens.weight": ("BF16", [1000, 256]), "model.norm.weight": ("BF16", [256]),
               "lm_head.weight": ("BF16", [1000, 256]), "model.layers.0.input_layernorm.weight": ("BF16", [256]),
               "model.layers.0.post_attention_layernorm.weight": ("BF16", [256])}
    for name, n, k in [("self_attn.q_proj", 256, 256), ("self_attn.k_proj", 128, 256), ("self_attn.v_proj", 128, 256),
                       ("self_attn.o_proj", 256, 256), ("mlp.gate_proj", 320, 256), ("mlp.up_proj", 320, 256),
                       ("mlp.down_proj", 256, 320)]:
        tensors[f"model.layers.0.{name}.weight"] = ("F8_E4M3", [n, k])
        tensors[f"model.layers.0.{name}.weight_scale_inv"] = ("F32", [-(-n // 128), -(-k // 128)])
    directory = H.write_checkpoint_dir(tmp_path / "fp8", config)
    _write_safetensors(directory / "model.safetensors", tensors)
    out = H.strata_plan_json(strata_plan, "--model", directory, "--max-memory", "cpu=1GiB")
    assert out["quantization"]["quantized_linears"] == 7
    tensors["model.layers.0.mlp.down_proj.weight_scale_inv"] = ("F32", [2, 2])
    _write_safetensors(directory / "model.safetensors", tensors)
    proc = H.run_strata_plan(strata_plan, "--model", directory, "--max-memory", "cpu=1GiB", expect_rc=2)
    assert "tensor model.layers.0.mlp.down_proj.weight_scale_inv has shape [2, 2]" in proc.stderr, proc.stderr
    assert "expected [2, 3]" in proc.stderr, proc.stderr


# gpt-oss's MXFP4 release (quantization_config as openai/gpt-oss-20b states it): on a machine without a GPU and
# triton's kernels transformers' Mxfp4 quantizer dequantizes the experts to bfloat16, which
# `--quantized-sizing transformers` reproduces; packed sizing counts the blocks and scales.
MXFP4 = {"quant_method": "mxfp4", "modules_to_not_convert": ["model.layers.*.self_attn", "model.layers.*.mlp.router",
                                                             "model.embed_tokens", "lm_head"]}
MXFP4_CASES = [pytest.param(f, l, s, id=f"{f}-{l}-{s}") for f in ("gpt-oss-20b", "gpt-oss-120b")
               for l in VARIANT_LAYOUTS for s in H.STRATEGIES]


@pytest.mark.parametrize("family,layout,strategy", MXFP4_CASES)
def test_mxfp4_device_map_matches_transformers(strata_plan, quantized_dir, family, layout, strategy):
    config = dict(MOE.CONFIGS[family], quantization_config=MXFP4)
    model, quantizer = Q.cached_quantized_model(config, DTYPE, None)
    assert quantizer.quantization_config.dequantize, "this machine was expected to dequantize MXFP4"
    max_memory = Q.quantized_layout(model, quantizer, layout)
    expected = Q.reference_quantized_device_map(model, quantizer, strategy, max_memory)
    out = H.strata_plan_json(strata_plan, "--model", quantized_dir(config), "--device-map", strategy,
                             "--max-memory", H.max_memory_arg(max_memory), "--dtype", DTYPE,
                             "--quantized-sizing", "transformers")
    assert out["quantization"]["planned_dense"]
    assert out["device_map"] == expected, (
        f"{family} mxfp4 {layout} {strategy}: max_memory={H.max_memory_arg(max_memory)}\n"
        f"strata differs from transformers:\n{H.map_diff(expected, out['device_map'])}")


@pytest.mark.parametrize("family", ["gpt-oss-20b", "gpt-oss-120b"])
def test_mxfp4_module_tree_matches_transformers(strata_plan, quantized_dir, family):
    config = dict(MOE.CONFIGS[family], quantization_config=MXFP4)
    model, _ = Q.cached_quantized_model(config, DTYPE, None)
    proc = H.run_strata_plan(strata_plan, "--model", quantized_dir(config), "--print-module-tree", "--dtype", DTYPE,
                             "--quantized-sizing", "transformers")
    expected, actual = Q.module_tree_of(model), Q.strata_tree(json.loads(proc.stdout))
    diff = [f"  {k}: transformers {expected.get(k)} != strata {actual.get(k)}"
            for k in sorted(set(expected) | set(actual)) if expected.get(k) != actual.get(k)]
    assert not diff, f"{family} mxfp4:\n" + "\n".join(diff[:30])
