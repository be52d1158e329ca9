#!/usr/bin/env python3
"""Peak RSS of loading quantized checkpoints onto the CPU, against their file sizes (issue 23: "the peak RSS of
loading a quantized checkpoint onto the CPU stays within 1.15x of its file size"; see bench/README.md).

One Llama shape (default hidden 2048, intermediate 8192, 16 layers, vocab 32000: 1.07B parameters in its linear
layers) written three ways, each tensor random, straight into safetensors (no dense model is built: the bench
measures loading, not quality):
  fp8        block-wise FP8 (quant_method fp8: e4m3 weights, float32 weight_scale_inv in 128 x 128 blocks), lm_head,
             embeddings and norms bfloat16 (modules_to_not_convert ["lm_head"]);
  int4-g128  compressed-tensors W4A16 pack-quantized (int32 weight_packed, bfloat16 weight_scale, weight_shape),
             ignore ["lm_head"];
  bf16       the same shapes dense, for comparison.
Each is loaded by strata-generate --dtype bfloat16 --device-map '{"": "cpu"}' (one prompt of 4 tokens, 2 new
tokens), run --repeats times; the table gives the smallest peak RSS (VmHWM, /usr/bin/time -f %M) of the runs, the
file size, peak / file, and (peak - the process's own) / file, where the process's own is strata-generate's peak
RSS on a tiny checkpoint (LibTorch and the rest of the binary, no weights to speak of).

  STRATA_BUILD_DIR=build ~/.cache/strata/venv/bin/python bench/quantized_load_rss.py [--work DIR] [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import re
import subprocess
import sys
import tempfile

import torch

REPO = pathlib.Path(__file__).resolve().parents[1]


def build_dir() -> pathlib.Path:
    return pathlib.Path(os.environ.get("STRATA_BUILD_DIR", REPO / "build")).resolve()


def cpu_name() -> str:
    text = pathlib.Path("/proc/cpuinfo").read_text()
    model = re.search(r"model name\s*:\s*(.*)", text)
    flags = set(re.search(r"flags\s*:\s*(.*)", text).group(1).split())
    isa = "AVX-512" if "avx512f" in flags else "AVX2" if "avx2" in flags else "SSE4"
    if "avx512_bf16" in flags:
        isa += " + AVX512_BF16"
    return f"{model.group(1).strip() if model else 'unknown CPU'} ({isa}, {os.cpu_count()} vCPUs)"


def config(hidden: int, inter: int, layers: int, vocab: int, quantization: dict | None) -> dict:
    out = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": hidden,
           "intermediate_size": inter, "num_hidden_layers": layers, "num_attention_heads": hidden // 128,
           "num_key_value_heads": hidden // 128, "head_dim": 128, "vocab_size": vocab, "max_position_embeddings": 4096,
           "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "hidden_act": "silu", "tie_word_embeddings": False,
           "attention_bias": False, "mlp_bias": False, "dtype": "bfloat16", "bos_token_id": None,
           "eos_token_id": None}
    if quantization:
        out["quantization_config"] = quantization
    return out


def linears(hidden: int, inter: int) -> dict[str, tuple[int, int]]:
    """Each decoder layer's linear layers, [out, in]."""
    return {"self_attn.q_proj": (hidden, hidden), "self_attn.k_proj": (hidden, hidden),
            "self_attn.v_proj": (hidden, hidden), "self_attn.o_proj": (hidden, hidden),
            "mlp.gate_proj": (inter, hidden), "mlp.up_proj": (inter, hidden), "mlp.down_proj": (hidden, inter)}


