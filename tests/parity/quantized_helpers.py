"""transformers' placement of a quantized checkpoint, computed as from_pretrained computes it, without weights:
the quantizer from AutoHfQuantizer (pre_quantized, as get_hf_quantizer builds it), its dtype hook, the model
built under from_pretrained's init context with the quantizer's preprocess_model (its replacement modules on
the meta device), then _get_device_map with the quantizer (param_element_size, adjust_max_memory). The FP8
and compressed-tensors quantizers' machine-dependent `dequantize` is forced either way, standing in for
validate_environment on a machine with or without a GPU of compute capability 8.9."""

from __future__ import annotations

import copy
import functools
import json

import contextlib

import gptqmodel_stub
import parity_helpers as H


def quantizer_environment(quant_method: str):
    """What the quantizer needs installed: gptqmodel for AWQ and GPTQ (gptqmodel_stub), nothing else otherwise."""
    return gptqmodel_stub.installed() if quant_method in ("awq", "gptq") else contextlib.nullcontext()


@functools.lru_cache(maxsize=None)
def _quantized_model_cached(config_json: str, dtype_name: str, dequantize):
    return quantized_meta_model(json.loads(config_json), dtype_name, dequantize)


def quantized_meta_model(config_dict: dict, dtype_name: str, dequantize=None):
    """(model on the meta device with the quantizer's modules, the quantizer)."""
    with quantizer_environment(config_dict["quantization_config"]["quant_method"]):
        return _quantized_meta_model(config_dict, dtype_name, dequantize)


def _quantized_meta_model(config_dict: dict, dtype_name: str, dequantize=None):
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM
    from transformers.quantizers.auto import AutoHfQuantizer
    from transformers.utils.generic import ContextManagers

    config = AutoConfig.for_model(**copy.deepcopy(config_dict))
    quantizer = AutoHfQuantizer.from_config(config.quantization_config, pre_quantized=True)
    quantizer.validate_environment(device_map="auto", weights_only=True)  # this machine's verdict ...
    if dequantize is not None:  # ... or the one forced
        quantizer.quantization_config.dequantize = dequantize
    dtype = quantizer.update_dtype(getattr(torch, dtype_name))
    cls = AutoModelForCausalLM._model_mapping[type(config)]
    config = copy.deepcopy(config)
    with ContextManagers(cls.get_init_context(dtype, True, False, False)):
        model = cls(config)
        quantizer.preprocess_model(model=model, dtype=dtype, device_map="auto", checkpoint_files=None,
                                   use_kernels=False)
    return model, quantizer


def cached_quantized_model(config_dict: dict, dtype_name: str, dequantize=None):
    return _quantized_model_cached(json.dumps(config_dict, sort_keys=True), dtype_name, dequantize)


def reference_quantized_device_map(model, quantizer, strategy: str, max_memory: dict) -> dict:
    """_get_device_map(model, strategy, max_memory, quantizer) with no GPU queries; the quantizer's config is
    restored afterwards (its validate_environment may flip `dequantize` on this GPU-less machine)."""
    from transformers.integrations.accelerate import _get_device_map

    saved = copy.deepcopy(quantizer.quantization_config.__dict__)
    try:
        method = str(getattr(quantizer.quantization_config.quant_method, "value",
                             quantizer.quantization_config.quant_method))
        with H.stub_accelerators(H.num_gpus(max_memory)), quantizer_environment(method):
            dm = _get_device_map(model, strategy, copy.deepcopy(max_memory), quantizer)
    finally:
        quantizer.quantization_config.__dict__.update(saved)
    return {k: H.normalise_device(v) for k, v in dm.items()}


def quantized_model_size(model, quantizer) -> int:
    from transformers.integrations.accelerate import compute_module_sizes

    return compute_module_sizes(model, hf_quantizer=quantizer)[0][""]


def quantized_largest_layer(model, quantizer) -> int:
    from transformers.integrations.accelerate import compute_module_sizes

    sizes, leaves = compute_module_sizes(model, hf_quantizer=quantizer)
    no_split = set(model._no_split_modules or [])
    blocks = [sizes[n] for n, m in model.named_modules() if type(m).__name__ in no_split]
    return max(blocks + list(leaves.values()) + [0])


def quantized_layout(model, quantizer, layout: str) -> dict:
    return H.LAYOUTS[layout](quantized_model_size(model, quantizer), quantized_largest_layer(model, quantizer))


def _dtype_name(dtype) -> str:
    # strata sizes ue8m0 scales (torch.float8_e8m0fnu) as uint8: one byte either way, the checkpoints' U8.
    name = str(dtype).removeprefix("torch.")
    return "uint8" if name == "float8_e8m0fnu" else name


def module_tree_of(model) -> dict:
    """{parameter or buffer name: (shape, dtype)} of a (meta) model, for tree comparisons."""
    out = {}
    for n, p in model.named_parameters():
        out[n] = (list(p.shape), _dtype_name(p.dtype))
    for n, b in model.named_buffers():
        out[n] = (list(b.shape), _dtype_name(b.dtype))
    return out


def strata_tree(tree_json: dict) -> dict:
    """The same {name: (shape, dtype)} of strata-plan --print-module-tree's output."""
    out = {}

    def walk(node, prefix):
        for t in node.get("parameters", []) + node.get("buffers", []):
            out[prefix + t["name"]] = (t["shape"], t["dtype"])
        for c in node.get("children", []):
            walk(c, prefix + c["name"] + ".")

    walk(tree_json["root"], "")
    return out
