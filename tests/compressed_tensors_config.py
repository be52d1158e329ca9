"""The compressed-tensors quantization_config of the test checkpoints: one config group targeting Linear, as
RedHatAI's W4A16 / W8A16 / FP8-dynamic checkpoints ship it. Shared by the planner's placement parity
(tests/parity) and the runtime's quantized checkpoints (tests/runtime_parity/quantized_checkpoints.py)."""

from __future__ import annotations


def ct_config(weights: dict, fmt: str, ignore=("lm_head",), input_activations=None) -> dict:
    """`weights` overrides the weight scheme's defaults (int4, group-wise, symmetric, minmax); `fmt` is the
    compressor's format ("pack-quantized", "float-quantized")."""
    args = {"actorder": None, "block_structure": None, "dynamic": False, "group_size": None, "num_bits": 4,
            "observer": "minmax", "observer_kwargs": {}, "strategy": "group", "symmetric": True, "type": "int"}
    args.update(weights)
    return {"config_groups": {"group_0": {"input_activations": input_activations, "output_activations": None,
                                          "targets": ["Linear"], "weights": args}},
            "format": fmt, "ignore": list(ignore), "kv_cache_scheme": None, "quant_method": "compressed-tensors",
            "quantization_status": "compressed"}
