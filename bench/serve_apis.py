#!/usr/bin/env python3
"""strata-server's two APIs side by side, and its HTTP API against llama.cpp's llama-server (issue 21).

1. One strata-server process serving gRPC (--listen) and the OpenAI-compatible HTTP API (--http-listen):
   the same --streams concurrent streams (each count in turn: 16 and 64) through each API, in alternating
   runs (HTTP first in even repeats, gRPC first in odd ones). Same prompts (token ids), greedy, every stream
   generating --tokens tokens (HTTP: ignore_eos; gRPC has no ignore_eos, so prompts are chosen whose greedy
   continuation holds no end-of-sequence token).
2. strata-server's HTTP API vs llama-server (`-np STREAMS`, continuous batching) on the same weights (the
   random Llama of bench/peer_llamacpp.py, converted to GGUF by llama.cpp's converter) with the same HTTP
   client code and requests (`/v1/completions`, stream, ignore_eos, top_k 1, temperature 0), the same
   threads (--intra-op-threads / -t -tb), alternating runs.

Per run: aggregate tokens/s (every stream's tokens / the time until the last stream ended), TTFT (request
sent to the first event or message carrying a token) p50 / p99 over the streams, inter-token latency (gaps
between token-bearing events or messages of a stream) p50 / p99 over all gaps of the run. The tables show
the median over repeats and the min-max. Token counts are checked: HTTP from the usage event
(stream_options.include_usage), gRPC from token_ids. Also per run: the CPU time the server process and this
client process spent per 1000 tokens (/proc and process_time). The client runs in this Python process, on the same
CPUs as the server: both APIs pay for it.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import shutil
import socket
import statistics
import sys
import tempfile
import time

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))

import peer_llamacpp as P  # noqa: E402  (its sys.path entries also bring integration_helpers)

IH = P.IH
MODEL_NAME = "bench"
EOS_ID = P.MODEL["eos_token_id"]


class Stream:
    """What the client saw of one stream: when it was sent, when each token-bearing event came, tokens."""

    def __init__(self):
        self.sent = 0.0
        self.arrivals: list[float] = []
        self.tokens = 0


def body_lines(reader):
    """The lines of an HTTP/1.1 response body after its status line, chunked or not, as they arrive."""
    chunked = False
    while (header := reader.readline()) not in (b"\r\n", b""):
        chunked |= header.lower().replace(b" ", b"").startswith(b"transfer-encoding:chunked")
    if not chunked:
        yield from reader
        return
    pending = b""
    while size := int(reader.readline().split(b";")[0], 16):
        pending += reader.read(size)
        reader.readline()  # the CRLF after the chunk
        *lines, pending = pending.split(b"\n")
        yield from lines


def http_stream(port: int, prompt: list[int], tokens: int, extra: dict) -> Stream:
    """One streamed /v1/completions over a fresh HTTP/1.1 connection, read line by line from the socket."""
    body = json.dumps({"model": MODEL_NAME, "prompt": prompt, "max_tokens": tokens, "temperature": 0.0, "top_k": 1,
                       "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}, **extra})
    request = (f"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\n"
               f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n{body}").encode()
    out = Stream()
    with socket.create_connection(("127.0.0.1", port), timeout=600) as sock:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        reader = sock.makefile("rb")
        out.sent = time.perf_counter()
        sock.sendall(request)
        status = reader.readline()
        if b" 200 " not in status:
            raise SystemExit(f"serve_apis: /v1/completions on port {port}: {status!r} {reader.read(500)!r}")
        for line in body_lines(reader):
            if not line.startswith(b"data: "):
                continue
            now = time.perf_counter()
            if line.startswith(b"data: [DONE]"):
                break
            event = json.loads(line[6:])
            if any(c.get("text") for c in event.get("choices", [])):
                out.arrivals.append(now)
            if event.get("usage"):
                out.tokens = event["usage"]["completion_tokens"]
    return out


def grpc_stream(stubs, channel, prompt: list[int], tokens: int) -> Stream:
    stub = stubs.strata_grpc.InferenceServiceStub(channel)
    out = Stream()
    out.sent = time.perf_counter()
    for reply in stub.Generate(stubs.strata.GenerateRequest(prompt_ids=prompt, max_new_tokens=tokens), timeout=600):
        if reply.token_ids:
            out.arrivals.append(time.perf_counter())
            out.tokens += len(reply.token_ids)
    return out


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q / 100 * (len(ordered) - 1))))]


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of process `pid` so far (all its threads), from /proc."""
    fields = pathlib.Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def measure(streams: int, tokens: int, one, server_pid: int) -> dict:
    """`streams` concurrent calls of one(i) -> Stream; the run's figures (latencies in ms), and the CPU time
    the server and this client spent per 1000 tokens (the two share the CPUs: an API whose client is
    costlier leaves the server less)."""
    server_before, client_before = cpu_seconds(server_pid), time.process_time()
    seconds, results = P.together(streams, one)
    server_cpu = cpu_seconds(server_pid) - server_before
    client_cpu = time.process_time() - client_before
    wrong = [r.tokens for r in results if r.tokens != tokens]
    if wrong:
        raise SystemExit(f"serve_apis: streams generated {wrong[:4]} tokens, not {tokens}")
    ttft = [(r.arrivals[0] - r.sent) * 1e3 for r in results]
    itl = [(b - a) * 1e3 for r in results for a, b in zip(r.arrivals, r.arrivals[1:])]
    events = sum(len(r.arrivals) for r in results)
    return {"tok/s": streams * tokens / seconds, "ttft p50": percentile(ttft, 50), "ttft p99": percentile(ttft, 99),
            "itl p50": percentile(itl, 50), "itl p99": percentile(itl, 99),
            "tokens/event": streams * tokens / events,
            "server cpu/ktok": server_cpu * 1e6 / (streams * tokens),
            "client cpu/ktok": client_cpu * 1e6 / (streams * tokens)}


