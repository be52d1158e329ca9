#!/usr/bin/env python3
"""Structured outputs: what a JSON schema costs strata, and strata against llama-server's json_schema, side by side
in one run (see bench/README.md).

The model is peer_llamacpp.py's random ~125M Llama, here with a 32,000-token SentencePiece vocabulary (byte
fallback: every JSON text is expressible), float32; llama.cpp reads its GGUF conversion. Every request sends the
same token-id prompt to both servers and decodes greedily, so both sides do the same work:

1. tokens/s at 1 and --streams concurrent streams, every request constrained by a realistic schema (an order
   with a customer, line items, an enum status, dates; `schema_corpus.py`'s) against the same requests
   unconstrained (max_tokens tokens each, EOS ignored), on strata (HTTP /v1/completions, vLLM's
   structured_outputs.json) and on llama-server (/completion with json_schema: its JSON-schema-to-GBNF grammar);
   the constrained/unconstrained ratio of each, and strata over llama.cpp constrained;
2. the mask fill per token (strata's strata_grammar_mask_seconds histogram over the constrained runs) and, from
   strata_grammar_bench, compile time and mask fill p50/p99 over the whole schema corpus (each compile from an
   empty cache; seeded random walks through each grammar).

llama.cpp is the llama-cpp-python sdist's (--llama-cpp DIR or LLAMA_CPP_DIR: DIR/build/bin/llama-server), as
peer_llamacpp.py uses it; without it only strata's rows are printed.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import pathlib
import re
import shutil
import statistics
import subprocess
import sys
import tempfile

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))
sys.path.insert(0, str(REPO / "tests" / "integration"))
sys.path.insert(0, str(REPO / "tests" / "structured_outputs"))

import integration_helpers as IH  # noqa: E402
import peer_llamacpp as P  # noqa: E402

BUILD = pathlib.Path(os.environ.get("STRATA_BUILD_DIR", REPO / "build"))

# The served schema: an order as a shop's API returns it (an OpenAPI-style object: nested objects, an array of
# line items, an enum, a date, integers with bounds).
ORDER = {
    "type": "object",
    "properties": {
        "id": {"type": "integer", "minimum": 1},
        "status": {"type": "string", "enum": ["placed", "approved", "shipped", "delivered"]},
        "customer": {"type": "object", "properties": {"name": {"type": "string"}, "email": {"type": "string"}},
                     "required": ["name", "email"], "additionalProperties": False},
        "items": {"type": "array", "minItems": 1, "maxItems": 4,
                  "items": {"type": "object",
                            "properties": {"sku": {"type": "string"}, "quantity": {"type": "integer", "minimum": 1},
                                           "price": {"type": "number"}},
                            "required": ["sku", "quantity", "price"], "additionalProperties": False}},
        "ship_date": {"type": "string", "format": "date"},
        "complete": {"type": "boolean"},
    },
    "required": ["id", "status", "customer", "items", "ship_date", "complete"],
    "additionalProperties": False,
}


def post(port: int, path: str, body: dict) -> dict:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    conn.request("POST", path, body=json.dumps(body), headers={"Content-Type": "application/json"})
    response = conn.getresponse()
    data = response.read()
    conn.close()
    if response.status != 200:
        raise SystemExit(f"structured_speed: {path}: {response.status} {data[:500]!r}")
    return json.loads(data)


def strata_completion(port: int, prompt: list[int], max_tokens: int, constrained: bool) -> int:
    body = {"model": "m", "prompt": prompt, "max_tokens": max_tokens, "temperature": 0}
    if constrained:
        body["structured_outputs"] = {"json": ORDER}
    else:
        body["ignore_eos"] = True
    return int(post(port, "/v1/completions", body)["usage"]["completion_tokens"])


def strata_text(port: int, prompt: list[int], max_tokens: int) -> str:
    body = {"model": "m", "prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
            "structured_outputs": {"json": ORDER}}
    return post(port, "/v1/completions", body)["choices"][0]["text"]


def llama_completion(server: P.LlamaServer, prompt: list[int], max_tokens: int, constrained: bool) -> int:
    body = {"prompt": prompt, "n_predict": max_tokens, "temperature": 0.0, "top_k": 1, "cache_prompt": False,
            "samplers": ["top_k"]}
    if constrained:
        body["json_schema"] = ORDER
    else:
        body["ignore_eos"] = True
    status, data = server.request("POST", "/completion", body)
    if status != 200:
        raise SystemExit(f"structured_speed: llama-server /completion: {status} {data[:500]!r}")
    return int(json.loads(data)["tokens_predicted"])


def histogram_quantiles(metrics: str, name: str) -> tuple[float, float, int]:
    """p50 and p99 (upper bucket bounds) and the count of a Prometheus histogram in /metrics text."""
    buckets = []
    for line in metrics.splitlines():
        m = re.match(rf'{name}_bucket\{{.*le="([^"]+)".*\}} ([0-9.e+-]+)', line)
        if m:
            buckets.append((float(m.group(1)), float(m.group(2))))
    if not buckets:
        return float("nan"), float("nan"), 0
    total = buckets[-1][1]

    def quantile(q):
        for bound, count in buckets:
            if count >= q * total:
                return bound
        return buckets[-1][0]

    return quantile(0.5), quantile(0.99), int(total)


def metrics_text(url: str) -> str:
    import urllib.request

    with urllib.request.urlopen(url, timeout=30) as r:
        return r.read().decode()


def cpu_name() -> str:
    for line in pathlib.Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return os.uname().machine


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--llama-cpp", help="llama.cpp built with cmake (default: $LLAMA_CPP_DIR)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--streams", type=int, default=16)
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--depth", type=int, default=16, help="prompt tokens")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--work", help="directory for the checkpoint and GGUF (default: a temporary one)")
    args = ap.parse_args(argv)

    root = P.find_llama_cpp(args.llama_cpp)
    work = pathlib.Path(args.work) if args.work else pathlib.Path(tempfile.mkdtemp(prefix="structured_speed_"))
    model_dir = work / "hf"
    vocab = 32000
    if not (model_dir / "config.json").exists():
        P.make_checkpoint(model_dir, vocab)
        P.write_tokenizer_json(model_dir)
    gguf = work / "model-f32.gguf"
    if root is not None and not gguf.exists():
        P.convert(root, model_dir, gguf, "f32")

    # 2. compile and mask times over the corpus.
    import schema_corpus

    corpus = work / "corpus.jsonl"
    corpus.write_text("".join(json.dumps(s.schema) + "\n" for s in schema_corpus.CORPUS))
    bench = subprocess.run([str(BUILD / "bench" / "strata_grammar_bench"), "--tokenizer",
                            str(model_dir / "tokenizer.json"), "--vocab", str(vocab), "--eos", "2", "--schemas",
                            str(corpus)], capture_output=True, text=True)
    if bench.returncode != 0:
        raise SystemExit(f"structured_speed: strata_grammar_bench: {bench.stderr[-2000:]}")
    corpus_lines = bench.stdout.strip().splitlines()

    # 1. serving.
    stubs = IH.stubs_under(work)
    context = args.depth + args.max_tokens
    prompts = [P.prompt_ids(args.depth, vocab, salt=i + 1) for i in range(args.streams)]
    def strata_server(name: str, *extra: str):
        server = IH.ServerProcess(IH.require_binary(IH.SERVER_BIN),
                                  ["--model", str(model_dir), "--device-map", '{"": "cpu"}', "--dtype", "float32",
                                   "--max-batch", str(args.streams), "--max-context", str(context),
                                   "--intra-op-threads", str(args.threads), "--served-model-name", "m", *extra],
                                  work / name, http=True)
        server.start(stubs)
        return server

    server = strata_server("strata")
    jumping = strata_server("strata-jump", "--jump-forward")
    theirs = P.LlamaServer(root, gguf, args.threads, args.streams, context, work / "llama.log") if root else None
    rows = []
    try:
        port, jump_port = server.http_port, jumping.http_port
        # Every free request decodes as many tokens as the same prompt's constrained one did on that side (greedy:
        # the same every run), EOS ignored: both kinds do the same work, and the ratio is the grammar's cost alone.
        strata_lengths = [strata_completion(port, p, args.max_tokens, True) for p in prompts]
        jump_lengths = [strata_completion(jump_port, p, args.max_tokens, True) for p in prompts]
        llama_lengths = [llama_completion(theirs, p, args.max_tokens, True) for p in prompts] if theirs else []
        strata_completion(port, prompts[0], 4, False)
        if theirs:
            llama_completion(theirs, prompts[0], 4, False)
        for streams in (1, args.streams):
            sides = {
                ("strata", "free"): lambda n=streams: P.concurrently(
                    n, lambda i: strata_completion(port, prompts[i], strata_lengths[i], False)),
                ("strata", "json_schema"): lambda n=streams: P.concurrently(
                    n, lambda i: strata_completion(port, prompts[i], args.max_tokens, True)),
                ("strata --jump-forward", "json_schema"): lambda n=streams: P.concurrently(
                    n, lambda i: strata_completion(jump_port, prompts[i], args.max_tokens, True)),
            }
            if theirs:
                sides[("llama.cpp", "free")] = lambda n=streams: P.concurrently(
                    n, lambda i: llama_completion(theirs, prompts[i], llama_lengths[i], False))
                sides[("llama.cpp", "json_schema")] = lambda n=streams: P.concurrently(
                    n, lambda i: llama_completion(theirs, prompts[i], args.max_tokens, True))
            runs = P.alternating_runs(args.repeats, list(sides.values()))
            for (side, kind), values in zip(sides, runs):
                rows.append((streams, side, kind, values))
                print(f"  {streams} stream(s) {side} {kind}: {P.summary(values)} tok/s", flush=True)
        mask_p50, mask_p99, masks = histogram_quantiles(metrics_text(server.metrics_url), "strata_grammar_mask_seconds")
        same = all(strata_text(port, p, args.max_tokens) == strata_text(jump_port, p, args.max_tokens) for p in prompts)
        forced = re.search(r"^strata_grammar_forced_tokens_total ([0-9.e+]+)", metrics_text(jumping.metrics_url), re.M)
    finally:
        if theirs:
            theirs.stop()
        server.stop()
        jumping.stop()

    print()
    print(f"CPU: {cpu_name()}, {args.threads} threads; model: "
          f"random Llama ~125M, vocab {vocab}, float32; {args.max_tokens} max tokens per request, greedy; "
          f"{args.repeats} alternating runs per side")
    print("| streams | side | free tok/s (min / median / max) | json_schema tok/s | json_schema / free |")
    print("|---|---|---|---|---|")
    medians = {}
    for streams in (1, args.streams):
        free_of = {}
        for side in ("strata", "strata --jump-forward", "llama.cpp"):
            got = {kind: values for s, sd, kind, values in rows if s == streams and sd == side}
            if not got:
                continue
            free = got.get("free") or free_of["strata"]
            free_of[side] = free
            constrained = got["json_schema"]
            medians[(streams, side)] = statistics.median(constrained)
            print(f"| {streams} | {side} | {P.summary(free)} | {P.summary(constrained)} | "
                  f"{statistics.median(constrained) / statistics.median(free):.2f}x |")
    for streams in (1, args.streams):
        if (streams, "llama.cpp") in medians:
            print(f"json_schema, {streams} stream(s): strata / llama.cpp = "
                  f"{medians[(streams, 'strata')] / medians[(streams, 'llama.cpp')]:.2f}x")
    print(f"requests: {args.streams} prompts of {args.depth} tokens; constrained outputs (strata, greedy): "
          f"{sum(strata_lengths)} tokens, {sum(1 for n in strata_lengths if n < args.max_tokens)} ended before "
          f"max_tokens; llama.cpp: {sum(llama_lengths)} tokens")
    if forced:
        print(f"--jump-forward: {float(forced.group(1)):.0f} tokens appended without a forward pass of their own over "
              f"the run; its outputs equal the plain server's: {same and jump_lengths == strata_lengths}")
    print(f"mask fill while serving (strata_grammar_mask_seconds, bucket bounds): p50 <= {mask_p50 * 1e6:.0f} us, "
          f"p99 <= {mask_p99 * 1e6:.0f} us over {masks} masks")
    print("schema corpus (strata_grammar_bench, vocab 32000):")
    for line in corpus_lines:
        print(f"  {line}")
    if not args.work:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
