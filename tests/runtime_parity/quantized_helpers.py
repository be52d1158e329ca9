"""Quantized test checkpoints, made offline from tiny random models by the formats' own code: FP8 with
transformers' FP8 quantizer (Fp8Quantize: per-block amax, float8_e4m3fn), compressed-tensors with the
compressed-tensors library's compressor, AWQ and GPTQ with packers checked against independent readers. And
strata's own dequantization of a checkpoint (tests/runtime/strata_dequantize_probe)."""

from __future__ import annotations

import json
import pathlib
import re
import subprocess

import torch

import runtime_helpers as H

# Shapes whose every projection is a whole number of 128 x 128 FP8 blocks (hidden 256, heads of 64, 2 KV heads:
# k/v are [128, 256]); eos/bos None as in runtime_helpers.
_BLOCKS = dict(H._COMMON, hidden_size=256, intermediate_size=512, num_attention_heads=4, num_key_value_heads=2,
               head_dim=64)

CONFIGS = {
    "llama": ("LlamaConfig", dict(_BLOCKS)),
    "qwen3": ("Qwen3Config", dict(_BLOCKS, use_sliding_window=True, sliding_window=6,
                                  layer_types=["full_attention", "sliding_attention", "full_attention",
                                               "sliding_attention"])),
    "qwen3_moe": ("Qwen3MoeConfig", dict(_BLOCKS, moe_intermediate_size=128, num_experts=4, num_experts_per_tok=2,
                                         mlp_only_layers=[2], norm_topk_prob=True)),
    "phi3": ("Phi3Config", dict(_BLOCKS, num_key_value_heads=4)),
    "gemma3": ("Gemma3TextConfig", dict(_BLOCKS, sliding_window=5, sliding_window_pattern=2, query_pre_attn_scalar=64,
                                        final_logit_softcapping=6.0, tie_word_embeddings=True)),
}


def dense_model(name: str, seed: int = 1):
    import transformers

    config_class, kwargs = CONFIGS[name]
    config = getattr(transformers, config_class)(**kwargs)
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() > 1:
                p.mul_(8.0)
            else:
                p.uniform_(-0.5, 0.5)
    return model


def saved_dense(directory: pathlib.Path, model) -> dict:
    """The model as save_pretrained writes it (sparse experts one tensor per expert and projection), read back."""
    from safetensors.torch import load_file

    directory.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(directory, safe_serialization=True)
    return load_file(directory / "model.safetensors")


def linear_weights(model, saved: dict, skip=()) -> list[str]:
    """The checkpoint names of the weights of the model's linear layers (its nn.Linear modules, and each expert's
    projections as saved), minus the modules named in `skip`."""
    names = {module_name + ".weight" for module_name, module in model.named_modules()
             if isinstance(module, torch.nn.Linear) and module_name not in skip}
    names |= {k for k in saved if re.search(r"\.experts\.\d+\.\w+\.weight$", k)}
    return sorted(k for k in names if k in saved)


def fp8_quantizer(block=(128, 128), scale_fmt=None):
    import transformers
    from transformers.integrations.finegrained_fp8 import Fp8Quantize

    class _Quantizer:  # what Fp8Quantize reads of an HfQuantizer
        quantization_config = transformers.utils.quantization_config.FineGrainedFP8Config(
            weight_block_size=list(block), scale_fmt=scale_fmt or "float")

    return Fp8Quantize(_Quantizer())


