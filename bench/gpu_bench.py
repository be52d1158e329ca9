#!/usr/bin/env python3
"""GPU decode speed: strata-generate vs transformers generate() on the same GPU, same checkpoint, same
prompts, same number of new tokens, greedy. Needs a CUDA device (run by scripts/gpu-check.sh on the
GPU machine); refuses without one.

Model: a ~1B-parameter Llama in bfloat16 with random weights (hidden 2048, 16 layers, intermediate
5632, 32 heads, 8 KV heads, vocab 64000), written here as config.json + model.safetensors.

Rows (markdown + JSON into --out):
- batch-1 decode tok/s, strata vs transformers, and strata's fraction of the HBM roofline: weight bytes
  read per token (every parameter except the input embedding, of which one row is read) / the device's
  memory bandwidth, measured here as a large device-to-device copy_ timed with CUDA events (bytes read +
  written per second);
- 32 concurrent streams, aggregate tok/s (strata: 32 prompts, --max-batch 32; transformers: one batch
  of 32);
- 2 logical stages on one GPU (`0=cuda:0,1=cuda:0`) vs 1 stage, batch 1;
- half the layers on "cpu": strata's prefetching offload vs accelerate's device_map offload of the same
  map (transformers from_pretrained(device_map=...)), batch 1.
Goals, reported and not asserted: batch-1 >= 60% of the roofline and >= 2x transformers; offload >= 2x
accelerate; 2 stages on one GPU within 10% of 1 stage.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import subprocess
import sys
import time

REPO = pathlib.Path(__file__).resolve().parents[1]

MODEL_1B = dict(hidden_size=2048, intermediate_size=5632, num_hidden_layers=16, num_attention_heads=32,
                num_key_value_heads=8, vocab_size=64000, max_position_embeddings=4096, rms_norm_eps=1e-5,
                rope_theta=10000.0, tie_word_embeddings=False, bos_token_id=None, eos_token_id=None,
                pad_token_id=0)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, type=pathlib.Path, help="folder for gpu_bench.md and gpu_bench.json")
    p.add_argument("--strata-generate", type=pathlib.Path,
                   default=pathlib.Path(os.environ.get("STRATA_BUILD_DIR", REPO / "build")) / "runtime" / "strata-generate")
    p.add_argument("--work", type=pathlib.Path, default=pathlib.Path("/tmp/strata-gpu-bench"),
                   help="where the checkpoint is written (kept and reused)")
    p.add_argument("--prompt-tokens", type=int, default=32)
    p.add_argument("--new-tokens", type=int, default=128)
    p.add_argument("--streams", type=int, default=32)
    p.add_argument("--offload-new-tokens", type=int, default=32)
    p.add_argument("--layers", type=int, default=MODEL_1B["num_hidden_layers"], help="fewer for a quick try")
    args = p.parse_args(argv)
    for name in ("prompt_tokens", "new_tokens", "streams", "offload_new_tokens", "layers"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1")
    if args.new_tokens < 2 or args.offload_new_tokens < 2:
        p.error("--new-tokens and --offload-new-tokens must be >= 2 (decode is timed past the first token)")
    return args


def write_random_llama(directory: pathlib.Path, config_kwargs: dict, dtype_name: str = "bfloat16", device: str = "cuda") -> int:
    """config.json (transformers' LlamaConfig) + model.safetensors with random weights drawn on the GPU
    (std 0.02; norms 1); returns the parameter count. Reused when present with the same config."""
    import torch
    import transformers
    from safetensors.torch import save_file

    dtype = getattr(torch, dtype_name)
    stamp = directory / "strata_bench_config.json"
    wanted = json.dumps({"config": config_kwargs, "dtype": dtype_name}, sort_keys=True)
    if stamp.is_file() and stamp.read_text() == wanted and (directory / "model.safetensors").is_file():
        return json.loads((directory / "strata_bench_params.json").read_text())["params"]
    directory.mkdir(parents=True, exist_ok=True)
    config = transformers.LlamaConfig(**config_kwargs)
    config.dtype = dtype
    config.architectures = ["LlamaForCausalLM"]
    config.save_pretrained(directory)
    h, inter, v = config.hidden_size, config.intermediate_size, config.vocab_size
    head_dim = h // config.num_attention_heads
    kv = config.num_key_value_heads * head_dim
    shapes = {"model.embed_tokens.weight": (v, h), "model.norm.weight": (h,), "lm_head.weight": (v, h)}
    for i in range(config.num_hidden_layers):
        p = f"model.layers.{i}."
        shapes.update({p + "input_layernorm.weight": (h,), p + "post_attention_layernorm.weight": (h,),
                       p + "self_attn.q_proj.weight": (h, h), p + "self_attn.k_proj.weight": (kv, h),
                       p + "self_attn.v_proj.weight": (kv, h), p + "self_attn.o_proj.weight": (h, h),
                       p + "mlp.gate_proj.weight": (inter, h), p + "mlp.up_proj.weight": (inter, h),
                       p + "mlp.down_proj.weight": (h, inter)})
    gen = torch.Generator(device=device).manual_seed(0)
    tensors = {}
    for name, shape in shapes.items():
        if len(shape) == 1:
            tensors[name] = torch.ones(shape, dtype=dtype)
        else:
            tensors[name] = (torch.randn(shape, generator=gen, device=device, dtype=torch.float32) * 0.02).to(dtype).cpu()
    save_file(tensors, str(directory / "model.safetensors"), metadata={"format": "pt"})
    params = sum(t.numel() for t in tensors.values())
    (directory / "strata_bench_params.json").write_text(json.dumps({"params": params}))
    stamp.write_text(wanted)
    return params


def copy_bandwidth() -> float:
    """Bytes read + written per second by a 2 GiB device-to-device copy_, best of 10 (CUDA events)."""
    import torch

    src = torch.empty(2 * 2**30, dtype=torch.uint8, device="cuda").fill_(1)
    dst = torch.empty_like(src)
    for _ in range(3):
        dst.copy_(src)
    best = float("inf")
    for _ in range(10):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        dst.copy_(src)
        end.record()
        end.synchronize()
        best = min(best, start.elapsed_time(end) / 1e3)
    del src, dst
    torch.cuda.empty_cache()
    return 2 * 2 * 2**30 / best


def layer_map(n_layers: int, layer_device) -> dict:
    """{"model.embed_tokens": 0, "model.layers.i": layer_device(i), norm/rotary/lm_head: 0}."""
    m = {"model.embed_tokens": 0}
    for i in range(n_layers):
        m[f"model.layers.{i}"] = layer_device(i)
    m.update({"model.norm": 0, "model.rotary_emb": 0, "lm_head": 0})
    return m


def strata(binary, model_dir, prompts, new_tokens, device_map, physical, max_batch=1):
    """strata-generate --json: (tok/s over the decode steps, all rows together; ids per prompt; load)."""
    args = [str(binary), "--model", str(model_dir), "--max-new-tokens", str(new_tokens), "--json",
            "--device-map", json.dumps(device_map), "--physical-devices", physical, "--dtype", "bfloat16",
            "--max-batch", str(max_batch), "--max-context", str(len(prompts[0]) + new_tokens + 8)]
    for p in prompts:
        args += ["--prompt-ids", ",".join(map(str, p))]
    proc = subprocess.run(args, capture_output=True, text=True, timeout=600)
    if proc.returncode != 0:
        raise RuntimeError(f"strata-generate failed ({proc.returncode}): {proc.stderr[-2000:]}")
    out = json.loads(proc.stdout)
    t = out["timing"]
    rows = min(len(prompts), max_batch)
    return rows * t["decode_steps"] / t["decode_seconds"], [r["ids"] for r in out["results"]], out["load"]


def transformers_tok_s(model, prompts, new_tokens):
    """Decode tok/s of generate(): (time(N tokens) - time(1 token)) over N-1 steps x rows; best of 2."""
    import torch

    ids = torch.tensor(prompts, device="cuda")
    mask = torch.ones_like(ids)

    def timed(n):
        torch.cuda.synchronize()
        t = time.perf_counter()
        with torch.no_grad():
            out = model.generate(input_ids=ids, attention_mask=mask, do_sample=False, max_new_tokens=n,
                                 min_new_tokens=n, pad_token_id=0, eos_token_id=None)
        torch.cuda.synchronize()
        return time.perf_counter() - t, out

    timed(4)  # warm-up
    best = float("inf")
    out = None
    for _ in range(2):
        one, _ = timed(1)
        full, out = timed(new_tokens)
        best = min(best, full - one)
    return len(prompts) * (new_tokens - 1) / best, out[:, ids.shape[1]:].tolist()


def same_prefix(a, b) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def refusal(script: str, step: str, binary: pathlib.Path, flag: str) -> int:
    """0 when a CUDA device and `binary` are there; otherwise says why on stderr and returns the exit code
    (1: no GPU, 2: not built). Shared by the GPU benches."""
    import torch

    if not torch.cuda.is_available():
        print(f"{script}: needs a CUDA device and torch.cuda.is_available() is False here; run it on the "
              f"GPU machine (scripts/gpu-check.sh --steps build,{step} OUTDIR)", file=sys.stderr)
        return 1
    if not binary.is_file():
        print(f"{script}: {binary} does not exist (build first, or pass {flag})", file=sys.stderr)
        return 2
    return 0


def main(argv=None) -> int:
    args = parse_args(argv)
    if rc := refusal("gpu_bench.py", "bench", args.strata_generate, "--strata-generate"):
        return rc
    import torch
    import transformers

    args.out.mkdir(parents=True, exist_ok=True)
    config = dict(MODEL_1B, num_hidden_layers=args.layers)
    model_dir = args.work / f"llama_1b_bf16_{args.layers}l"
    t = time.perf_counter()
    params = write_random_llama(model_dir, config)
    print(f"checkpoint: {params / 1e9:.2f} B parameters, bfloat16, {model_dir} ({time.perf_counter() - t:.0f} s)")
    n = config["num_hidden_layers"]
    weight_bytes = 2 * (params - config["vocab_size"] * config["hidden_size"])  # one embedding row per token
    bandwidth = copy_bandwidth()
    roofline = bandwidth / weight_bytes
    print(f"device-to-device copy: {bandwidth / 1e12:.2f} TB/s; roofline {roofline:.0f} tok/s "
          f"({weight_bytes / 1e9:.2f} GB of weights per token)")

    g = torch.Generator().manual_seed(0)
    prompts = torch.randint(1, config["vocab_size"], (args.streams, args.prompt_tokens), generator=g).tolist()
    one = [prompts[0]]
    gpu_map = layer_map(n, lambda i: 0)
    two_map = layer_map(n, lambda i: 0 if i < n // 2 else 1)
    two_map.update({"model.norm": 1, "model.rotary_emb": 1, "lm_head": 1})
    offload_map = layer_map(n, lambda i: 0 if i < n // 2 else "cpu")
    rows = {}

    s1, s1_ids, load = strata(args.strata_generate, model_dir, one, args.new_tokens, gpu_map, "0=cuda:0")
    print(f"strata batch 1: {s1:.1f} tok/s ({load['stages'].strip()})")
    s32, s32_ids, _ = strata(args.strata_generate, model_dir, prompts, args.new_tokens, gpu_map, "0=cuda:0",
                             max_batch=args.streams)
    print(f"strata {args.streams} streams: {s32:.1f} tok/s")
    s2, s2_ids, _ = strata(args.strata_generate, model_dir, one, args.new_tokens, two_map, "0=cuda:0,1=cuda:0")
    print(f"strata 2 logical stages on cuda:0, batch 1: {s2:.1f} tok/s")
    so, so_ids, _ = strata(args.strata_generate, model_dir, one, args.offload_new_tokens, offload_map, "0=cuda:0")
    print(f"strata half the layers on cpu, batch 1: {so:.1f} tok/s")

    model = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.bfloat16, device_map={"": 0})
    model.eval()
    t1, t1_ids = transformers_tok_s(model, one, args.new_tokens)
    print(f"transformers batch 1: {t1:.1f} tok/s")
    t32, t32_ids = transformers_tok_s(model, prompts, args.new_tokens)
    print(f"transformers {args.streams} streams: {t32:.1f} tok/s")
    del model
    torch.cuda.empty_cache()
    model = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.bfloat16, device_map=offload_map)
    model.eval()
    to, to_ids = transformers_tok_s(model, one, args.offload_new_tokens)
    print(f"accelerate offload (same map), batch 1: {to:.1f} tok/s")
    del model
    torch.cuda.empty_cache()

    rows = [
        {"case": "batch 1", "strata_tok_s": s1, "reference": "transformers", "reference_tok_s": t1,
         "ratio": s1 / t1, "goal": ">= 2x transformers and >= 60% of roofline", "met": s1 / t1 >= 2 and s1 / roofline >= 0.6,
         "roofline_fraction": s1 / roofline, "same_ids_prefix": same_prefix(s1_ids[0], t1_ids[0])},
        {"case": f"{args.streams} streams (aggregate)", "strata_tok_s": s32, "reference": "transformers",
         "reference_tok_s": t32, "ratio": s32 / t32, "goal": "(reported)", "met": None,
         "same_ids_prefix": min(same_prefix(a, b) for a, b in zip(s32_ids, t32_ids))},
        {"case": "2 logical stages on cuda:0, batch 1", "strata_tok_s": s2, "reference": "strata 1 stage",
         "reference_tok_s": s1, "ratio": s2 / s1, "goal": "within 10% of 1 stage", "met": s2 / s1 >= 0.9,
         "same_ids_prefix": same_prefix(s2_ids[0], s1_ids[0])},
        {"case": f"half the layers on cpu, batch 1 ({args.offload_new_tokens} tokens)", "strata_tok_s": so,
         "reference": "accelerate offload", "reference_tok_s": to, "ratio": so / to, "goal": ">= 2x accelerate",
         "met": so / to >= 2, "same_ids_prefix": same_prefix(so_ids[0], to_ids[0])},
    ]
    gpu = torch.cuda.get_device_name(0)
    header = (f"{gpu}, torch {torch.__version__}, transformers {transformers.__version__}; random Llama "
              f"{params / 1e9:.2f} B bfloat16 ({n} layers), prompts of {args.prompt_tokens} tokens, "
              f"{args.new_tokens} new tokens, greedy; copy bandwidth {bandwidth / 1e12:.2f} TB/s, roofline "
              f"{roofline:.0f} tok/s (batch 1: strata at {s1 / roofline:.0%} of it)")
    lines = ["## GPU decode (bench/gpu_bench.py)", "", header, "",
             "| case | strata tok/s | reference | reference tok/s | ratio | goal | met | same ids (prefix) |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        met = "-" if r["met"] is None else ("yes" if r["met"] else "no")
        lines.append(f"| {r['case']} | {r['strata_tok_s']:.1f} | {r['reference']} | {r['reference_tok_s']:.1f} | "
                     f"{r['ratio']:.2f}x | {r['goal']} | {met} | {r['same_ids_prefix']} |")
    lines += ["", "Ids: bfloat16 with random weights; continuations may part after near-ties (reported, not checked)."]
    text = "\n".join(lines) + "\n"
    print(text)
    (args.out / "gpu_bench.md").write_text(text)
    (args.out / "gpu_bench.json").write_text(json.dumps({
        "device": gpu, "torch": torch.__version__, "transformers": transformers.__version__, "params": params,
        "config": config, "weight_bytes_per_token": weight_bytes, "copy_bandwidth_bytes_per_s": bandwidth,
        "roofline_tok_s": roofline, "prompt_tokens": args.prompt_tokens, "new_tokens": args.new_tokens,
        "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