FIGURES = ("tok/s", "ttft p50", "ttft p99", "itl p50", "itl p99", "tokens/event", "server cpu/ktok",
           "client cpu/ktok")


def alternate(repeats: int, sides: dict) -> dict:
    """sides: name -> () -> figures. Runs them in turn, the order reversed every other repeat."""
    runs = {name: [] for name in sides}
    names = list(sides)
    for r in range(repeats):
        for name in (names if r % 2 == 0 else names[::-1]):
            runs[name].append(sides[name]())
            figures = runs[name][-1]
            print(f"    {name} run {r + 1}: {figures['tok/s']:.1f} tok/s, TTFT p50 {figures['ttft p50']:.1f} ms, "
                  f"ITL p50 {figures['itl p50']:.1f} ms", flush=True)
    return runs


def ttft_alone(samples: int, sides: dict) -> dict:
    """sides: name -> () -> Stream of one request alone; TTFT in ms of `samples` requests per side, the sides
    in turn (the order reversed every other sample)."""
    ttft = {name: [] for name in sides}
    names = list(sides)
    for k in range(samples):
        for name in (names if k % 2 == 0 else names[::-1]):
            stream = sides[name]()
            ttft[name].append((stream.arrivals[0] - stream.sent) * 1e3)
    return ttft


def cell(runs: list[dict], figure: str) -> str:
    values = [run[figure] for run in runs]
    digits = 2 if figure == "tokens/event" else 1
    return f"{statistics.median(values):.{digits}f} ({min(values):.{digits}f}-{max(values):.{digits}f})"


