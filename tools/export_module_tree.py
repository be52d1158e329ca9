#!/usr/bin/env python3
"""Export the module tree of any transformers model, built on the meta device, as JSON.

    python tools/export_module_tree.py CONFIG_OR_DIR [--dtype bfloat16]
        [--auto-class AutoModelForCausalLM] [--trust-remote-code] -o FILE

CONFIG_OR_DIR is a config.json file or a checkpoint directory holding one. No weights are read or
allocated: the model is built with `torch.device("meta")`, exactly as `from_pretrained` builds it
before it computes a device map. The output ("strata.module_tree.v1") is what
`strata-plan --module-tree FILE` reads, and what `strata-plan --print-module-tree` prints for the
architectures strata builds natively; see planner/README.md.

Format:
  {"format": "strata.module_tree.v1", "architecture": str, "dtype": str,
   "no_split_modules": [str, ...] (sorted), "tied_weights": {param: param},
   "kv_cache": {"num_hidden_layers", "num_key_value_heads", "head_dim"[, "latent": true]}   (when the config has
               them; MLA's latent cache: one row of kv_lora_rank + qk_rope_head_dim per token, keys and values alike),
   "root": NODE}
  NODE = {"class": str,
          "parameters": [{"name", "shape", "dtype"}],             (direct parameters, in order)
          "buffers": [{"name", "shape", "dtype", "persistent"}],  (direct buffers, in order)
          "children": [{"name": local name, **NODE}]}             (named_children order)
"""

from __future__ import annotations

import argparse
import json
import os
import sys

FORMAT = "strata.module_tree.v1"


def _dtype_name(dtype) -> str:
    return str(dtype).removeprefix("torch.")


def module_node(module) -> dict:
    """The NODE of one nn.Module (recursive)."""
    non_persistent = getattr(module, "_non_persistent_buffers_set", set())
    return {
        "class": type(module).__name__,
        "parameters": [
            {"name": n, "shape": list(p.shape), "dtype": _dtype_name(p.dtype)}
            for n, p in module.named_parameters(recurse=False)
        ],
        "buffers": [
            {"name": n, "shape": list(b.shape), "dtype": _dtype_name(b.dtype), "persistent": n not in non_persistent}
            for n, b in module.named_buffers(recurse=False)
        ],
        "children": [{"name": local, **module_node(child)} for local, child in module.named_children()],
    }


def kv_cache_info(config) -> dict | None:
    """Layers, KV heads and head_dim, when the config describes a standard decoder."""
    layers = getattr(config, "num_hidden_layers", None)
    heads = getattr(config, "num_attention_heads", None)
    if layers is None or heads is None:
        return None
    kv_heads = getattr(config, "num_key_value_heads", None)
    if kv_heads is None:
        kv_heads = heads
    if getattr(config, "kv_lora_rank", None):  # multi-head latent attention (DeepSeek-V3)
        return {"num_hidden_layers": int(layers), "num_key_value_heads": 1,
                "head_dim": int(config.kv_lora_rank + config.qk_rope_head_dim), "latent": True}
    head_dim = getattr(config, "head_dim", None)
    if head_dim is None:
        head_dim = config.hidden_size // heads
    return {"num_hidden_layers": int(layers), "num_key_value_heads": int(kv_heads), "head_dim": int(head_dim)}


def module_tree(model, config, dtype_name: str) -> dict:
    """The whole module tree document for a model built on meta."""
    architectures = getattr(config, "architectures", None) or []
    tree = {
        "format": FORMAT,
        "architecture": architectures[0] if architectures else type(model).__name__,
        "dtype": dtype_name,
        "no_split_modules": sorted(getattr(model, "_no_split_modules", None) or []),
        "tied_weights": dict(getattr(model, "all_tied_weights_keys", None) or {}),
    }
    kv = kv_cache_info(config)
    if kv is not None:
        tree["kv_cache"] = kv
    tree["root"] = module_node(model)
    return tree


def load_config(config_or_dir: str, trust_remote_code: bool = False):
    from transformers import AutoConfig, PretrainedConfig

    if os.path.isdir(config_or_dir):
        return AutoConfig.from_pretrained(config_or_dir, trust_remote_code=trust_remote_code)
    with open(config_or_dir) as f:
        config_dict = json.load(f)
    if "model_type" in config_dict:
        return AutoConfig.for_model(**config_dict) if not trust_remote_code else AutoConfig.from_pretrained(
            os.path.dirname(os.path.abspath(config_or_dir)), trust_remote_code=True)
    return PretrainedConfig.from_dict(config_dict)


def build_meta_model(config, dtype_name: str, auto_class: str = "AutoModelForCausalLM", trust_remote_code: bool = False):
    """Builds the model on the meta device in `dtype_name` (no memory for weights)."""
    import torch
    import transformers

    dtype = getattr(torch, dtype_name)
    cls = getattr(transformers, auto_class)
    kwargs = {"dtype": dtype}
    if trust_remote_code:
        kwargs["trust_remote_code"] = True
    with torch.device("meta"):
        return cls.from_config(config, **kwargs)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("config_or_dir", help="config.json or a checkpoint directory containing config.json")
    parser.add_argument("--dtype", default="bfloat16", help="parameter dtype (float16, bfloat16, float32, ...)")
    parser.add_argument("--auto-class", default="AutoModelForCausalLM", help="transformers auto class to build with")
    parser.add_argument("--trust-remote-code", action="store_true", help="passed through to transformers")
    parser.add_argument("-o", "--output", required=True, help="output JSON file ('-' for stdout)")
    parser.add_argument("--indent", type=int, default=1, help="JSON indent (0 for compact)")
    args = parser.parse_args(argv)

    import torch

    if not isinstance(getattr(torch, args.dtype, None), torch.dtype):
        print(f"export_module_tree: unknown --dtype {args.dtype!r}", file=sys.stderr)
        return 2
    if not os.path.exists(args.config_or_dir):
        print(f"export_module_tree: {args.config_or_dir}: no such file or directory", file=sys.stderr)
        return 2
    config = load_config(args.config_or_dir, args.trust_remote_code)
    model = build_meta_model(config, args.dtype, args.auto_class, args.trust_remote_code)
    tree = module_tree(model, config, args.dtype)
    indent = args.indent if args.indent > 0 else None
    if args.output == "-":
        json.dump(tree, sys.stdout, indent=indent)
        sys.stdout.write("\n")
    else:
        with open(args.output, "w") as f:
            json.dump(tree, f, indent=indent)
            f.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
