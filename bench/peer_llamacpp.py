#!/usr/bin/env python3
"""strata against llama.cpp on the CPU, side by side in one run (see bench/README.md).

Both sides run the same random ~125M-parameter Llama: saved as HF safetensors for strata (float32, and a
bfloat16 copy for the bf16 runs: each side reads a file in the dtype it serves), converted to
GGUF (f32 and bf16) with the `convert_hf_to_gguf.py` of the llama.cpp checkout given by --llama-cpp DIR
or LLAMA_CPP_DIR (a checkout built with cmake: DIR/build/bin/llama-bench and llama-server). The bench
builds nothing of llama.cpp and writes nothing into it. Measures, per dtype, alternating A/B runs:

1. decode batch 1, tokens/s, at each --threads: `strata-generate --warmup 1` (decode steps after a
   --depth-token prompt, warm process) vs `llama-bench -p 0 -n N -d DEPTH` (its warm-up run included);
2. prompt processing of --prefill tokens, tokens/s: the same two tools (`-p N -n 0`);
3. serving --streams concurrent streams of --serve-tokens each (prompts of --depth tokens, greedy):
   strata-server over gRPC vs llama-server (`-np STREAMS`, continuous batching) over HTTP, both
   streaming every token, both warm, aggregate tokens/s;
4. peak RSS of each server process after serving (VmHWM);
5. greedy ids of both sides for the same prompt (llama-server with top_k 1 vs strata-generate), and the
   first step where they differ.

The roofline is weight bytes read per decoded token / read bandwidth (a sum over 256 MiB, on the same
threads).

To measure the code an AVX2-only server runs on a machine with AVX-512, cap strata
(STRATA_CPU_ISA=avx2 ATEN_CPU_CAPABILITY=avx2 MKL_ENABLE_INSTRUCTIONS=AVX2 ONEDNN_MAX_CPU_ISA=AVX2 in the
environment) and point --llama-cpp at an AVX2-only build of llama.cpp (bench/README.md).
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import pathlib
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "integration"))
sys.path.insert(0, str(REPO / "tests" / "tokenizer_parity"))

import integration_helpers as IH  # noqa: E402

BUILD = pathlib.Path(os.environ.get("STRATA_BUILD_DIR", REPO / "build"))
# ~125M parameters: 12 layers of hidden 768 (GQA 12/4 heads), SwiGLU 3072, untied head.
MODEL = dict(hidden_size=768, intermediate_size=3072, num_hidden_layers=12, num_attention_heads=12,
             num_key_value_heads=4, max_position_embeddings=2048, rms_norm_eps=1e-5, rope_theta=10000.0,
             tie_word_embeddings=False, bos_token_id=1, eos_token_id=2, pad_token_id=0)


def find_llama_cpp(given: str | None) -> pathlib.Path | None:
    root = given or os.environ.get("LLAMA_CPP_DIR")
    return pathlib.Path(root).resolve() if root else None


def llama_bin(root: pathlib.Path, name: str) -> pathlib.Path:
    for candidate in (root / "build" / "bin" / name, root / "bin" / name):
        if candidate.exists():
            return candidate
    raise SystemExit(f"peer_llamacpp: {name} not found under {root}/build/bin or {root}/bin "
                     f"(build it: cmake -B build && cmake --build build --target {name})")


def make_checkpoint(directory: pathlib.Path, vocab: int = 8000) -> int:
    """A SentencePiece BPE vocabulary (tokenizer.model: what llama.cpp's converter reads for a Llama) and
    random weights scaled so that logits are well separated: greedy ids comparable across implementations.
    Both sides are given token ids, so strata needs no tokenizer.json. Returns the parameter count."""
    import io

    import sentencepiece as spm
    import torch
    import transformers

    import tokenizer_fixtures as TF

    directory.mkdir(parents=True, exist_ok=True)
    proto = io.BytesIO()
    spm.SentencePieceTrainer.train(sentence_iterator=iter(TF.training_text(n=20000)), model_writer=proto,
                                   vocab_size=vocab, model_type="bpe", byte_fallback=True, minloglevel=2,
                                   unk_id=0, bos_id=1, eos_id=2, pad_id=-1)
    (directory / "tokenizer.model").write_bytes(proto.getvalue())
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(vocab_size=vocab, **MODEL))
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() > 1:
                p.mul_(4.0)
    model.save_pretrained(directory, safe_serialization=True)
    return sum(p.numel() for p in model.parameters())


def write_tokenizer_json(directory: pathlib.Path) -> None:
    """A tokenizer.json for make_checkpoint's vocabulary (its pieces, byte fallback, the Llama decoder), for
    servers that stream text (strata's HTTP API makes no event for a token without text). It decodes as the
    SentencePiece model does; it has no merges, so it is for decoding only: the benches send token ids. Write
    it after convert(): llama.cpp's converter reads tokenizer.model, as it does without this file."""
    import sentencepiece as spm
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    sp = spm.SentencePieceProcessor(model_file=str(directory / "tokenizer.model"))
    vocab = {sp.id_to_piece(i): i for i in range(sp.get_piece_size())}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[], byte_fallback=True, unk_token=sp.id_to_piece(0)))
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="first", split=False)
    tok.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse(),
                                     decoders.Strip(" ", 1, 0)])
    tok.add_special_tokens([AddedToken(sp.id_to_piece(i), special=True, normalized=False) for i in (0, 1, 2)])
    tok.save(str(directory / "tokenizer.json"))