def quantize_fp8_ragged(weight: torch.Tensor, block=(128, 128)):
    """The FP8 quantizer's math (per-block amax over the block's elements, scale = 448 / amax, clamp, cast) for
    shapes that are not whole blocks, which Fp8Quantize leaves unquantized: the last blocks are partial."""
    rows, cols = weight.shape
    bm, bn = block
    gr, gc = -(-rows // bm), -(-cols // bn)
    padded = torch.zeros(gr * bm, gc * bn)
    padded[:rows, :cols] = weight.float()
    tiles = padded.reshape(gr, bm, gc, bn)
    amax = tiles.abs().amax(dim=(1, 3))
    fp8_max = torch.finfo(torch.float8_e4m3fn).max
    scales = torch.where(amax > 0, fp8_max / torch.where(amax > 0, amax, torch.ones_like(amax)), torch.ones_like(amax))
    inv = (1.0 / scales).float()
    q = torch.clamp(tiles * scales[:, None, :, None], -fp8_max, fp8_max).reshape(gr * bm, gc * bn)
    return q[:rows, :cols].to(torch.float8_e4m3fn).contiguous(), inv


def save_quantized(directory: pathlib.Path, model, tensors: dict, quantization_config: dict) -> pathlib.Path:
    from safetensors.torch import save_file

    directory.mkdir(parents=True, exist_ok=True)
    model.config.save_pretrained(directory)
    config = json.loads((directory / "config.json").read_text())
    config["quantization_config"] = quantization_config
    (directory / "config.json").write_text(json.dumps(config, indent=2))
    save_file({k: v.contiguous() for k, v in tensors.items()}, directory / "model.safetensors", metadata={"format": "pt"})
    return directory


def make_fp8_checkpoint(directory: pathlib.Path, name: str, scale_dtype=torch.float32, skip=("lm_head",),
                        scale_fmt=None, dense_dtype=torch.float32) -> pathlib.Path:
    """Every nn.Linear but `skip` quantized by transformers' Fp8Quantize with 128 x 128 blocks; the other tensors
    (embeddings, norms, skipped layers) in `dense_dtype`, as the checkpoint's declared dtype (transformers keeps a
    quantized checkpoint's other tensors in their stored dtype)."""
    return quantize_fp8(directory, dense_model(name), scale_dtype, skip, scale_fmt, dense_dtype)


def quantize_fp8(directory: pathlib.Path, model, scale_dtype=torch.float32, skip=("lm_head",), scale_fmt=None,
                 dense_dtype=torch.float32) -> pathlib.Path:
    """make_fp8_checkpoint of a given model (any float32 transformers model: the bench's ~125M Llama)."""
    state = saved_dense(directory, model)
    op = fp8_quantizer(scale_fmt=scale_fmt)
    tensors = {}
    quantized = set(linear_weights(model, state, skip))
    for key, value in state.items():
        if key in quantized:
            out = op._quantize_one(key, value)
            assert len(out) == 2, f"{key} {tuple(value.shape)} is not whole 128 x 128 blocks"
            scale_key = key.removesuffix(".weight") + ".weight_scale_inv"
            if scale_fmt != "ue8m0":
                out[scale_key] = out[scale_key].to(scale_dtype)
            tensors.update(out)
        else:
            tensors[key] = value.to(dense_dtype)
    model.config.dtype = dense_dtype
    config = {"quant_method": "fp8", "weight_block_size": [128, 128], "activation_scheme": "dynamic"}
    if skip:
        config["modules_to_not_convert"] = list(skip)
    if scale_fmt:
        config["scale_fmt"] = scale_fmt
    return save_quantized(directory, model, tensors, config)


def probe_path() -> pathlib.Path:
    return H.build_dir() / "tests" / "runtime" / "strata_dequantize_probe"


def strata_dequantized(checkpoint: pathlib.Path, dtype: str, path: str = "kernels") -> dict:
    """strata's dequantization of every quantized layer (kernels/quantized.h, or the ATen ops a GPU runs)."""
    from safetensors.torch import load_file

    out = checkpoint / f"strata-dequantized-{dtype}-{path}.safetensors"
    proc = subprocess.run([str(probe_path()), str(checkpoint), str(out), dtype, path], capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr
    return load_file(out)


def ct_config(weights: dict, fmt: str, ignore=("lm_head",), input_activations=None) -> dict:
    """A compressed-tensors quantization_config of one group targeting Linear (RedHatAI's layout)."""
    args = {"actorder": None, "block_structure": None, "dynamic": False, "group_size": None, "num_bits": 4,
            "observer": "minmax", "observer_kwargs": {}, "strategy": "group", "symmetric": True, "type": "int"}
    args.update(weights)
    return {"config_groups": {"group_0": {"input_activations": input_activations, "output_activations": None,
                                          "targets": ["Linear"], "weights": args}},
            "format": fmt, "ignore": list(ignore), "kv_cache_scheme": None, "quant_method": "compressed-tensors",
            "quantization_status": "compressed"}


def make_ct_checkpoint(directory: pathlib.Path, name: str, config: dict, dense_dtype=torch.float32) -> pathlib.Path:
    """The model quantized and compressed by the compressed-tensors library itself: its quantization config applied
    to the model, each layer's scale and zero point from its min/max observer values (calculate_qparams), then
    ModelCompressor's compress_model (pack-quantized: weight_packed, weight_scale, weight_zero_point, weight_shape;
    float-quantized: FP8 weight and weight_scale)."""
    return quantize_ct(directory, dense_model(name).to(dense_dtype), config, dense_dtype,
                       reference=lambda: dense_model(name).to(dense_dtype))


def quantize_ct(directory: pathlib.Path, model, config: dict, dense_dtype=torch.float32, reference=None) -> pathlib.Path:
    """make_ct_checkpoint of a given model (quantized in place); `reference` makes a fresh dense model of the same
    config for the decompressed copy beside the checkpoint (ct_dense_reference), none without it."""
    from compressed_tensors.compressors import ModelCompressor
    from compressed_tensors.quantization import QuantizationConfig, QuantizationStatus, apply_quantization_config
    from compressed_tensors.quantization.utils import calculate_qparams

    qconfig = QuantizationConfig.model_validate(dict(config, quantization_status="initialized"))
    apply_quantization_config(model, qconfig)
    with torch.no_grad():
        for module in model.modules():
            scheme = getattr(module, "quantization_scheme", None)
            if scheme is None or scheme.weights is None:
                continue
            args = scheme.weights
            w = module.weight.float()
            strategy = str(args.strategy.value if hasattr(args.strategy, "value") else args.strategy)
            if strategy == "group":
                tiles = w.reshape(w.shape[0], -1, args.group_size)
                low, high = tiles.amin(-1), tiles.amax(-1)
            elif strategy == "channel":
                low, high = w.amin(-1, keepdim=True), w.amax(-1, keepdim=True)
            elif strategy == "tensor":
                low, high = w.amin().reshape(1), w.amax().reshape(1)
            else:
                raise ValueError(strategy)
            scale, zero = calculate_qparams(low, high, args)
            module.weight_scale.data = scale.to(module.weight_scale.dtype).reshape(module.weight_scale.shape)
            if hasattr(module, "weight_zero_point") and module.weight_zero_point is not None:
                module.weight_zero_point.data = zero.to(module.weight_zero_point.dtype).reshape(
                    module.weight_zero_point.shape)
            module.quantization_status = QuantizationStatus.FROZEN
    compressor = ModelCompressor.from_pretrained_model(model, quantization_format=config["format"])
    compressor.compress_model(model)
    tensors = dict(model.state_dict())
    if model.config.tie_word_embeddings:
        tensors.pop("lm_head.weight", None)
    model.config.dtype = dense_dtype
    directory.mkdir(parents=True, exist_ok=True)
    save_quantized(directory, model, tensors, config)
    compressor.update_config(str(directory))
    if reference is None:
        return directory
    # The library's own decompression of the same layers, in a plain dense model beside the checkpoint
    # (ct_dense_reference): the reference of schemes transformers cannot load (packed asymmetric zero points) and
    # of weight-only generation (transformers runs FP8-dynamic's activations through FP8 too).
    compressor.decompress_model(model)
    dense = reference()
    decompressed = model.state_dict()
    with torch.no_grad():
        for key, value in dense.state_dict().items():
            value.copy_(decompressed[key])
    dense.save_pretrained(ct_dense_reference(directory), safe_serialization=True)
    return directory


def ct_dense_reference(checkpoint: pathlib.Path) -> pathlib.Path:
    """The dense model make_ct_checkpoint saved beside `checkpoint`: its weights decompressed by compressed-tensors."""
    return checkpoint.with_name(checkpoint.name + "-dense")
