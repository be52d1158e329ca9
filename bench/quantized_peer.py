#!/usr/bin/env python3
"""strata's quantized checkpoints on the CPU against its bfloat16 checkpoint and llama.cpp's quantized GGUFs, in one
run (issue 23; see bench/README.md).

One random ~125M Llama (peer_llamacpp.make_checkpoint: float32 HF safetensors), and from those same dense weights:

  strata (HF safetensors, served with --dtype bfloat16):
    bf16       every tensor bfloat16 (peer_llamacpp.save_as);
    fp8        block-wise FP8 as transformers' FP8 quantizer writes it (Fp8Quantize: e4m3, 128 x 128 blocks, float32
               weight_scale_inv; quant_method fp8, activation_scheme dynamic), lm_head kept bfloat16
               (modules_to_not_convert ["lm_head"], as Qwen3-FP8 and DeepSeek-V3 ship it and transformers does by
               default), embeddings and norms bfloat16;
    int4-g32, int4-g128
               compressed-tensors W4A16 pack-quantized, symmetric int4, group 32 / 128, bfloat16 scales, compressed by
               the compressed-tensors library itself (ignore ["lm_head"], as RedHatAI's W4A16 checkpoints);
  llama.cpp (GGUF by its convert_hf_to_gguf.py from the float32 checkpoint):
    bf16, q8_0 straight from the converter (--outtype); q4_0, q4_k_m by llama-quantize from the f32 GGUF (its
               defaults: token_embd and output get the type llama-quantize picks for the mix, Q6_K for output).

Measured per format and --threads, in alternating order (each repeat runs every format once, the order reversed on
odd repeats): decode batch 1 tokens/s after a --depth-token prompt (strata-generate --warmup 1, llama-bench -p 0 -n N
-d DEPTH), prefill of --prefill tokens tokens/s (the same tools), the weight bytes read per decoded token (every
tensor of the file but the token embedding, which decode reads one row of) and the share of the read roofline
(peer_llamacpp.read_bandwidth), the peak RSS (VmHWM) of strata-generate; with serving, --streams concurrent streams
on strata-server (gRPC) and llama-server (HTTP) per format, and each server's peak RSS (beside the others, and
after the alternating runs alone: one more serving run with the machine to itself).

llama-quantize is not built by this bench: without DIR/build/bin/llama-quantize the q4_0 and q4_k_m rows are left
out (build it: cmake --build DIR/build --target llama-quantize). For strata's AVX2 code on an AVX-512 machine, set
STRATA_CPU_ISA=avx2 (and the ATen variables peer_llamacpp names) and point --llama-cpp at an AVX2-only build.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import shutil
import statistics
import subprocess
import sys
import tempfile

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))
sys.path.insert(0, str(REPO / "tests" / "runtime_parity"))
sys.path.insert(0, str(REPO / "tests"))

import peer_llamacpp as P  # noqa: E402

TWO_STAGE = "strata 2-stage"
STRATA_FORMATS = ("bf16", "fp8", "int4-g32", "int4-g128")
LLAMA_FORMATS = ("bf16", "q8_0", "q4_0", "q4_k_m")
# (label, strata format over the format it is compared with: ("strata" | "llama.cpp", format))
RATIOS = (
    ("strata fp8 / strata bf16", "fp8", ("strata", "bf16")),
    ("strata fp8 / llama.cpp q8_0", "fp8", ("llama.cpp", "q8_0")),
    ("strata int4-g32 / strata bf16", "int4-g32", ("strata", "bf16")),
    ("strata int4-g128 / strata bf16", "int4-g128", ("strata", "bf16")),
    ("strata int4-g32 / llama.cpp q4_0", "int4-g32", ("llama.cpp", "q4_0")),
    ("strata int4-g128 / llama.cpp q4_0", "int4-g128", ("llama.cpp", "q4_0")),
    ("strata int4-g32 / llama.cpp q4_k_m", "int4-g32", ("llama.cpp", "q4_k_m")),
    ("strata int4-g128 / llama.cpp q4_k_m", "int4-g128", ("llama.cpp", "q4_k_m")),
    ("strata bf16 / llama.cpp bf16", "bf16", ("llama.cpp", "bf16")),
)


def dense_model(model_dir: pathlib.Path, dtype):
    import torch
    import transformers

    return transformers.LlamaForCausalLM.from_pretrained(model_dir, dtype=torch.float32).to(dtype)


def make_strata(fmt: str, model_dir: pathlib.Path, out: pathlib.Path) -> pathlib.Path:
    import torch

    import quantized_checkpoints as Q

    if fmt == "bf16":
        return P.save_as(model_dir, out, "bf16")
    if fmt == "fp8":
        return Q.quantize_fp8(out, dense_model(model_dir, torch.float32), scale_dtype=torch.float32, skip=("lm_head",),
                              dense_dtype=torch.bfloat16)
    group = {"int4-g32": 32, "int4-g128": 128}[fmt]
    config = Q.ct_config({"group_size": group, "num_bits": 4, "symmetric": True}, "pack-quantized", ignore=("lm_head",))
    return Q.quantize_ct(out, dense_model(model_dir, torch.bfloat16), config, dense_dtype=torch.bfloat16)


def make_gguf(fmt: str, root: pathlib.Path, model_dir: pathlib.Path, work: pathlib.Path) -> pathlib.Path:
    out = work / f"model-{fmt}.gguf"
    if fmt in ("bf16", "q8_0", "f32"):
        P.convert(root, model_dir, out, fmt)
        return out
    f32 = work / "model-f32.gguf"
    if not f32.exists():
        P.convert(root, model_dir, f32, "f32")
    proc = subprocess.run([str(P.llama_bin(root, "llama-quantize")), str(f32), str(out), fmt.upper()],
                          capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"quantized_peer: llama-quantize {fmt.upper()} failed:\n{proc.stderr[-3000:]}")
    return out


def strata_weight_bytes(checkpoint: pathlib.Path) -> int:
    """Bytes of every tensor of the checkpoint but the token embedding (decode reads one row of it)."""
    from safetensors import safe_open

    total = 0
    for f in checkpoint.glob("*.safetensors"):
        with safe_open(f, "pt") as st:
            for k in st.keys():
                if "embed_tokens" not in k:
                    t = st.get_slice(k)
                    n = 1
                    for d in t.get_shape():
                        n *= d
                    total += n * {"F8_E4M3": 1, "BF16": 2, "F16": 2, "F32": 4, "I32": 4, "I8": 1, "U8": 1,
                                  "I64": 8}[t.get_dtype()]
    return total


def gguf_weight_bytes(root: pathlib.Path, gguf: pathlib.Path) -> int:
    sys.path.insert(0, str(root / "gguf-py"))
    from gguf import GGUFReader

    return sum(int(t.n_bytes) for t in GGUFReader(str(gguf)).tensors if t.name != "token_embd.weight")


def two_stage_plan(layers: int) -> tuple:
    """A 2-stage plan: the embedding and the first half of the layers on plan GPU 0, run on the CPU
    (--physical-devices 0=cpu), the rest on "cpu": a "cpu" stage behind another stage, as behind a GPU."""
    device_map = {"model.embed_tokens": 0, "model.norm": "cpu", "lm_head": "cpu"}
    device_map.update({f"model.layers.{i}": 0 if i < layers // 2 else "cpu" for i in range(layers)})
    return ("--device-map", json.dumps(device_map), "--physical-devices", "0=cpu")


def cpu_line() -> str:
    model, flags = "unknown CPU", set()
    for line in pathlib.Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name") and model == "unknown CPU":
            model = line.split(":", 1)[1].strip()
        elif line.startswith("flags") and not flags:
            flags = set(line.split(":", 1)[1].split())
    isa = ", ".join(name for flag, name in (("avx512f", "AVX-512"), ("avx512_bf16", "AVX512_BF16"), ("avx2", "AVX2"))
                    if flag in flags) or "no AVX2"
    cap = os.environ.get("STRATA_CPU_ISA")
    return (f"{model}, {os.cpu_count()} CPUs ({isa}); strata "
            f"{'capped with STRATA_CPU_ISA=' + cap if cap else 'on its best target (no STRATA_CPU_ISA)'}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--llama-cpp", help="llama.cpp checkout built with cmake (default: $LLAMA_CPP_DIR)")
    ap.add_argument("--threads", default="1,2", help="thread counts for decode and prefill (default 1,2)")
    ap.add_argument("--strata-formats", default=",".join(STRATA_FORMATS))
    ap.add_argument("--llama-formats", default=",".join(LLAMA_FORMATS))
    ap.add_argument("--repeats", type=int, default=3, help="runs per format and measure, alternating (default 3)")
    P.add_run_arguments(ap)
    ap.add_argument("--work", help="directory for the checkpoints and GGUF files (default: a temporary one)")
    ap.add_argument("--reuse", action="store_true", help="with --work: keep the files a previous run made there")
    ap.add_argument("--two-stage", action="store_true",
                    help="also run each strata format on a 2-stage plan (side \"strata 2-stage\": layers split "
                         "between plan GPU 0 on the CPU and \"cpu\")")
    args = ap.parse_args(argv)

    root = P.find_llama_cpp(args.llama_cpp)
    if root is None:
        print("quantized_peer: skipped: no llama.cpp given (--llama-cpp DIR or LLAMA_CPP_DIR).")
        return 0
    for name in ("llama-bench", "llama-server"):
        P.llama_bin(root, name)
    strata_formats = [f for f in args.strata_formats.split(",") if f]
    llama_formats = [f for f in args.llama_formats.split(",") if f]
    for f in strata_formats:
        if f not in STRATA_FORMATS:
            raise SystemExit(f"quantized_peer: unknown strata format {f} (known: {', '.join(STRATA_FORMATS)})")
    for f in llama_formats:
        if f not in LLAMA_FORMATS:
            raise SystemExit(f"quantized_peer: unknown llama.cpp format {f} (known: {', '.join(LLAMA_FORMATS)})")
    quantize = root / "build" / "bin" / "llama-quantize"
    if not quantize.exists() and not (root / "bin" / "llama-quantize").exists():
        left = [f for f in llama_formats if f in ("q4_0", "q4_k_m")]
        if left:
            print(f"quantized_peer: no llama-quantize under {root}: {', '.join(left)} left out "
                  f"(cmake --build {root}/build --target llama-quantize)")
        llama_formats = [f for f in llama_formats if f not in left]
    for binary in (P.BUILD / "runtime" / "strata-generate", P.BUILD / "server" / "strata-server"):
        if not binary.exists():
            raise SystemExit(f"quantized_peer: {binary} not found (build strata first, or set STRATA_BUILD_DIR)")

    threads = [int(t) for t in args.threads.split(",")]
    serve_threads = args.serve_threads or max(threads)
    work = pathlib.Path(args.work) if args.work else pathlib.Path(tempfile.mkdtemp(prefix="quantized_peer_"))
    reuse = args.reuse and args.work
    model_dir = work / "hf"
    vocab = 8000
    if not (reuse and (model_dir / "config.json").exists()):
        if model_dir.exists():
            shutil.rmtree(model_dir)
        P.make_checkpoint(model_dir, vocab)
    config = json.loads((model_dir / "config.json").read_text())
    embed = config["hidden_size"] * config["vocab_size"]
    params = strata_weight_bytes(model_dir) // 4 + embed

    # Every side and format: (side, format) -> (file, weight bytes per decoded token).
    files = {}
    for fmt in strata_formats:
        out = work / f"hf-{fmt}"
        if not (reuse and (out / "config.json").exists()):
            if out.exists():
                shutil.rmtree(out)
            make_strata(fmt, model_dir, out)
        files[("strata", fmt)] = (out, strata_weight_bytes(out))
        if args.two_stage:
            files[(TWO_STAGE, fmt)] = files[("strata", fmt)]
    for fmt in llama_formats:
        out = work / f"model-{fmt}.gguf"
        if not (reuse and out.exists()):
            make_gguf(fmt, root, model_dir, work)
        files[("llama.cpp", fmt)] = (out, gguf_weight_bytes(root, out))
    formats = list(files)

    bandwidth = {t: P.read_bandwidth(t) for t in threads}
    results = {}  # (measure, threads, side, format) -> [values]
    rss = {}  # (what, side, format) -> bytes

    plans = {"strata": P.CPU_ONLY, TWO_STAGE: two_stage_plan(config["num_hidden_layers"])}

    def decode(side, fmt, t):
        path = files[(side, fmt)][0]
        if side == "llama.cpp":
            return P.llama_bench(root, path, t, 0, args.new_tokens, args.depth)
        out = P.strata_generate(path, P.prompt_ids(args.depth, vocab), args.new_tokens, t, "bfloat16", plans[side])
        key = ("strata-generate, decode run", side, fmt)
        rss[key] = max(rss.get(key, 0), out["peak_rss"] or 0)
        return out["timing"]["decode_steps"] / out["timing"]["decode_seconds"]

    def prefill(side, fmt, t):
        path = files[(side, fmt)][0]
        if side == "llama.cpp":
            return P.llama_bench(root, path, t, args.prefill, 0, 0)
        out = P.strata_generate(path, P.prompt_ids(args.prefill, vocab), 1, t, "bfloat16", plans[side])
        key = (f"strata-generate, {args.prefill}-token prefill run", side, fmt)
        rss[key] = max(rss.get(key, 0), out["peak_rss"] or 0)
        return args.prefill / out["timing"]["prefill_seconds"]

    def alternate(measure, t, fn):
        runs = P.alternating_runs(args.repeats, [lambda side=side, fmt=fmt: fn(side, fmt) for side, fmt in formats])
        for (side, fmt), values in zip(formats, runs):
            results.setdefault((measure, t, side, fmt), []).extend(values)
        print(f"  {measure} {t} thread(s): " + "; ".join(
            f"{side} {fmt} {P.summary(results[(measure, t, side, fmt)])}" for side, fmt in formats), flush=True)

    print(f"model: Llama {params / 1e6:.0f}M parameters (vocab {vocab}); {cpu_line()}; llama.cpp at {root}; "
          f"{args.repeats} runs per format, alternating", flush=True)
    for t in threads:
        alternate("decode", t, lambda side, fmt: decode(side, fmt, t))
        alternate("prefill", t, lambda side, fmt: prefill(side, fmt, t))

    serve_measure = f"serve {args.streams} streams"
    if not args.skip_serving:
        stubs = P.IH.stubs_under(work)
        context = args.depth + args.serve_tokens
        requests = [P.prompt_ids(args.depth, vocab, salt=i + 1) for i in range(args.streams)]
        servers = {}
        # Each stage's worker runs its own intra-op threads, and both stages of the 2-stage plan share this machine's
        # cores: with micro-batches in flight on both at once, the 2-stage server gets the 1-stage one's threads in
        # all (serve_threads / 2 per stage), not twice as many on the same cores.
        stage_threads = {"strata": serve_threads, TWO_STAGE: max(1, serve_threads // 2)}

        def start_server(side, fmt):
            """One warmed server for (side, fmt)."""
            if side != "llama.cpp":
                return P.start_strata_server(stubs, files[(side, fmt)][0], work / f"{side.replace(' ', '-')}-{fmt}",
                                             "bfloat16", args.streams, context, stage_threads[side], requests[0],
                                             plans[side])
            server = P.LlamaServer(root, files[(side, fmt)][0], serve_threads, args.streams, context,
                                   work / f"llama-{fmt}.log")
            server.stream(requests[0], 4)
            return server

        def server_pid(side, server) -> int:
            return server.proc.pid if side == "llama.cpp" else server.process.pid

        def serve_once(side, fmt, server):
            if side != "llama.cpp":
                return P.concurrently(args.streams, lambda i: P.strata_stream(stubs, server, requests[i],
                                                                              args.serve_tokens))
            return P.concurrently(args.streams, lambda i: server.stream(requests[i], args.serve_tokens))

        try:
            for side, fmt in formats:
                servers[(side, fmt)] = start_server(side, fmt)

            def serve(side, fmt):
                return serve_once(side, fmt, servers[(side, fmt)])

            alternate(serve_measure, serve_threads, serve)
            for (side, fmt), server in servers.items():
                rss[("server after serving, beside the others", side, fmt)] = P.peak_rss(server_pid(side, server))
        finally:
            for server in servers.values():
                server.stop()
        # Each server again, alone: read-only code pages that the other strata servers map too cannot be paged
        # out (their mapcount is above one), so only a server with the machine to itself shows what one costs.
        for side, fmt in formats:
            server = start_server(side, fmt)
            try:
                serve_once(side, fmt, server)
                rss[("server after serving, alone", side, fmt)] = P.peak_rss(server_pid(side, server))
            finally:
                server.stop()

    measures = [("decode", t) for t in threads] + [("prefill", t) for t in threads]
    if not args.skip_serving:
        measures.append((serve_measure, serve_threads))
    print()
    print("| measure | threads | side | format | min / median / max | weight MiB per token | roofline tok/s | "
          "share of roofline |")
    print("|---|---|---|---|---|---|---|---|")
    for measure, t in measures:
        for side, fmt in formats:
            values = results[(measure, t, side, fmt)]
            weight = files[(side, fmt)][1]
            if measure == "decode":
                roofline = bandwidth[t] / weight
                roof = f"{roofline:.1f} | {statistics.median(values) / roofline:.0%}"
            else:
                roof = " | "
            unit = "tok/s" if measure != serve_measure else "tok/s, aggregate"
            print(f"| {measure} ({unit}) | {t} | {side} | {fmt} | {P.summary(values)} | {weight / 2**20:.0f} | "
                  f"{roof} |")
    print()
    ratios = [(label, "strata", ours, theirs) for label, ours, theirs in RATIOS
              if ("strata", ours) in files and theirs in files]
    for _, ours, theirs in RATIOS:  # the 2-stage plan against llama.cpp and against its own bf16
        theirs = (TWO_STAGE, theirs[1]) if theirs[0] == "strata" else theirs
        if (TWO_STAGE, ours) in files and theirs in files:
            ratios.append((f"{TWO_STAGE} {ours} / {' '.join(theirs)}", TWO_STAGE, ours, theirs))
    ratios += [(f"{TWO_STAGE} {fmt} / strata {fmt}", TWO_STAGE, fmt, ("strata", fmt))
               for side, fmt in formats if side == TWO_STAGE]
    print("| ratio of medians | " + " | ".join(f"{m} {t}t" for m, t in measures) + " |")
    print("|---|" + "---|" * len(measures))
    for label, side, ours, theirs in ratios:
        cells = [statistics.median(results[(m, t, side, ours)]) / statistics.median(results[(m, t, *theirs)])
                 for m, t in measures]
        print(f"| {label} | " + " | ".join(f"{c:.2f}x" for c in cells) + " |")
    print()
    for t in threads:
        print(f"read bandwidth {t} thread(s): {bandwidth[t] / 2**30:.1f} GiB/s (sum over 256 MiB, best of 5)")
    for (what, side, fmt), value in rss.items():
        shown = f"{value / 1e6:.0f} MB" if value else "unknown (no /usr/bin/time)"
        print(f"peak RSS ({what}): {side} {fmt} {shown}")
    if not args.work:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