def save_as(model_dir: pathlib.Path, out: pathlib.Path, dtype: str) -> pathlib.Path:
    """The checkpoint with its tensors in `dtype` (bf16), the other files as they are."""
    import torch
    from safetensors.torch import load_file, save_file

    out.mkdir(parents=True, exist_ok=True)
    for f in model_dir.iterdir():
        if f.suffix != ".safetensors":
            shutil.copy(f, out / f.name)
    cast = {"bf16": torch.bfloat16}[dtype]
    for f in model_dir.glob("*.safetensors"):
        save_file({k: v.to(cast).contiguous() for k, v in load_file(f).items()}, out / f.name,
                  metadata={"format": "pt"})
    return out


def convert(root: pathlib.Path, model_dir: pathlib.Path, out: pathlib.Path, outtype: str) -> None:
    """llama.cpp's own converter, run by this Python (strata's environment: torch, numpy, transformers)."""
    env = dict(os.environ, PYTHONPATH=str(root / "gguf-py"), NO_LOCAL_GGUF="")
    proc = subprocess.run([sys.executable, str(root / "convert_hf_to_gguf.py"), str(model_dir), "--outfile", str(out),
                           "--outtype", outtype], capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        raise SystemExit(f"peer_llamacpp: convert_hf_to_gguf.py --outtype {outtype} failed:\n{proc.stderr[-4000:]}")


def read_bandwidth(threads: int) -> float:
    """Bytes per second read by a sum over 256 MiB, best of 5, on `threads` threads: what decode does with
    the weights (read them once, write nothing of their size)."""
    import torch

    torch.set_num_threads(threads)
    src = torch.ones(64 * 2**20)
    best = float("inf")
    for _ in range(5):
        start = time.perf_counter()
        src.sum()
        best = min(best, time.perf_counter() - start)
    return src.numel() * 4 / best


def prompt_ids(n: int, vocab: int, salt: int = 0) -> list[int]:
    """Ids of ordinary tokens (past the 3 specials and the 256 byte tokens), deterministic."""
    return [300 + (salt * 7919 + k * 131) % (vocab - 300) for k in range(n)]


# --- strata ---------------------------------------------------------------------------------------------

CPU_ONLY = ("--device-map", '{"": "cpu"}')


def strata_generate(model_dir, prompt, new_tokens, threads, dtype, plan=CPU_ONLY, extra=()) -> dict:
    """strata-generate's --json result (and "peak_rss") for one prompt's ids, or for a list of prompts run together;
    plan: the placement flags (default: every module on the CPU, one stage); extra: more flags."""
    prompts = prompt if prompt and isinstance(prompt[0], list) else [prompt]
    args = [str(BUILD / "runtime" / "strata-generate"), "--model", str(model_dir), "--json", "--warmup", "1",
            *(a for p in prompts for a in ("--prompt-ids", ",".join(map(str, p)))), "--max-new-tokens",
            str(new_tokens), *plan, "--dtype", dtype, *extra]
    env = dict(os.environ, OMP_NUM_THREADS=str(threads))
    proc, rss = run_peak_rss(args, env)
    if proc.returncode != 0:
        raise SystemExit(f"peer_llamacpp: strata-generate failed: {proc.stderr}")
    result = json.loads(proc.stdout)
    result["peak_rss"] = rss
    return result


def run_peak_rss(args, env) -> tuple[subprocess.CompletedProcess, int | None]:
    """subprocess.run(args, capture_output=True, text=True), and the process's peak RSS in bytes (its VmHWM) as GNU
    time reports it (/usr/bin/time -f %M; None without it). Not wait4's ru_maxrss of a child of this process: Linux
    carries the parent's high-water mark at fork into it (this Python holds the model), and it would read that."""
    timer = shutil.which("time", path="/usr/bin:/bin")
    if timer is None:
        proc = subprocess.run(args, capture_output=True, text=True, env=env)
        return proc, None
    with tempfile.NamedTemporaryFile(mode="r") as report:
        proc = subprocess.run([timer, "-f", "%M", "-o", report.name, *args], capture_output=True, text=True, env=env)
        text = report.read().strip().splitlines()
    rss = int(text[-1]) * 1024 if text and text[-1].isdigit() else None
    return proc, rss


def strata_decode(model_dir, depth, new_tokens, threads, dtype, vocab) -> float:
    timing = strata_generate(model_dir, prompt_ids(depth, vocab), new_tokens, threads, dtype)["timing"]
    return timing["decode_steps"] / timing["decode_seconds"]


def strata_prefill(model_dir, tokens, threads, dtype, vocab) -> float:
    timing = strata_generate(model_dir, prompt_ids(tokens, vocab), 1, threads, dtype)["timing"]
    return tokens / timing["prefill_seconds"]


def start_strata_server(stubs, model_dir, log_dir, dtype, max_batch, context, threads, warm_prompt, plan=CPU_ONLY,
                        extra=()):
    """A SERVING strata-server for the serving benches (gRPC), warmed by one short stream of `warm_prompt` (None: not
    warmed)."""
    server = IH.ServerProcess(
        IH.require_binary(IH.SERVER_BIN),
        ["--model", str(model_dir), *plan, "--dtype", dtype, "--max-batch", str(max_batch), "--max-context",
         str(context), "--intra-op-threads", str(threads), *extra], log_dir)
    server.start(stubs)
    if warm_prompt is not None:
        strata_stream(stubs, server, warm_prompt, 4)
    return server


# --- llama.cpp --------------------------------------------------------------------------------------------

def llama_bench(root, gguf, threads, prompt, gen, depth) -> float:
    args = [str(llama_bin(root, "llama-bench")), "-m", str(gguf), "-t", str(threads), "-p", str(prompt),
            "-n", str(gen), "-d", str(depth), "-r", "1", "-o", "json"]
    proc = subprocess.run(args, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"peer_llamacpp: llama-bench failed: {proc.stderr[-3000:]}")
    return float(json.loads(proc.stdout)[0]["avg_ts"])


class LlamaServer:
    def __init__(self, root, gguf, threads, streams, context, log: pathlib.Path, extra=()):
        self.port = IH.free_port()
        self.log = open(log, "w")
        self.proc = subprocess.Popen(
            [str(llama_bin(root, "llama-server")), "-m", str(gguf), "--host", "127.0.0.1", "--port", str(self.port),
             "-t", str(threads), "-tb", str(threads), "-np", str(streams), "-c", str(context * streams),
             "--no-webui", "--cache-ram", "0", *extra],
            stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 120
        while True:
            try:
                if self.request("GET", "/health")[0] == 200:
                    break
            except OSError:
                pass
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"peer_llamacpp: llama-server did not start; see {log}")
            time.sleep(0.2)

    def request(self, method, path, body=None):
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=600)
        conn.request(method, path, body=json.dumps(body) if body is not None else None,
                     headers={"Content-Type": "application/json"})
        response = conn.getresponse()
        data = response.read()
        conn.close()
        return response.status, data

    def completion(self, prompt, new_tokens) -> list[int]:
        status, data = self.request("POST", "/completion", {
            "prompt": prompt, "n_predict": new_tokens, "top_k": 1, "temperature": 0.0, "ignore_eos": True,
            "return_tokens": True, "cache_prompt": False, "samplers": ["top_k"]})
        if status != 200:
            raise SystemExit(f"peer_llamacpp: llama-server /completion: {status} {data[:500]!r}")
        return json.loads(data)["tokens"]

    def stream(self, prompt, new_tokens) -> int:
        """One streamed greedy completion; the number of tokens received."""
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=600)
        conn.request("POST", "/completion", body=json.dumps({
            "prompt": prompt, "n_predict": new_tokens, "top_k": 1, "temperature": 0.0, "ignore_eos": True,
            "stream": True, "return_tokens": True, "cache_prompt": False, "samplers": ["top_k"]}),
            headers={"Content-Type": "application/json"})
        response = conn.getresponse()
        tokens = 0
        for line in response:
            if line.startswith(b"data: "):
                event = json.loads(line[6:])
                tokens += len(event.get("tokens", []))
                if event.get("stop"):
                    break
        conn.close()
        return tokens

    def peak_rss(self) -> int:
        return peak_rss(self.proc.pid)

    def stop(self):
        self.proc.terminate()
        self.proc.wait(30)
        self.log.close()