def table(title: str, rows: list[tuple[str, dict]], a: str, b: str) -> None:
    """rows: (label, {side: runs}); columns a, b, a/b of the medians, and a/b run by run: run r of a and run r
    of b ran one after the other, so their ratio holds when the machine's speed drifts between repeats."""
    print(f"\n{title}\n")
    print(f"| streams | figure | {a} median (min-max) | {b} median (min-max) | {a} / {b} (medians) "
          f"| {a} / {b} pair by pair: median (min-max) |")
    print("|---|---|---|---|---|---|")
    for label, runs in rows:
        for figure in FIGURES:
            ma = statistics.median(run[figure] for run in runs[a])
            mb = statistics.median(run[figure] for run in runs[b])
            pairs = [ra[figure] / rb[figure] for ra, rb in zip(runs[a], runs[b])]
            unit = "" if figure in ("tok/s", "tokens/event") else " (ms)"
            print(f"| {label} | {figure}{unit} | {cell(runs[a], figure)} | {cell(runs[b], figure)} | {ma / mb:.3f} "
                  f"| {statistics.median(pairs):.3f} ({min(pairs):.3f}-{max(pairs):.3f}) |")


def choose_prompts(stubs, channel, count: int, depth: int, tokens: int, vocab: int) -> list[list[int]]:
    """`count` prompts whose greedy continuation (through gRPC) has no end-of-sequence token: gRPC would stop
    there. (A byte token of an incomplete character still makes HTTP send two tokens in one event: the
    tokens/event row.)"""
    chosen = []
    salt = 0
    while len(chosen) < count:
        batch = [P.prompt_ids(depth, vocab, salt=salt + k + 1) for k in range(16)]
        salt += 16
        _, ids = P.together(16, lambda i: [t for r in stubs.strata_grpc.InferenceServiceStub(channel).Generate(
            stubs.strata.GenerateRequest(prompt_ids=batch[i], max_new_tokens=tokens), timeout=600)
            for t in r.token_ids])
        chosen += [p for p, out in zip(batch, ids)
                   if len(out) == tokens and EOS_ID not in out]
        print(f"  prompts: {len(chosen)} of {salt} without end-of-sequence", flush=True)
        if salt > 50 * count:
            raise SystemExit(f"serve_apis: found only {len(chosen)} usable prompts of {salt} tried")
    return chosen[:count]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--strata-server", default=str(IH.SERVER_BIN), help="strata-server binary (default: "
                    "$STRATA_BUILD_DIR/server/strata-server)")
    ap.add_argument("--llama-cpp", help="llama.cpp checkout built with cmake (default: $LLAMA_CPP_DIR); "
                    "without one, part 2 is skipped")
    ap.add_argument("--streams", default="16,64", help="concurrent streams, HTTP vs gRPC (default 16,64)")
    ap.add_argument("--peer-streams", type=int, default=16, help="concurrent streams vs llama-server (default 16)")
    ap.add_argument("--tokens", type=int, default=64, help="new tokens per stream (default 64)")
    ap.add_argument("--depth", type=int, default=16, help="prompt tokens (default 16)")
    ap.add_argument("--threads", type=int, default=2, help="threads of both servers (default 2)")
    ap.add_argument("--dtype", default="f32", choices=["f32", "bf16"])
    ap.add_argument("--repeats", type=int, default=5, help="alternating runs per side (default 5)")
    ap.add_argument("--alone", type=int, default=200, help="requests per API for the TTFT of one request alone "
                    "(default 200)")
    ap.add_argument("--work", help="directory for the checkpoint and the GGUF file (default: a temporary one)")
    args = ap.parse_args(argv)

    server_bin = pathlib.Path(args.strata_server)
    if not server_bin.is_file():
        raise SystemExit(f"serve_apis: {server_bin} not found (build strata, or pass --strata-server)")
    root = P.find_llama_cpp(args.llama_cpp)
    stream_counts = [int(s) for s in args.streams.split(",")]
    work = pathlib.Path(args.work) if args.work else pathlib.Path(tempfile.mkdtemp(prefix="serve_apis_"))
    model_dir = work / "hf"
    vocab = 8000
    params = P.make_checkpoint(model_dir, vocab)
    if root is not None:
        gguf = work / f"model-{args.dtype}.gguf"
        P.convert(root, model_dir, gguf, args.dtype)
    P.write_tokenizer_json(model_dir)
    checkpoint = model_dir if args.dtype == "f32" else P.save_as(model_dir, work / f"hf-{args.dtype}", args.dtype)
    torch_dtype = {"f32": "float32", "bf16": "bfloat16"}[args.dtype]
    most = max(stream_counts + [args.peer_streams])
    print(f"model: Llama {params / 1e6:.0f}M parameters ({args.dtype}); {os.cpu_count()} CPUs; {args.threads} "
          f"server threads; {args.depth}-token prompts, {args.tokens} tokens per stream; {args.repeats} alternating "
          f"runs per side", flush=True)

    stubs = IH.stubs_under(work)
    server = IH.ServerProcess(
        server_bin, ["--model", str(checkpoint), "--device-map", '{"": "cpu"}', "--dtype", torch_dtype,
                     "--max-batch", str(most), "--max-context", str(args.depth + args.tokens),
                     "--intra-op-threads", str(args.threads), "--prefix-cache=false",
                     "--served-model-name", MODEL_NAME], work / "strata", http=True)
    server.start(stubs)
    peer = None
    try:
        prompts = choose_prompts(stubs, server.channel, most, args.depth, args.tokens, vocab)
        port = int(server.http_url.rsplit(":", 1)[1])
        api_rows = []
        for streams in stream_counts:
            print(f"  strata-server, {streams} streams:", flush=True)
            def http(streams=streams):
                return measure(streams, args.tokens, lambda i: http_stream(port, prompts[i], args.tokens, {}),
                               server.process.pid)

            def grpc(streams=streams):
                return measure(streams, args.tokens,
                               lambda i: grpc_stream(stubs, server.channel, prompts[i], args.tokens),
                               server.process.pid)
            http(), grpc()  # warm both paths at this batch size
            api_rows.append((str(streams), alternate(args.repeats, {"HTTP/SSE": http, "gRPC": grpc})))

        # One request at a time: TTFT without the batch's prefill in it, where an API's own cost shows.
        alone = ttft_alone(args.alone, {
            "HTTP/SSE": lambda: http_stream(port, prompts[0], 1, {}),
            "gRPC": lambda: grpc_stream(stubs, server.channel, prompts[0], 1)})

        peer_rows = []
        if root is not None:
            n = args.peer_streams
            peer = P.LlamaServer(root, gguf, args.threads, n, args.depth + args.tokens, work / "llama-server.log")
            # llama-server's prompt cache is off, as strata's prefix cache is (--prefix-cache=false).
            sides = {
                "strata HTTP": lambda: measure(n, args.tokens, lambda i: http_stream(
                    port, prompts[i], args.tokens, {"cache_prompt": False}), server.process.pid),
                "llama-server": lambda: measure(n, args.tokens, lambda i: http_stream(
                    peer.port, prompts[i], args.tokens, {"cache_prompt": False}), peer.proc.pid),
            }
            print(f"  strata-server HTTP vs llama-server, {n} streams:", flush=True)
            for side in sides.values():
                side()
            peer_rows.append((str(n), alternate(args.repeats, sides)))
    finally:
        if peer is not None:
            peer.stop()
        server.stop()

    table("HTTP/SSE vs gRPC, one strata-server process", api_rows, "HTTP/SSE", "gRPC")
    print(f"\nTTFT of one request alone (1 new token), {args.alone} requests per API in turn: "
          + ", ".join(f"{name} p50 {percentile(v, 50):.2f} ms, p99 {percentile(v, 99):.2f} ms"
                      for name, v in alone.items())
          + f"; HTTP - gRPC p50 {percentile(alone['HTTP/SSE'], 50) - percentile(alone['gRPC'], 50):+.2f} ms")
    if peer_rows:
        table("strata-server vs llama-server, the same HTTP client", peer_rows, "strata HTTP", "llama-server")
    else:
        print("\nllama-server: skipped (no --llama-cpp DIR or LLAMA_CPP_DIR)")
    if not args.work:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
