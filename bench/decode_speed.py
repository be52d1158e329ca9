#!/usr/bin/env python3
"""Decode speed, load time and loading memory: strata-generate vs transformers on the same checkpoint.

1. A ~110M-parameter Llama (random weights, float32, saved by transformers): batch-1 greedy decode
   tokens/s of strata-generate and of transformers generate() with the same prompt and the same
   number of tokens (ids checked equal), on the CPU; and the roofline: bytes of weights read per
   token / measured large-copy bandwidth. Warm against warm: each side runs the batch once before the
   timed run (strata-generate --warmup 1; a warm-up generate()).
2. Time to the first logits: load + the first forward of the prompt, strata (LoadedModel::Load, as
   strata-generate reports it, then its prefill: strata copies each weight out of the mapped file)
   vs from_pretrained(device_map={"": "cpu"}) then one forward, same checkpoint, page cache warm.
3. Peak RSS of strata-generate loading a >= 1 GB checkpoint, float32 and bfloat16 (each weight copied, and
   cast, into 2 MiB pages and its file pages released), against the checkpoint size.
See bench/README.md.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import resource
import statistics
import subprocess
import sys
import tempfile
import time

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "runtime_parity"))

import runtime_helpers as H  # noqa: E402

MODEL_100M = dict(hidden_size=768, intermediate_size=2048, num_hidden_layers=12, num_attention_heads=12,
                  num_key_value_heads=4, vocab_size=16000, max_position_embeddings=2048,
                  bos_token_id=None, eos_token_id=None, pad_token_id=0)
THREADS = 1  # set from --threads; both sides run with the same intra-op thread count
MODEL_1G = dict(MODEL_100M, hidden_size=1536, intermediate_size=4096, num_hidden_layers=12, vocab_size=32000)


def save(directory: pathlib.Path, config_kwargs: dict) -> int:
    import torch
    import transformers

    config = transformers.LlamaConfig(**config_kwargs)
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.save_pretrained(directory, safe_serialization=True)
    return sum(p.numel() for p in model.parameters())


def copy_bandwidth() -> float:
    """Memory traffic per second of a large tensor copy, best of 5: each byte copied is read once and
    written once, so the traffic is twice the bytes copied (weights in decode are only read)."""
    import torch

    src = torch.ones(256 * 2**20 // 4)  # 256 MiB
    dst = torch.empty_like(src)
    best = float("inf")
    for _ in range(5):
        t = time.perf_counter()
        dst.copy_(src)
        best = min(best, time.perf_counter() - t)
    return 2 * src.numel() * 4 / best


def strata(binary, model_dir, prompt, new_tokens, *extra):
    args = [str(binary), "--model", str(model_dir), "--max-new-tokens", str(new_tokens), "--json",
            "--prompt-ids", ",".join(map(str, prompt)), "--device-map", '{"": "cpu"}', *extra]
    env = dict(os.environ, OMP_NUM_THREADS=str(THREADS))
    proc = subprocess.run(["/usr/bin/time", "-f", "%M", *args], capture_output=True, text=True, check=True, env=env)
    peak_kib = int(proc.stderr.strip().splitlines()[-1])
    return json.loads(proc.stdout), peak_kib * 1024


def transformers_load(model_dir, prompt):
    """from_pretrained, then the first forward of the prompt: seconds until the weights are read and the
    first logits are out (strata maps the file and reads weights on first use; transformers reads them while
    loading: only load + first forward compares the same work)."""
    import torch
    import transformers

    torch.set_num_threads(THREADS)
    t = time.perf_counter()
    model = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32, device_map={"": "cpu"})
    with torch.no_grad():
        model(torch.tensor([prompt]))
    return model, time.perf_counter() - t


def transformers_decode(model, prompt, new_tokens):
    """Decode tokens/s of generate(): the time of N new tokens minus that of the first (the prefill)."""
    import torch

    ids = torch.tensor([prompt])
    kwargs = dict(do_sample=False, pad_token_id=0, eos_token_id=None)
    with torch.no_grad():
        model.generate(ids, max_new_tokens=4, min_new_tokens=4, **kwargs)  # warm-up
        t = time.perf_counter()
        model.generate(ids, max_new_tokens=1, min_new_tokens=1, **kwargs)
        prefill = time.perf_counter() - t
        t = time.perf_counter()
        out = model.generate(ids, max_new_tokens=new_tokens, min_new_tokens=new_tokens, **kwargs)
        total = time.perf_counter() - t
    return out[0, len(prompt):].tolist(), (new_tokens - 1) / (total - prefill)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--threads", type=int, default=1,
                    help="intra-op threads for both sides (default 1: on a shared 2-core machine, spinning OpenMP "
                         "threads compete with other work and make both sides erratic)")
    ap.add_argument("--repeats", type=int, default=5,
                    help="decode runs per side, alternating strata and transformers; medians are compared, so "
                         "that a burst of other work on the machine does not decide the ratio")
    ap.add_argument("--skip-rss", action="store_true", help="skip the >= 1 GB loading-memory measurement")
    ap.add_argument("--strata-generate", default=str(H.generate_path()))
    args = ap.parse_args(argv)
    global THREADS
    THREADS = args.threads
    binary = pathlib.Path(args.strata_generate)
    if not binary.is_file():
        print(f"strata-generate not found at {binary}", file=sys.stderr)
        return 1
    prompt = list(range(1, 17))
    with tempfile.TemporaryDirectory() as tmp:
        d = pathlib.Path(tmp) / "m100"
        params = save(d, MODEL_100M)
        strata(binary, d, prompt, 4)  # warm the page cache for both sides
        cold, _ = strata(binary, d, prompt, 1)  # load + the first forward of a fresh process
        s_ready = cold["load"]["seconds"] + cold["timing"]["prefill_seconds"]
        model, t_ready = transformers_load(d, prompt)
        s_runs, t_runs, same = [], [], True
        for _ in range(max(1, args.repeats)):
            # Warm against warm: transformers_decode runs a warm-up generate() first, strata a warm-up batch.
            got, _ = strata(binary, d, prompt, args.new_tokens, "--warmup", "1")
            s_runs.append(got["timing"]["decode_steps"] / got["timing"]["decode_seconds"])
            ref_ids, t_tps = transformers_decode(model, prompt, args.new_tokens)
            t_runs.append(t_tps)
            same = same and ref_ids == got["results"][0]["ids"]
        s_tps, t_tps = statistics.median(s_runs), statistics.median(t_runs)
        # Weight bytes read per decoded token: every parameter once, except the embedding (one row).
        weight_bytes = (params - MODEL_100M["vocab_size"] * MODEL_100M["hidden_size"]) * 4
        bandwidth = copy_bandwidth()
        roofline = bandwidth / weight_bytes
        print(f"model: Llama {params / 1e6:.0f}M parameters, float32, CPU ({os.cpu_count()} cores, {THREADS} thread(s) each side), "
              f"prompt {len(prompt)} tokens, {args.new_tokens} new tokens, batch 1, ids equal: {same}; "
              f"median of {len(s_runs)} alternating runs per side")
        print(f"{'':28}{'strata':>12}{'transformers':>14}{'ratio':>8}")
        print(f"{'decode tokens/s':28}{s_tps:12.1f}{t_tps:14.1f}{s_tps / t_tps:7.2f}x")
        print(f"{'  (range over the runs)':28}{f'{min(s_runs):.1f}-{max(s_runs):.1f}':>12}"
              f"{f'{min(t_runs):.1f}-{max(t_runs):.1f}':>14}")
        print(f"{'load + first forward, s':28}{s_ready:12.3f}{t_ready:14.3f}{t_ready / s_ready:7.1f}x")
        print(f"roofline: {weight_bytes / 2**20:.0f} MiB of weights per token / {bandwidth / 2**30:.1f} GiB/s copy traffic "
              f"bandwidth = {roofline:.1f} tokens/s; strata reaches {100 * s_tps / roofline:.0f}%, "
              f"transformers {100 * t_tps / roofline:.0f}%")
        if not same:
            print("WARNING: the generated ids differ", file=sys.stderr)
        if args.skip_rss:
            return 0 if same else 1
        big = pathlib.Path(tmp) / "m1g"
        save(big, MODEL_1G)
        size = sum(f.stat().st_size for f in big.glob("*.safetensors"))
        print(f"loading a {size / 2**30:.2f} GiB checkpoint (float32 file): peak RSS of strata-generate")
        for dtype in ("float32", "bfloat16"):
            got, peak = strata(binary, big, prompt[:4], 2, "--dtype", dtype)
            print(f"  serving {dtype:9} load {got['load']['seconds']:6.2f} s, peak RSS {peak / 2**30:5.2f} GiB "
                  f"= {peak / size:4.2f} x checkpoint ({got['load']['copied_tensors']} tensors copied, "
                  f"{got['load']['huge_page_bytes'] / 2**30:.2f} GiB in 2 MiB pages)")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