def peak_rss(pid: int) -> int:
    for line in pathlib.Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmHWM")


# --- serving --------------------------------------------------------------------------------------------

def concurrently(n: int, one) -> float:
    """Runs one(i) for i < n on n threads started together; aggregate tokens/s."""
    seconds, counts = together(n, one)
    return sum(counts) / seconds


def together(n: int, one) -> tuple[float, list]:
    """Runs one(i) for i < n on n threads released together; the seconds until the last returned, and each
    one's result."""
    counts = [None] * n
    errors = []
    barrier = threading.Barrier(n + 1)

    def run(i):
        barrier.wait()
        try:
            counts[i] = one(i)
        except Exception as e:  # noqa: BLE001 - re-raised below
            errors.append(e)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    barrier.wait()
    start = time.perf_counter()
    for t in threads:
        t.join()
    seconds = time.perf_counter() - start
    if errors:
        raise errors[0]
    return seconds, counts


def strata_stream(stubs, server, prompt, new_tokens) -> int:
    stub = stubs.strata_grpc.InferenceServiceStub(server.channel)
    tokens = 0
    for r in stub.Generate(stubs.strata.GenerateRequest(prompt_ids=prompt, max_new_tokens=new_tokens), timeout=600):
        tokens += len(r.token_ids)
    return tokens