def quantized(fmt: str, n: int, k: int, generator: torch.Generator) -> dict[str, torch.Tensor]:
    """One linear layer's tensors, by their local names."""
    if fmt == "bf16":
        return {"weight": (torch.randn(n, k, generator=generator) * 0.02).to(torch.bfloat16)}
    if fmt == "fp8":
        codes = torch.randint(0, 0x7F, (n, k), dtype=torch.uint8, generator=generator)  # finite, positive half
        codes |= torch.randint(0, 2, (n, k), dtype=torch.uint8, generator=generator) << 7
        scales = torch.rand(n // 128, k // 128, generator=generator) * 1e-3 + 1e-4
        return {"weight": codes.view(torch.float8_e4m3fn), "weight_scale_inv": scales}
    if fmt == "int4-g128":
        words = torch.randint(-2**31, 2**31 - 1, (n, k // 8), dtype=torch.int32, generator=generator)
        scales = (torch.rand(n, k // 128, generator=generator) * 1e-3 + 1e-4).to(torch.bfloat16)
        return {"weight_packed": words, "weight_scale": scales, "weight_shape": torch.tensor([n, k])}
    raise ValueError(fmt)


QUANTIZATION = {
    "bf16": None,
    "fp8": {"quant_method": "fp8", "weight_block_size": [128, 128], "activation_scheme": "dynamic",
            "modules_to_not_convert": ["lm_head"]},
    "int4-g128": {"quant_method": "compressed-tensors", "format": "pack-quantized", "ignore": ["lm_head"],
                  "quantization_status": "compressed", "kv_cache_scheme": None,
                  "config_groups": {"group_0": {"targets": ["Linear"], "input_activations": None,
                                                "output_activations": None,
                                                "weights": {"num_bits": 4, "type": "int", "symmetric": True,
                                                            "strategy": "group", "group_size": 128,
                                                            "dynamic": False, "actorder": None,
                                                            "observer": "minmax"}}}},
}


def write(directory: pathlib.Path, fmt: str, hidden: int, inter: int, layers: int, vocab: int) -> int:
    """The checkpoint, one shard per decoder layer (as large checkpoints are sharded); returns its bytes."""
    from safetensors.torch import save_file

    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps(config(hidden, inter, layers, vocab, QUANTIZATION[fmt])))
    generator = torch.Generator().manual_seed(0)
    weight_map = {}
    shards = layers + 1

    def save(index: int, tensors: dict) -> None:
        name = f"model-{index + 1:05d}-of-{shards:05d}.safetensors"
        save_file(tensors, directory / name, metadata={"format": "pt"})
        weight_map.update({key: name for key in tensors})

    save(0, {"model.embed_tokens.weight": (torch.randn(vocab, hidden, generator=generator) * 0.02).to(torch.bfloat16),
             "lm_head.weight": (torch.randn(vocab, hidden, generator=generator) * 0.02).to(torch.bfloat16),
             "model.norm.weight": torch.ones(hidden, dtype=torch.bfloat16)})
    for i in range(layers):
        tensors = {f"model.layers.{i}.input_layernorm.weight": torch.ones(hidden, dtype=torch.bfloat16),
                   f"model.layers.{i}.post_attention_layernorm.weight": torch.ones(hidden, dtype=torch.bfloat16)}
        for module, (n, k) in linears(hidden, inter).items():
            for local, value in quantized(fmt, n, k, generator).items():
                tensors[f"model.layers.{i}.{module}.{local}"] = value
        save(i + 1, tensors)
    (directory / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return sum(f.stat().st_size for f in directory.glob("*.safetensors"))


def peak_rss(checkpoint: pathlib.Path) -> tuple[int, dict]:
    """strata-generate's peak RSS (bytes) loading `checkpoint` onto the CPU in bfloat16, and its load report."""
    args = ["/usr/bin/time", "-f", "%M", str(build_dir() / "runtime" / "strata-generate"), "--model", str(checkpoint),
            "--dtype", "bfloat16", "--device-map", '{"": "cpu"}', "--prompt-ids", "1,2,3,4", "--max-new-tokens", "2",
            "--json"]
    proc = subprocess.run(args, capture_output=True, text=True, timeout=900, env=dict(os.environ, OMP_NUM_THREADS="1"))
    if proc.returncode != 0:
        raise SystemExit(f"strata-generate failed on {checkpoint}: {proc.stderr[-2000:]}")
    kib = int(proc.stderr.strip().splitlines()[-1])
    return kib * 1024, json.loads(proc.stdout)["load"]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--work", type=pathlib.Path, help="where the checkpoints go (default: a temporary directory)")
    ap.add_argument("--hidden", type=int, default=2048)
    ap.add_argument("--intermediate", type=int, default=8192)
    ap.add_argument("--layers", type=int, default=16)
    ap.add_argument("--vocab", type=int, default=32000)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--formats", default="fp8,int4-g128,bf16")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        work = args.work or pathlib.Path(tmp)
        tiny = work / "tiny"
        write(tiny, "bf16", 256, 512, 1, 256)
        own = min(peak_rss(tiny)[0] for _ in range(args.repeats))
        params = args.layers * sum(n * k for n, k in linears(args.hidden, args.intermediate).values())
        print(f"CPU: {cpu_name()}")
        print(f"Llama {args.layers} layers, hidden {args.hidden}, intermediate {args.intermediate}, vocab {args.vocab}: "
              f"{params / 1e9:.2f}B parameters in its linear layers; strata-generate --dtype bfloat16 on the CPU; "
              f"smallest of {args.repeats} runs; the process's own peak RSS (a tiny checkpoint): {own / 2**20:.0f} MiB")
        print(f"| format | file (MiB) | peak RSS (MiB) | peak / file | (peak - own) / file | packed layers | "
              f"in 2 MiB pages (MiB) |")
        print("|---|---|---|---|---|---|---|")
        for fmt in args.formats.split(","):
            directory = work / fmt
            size = write(directory, fmt, args.hidden, args.intermediate, args.layers, args.vocab)
            runs = [peak_rss(directory) for _ in range(args.repeats)]
            peak, load = min(runs, key=lambda r: r[0])
            print(f"| {fmt} | {size / 2**20:.0f} | {peak / 2**20:.0f} | {peak / size:.2f}x | {(peak - own) / size:.2f}x | "
                  f"{load['packed_tensors']} | {load['huge_page_bytes'] / 2**20:.0f} |", flush=True)
            if not args.work:
                for f in directory.iterdir():
                    f.unlink()
    return 0


if __name__ == "__main__":
    sys.exit(main())
