#!/usr/bin/env python3
"""gpt-oss's architecture with MXFP4 experts on the CPU: strata against llama.cpp side by side in one run, and strata's
MXFP4 against its bfloat16 decode of the same model (see bench/README.md, "gpt-oss-shaped model, MXFP4").

Both sides run the same random gpt-oss-shaped model of ~170M parameters (gpt-oss's ratios where that size allows:
experts as wide as the hidden size, 32 experts with 4 active, 8 query heads per KV head of 64, sliding (128) and full
layers alternating, attention sinks, biases everywhere, GptOssConfig's YaRN), saved by transformers as a dense
bfloat16 checkpoint, and an MXFP4 copy of it: every expert matrix quantized here, each block of 32 weights to E2M1
codes with one E8M0 scale (the smallest power of two that keeps the block's largest magnitude within E2M1's 6,
every weight rounded to the nearest code), stored as gpt-oss's release stores them (`*_blocks` [E, N, K/32, 16],
`*_scales` [E, N, K/32], the gate/up rows interleaved; transformers' convert_moe_packed_tensors turns them back into
the dense [E, K, N]) with its quantization_config. The quantizer is checked against that function before anything
runs. llama.cpp reads the GGUFs its own `convert_hf_to_gguf.py` writes (--llama-cpp DIR or LLAMA_CPP_DIR): its
GptOssModel repacks the MXFP4 blocks as they are (no requantization), and the bf16 checkpoint becomes a bf16 GGUF.
The tokenizer is deepseek_peer.py's byte-level BPE (both sides are given token ids).

Measures, alternating A/B runs on the same threads (peer_llamacpp.py's tools), per --formats (mxfp4, bf16):
1. decode batch 1 (tok/s) at each --threads after a --depth-token prompt (strata-generate vs llama-bench);
2. --streams concurrent served streams (strata-server over gRPC vs llama-server over HTTP), aggregate tok/s;
3. peak RSS of both servers after serving;
4. greedy ids of both sides for one prompt;
5. strata alone: MXFP4 against bfloat16 decode (the issue's goal ≥ 2.5x; the experts' bytes ratio is 32 / 8.5).
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import shutil
import statistics
import sys
import tempfile

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import deepseek_peer as D  # noqa: E402
import peer_llamacpp as P  # noqa: E402

IH = P.IH
BUILD = P.BUILD

# gpt-oss's ratios at ~170M parameters (gpt-oss-20b: hidden 2880 = intermediate, 24 layers, 64 query heads and 8 KV
# heads of 64, 32 experts with 4 active, sliding window 128 on every other layer).
MODEL = dict(hidden_size=512, intermediate_size=512, num_hidden_layers=6, num_attention_heads=16,
             num_key_value_heads=2, head_dim=64, num_local_experts=32, num_experts_per_tok=4, sliding_window=128,
             max_position_embeddings=131072, rms_norm_eps=1e-5, tie_word_embeddings=False, bos_token_id=1,
             eos_token_id=2, pad_token_id=0)
VOCAB = D.VOCAB  # the byte-level BPE deepseek_peer.make_tokenizer trains
MXFP4_CONFIG = {"quant_method": "mxfp4",
                "modules_to_not_convert": ["model.layers.*.self_attn", "model.layers.*.mlp.router",
                                           "model.embed_tokens", "lm_head"]}
E2M1 = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]  # the codes 0-7; 8-15 are their negatives (transformers' FP4_VALUES)


def make_checkpoint(directory: pathlib.Path) -> int:
    """The random model in bfloat16 (matrices scaled up so greedy ids are well separated; biases and sinks random)
    and its tokenizer; the parameter count."""
    import torch
    import transformers

    D.make_tokenizer(directory)
    torch.manual_seed(0)
    model = transformers.GptOssForCausalLM(transformers.GptOssConfig(vocab_size=VOCAB, **MODEL))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() > 1:
                p.mul_(4.0)
            elif name.endswith("sinks"):
                p.uniform_(-1.0, 1.0)  # torch.empty at init
            elif "bias" in name:
                p.uniform_(-0.1, 0.1)
    model.to(torch.bfloat16).save_pretrained(directory, safe_serialization=True)
    return sum(p.numel() for p in model.parameters())


def quantize_mxfp4(weight):
    """[E, K, N] (transformers' dense layout: x @ weight) -> MXFP4 blocks [E, N, K/32, 16] and scales [E, N, K/32],
    uint8: per block of 32 weights along K the E8M0 exponent e = ceil(log2(amax / 6)) (no code saturates), each
    weight / 2^e rounded to the nearest E2M1 value; two codes per byte, the even index in the low nibble. Also the
    values the codes stand for, float32 [E, K, N], to check the layout against transformers'."""
    import torch

    experts, k, n = weight.shape
    w = weight.float().transpose(1, 2).reshape(experts, n, k // 32, 32)
    amax = w.abs().amax(dim=-1)
    exponent = torch.ceil(torch.log2(amax.clamp(min=2.0**-126) / 6.0)).clamp(-127, 127)
    scaled = w / torch.exp2(exponent).unsqueeze(-1)
    grid = torch.tensor(E2M1)
    magnitude = (scaled.abs().unsqueeze(-1) - grid).abs().argmin(dim=-1)
    negative = (scaled < 0) & (magnitude != 0)
    codes = (magnitude | (negative.long() << 3)).to(torch.uint8)
    blocks = codes[..., 0::2] | (codes[..., 1::2] << 4)
    values = torch.where(negative, -grid[magnitude], grid[magnitude]) * torch.exp2(exponent).unsqueeze(-1)
    return (blocks.contiguous(), (exponent + 127).to(torch.uint8).contiguous(),
            values.reshape(experts, n, k).transpose(1, 2))


def make_mxfp4(dense_dir: pathlib.Path, out: pathlib.Path) -> dict:
    """The MXFP4 copy of the bf16 checkpoint: its experts quantized, everything else as it is. Checks that
    transformers' convert_moe_packed_tensors reads back exactly the values quantized (layout, nibble order, scales);
    returns the relative RMS error of the quantization."""
    import torch
    from safetensors.torch import load_file, save_file
    from transformers.integrations.mxfp4 import convert_moe_packed_tensors

    out.mkdir(parents=True, exist_ok=True)
    for f in dense_dir.iterdir():
        if f.suffix != ".safetensors" and f.name != "config.json":
            shutil.copy(f, out / f.name)
    error, norm = 0.0, 0.0
    for f in dense_dir.glob("*.safetensors"):
        tensors = load_file(f)
        for name in [n for n in tensors if n.endswith(("mlp.experts.gate_up_proj", "mlp.experts.down_proj"))]:
            dense = tensors.pop(name)
            blocks, scales, values = quantize_mxfp4(dense)
            back = convert_moe_packed_tensors(blocks.clone(), scales.clone(), dtype=torch.float32)
            if back.shape != dense.shape or not torch.equal(back, values):
                raise SystemExit(f"gpt_oss_peer: {name}: convert_moe_packed_tensors reads other values than the "
                                 f"quantizer wrote")
            error += float((back - dense.float()).pow(2).sum())
            norm += float(dense.float().pow(2).sum())
            tensors[name + "_blocks"], tensors[name + "_scales"] = blocks, scales
        save_file({k: v.contiguous() for k, v in tensors.items()}, out / f.name, metadata={"format": "pt"})
    config = json.loads((dense_dir / "config.json").read_text())
    (out / "config.json").write_text(json.dumps(dict(config, quantization_config=MXFP4_CONFIG), indent=2))
    return {"relative_rms_error": (error / norm) ** 0.5}


def parameter_count(model_dir: pathlib.Path) -> int:
    """The dense checkpoint's parameters, from its safetensors headers."""
    import math

    from safetensors import safe_open

    count = 0
    for f in model_dir.glob("*.safetensors"):
        with safe_open(f, "pt") as st:
            count += sum(math.prod(st.get_slice(k).get_shape()) for k in st.keys())
    return count


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--llama-cpp", help="llama.cpp checkout built with cmake (default: $LLAMA_CPP_DIR)")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--formats", default="mxfp4,bf16", help="checkpoints compared with llama.cpp (default mxfp4,bf16)")
    ap.add_argument("--serve-formats", default="mxfp4", help="checkpoints served (default mxfp4)")
    ap.add_argument("--repeats", type=int, default=3)
    P.add_run_arguments(ap)
    ap.add_argument("--work", help="directory for the checkpoints and GGUF files (default: a temporary one)")
    args = ap.parse_args(argv)

    root = P.find_llama_cpp(args.llama_cpp)
    threads = [int(t) for t in args.threads.split(",")]
    serve_threads = args.serve_threads or max(threads)
    formats = args.formats.split(",")
    work = pathlib.Path(args.work) if args.work else pathlib.Path(tempfile.mkdtemp(prefix="gpt_oss_peer_"))
    checkpoints = {"bf16": work / "hf-bf16", "mxfp4": work / "hf-mxfp4"}
    if not (checkpoints["bf16"] / "config.json").exists():
        make_checkpoint(checkpoints["bf16"])
    params = parameter_count(checkpoints["bf16"])
    if not (checkpoints["mxfp4"] / "config.json").exists():
        check = make_mxfp4(checkpoints["bf16"], checkpoints["mxfp4"])
        print(f"MXFP4 experts: relative RMS error {check['relative_rms_error']:.4f} against the bf16 weights; "
              f"layout equal to convert_moe_packed_tensors'", flush=True)
    load = P.strata_generate(checkpoints["mxfp4"], P.prompt_ids(4, VOCAB), 1, 1, "bfloat16")
    print(f"strata load report (MXFP4 checkpoint): {json.dumps(load.get('load', {}))}", flush=True)
    rows = []

    def alternate(measure, t, fmt, other, a, b, unit="tok/s"):
        ours, theirs = P.alternating_runs(args.repeats, [a, b])
        rows.append((measure, t, fmt, other, ours, theirs, unit))
        print(f"  {measure} {fmt} {t} thread(s): {P.summary(ours)} vs {other} {P.summary(theirs)}", flush=True)

    print(f"model: gpt-oss-shaped, {params / 1e6:.0f}M parameters; {os.cpu_count()} CPUs; "
          f"{args.repeats} alternating runs per side", flush=True)
    for t in threads:
        alternate("decode", t, "mxfp4", "strata bf16",
                  lambda: P.strata_decode(checkpoints["mxfp4"], args.depth, args.new_tokens, t, "bfloat16", VOCAB),
                  lambda: P.strata_decode(checkpoints["bf16"], args.depth, args.new_tokens, t, "bfloat16", VOCAB))

    rss, ids_report = {}, []
    if root is not None:
        ggufs = {fmt: work / f"model-{fmt}.gguf" for fmt in formats}
        for fmt in formats:
            if not ggufs[fmt].exists():
                # The MXFP4 checkpoint's experts stay MXFP4 whatever --outtype says (GptOssModel repacks the blocks);
                # the rest of it is bfloat16 on both sides.
                D.convert(root, checkpoints[fmt], ggufs[fmt], "bf16")
        for fmt in formats:
            for t in threads:
                alternate("decode", t, fmt, "llama.cpp",
                          lambda: P.strata_decode(checkpoints[fmt], args.depth, args.new_tokens, t, "bfloat16", VOCAB),
                          lambda: P.llama_bench(root, ggufs[fmt], t, 0, args.new_tokens, args.depth))
        if not args.skip_serving:
            stubs = IH.stubs_under(work)
            context = args.depth + args.serve_tokens
            requests = [P.prompt_ids(args.depth, VOCAB, salt=i + 1) for i in range(args.streams)]
            for fmt in args.serve_formats.split(","):
                ours_server = IH.ServerProcess(
                    IH.require_binary(IH.SERVER_BIN),
                    ["--model", str(checkpoints[fmt]), "--device-map", '{"": "cpu"}', "--dtype", "bfloat16",
                     "--max-batch", str(args.streams), "--max-context", str(context),
                     "--kv-cache-tokens", str(args.streams * context), "--intra-op-threads", str(serve_threads)],
                    work / f"strata-{fmt}")
                ours_server.start(stubs)
                theirs = P.LlamaServer(root, ggufs[fmt], serve_threads, args.streams, context,
                                       work / f"llama-{fmt}.log")
                try:
                    prompt = P.prompt_ids(args.depth, VOCAB, salt=99)
                    theirs_ids = theirs.completion(prompt, args.serve_tokens)
                    ours_ids = P.strata_generate(checkpoints[fmt], prompt, args.serve_tokens, serve_threads,
                                                 "bfloat16")["results"][0]["ids"]
                    first = next((i for i, (a, b) in enumerate(zip(ours_ids, theirs_ids)) if a != b), None)
                    ids_report.append(f"{fmt}: {'identical' if first is None else f'first divergence at step {first}'}"
                                      f" over {min(len(ours_ids), len(theirs_ids))} greedy tokens"
                                      f" (strata {ours_ids[:8]}..., llama.cpp {theirs_ids[:8]}...)")
                    P.strata_stream(stubs, ours_server, requests[0], 4)
                    theirs.stream(requests[0], 4)
                    alternate(f"serve {args.streams} streams", serve_threads, fmt, "llama.cpp",
                              lambda: P.concurrently(args.streams, lambda i: P.strata_stream(
                                  stubs, ours_server, requests[i], args.serve_tokens)),
                              lambda: P.concurrently(args.streams, lambda i: theirs.stream(requests[i],
                                                                                           args.serve_tokens)))
                    rss[fmt] = (P.peak_rss(ours_server.process.pid), theirs.peak_rss())
                finally:
                    theirs.stop()
                    ours_server.stop()
    else:
        print("gpt_oss_peer: no llama.cpp given (--llama-cpp DIR or LLAMA_CPP_DIR): strata's own rows only")

    print()
    print("| measure | threads | checkpoint | strata min / median / max | other | other min / median / max | "
          "ratio (medians) |")
    print("|---|---|---|---|---|---|---|")
    for measure, t, fmt, other, ours, theirs, unit in rows:
        ratio = statistics.median(ours) / statistics.median(theirs)
        print(f"| {measure} ({unit}) | {t} | {fmt} | {P.summary(ours)} | {other} | {P.summary(theirs)} | "
              f"{ratio:.2f}x |")
    for fmt, (ours_rss, theirs_rss) in rss.items():
        print(f"| peak RSS (MB, server after serving) | {serve_threads} | {fmt} | {ours_rss / 1e6:.0f} | llama.cpp | "
              f"{theirs_rss / 1e6:.0f} | {ours_rss / theirs_rss:.2f}x |")
    for line in ids_report:
        print(f"greedy ids, strata-generate vs llama-server: {line}")
    if not args.work:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
