#!/usr/bin/env python3
"""What running a MoE layer's experts apart from the rest of the layer costs (strata-plan --experts-on,
or a manual map placing model.layers.N.mlp.experts on another device).

Saves a small Qwen3-MoE (random weights, float32: hidden 512, 8 layers, 16 experts of 256, top 4) and
times batch-1 greedy decode with strata-generate under:

- together: the whole model on logical GPU 0;
- experts on cpu: attention, router and norms on logical GPU 0, every layer's experts on "cpu";
- experts on GPU 1: the experts on logical GPU 1.

On a CPU-only machine the logical GPUs are the CPU (--physical-devices 0=cpu,1=cpu): the hop is then
the dispatch bookkeeping alone (the routed rows are on the same device, nothing is copied), so the
ratio shows the overhead of the split itself. With CUDA (--cuda), GPU 0 and 1 are cuda:0 and the
"cpu" experts really run on the host: the ratio is the PCIe round trip of the routed rows plus CPU
expert compute. Ids are checked equal across plans. See bench/README.md.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import statistics
import subprocess
import sys
import tempfile

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "runtime_parity"))

import runtime_helpers as H  # noqa: E402

CONFIG = dict(hidden_size=512, intermediate_size=1024, moe_intermediate_size=256, num_hidden_layers=8,
              num_attention_heads=8, num_key_value_heads=4, vocab_size=8000, num_experts=16,
              num_experts_per_tok=4, norm_topk_prob=True, max_position_embeddings=1024,
              bos_token_id=None, eos_token_id=None, pad_token_id=0)


def save(directory: pathlib.Path) -> None:
    import torch
    import transformers

    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(transformers.Qwen3MoeConfig(**CONFIG), dtype=torch.float32)
    model.save_pretrained(directory, safe_serialization=True)


def apart_map(experts_device) -> str:
    entries = {"model.embed_tokens": 0}
    for i in range(CONFIG["num_hidden_layers"]):
        for child in ["self_attn", "mlp.gate", "input_layernorm", "post_attention_layernorm"]:
            entries[f"model.layers.{i}.{child}"] = 0
        entries[f"model.layers.{i}.mlp.experts"] = experts_device
    entries.update({"model.norm": 0, "model.rotary_emb": 0, "lm_head": 0})
    return json.dumps(entries)


def run(model_dir, device_map: str, physical: str, tokens: int, runs: int):
    rates, ids = [], None
    for _ in range(runs):
        out = H.run_generate(model_dir, [list(range(1, 17))], tokens, "--device-map", device_map,
                             "--physical-devices", physical, "--max-memory", "0=8GiB,1=8GiB,cpu=8GiB")
        t = out["timing"]
        rates.append(t["decode_steps"] / t["decode_seconds"])
        ids = out["results"][0]["ids"]
    return statistics.median(rates), ids


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--cuda", action="store_true", help="logical GPUs 0 and 1 on cuda:0")
    args = parser.parse_args()
    if not H.generate_path().is_file():
        print(f"strata-generate is not built: {H.generate_path()}", file=sys.stderr)
        return 2
    physical = "0=cuda:0,1=cuda:0" if args.cuda else "0=cpu,1=cpu"
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = pathlib.Path(tmp) / "qwen3-moe"
        save(model_dir)
        plans = [("together", json.dumps({"": 0})), ("experts on cpu", apart_map("cpu")),
                 ("experts on GPU 1", apart_map(1))]
        results = [(name, *run(model_dir, m, physical, args.tokens, args.runs)) for name, m in plans]
    base = results[0][1]
    print(f"Qwen3-MoE {CONFIG['num_hidden_layers']} layers x {CONFIG['num_experts']} experts (top "
          f"{CONFIG['num_experts_per_tok']}), float32, batch 1, {args.tokens} new tokens, logical GPUs on "
          f"{physical}; median of {args.runs} runs")
    print("| plan             | decode tok/s | vs together | ids equal |")
    print("|------------------|--------------|-------------|-----------|")
    for name, rate, ids in results:
        print(f"| {name:<16} | {rate:12.1f} | {rate / base:10.2f}x | {'yes' if ids == results[0][2] else 'NO':<9} |")
    return 0 if all(r[2] == results[0][2] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