# --- table ----------------------------------------------------------------------------------------------

def alternating_runs(repeats: int, sides: list) -> list:
    """sides: zero-argument functions, each one side's measurement. Runs them in turn `repeats` times, the order
    reversed every other repeat (neither side always runs on a warmer or a cooler machine); one list of figures
    per side."""
    runs = [[] for _ in sides]
    order = list(range(len(sides)))
    for r in range(repeats):
        for k in (order if r % 2 == 0 else order[::-1]):
            runs[k].append(sides[k]())
    return runs


def summary(values: list[float]) -> str:
    return f"{min(values):.1f} / {statistics.median(values):.1f} / {max(values):.1f}"


def add_run_arguments(ap: argparse.ArgumentParser) -> None:
    """The decode / prefill / serving options this bench and quantized_peer.py share."""
    ap.add_argument("--depth", type=int, default=16, help="prompt tokens before decode (default 16)")
    ap.add_argument("--new-tokens", type=int, default=64, help="decoded tokens per decode run (default 64)")
    ap.add_argument("--prefill", type=int, default=512, help="prompt tokens of the prefill runs (default 512)")
    ap.add_argument("--streams", type=int, default=16)
    ap.add_argument("--serve-tokens", type=int, default=64, help="new tokens per served stream (default 64)")
    ap.add_argument("--serve-threads", type=int, default=None, help="threads of both servers (default: max --threads)")
    ap.add_argument("--skip-serving", action="store_true")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--llama-cpp", help="llama.cpp checkout built with cmake (default: $LLAMA_CPP_DIR)")
    ap.add_argument("--threads", default="1,2", help="thread counts for decode and prefill (default 1,2)")
    ap.add_argument("--dtypes", default="f32,bf16")
    ap.add_argument("--repeats", type=int, default=3, help="alternating runs per side and measure (default 3)")
    add_run_arguments(ap)
    ap.add_argument("--work", help="directory for the checkpoint and GGUF files (default: a temporary one)")
    args = ap.parse_args(argv)

    root = find_llama_cpp(args.llama_cpp)
    if root is None:
        print("peer_llamacpp: skipped: no llama.cpp given. Pass --llama-cpp DIR or set LLAMA_CPP_DIR to a llama.cpp "
              "checkout built with cmake (DIR/build/bin/llama-bench, llama-server); the bench builds none of it.")
        return 0
    try:
        import sentencepiece  # noqa: F401
    except ImportError:
        # The vocabulary is a SentencePiece model, and llama.cpp's converter needs the package anyway.
        raise SystemExit(f"peer_llamacpp: sentencepiece is needed (the checkpoint's tokenizer.model, and llama.cpp's "
                         f"converter): {sys.executable} -m pip install 'sentencepiece<0.3' (as "
                         f"{root}/requirements/requirements-convert_legacy_llama.txt asks)") from None
    for name in ("llama-bench", "llama-server"):
        llama_bin(root, name)
    if not (root / "convert_hf_to_gguf.py").exists():
        raise SystemExit(f"peer_llamacpp: {root}/convert_hf_to_gguf.py not found")
    for binary in (BUILD / "runtime" / "strata-generate", BUILD / "server" / "strata-server"):
        if not binary.exists():
            raise SystemExit(f"peer_llamacpp: {binary} not found (build strata first, or set STRATA_BUILD_DIR)")

    threads = [int(t) for t in args.threads.split(",")]
    serve_threads = args.serve_threads or max(threads)
    dtypes = args.dtypes.split(",")
    torch_dtype = {"f32": "float32", "bf16": "bfloat16"}
    work = pathlib.Path(args.work) if args.work else pathlib.Path(tempfile.mkdtemp(prefix="peer_llamacpp_"))
    model_dir = work / "hf"
    vocab = 8000
    params = make_checkpoint(model_dir, vocab)
    ggufs = {}
    for dtype in dtypes:
        ggufs[dtype] = work / f"model-{dtype}.gguf"
        convert(root, model_dir, ggufs[dtype], dtype)
    # Each side reads a file in the dtype it serves, as a user's would be: llama.cpp its GGUF, strata a
    # checkpoint saved in that dtype (loaded zero-copy from the mapped file; a float32 file served in
    # bfloat16 would be converted at load, into anonymous memory).
    checkpoints = {dtype: (model_dir if dtype == "f32" else save_as(model_dir, work / f"hf-{dtype}", dtype))
                   for dtype in dtypes}
    embed = MODEL["hidden_size"] * vocab
    bandwidth = {t: read_bandwidth(t) for t in threads}
    rows = []  # (measure, threads, dtype, strata values, llama values, unit)

    def alternate(measure, t, dtype, strata_fn, llama_fn, unit="tok/s"):
        ours, theirs = alternating_runs(args.repeats, [strata_fn, llama_fn])
        rows.append((measure, t, dtype, ours, theirs, unit))
        print(f"  {measure} {dtype} {t} thread(s): strata {summary(ours)}, llama.cpp {summary(theirs)}", flush=True)

    print(f"model: Llama {params / 1e6:.0f}M parameters (vocab {vocab}); llama.cpp at {root}; "
          f"{os.cpu_count()} CPUs; {args.repeats} alternating runs per side", flush=True)
    for dtype in dtypes:
        for t in threads:
            alternate("decode", t, dtype,
                      lambda: strata_decode(checkpoints[dtype], args.depth, args.new_tokens, t, torch_dtype[dtype], vocab),
                      lambda: llama_bench(root, ggufs[dtype], t, 0, args.new_tokens, args.depth))
            alternate("prefill", t, dtype,
                      lambda: strata_prefill(checkpoints[dtype], args.prefill, t, torch_dtype[dtype], vocab),
                      lambda: llama_bench(root, ggufs[dtype], t, args.prefill, 0, 0))

    ids_report = []
    rss = {}
    if not args.skip_serving:
        stubs = IH.stubs_under(work)
        context = args.depth + args.serve_tokens
        requests = [prompt_ids(args.depth, vocab, salt=i + 1) for i in range(args.streams)]
        for dtype in dtypes:
            ours_server = start_strata_server(stubs, checkpoints[dtype], work / f"strata-{dtype}", torch_dtype[dtype],
                                              args.streams, context, serve_threads, None)
            theirs = LlamaServer(root, ggufs[dtype], serve_threads, args.streams, context, work / f"llama-{dtype}.log")
            try:
                # Greedy ids of one prompt on both sides (llama-server, top_k 1; strata-generate).
                prompt = prompt_ids(args.depth, vocab, salt=99)
                theirs_ids = theirs.completion(prompt, args.serve_tokens)
                ours_ids = strata_generate(checkpoints[dtype], prompt, args.serve_tokens, serve_threads,
                                           torch_dtype[dtype])["results"][0]["ids"]
                first = next((i for i, (a, b) in enumerate(zip(ours_ids, theirs_ids)) if a != b), None)
                ids_report.append(f"{dtype}: {'identical' if first is None else f'first divergence at step {first}'}"
                                  f" over {min(len(ours_ids), len(theirs_ids))} greedy tokens")
                # Warm both, then alternate.
                strata_stream(stubs, ours_server, requests[0], 4)
                theirs.stream(requests[0], 4)
                alternate(f"serve {args.streams} streams", serve_threads, dtype,
                          lambda: concurrently(args.streams, lambda i: strata_stream(stubs, ours_server, requests[i],
                                                                                      args.serve_tokens)),
                          lambda: concurrently(args.streams, lambda i: theirs.stream(requests[i], args.serve_tokens)))
                rss[dtype] = (peak_rss(ours_server.process.pid), theirs.peak_rss())
            finally:
                theirs.stop()
                ours_server.stop()

    print()
    print(f"| measure | threads | dtype | strata min / median / max | llama.cpp min / median / max | ratio (medians) |")
    print("|---|---|---|---|---|---|")
    for measure, t, dtype, ours, theirs, unit in rows:
        ratio = statistics.median(ours) / statistics.median(theirs)
        print(f"| {measure} ({unit}) | {t} | {dtype} | {summary(ours)} | {summary(theirs)} | {ratio:.2f}x |")
    for dtype, (ours_rss, theirs_rss) in rss.items():
        print(f"| peak RSS (MB, server after serving) | {serve_threads} | {dtype} | {ours_rss / 1e6:.0f} | "
              f"{theirs_rss / 1e6:.0f} | {ours_rss / theirs_rss:.2f}x |")
    print()
    bytes_per_param = {"f32": 4, "bf16": 2}
    for measure, t, dtype, ours, theirs, unit in rows:
        if measure != "decode":
            continue
        weight_bytes = (params - embed) * bytes_per_param[dtype]  # the embedding is read one row at a time
        roofline = bandwidth[t] / weight_bytes
        print(f"roofline decode {dtype} {t} thread(s): {weight_bytes / 2**20:.0f} MiB per token / "
              f"{bandwidth[t] / 2**30:.1f} GiB/s read bandwidth = {roofline:.1f} tok/s; strata "
              f"{statistics.median(ours) / roofline:.0%}, llama.cpp {statistics.median(theirs) / roofline:.0%}")
    for line in ids_report:
        print(f"greedy ids, strata-generate vs llama-server: {line}")
    if not args.work:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
