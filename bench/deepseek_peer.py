#!/usr/bin/env python3
"""DeepSeek-V3's architecture on the CPU: strata against llama.cpp side by side in one run, and strata's absorbed
against expanded MLA decode (see bench/README.md, "DeepSeek-V3-shaped model").

Both sides run the same random DeepSeek-V3-shaped model of ~150M parameters (MLA with V3's ratios: kv_lora_rank
4 x qk_nope_head_dim, q_lora_rank 1.5 x kv_lora_rank, RoPE half the nope dims; DeepSeekMoE with 64 routed experts in
8 groups, 4 groups kept, 6 active, one shared expert, the first layer dense), saved as HF safetensors for strata
(float32 and bfloat16 copies) and converted to GGUF (f32, bf16) with the `convert_hf_to_gguf.py` of the llama.cpp
checkout given by --llama-cpp DIR or LLAMA_CPP_DIR (its `deepseek2` graph runs MLA). The checkpoint's tokenizer is
a byte-level BPE trained here; llama.cpp's converter refuses BPE pre-tokenizers it has no hash for, so it runs with
`get_vocab_base_pre` answering "gpt-2" (both sides are given token ids: the vocabulary's text plays no part).

Measures, alternating A/B runs on the same threads (peer_llamacpp.py's tools):
1. decode batch 1 (tok/s) at each --threads after a --depth-token prompt; prefill of --prefill tokens;
2. --streams concurrent served streams (strata-server over gRPC vs llama-server over HTTP), aggregate tok/s;
3. KV cache bytes per token (strata: its plan's latent pools; llama.cpp: the K and V sizes llama-server logs);
4. peak RSS of both servers after serving;
5. greedy ids of both sides for one prompt;
6. strata alone: absorbed vs expanded decode (STRATA_MLA_ATTENTION=expanded) at each --positions.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import re
import shutil
import statistics
import subprocess
import sys
import tempfile

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import peer_llamacpp as P  # noqa: E402

IH = P.IH
BUILD = P.BUILD

# V3's ratios at ~150M parameters (V3: hidden 7168, 128 heads of 128 + 64, kv_lora 512, q_lora 1536, 256 experts
# of 2048 in 8 groups, 4 kept, 8 active, 1 shared, 3 dense layers).
MODEL = dict(hidden_size=768, intermediate_size=2048, moe_intermediate_size=160, num_hidden_layers=7,
             num_attention_heads=8, num_key_value_heads=8, n_shared_experts=1, n_routed_experts=64, n_group=8,
             topk_group=4, num_experts_per_tok=6, first_k_dense_replace=1, routed_scaling_factor=2.5,
             kv_lora_rank=256, q_lora_rank=384, qk_rope_head_dim=32, qk_nope_head_dim=64, v_head_dim=64,
             max_position_embeddings=40960, rms_norm_eps=1e-6, rope_theta=10000.0, rope_interleave=True,
             tie_word_embeddings=False, bos_token_id=1, eos_token_id=2, pad_token_id=0,
             # What DeepSeek-V3's config.json states and llama.cpp's converter reads (transformers ignores them): without
             # scoring_func its deepseek2 graph routes by softmax.
             scoring_func="sigmoid", topk_method="noaux_tc")
VOCAB = 8000


def make_tokenizer(directory: pathlib.Path) -> None:
    """A byte-level BPE of VOCAB tokens trained here, saved as tokenizer.json with its transformers files (llama.cpp's
    converters read a GPT-2-style tokenizer.json); gpt_oss_peer.py's too."""
    import transformers
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    sys.path.insert(0, str(HERE.parent / "tests" / "tokenizer_parity"))
    import tokenizer_fixtures as TF

    directory.mkdir(parents=True, exist_ok=True)
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(TF.training_text(n=20000), trainers.BpeTrainer(
        vocab_size=VOCAB - 3, special_tokens=["<unk>", "<s>", "</s>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tok.save(str(directory / "tokenizer.json"))
    transformers.PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>",
                                         unk_token="<unk>").save_pretrained(directory)


def make_checkpoint(directory: pathlib.Path) -> int:
    """The random model (matrices scaled up so greedy ids are well separated, routing biases random) and a
    byte-level BPE tokenizer.json; the parameter count."""
    import torch
    import transformers

    make_tokenizer(directory)
    torch.manual_seed(0)
    model = transformers.DeepseekV3ForCausalLM(transformers.DeepseekV3Config(vocab_size=VOCAB, **MODEL))
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() > 1:
                p.mul_(4.0)
        for name, b in model.named_buffers():
            if name.endswith("e_score_correction_bias"):
                b.uniform_(-0.1, 0.1)
    model.save_pretrained(directory, safe_serialization=True)
    return sum(p.numel() for p in model.parameters())


def convert(root: pathlib.Path, model_dir: pathlib.Path, out: pathlib.Path, outtype: str) -> None:
    code = ("import runpy, sys; sys.path.insert(0, sys.argv[1]); import conversion.base as b; "
            "b.TextModel.get_vocab_base_pre = lambda self, tokenizer: 'gpt-2'; "
            "script = sys.argv[1] + '/convert_hf_to_gguf.py'; sys.argv = [script] + sys.argv[2:]; "
            "runpy.run_path(script, run_name='__main__')")
    proc = subprocess.run([sys.executable, "-c", code, str(root), str(model_dir), "--outfile", str(out), "--outtype",
                           outtype], capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"deepseek_peer: convert_hf_to_gguf.py --outtype {outtype} failed:\n{proc.stderr[-4000:]}")


def strata_decode(model_dir, depth, new_tokens, threads, dtype, mode="absorbed") -> float:
    """peer_llamacpp's strata_decode with MLA's decode form chosen (STRATA_MLA_ATTENTION, runtime/model/deepseek_model.cc)."""
    saved = os.environ.get("STRATA_MLA_ATTENTION")
    os.environ["STRATA_MLA_ATTENTION"] = mode
    try:
        timing = P.strata_generate(model_dir, P.prompt_ids(depth, VOCAB), new_tokens, threads, dtype)["timing"]
    finally:
        if saved is None:
            os.environ.pop("STRATA_MLA_ATTENTION", None)
        else:
            os.environ["STRATA_MLA_ATTENTION"] = saved
    return timing["decode_steps"] / timing["decode_seconds"]


def llama_kv_bytes_per_token(log: pathlib.Path) -> float | None:
    """llama-server's own report: `llama_kv_cache: size = X MiB (N cells, ...)`."""
    text = log.read_text(errors="replace")
    m = re.search(r"llama_kv_cache:\s+size\s*=\s*([\d.]+) MiB \(\s*(\d+) cells", text)
    if not m:
        return None
    return float(m.group(1)) * 2**20 / int(m.group(2))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--llama-cpp", help="llama.cpp checkout built with cmake (default: $LLAMA_CPP_DIR)")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--dtypes", default="bf16")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--positions", default="1024,8192", help="context lengths of the absorbed/expanded decode runs")
    P.add_run_arguments(ap)
    ap.add_argument("--work", help="directory for the checkpoint and GGUF files (default: a temporary one)")
    args = ap.parse_args(argv)

    root = P.find_llama_cpp(args.llama_cpp)
    threads = [int(t) for t in args.threads.split(",")]
    serve_threads = args.serve_threads or max(threads)
    dtypes = args.dtypes.split(",")
    torch_dtype = {"f32": "float32", "bf16": "bfloat16"}
    work = pathlib.Path(args.work) if args.work else pathlib.Path(tempfile.mkdtemp(prefix="deepseek_peer_"))
    model_dir = work / "hf"
    params = make_checkpoint(model_dir) if not (model_dir / "config.json").exists() else None
    checkpoints = {dtype: (model_dir if dtype == "f32" else P.save_as(model_dir, work / f"hf-{dtype}", dtype))
                   for dtype in dtypes}
    rows = []

    def alternate(measure, t, dtype, strata_fn, llama_fn, unit="tok/s"):
        ours, theirs = P.alternating_runs(args.repeats, [strata_fn, llama_fn])
        rows.append((measure, t, dtype, ours, theirs, unit))
        print(f"  {measure} {dtype} {t} thread(s): {P.summary(ours)} vs {P.summary(theirs)}", flush=True)

    print(f"model: DeepSeek-V3-shaped, {params / 1e6 if params else 0:.0f}M parameters; {os.cpu_count()} CPUs; "
          f"{args.repeats} alternating runs per side", flush=True)

    # strata alone: absorbed against expanded decode at long contexts.
    for dtype in dtypes:
        for depth in [int(p) for p in args.positions.split(",")]:
            t = max(threads)
            alternate(f"decode at {depth} positions", t, dtype,
                      lambda: strata_decode(checkpoints[dtype], depth, 16, t, torch_dtype[dtype], "absorbed"),
                      lambda: strata_decode(checkpoints[dtype], depth, 16, t, torch_dtype[dtype], "expanded"))
    absorbed_rows = len(rows)

    rss, kv, ids_report = {}, {}, []
    if root is not None:
        ggufs = {}
        for dtype in dtypes:
            ggufs[dtype] = work / f"model-{dtype}.gguf"
            if not ggufs[dtype].exists():
                convert(root, model_dir, ggufs[dtype], dtype)
        for dtype in dtypes:
            for t in threads:
                alternate("decode", t, dtype,
                          lambda: strata_decode(checkpoints[dtype], args.depth, args.new_tokens, t, torch_dtype[dtype]),
                          lambda: P.llama_bench(root, ggufs[dtype], t, 0, args.new_tokens, args.depth))
                alternate("prefill", t, dtype,
                          lambda: P.strata_prefill(checkpoints[dtype], args.prefill, t, torch_dtype[dtype], VOCAB),
                          lambda: P.llama_bench(root, ggufs[dtype], t, args.prefill, 0, 0))
        if not args.skip_serving:
            stubs = IH.stubs_under(work)
            context = args.depth + args.serve_tokens
            requests = [P.prompt_ids(args.depth, VOCAB, salt=i + 1) for i in range(args.streams)]
            for dtype in dtypes:
                ours_server = IH.ServerProcess(
                    IH.require_binary(IH.SERVER_BIN),
                    ["--model", str(checkpoints[dtype]), "--device-map", '{"": "cpu"}', "--dtype", torch_dtype[dtype],
                     "--max-batch", str(args.streams), "--max-context", str(context),
                     "--kv-cache-tokens", str(args.streams * context), "--intra-op-threads", str(serve_threads)],
                    work / f"strata-{dtype}")
                ours_server.start(stubs)
                log = work / f"llama-{dtype}.log"
                theirs = P.LlamaServer(root, ggufs[dtype], serve_threads, args.streams, context, log)
                try:
                    prompt = P.prompt_ids(args.depth, VOCAB, salt=99)
                    theirs_ids = theirs.completion(prompt, args.serve_tokens)
                    ours_ids = P.strata_generate(checkpoints[dtype], prompt, args.serve_tokens, serve_threads,
                                                 torch_dtype[dtype])["results"][0]["ids"]
                    first = next((i for i, (a, b) in enumerate(zip(ours_ids, theirs_ids)) if a != b), None)
                    ids_report.append(f"{dtype}: {'identical' if first is None else f'first divergence at step {first}'}"
                                      f" over {min(len(ours_ids), len(theirs_ids))} greedy tokens")
                    P.strata_stream(stubs, ours_server, requests[0], 4)
                    theirs.stream(requests[0], 4)
                    alternate(f"serve {args.streams} streams", serve_threads, dtype,
                              lambda: P.concurrently(args.streams, lambda i: P.strata_stream(
                                  stubs, ours_server, requests[i], args.serve_tokens)),
                              lambda: P.concurrently(args.streams, lambda i: theirs.stream(requests[i],
                                                                                           args.serve_tokens)))
                    rss[dtype] = (P.peak_rss(ours_server.process.pid), theirs.peak_rss())
                finally:
                    theirs.stop()
                    ours_server.stop()
                kv[dtype] = llama_kv_bytes_per_token(log)
    else:
        print("deepseek_peer: no llama.cpp given (--llama-cpp DIR or LLAMA_CPP_DIR): strata's own rows only")

    element = {"f32": 4, "bf16": 2}
    print()
    print("| measure | threads | dtype | strata min / median / max | other min / median / max | ratio (medians) |")
    print("|---|---|---|---|---|---|")
    for i, (measure, t, dtype, ours, theirs, unit) in enumerate(rows):
        other = "expanded" if i < absorbed_rows else "llama.cpp"
        ratio = statistics.median(ours) / statistics.median(theirs)
        print(f"| {measure} ({unit}; {'absorbed vs expanded' if other == 'expanded' else 'strata vs llama.cpp'}) | "
              f"{t} | {dtype} | {P.summary(ours)} | {P.summary(theirs)} | {ratio:.2f}x |")
    for dtype, (ours_rss, theirs_rss) in rss.items():
        print(f"| peak RSS (MB, server after serving) | {serve_threads} | {dtype} | {ours_rss / 1e6:.0f} | "
              f"{theirs_rss / 1e6:.0f} | {ours_rss / theirs_rss:.2f}x |")
    # strata's pools are one latent row of kv_lora_rank + qk_rope_head_dim per token and layer (AddLatentLayer).
    layers = MODEL["num_hidden_layers"]
    ours_kv = layers * (MODEL["kv_lora_rank"] + MODEL["qk_rope_head_dim"])
    for dtype in dtypes:
        theirs = kv.get(dtype)
        print(f"| KV cache bytes per token | - | {dtype} | {ours_kv * element[dtype]} | "
              f"{f'{theirs:.0f}' if theirs else 'n/a'} | "
              f"{f'{ours_kv * element[dtype] / theirs:.2f}x' if theirs else '-'} |")
    for line in ids_report:
        print(f"greedy ids, strata-generate vs llama-server: {line}")
    if not args.work:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
