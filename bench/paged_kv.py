#!/usr/bin/env python3
"""Paged KV cache (issue 11) vs the dense slot cache, same KV memory on both sides (see bench/README.md).

A: the dense server (--baseline-server): --max-batch S --max-context C, KV memory S x C tokens per stage.
B: the paged server (--server): --kv-cache-tokens S*C --max-batch M --max-context C, M >> S: the same
   memory, shared by as many sequences as fit in it.

Scenarios, all greedy, on a small random Llama saved by the bench (as serve_speed.py does):
1. Realistic mix: prompts uniform in [16, 1024] tokens, outputs uniform in [16, 256], Poisson arrivals
   (seeded). Peak running sequences, generated tokens/s, TTFT p50/p99; ratios B/A. Goals: >= 4x peak
   running sequences, >= 1.5x tokens/s. The greedy ids of every request are compared between A and B.
2. Shared prefix: 1,000 prompt tokens shared by two requests with distinct short suffixes, one after the
   other: TTFT of the second (a prefix-cache hit on B) vs the first (a miss), over fresh prefixes.
   Also B with --prefix-cache=false, and A. Goal: hit >= 5x faster than miss on B.
3. Burst: a few decodes running; inter-token latency p99 of those decodes alone, and while a burst of
   long prompts arrives. Goal: p99 with the burst <= 2x without, on A and on B.

--dense-both runs the dense binary on both sides (B: --max-batch M --max-context C, i.e. M x C tokens of
memory, not the same memory): a test mode for the bench itself while no paged binary exists.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import random
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "integration"))

import integration_helpers as IH  # noqa: E402
import serve_speed  # noqa: E402  (save(): the random checkpoint with well-separated logits)

# Large enough that a 1,000-token prefill costs far more than a gRPC round trip, small enough that the
# whole bench runs in minutes on a 2-core CPU. max_position_embeddings covers the default --max-context.
# --model tiny: 2.5M parameters (10 MB float32), held in the CPU's caches: decode is compute bound, and
# a larger batch saves little. --model small (the default): serve_speed's 31.8M (127 MB float32), read
# from DRAM on every decode step: decode is bound by memory bandwidth, as a model served from a GPU's HBM
# is, so running more sequences at once (what a paged cache allows in the same memory) pays.
MODELS = {
    "tiny": dict(serve_speed.MODEL, hidden_size=256, intermediate_size=704, num_hidden_layers=2,
                 num_attention_heads=4, num_key_value_heads=2, vocab_size=2000, max_position_embeddings=4096),
    "small": dict(serve_speed.MODEL, max_position_embeddings=4096),
}
PAGED_FLAGS = ("--kv-block-tokens", "--prefix-cache")
DEFAULT_BASELINE = pathlib.Path.home() / ".cache" / "strata" / "baseline-dense" / "strata-server"
DEFAULT_SERVER = pathlib.Path(os.environ.get("STRATA_BUILD_DIR", REPO / "build")) / "server" / "strata-server"


class BenchError(Exception):
    """A missing binary or flag: printed, exit status 2."""


def check_binary(path: pathlib.Path, what: str, paged: bool) -> None:
    if not path.is_file() or not os.access(path, os.X_OK):
        raise BenchError(f"{what} {path} is missing or not executable")
    if not paged:
        return
    done = subprocess.run([str(path), "--help"], capture_output=True, text=True, timeout=30)
    missing = [flag for flag in PAGED_FLAGS if flag not in done.stdout + done.stderr]
    if missing:
        raise BenchError(f"{what} {path} lacks {', '.join(missing)}: it is not the paged KV cache server of "
                         "issue 11 (build it, point --server at it, or pass --dense-both to test the bench "
                         "with the dense server on both sides)")


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))] if ordered else float("nan")


def spread(values: list[float], fmt: str = "{:.1f}") -> str:
    """min / median / max."""
    return " / ".join(fmt.format(v) for v in (min(values), statistics.median(values), max(values)))


def scrape(url: str) -> dict[str, float]:
    """Every sample on /metrics, keyed by name with its labels as printed."""
    text = urllib.request.urlopen(url, timeout=5).read().decode()
    samples = {}
    for line in text.splitlines():
        match = re.match(r"^([a-zA-Z_:][^ ]*) (\S+)$", line)
        if match:
            samples[match.group(1)] = float(match.group(2))
    return samples


def values_of(samples: dict[str, float], name: str) -> list[float]:
    """A metric's values, one per label set."""
    return [v for k, v in samples.items() if k == name or k.startswith(name + "{")]


def summed(samples: dict[str, float], name: str) -> float | None:
    """A counter summed over its label sets; None when absent."""
    values = values_of(samples, name)
    return sum(values) if values else None


def largest(samples: dict[str, float], name: str) -> float | None:
    """A gauge's largest value over its label sets (one per stage where it has a device label); None
    when absent."""
    values = values_of(samples, name)
    return max(values) if values else None


class Server:
    """One strata-server on free loopback ports, with the flags it was started with."""

    def __init__(self, stubs, binary: pathlib.Path, label: str, flags: list[str], log_dir: pathlib.Path):
        self.label = label
        self.flags = flags
        try:
            self.process = IH.ServerProcess(binary, flags, log_dir).start(stubs)
        except AssertionError as e:
            raise AssertionError(f"{label} ({binary}) did not start: {e}") from None
        self.stub = stubs.strata_grpc.InferenceServiceStub(self.process.channel)
        self.request = stubs.strata.GenerateRequest
        self.metrics_url = self.process.metrics_url

    def generate(self, prompt: list[int], new_tokens: int) -> list[int]:
        ids = []
        for response in self.stub.Generate(self.request(prompt_ids=prompt, max_new_tokens=new_tokens), timeout=600):
            ids += response.token_ids
        return ids

    def stop(self) -> None:
        try:
            self.process.stop()
        except AssertionError as e:  # it ignored SIGTERM and was killed: say so, stop the others
            print(f"{self.label}: {e}", file=sys.stderr)


class Stream:
    """One Generate call read on its own thread: the arrival time of each message and its token count.
    `on_first` / `on_end` are called (on that thread) at the first token and at the end."""

    def __init__(self, server: Server, prompt: list[int], new_tokens: int, delay_s: float = 0.0,
                 on_first=None, on_end=None):
        self.server, self.prompt, self.new_tokens, self.delay_s = server, prompt, new_tokens, delay_s
        self.on_first, self.on_end = on_first, on_end
        self.messages: list[tuple[float, int]] = []  # (perf_counter, tokens in the message)
        self.ids: list[int] = []
        self.start = self.first = self.end = None
        self.error: Exception | None = None
        self.call = None
        self.cancelled = False
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        import grpc

        if self.delay_s > 0:
            time.sleep(self.delay_s)
        self.start = time.perf_counter()
        try:
            self.call = self.server.stub.Generate(
                self.server.request(prompt_ids=self.prompt, max_new_tokens=self.new_tokens), timeout=600)
            for response in self.call:
                now = time.perf_counter()
                if response.token_ids:
                    if self.first is None:
                        self.first = now
                        if self.on_first:
                            self.on_first()
                    self.messages.append((now, len(response.token_ids)))
                    self.ids += response.token_ids
        except grpc.RpcError as e:
            if not (self.cancelled and e.code() == grpc.StatusCode.CANCELLED):
                self.error = e
        finally:
            self.end = time.perf_counter()
            if self.on_end and self.first is not None:
                self.on_end()

    def cancel(self) -> None:
        self.cancelled = True
        if self.call is not None:
            self.call.cancel()

    def ttft(self) -> float:
        return self.first - self.start

    def gaps(self, after: float = 0.0, until: float = float("inf")) -> list[float]:
        """Per-token inter-token latencies: a message of k tokens that came g seconds after the previous
        one counts k gaps of g/k. Only messages that arrived in [after, until]."""
        out = []
        for (t0, _), (t1, k) in zip(self.messages, self.messages[1:]):
            if after <= t1 <= until:
                out += [(t1 - t0) / k] * k
        return out


class MetricsPoller:
    """Polls /metrics every `period_s` on its own thread: the peak of the running-sequences gauge
    (strata_requests_running when the server has it, else strata_active_sequences; the server itself
    refreshes its gauges every 250 ms) and of the KV usage, and the counters' first and last values."""

    COUNTERS = ("strata_preemptions_total", "strata_prefix_cache_queries_total", "strata_prefix_cache_hits_total",
                "strata_generated_tokens_total")

    def __init__(self, url: str, period_s: float = 0.05):
        self.url, self.period_s = url, period_s
        self.peak_running = 0.0
        self.running_metric = None
        self.peak_waiting = 0.0
        self.peak_kv_usage = None
        self.first: dict[str, float] = {}
        self.last: dict[str, float] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self):
        self._sample()
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        self._sample()

    def _run(self) -> None:
        while not self._stop.wait(self.period_s):
            self._sample()

    def _sample(self) -> None:
        try:
            samples = scrape(self.url)
        except OSError:
            return
        for name in ("strata_requests_running", "strata_active_sequences"):
            value = largest(samples, name)
            if value is not None:
                self.running_metric = name
                self.peak_running = max(self.peak_running, value)
                break
        for name in ("strata_requests_waiting", "strata_queue_depth"):
            value = largest(samples, name)
            if value is not None:
                self.peak_waiting = max(self.peak_waiting, value)
                break
        usage = largest(samples, "strata_kv_cache_usage_ratio")
        if usage is not None:
            self.peak_kv_usage = max(self.peak_kv_usage or 0.0, usage)
        for name in self.COUNTERS:
            value = summed(samples, name)
            if value is not None:
                self.first.setdefault(name, value)
                self.last[name] = value

    def delta(self, name: str) -> float | None:
        return self.last[name] - self.first[name] if name in self.last else None


def raise_errors(streams: list[Stream]) -> None:
    for stream in streams:
        if stream.error is not None:
            raise stream.error


# --- 1. realistic mix -------------------------------------------------------------------------------

def mix_requests(args, vocab: int) -> list[tuple[float, list[int], int]]:
    """(arrival offset s, prompt, new tokens) for args.requests requests; Poisson arrivals at args.rate."""
    rng = random.Random(args.seed)
    out, t = [], 0.0
    for _ in range(args.requests):
        prompt = [rng.randrange(1, vocab) for _ in range(rng.randint(args.prompt_min, args.prompt_max))]
        out.append((t, prompt, rng.randint(args.output_min, args.output_max)))
        t += rng.expovariate(args.rate)
    return out


def run_mix(server: Server, requests) -> dict:
    lock = threading.Lock()
    streaming = {"now": 0, "peak": 0}  # client side: streams that have a first token and have not ended

    def first():
        with lock:
            streaming["now"] += 1
            streaming["peak"] = max(streaming["peak"], streaming["now"])

    def end():
        with lock:
            streaming["now"] -= 1

    streams = [Stream(server, prompt, new, delay, first, end) for delay, prompt, new in requests]
    with MetricsPoller(server.metrics_url) as poller:
        start = time.perf_counter()
        for stream in streams:
            stream.thread.start()
        for stream in streams:
            stream.thread.join()
        seconds = time.perf_counter() - start
    raise_errors(streams)
    ttft = [s.ttft() for s in streams]
    return {"tokens_per_s": sum(len(s.ids) for s in streams) / seconds, "seconds": seconds,
            "ttft_p50": percentile(ttft, 0.5), "ttft_p99": percentile(ttft, 0.99),
            "peak_running": poller.peak_running, "running_metric": poller.running_metric,
            "peak_streaming": streaming["peak"], "peak_waiting": poller.peak_waiting,
            "peak_kv_usage": poller.peak_kv_usage, "preemptions": poller.delta("strata_preemptions_total"),
            "ids": [s.ids for s in streams]}


# --- 2. shared prefix -------------------------------------------------------------------------------

def run_prefix(servers: list[Server], args, vocab: int, seed: int) -> dict:
    """For each of args.prefix_repeats fresh prefixes (never sent before), on each server in turn (so that
    a burst of other work on the machine hits all alike), two requests one after the other: prefix +
    suffix a (the miss), then prefix + suffix b (a hit where a prefix cache has it)."""
    rng = random.Random(seed)
    out = {s.label: {"miss": [], "hit": [], "ids": []} for s in servers}
    pollers = [MetricsPoller(s.metrics_url, period_s=1.0) for s in servers]
    for poller in pollers:
        poller.__enter__()
    try:
        for _ in range(args.prefix_repeats):
            prefix = [rng.randrange(1, vocab) for _ in range(args.prefix_tokens)]
            prompts = [prefix + [rng.randrange(1, vocab) for _ in range(args.suffix_tokens)] for _ in range(2)]
            for server in servers:
                for kind, prompt in zip(("miss", "hit"), prompts):
                    stream = Stream(server, prompt, args.prefix_new_tokens)
                    stream.thread.start()
                    stream.thread.join()
                    raise_errors([stream])
                    out[server.label][kind].append(stream.ttft())
                    out[server.label]["ids"].append((prompt, stream.ids))
        time.sleep(0.3)  # counters the server updates with its gauges (every 250 ms) catch up
    finally:
        for poller in pollers:
            poller.__exit__(None, None, None)
    for server, poller in zip(servers, pollers):
        out[server.label]["queries"] = poller.delta("strata_prefix_cache_queries_total")
        out[server.label]["hits"] = poller.delta("strata_prefix_cache_hits_total")
    return out


# --- 3. burst ---------------------------------------------------------------------------------------

def run_burst(server: Server, args, vocab: int, seed: int, with_burst: bool) -> dict:
    """args.burst_decodes decodes (short prompts, cancelled at the end); once each has args.burst_warm
    tokens, either args.burst_window_s more seconds of decoding (without) or args.burst_prompts prompts of
    args.burst_prompt_tokens tokens at once (with). ITL of the decodes over that window."""
    rng = random.Random(seed)
    decodes = [Stream(server, [rng.randrange(1, vocab) for _ in range(16)], args.max_context - 16)
               for _ in range(args.burst_decodes)]
    for stream in decodes:
        stream.thread.start()
    deadline = time.monotonic() + 120
    while any(sum(k for _, k in s.messages) < args.burst_warm for s in decodes):
        if time.monotonic() > deadline or any(s.error for s in decodes):
            break
        time.sleep(0.01)
    window_start = time.perf_counter()
    burst = []
    if with_burst:
        burst = [Stream(server, [rng.randrange(1, vocab) for _ in range(args.burst_prompt_tokens)],
                        args.burst_new_tokens) for _ in range(args.burst_prompts)]
        for stream in burst:
            stream.thread.start()
        for stream in burst:
            stream.thread.join()
    else:
        time.sleep(args.burst_window_s)
    window_end = time.perf_counter()
    for stream in decodes:
        stream.cancel()
    for stream in decodes:
        stream.thread.join()
    raise_errors(decodes + burst)
    gaps = [g for s in decodes for g in s.gaps(window_start, window_end)]
    return {"p99": percentile(gaps, 0.99), "p50": percentile(gaps, 0.5), "gaps": len(gaps),
            "window_s": window_end - window_start,
            "burst_ttft": [s.ttft() for s in burst]}


# --- report -----------------------------------------------------------------------------------------

def verdict(ok: bool) -> str:
    return "MET" if ok else "NOT MET"


def table(header: list[str], rows: list[list[str]]) -> None:
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    line = lambda cells: "| " + " | ".join(str(c).ljust(w) for c, w in zip(cells, widths)) + " |"  # noqa: E731
    print(line(header))
    print("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    for row in rows:
        print(line(row))


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--server", type=pathlib.Path, default=DEFAULT_SERVER, help="the paged server (B)")
    parser.add_argument("--baseline-server", type=pathlib.Path, default=DEFAULT_BASELINE,
                        help="the dense server (A)")
    parser.add_argument("--dense-both", action="store_true",
                        help="test mode: B is a dense server too (--max-batch M --max-context C, more memory)")
    parser.add_argument("--quick", action="store_true", help="a smaller run (fewer requests and repeats)")
    parser.add_argument("--slots", type=int, default=4, help="S: A's --max-batch; KV memory = S x C tokens")
    parser.add_argument("--max-context", type=int, default=4096, help="C: --max-context of both")
    parser.add_argument("--max-batch", type=int, default=64, help="M: B's --max-batch (running sequences)")
    parser.add_argument("--kv-block-tokens", type=int, default=0, help="B's --kv-block-tokens (0: its default)")
    parser.add_argument("--server-flags", default="", help="more flags for every server (A and B)")
    parser.add_argument("--paged-flags", default="", help="more flags for B only (e.g. --max-batch-tokens 64)")
    parser.add_argument("--model", choices=sorted(MODELS), default="small",
                        help="small: 31.8M parameters, decode bound by memory bandwidth (default); tiny: 2.5M, in cache")
    parser.add_argument("--scenarios", default="mix,prefix,burst")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--repeats", type=int, help="alternating A/B runs of the mix and the burst (3; --quick 1)")
    parser.add_argument("--requests", type=int, help="requests in the mix (64; --quick 24)")
    parser.add_argument("--rate", type=float, default=32.0,
                        help="Poisson arrivals per second in the mix: more than A serves, so that requests queue")
    parser.add_argument("--prompt-min", type=int, default=16)
    parser.add_argument("--prompt-max", type=int, default=1024)
    parser.add_argument("--output-min", type=int, default=16)
    parser.add_argument("--output-max", type=int, help="(256; --quick 128)")
    parser.add_argument("--prefix-tokens", type=int, default=1000)
    parser.add_argument("--suffix-tokens", type=int, default=8)
    parser.add_argument("--prefix-new-tokens", type=int, default=4)
    parser.add_argument("--prefix-repeats", type=int, help="prefixes, each sent twice (9; --quick 5)")
    parser.add_argument("--burst-decodes", type=int, default=2, help="decodes running (fewer than --slots)")
    parser.add_argument("--burst-warm", type=int, default=16, help="tokens each decode has before the window")
    parser.add_argument("--burst-window-s", type=float, default=2.0, help="window without a burst")
    parser.add_argument("--burst-prompts", type=int, default=4)
    parser.add_argument("--burst-prompt-tokens", type=int, default=1024)
    parser.add_argument("--burst-new-tokens", type=int, default=4)
    return parser


def parse_args() -> argparse.Namespace:
    """The command line, --quick's defaults filled in, the sizes checked (parser.error exits 2)."""
    parser = build_parser()
    args = parser.parse_args()
    quick = args.quick
    args.repeats = args.repeats or (1 if quick else 3)
    args.requests = args.requests or (24 if quick else 64)
    args.output_max = args.output_max or (128 if quick else 256)
    args.prefix_repeats = args.prefix_repeats or (5 if quick else 9)
    longest = max(args.prompt_max + args.output_max, args.prefix_tokens + args.suffix_tokens + args.prefix_new_tokens,
                  args.burst_prompt_tokens + args.burst_new_tokens)
    if longest > args.max_context:
        parser.error("a request would not fit --max-context")
    if args.burst_decodes >= args.slots:
        parser.error("--burst-decodes must be below --slots, or A's burst would only queue")
    MODEL = MODELS[args.model]
    if args.max_context > MODEL["max_position_embeddings"]:
        parser.error(f"--max-context is at most {MODEL['max_position_embeddings']} for the bench's model")
    return args


def server_flags(args, model_dir: pathlib.Path) -> tuple[list[str], list[str], list[str]]:
    """The flags both servers get, then A's and B's: the same KV memory (S x C tokens) on both sides."""
    memory = args.slots * args.max_context
    common = ["--model", str(model_dir), "--device-map", '{"": "cpu"}', "--max-context", str(args.max_context),
              "--max-streams-per-connection", "1000", "--drain-timeout", "0", *args.server_flags.split()]
    a_flags = [*common, "--max-batch", str(args.slots)]
    if args.dense_both:
        b_flags = [*common, "--max-batch", str(args.max_batch)]
    else:
        b_flags = [*common, "--max-batch", str(args.max_batch), "--kv-cache-tokens", str(memory)]
        if args.kv_block_tokens:
            b_flags += ["--kv-block-tokens", str(args.kv_block_tokens)]
        b_flags += args.paged_flags.split()
    return common, a_flags, b_flags


def print_setup(args, params: int, vocab: int, common: list[str], b_flags: list[str]) -> None:
    """The model and what runs on each side."""
    memory = args.slots * args.max_context
    print(f"\nmodel: Llama {params / 1e6:.1f}M parameters (float32, random, vocab {vocab}), {os.cpu_count()} CPUs")
    print(f"A: {args.baseline_server} --max-batch {args.slots} --max-context {args.max_context} "
          f"(KV memory {memory} tokens)")
    if args.dense_both:
        print(f"B: {args.server} --max-batch {args.max_batch} --max-context {args.max_context} "
              f"(KV memory {args.max_batch * args.max_context} tokens)")
        print("*** --dense-both: TEST MODE, B is a dense server with more memory; this is not the paged "
              "comparison and the goals below mean nothing ***")
    else:
        print(f"B: {args.server} {' '.join(b_flags[len(common):])} --max-context {args.max_context}")
    if args.server_flags:
        print(f"both: {args.server_flags}")


def scenario_mix(args, a: Server, b: Server, vocab: int) -> bool:
    """1. Realistic mix: alternating runs on A and B, their table and goals. True when B's greedy ids equal
    A's and every run gave the ids of the first."""
    requests = mix_requests(args, vocab)
    runs = {a.label: [], b.label: []}
    for _ in range(args.repeats):
        for server in (a, b):
            runs[server.label].append(run_mix(server, requests))
    equal = sum(x == y for x, y in zip(runs[a.label][0]["ids"], runs[b.label][0]["ids"]))
    stable = all(r["ids"] == runs[s][0]["ids"] for s in runs for r in runs[s])
    ids_equal = equal == len(requests) and stable
    med = {s: {k: statistics.median(r[k] for r in runs[s])
               for k in ("tokens_per_s", "ttft_p50", "ttft_p99", "peak_running", "peak_streaming")}
           for s in runs}
    arrivals = requests[-1][0]
    print(f"\n1. Realistic mix: {len(requests)} requests, prompts {args.prompt_min}-{args.prompt_max} tokens, "
          f"outputs {args.output_min}-{args.output_max} (uniform, seed {args.seed}), Poisson arrivals at "
          f"{args.rate:g}/s (last at {arrivals:.1f} s); min / median / max of {args.repeats} alternating "
          f"run(s) per side")
    rows = []
    for s in runs:
        rs = runs[s]
        rows.append([s, spread([r["peak_running"] for r in rs], "{:.0f}"),
                     spread([r["peak_streaming"] for r in rs], "{:.0f}"),
                     spread([r["tokens_per_s"] for r in rs]),
                     spread([r["ttft_p50"] * 1e3 for r in rs], "{:.0f}"),
                     spread([r["ttft_p99"] * 1e3 for r in rs], "{:.0f}"),
                     spread([r["seconds"] for r in rs]),
                     spread([r["peak_waiting"] for r in rs], "{:.0f}"),
                     "-" if rs[0]["preemptions"] is None else spread([r["preemptions"] for r in rs], "{:.0f}"),
                     "-" if rs[0]["peak_kv_usage"] is None else
                     spread([r["peak_kv_usage"] for r in rs], "{:.2f}")])
    rows.append(["ratio B/A (medians)",
                 f"{med[b.label]['peak_running'] / max(med[a.label]['peak_running'], 1):.2f}x",
                 f"{med[b.label]['peak_streaming'] / max(med[a.label]['peak_streaming'], 1):.2f}x",
                 f"{med[b.label]['tokens_per_s'] / med[a.label]['tokens_per_s']:.2f}x",
                 f"{med[b.label]['ttft_p50'] / med[a.label]['ttft_p50']:.2f}x",
                 f"{med[b.label]['ttft_p99'] / med[a.label]['ttft_p99']:.2f}x", "", "", "", ""])
    table(["side", "peak running (server)", "peak streaming (client)", "generated tok/s", "TTFT p50 ms",
           "TTFT p99 ms", "wall s", "peak waiting", "preemptions", "peak KV usage"], rows)
    metrics = {s: runs[s][0]["running_metric"] for s in runs}
    print(f"peak running (server): the largest {metrics[a.label]} (A) / {metrics[b.label]} (B) on /metrics, "
          "polled every 50 ms (the server refreshes it every 250 ms); peak streaming (client): calls that "
          "had their first token and had not ended")
    if med[a.label]["peak_running"] < args.slots or min(r["peak_waiting"] for r in runs[a.label]) == 0:
        print(f"warning: A was not saturated (all {args.slots} slots busy with requests waiting) in every "
              "run: the mix did not load it, raise --rate or --requests")
    print(f"greedy ids equal A vs B: {equal}/{len(requests)} requests; every run the same as the first: "
          f"{'yes' if stable else 'NO'}")
    concurrency = med[b.label]["peak_running"] / max(med[a.label]["peak_running"], 1)
    speed = med[b.label]["tokens_per_s"] / med[a.label]["tokens_per_s"]
    print(f"goal: peak running sequences B/A >= 4x: {concurrency:.2f}x {verdict(concurrency >= 4)}")
    print(f"goal: generated tok/s B/A >= 1.5x: {speed:.2f}x {verdict(speed >= 1.5)}")
    return ids_equal


def scenario_prefix(args, a: Server, b: Server, b_flags: list[str], stubs, work: pathlib.Path,
                    servers: list[Server], vocab: int) -> bool:
    """2. Shared prefix: miss and hit TTFT on A, B and (paged) B without its prefix cache, a server started
    here and added to `servers`. True when every side gave the same greedy ids."""
    sides = [a, b]
    if not args.dense_both:
        off = Server(stubs, args.server, "B paged, --prefix-cache=false", [*b_flags, "--prefix-cache=false"],
                     work / "b-no-prefix")
        servers.append(off)
        off.generate([1, 2, 3], 4)
        sides.append(off)
    results = run_prefix(sides, args, vocab, seed=args.seed + 1000)
    print(f"\n2. Shared prefix: {args.prefix_repeats} fresh prefixes of {args.prefix_tokens} tokens, each "
          f"sent twice one after the other with distinct {args.suffix_tokens}-token suffixes "
          f"({args.prefix_new_tokens} new tokens): TTFT of the first (miss) and the second (hit where "
          "cached); min / median / max")
    rows = []
    for s in sides:
        r = results[s.label]
        cache = ("-" if r["queries"] is None else
                 f"{r['hits']:.0f}/{r['queries']:.0f}")
        rows.append([s.label, spread([x * 1e3 for x in r["miss"]]), spread([x * 1e3 for x in r["hit"]]),
                     f"{statistics.median(r['miss']) / statistics.median(r['hit']):.2f}x", cache])
    table(["side", "miss TTFT ms", "second request TTFT ms", "miss/second (medians)",
           "prefix cache hit/query tokens"], rows)
    same = all(results[s.label]["ids"] == results[a.label]["ids"] for s in sides)
    print(f"greedy ids equal on every side ({', '.join(s.label for s in sides)}) for all "
          f"{2 * args.prefix_repeats} prefix requests: {'yes' if same else 'NO'}")
    r = results[b.label]
    gain = statistics.median(r["miss"]) / statistics.median(r["hit"])
    print(f"goal: B prefix-cache hit >= 5x faster than a miss (TTFT medians): {gain:.2f}x {verdict(gain >= 5)}")
    return same


def scenario_burst(args, a: Server, b: Server, vocab: int) -> None:
    """3. Burst: inter-token latency of running decodes alone and while a burst of long prompts arrives."""
    results = {s.label: {False: [], True: []} for s in (a, b)}
    for i in range(args.repeats):
        for s in (a, b):
            for with_burst in (False, True):
                results[s.label][with_burst].append(
                    run_burst(s, args, vocab, seed=args.seed + 2000 + i, with_burst=with_burst))
    print(f"\n3. Burst: {args.burst_decodes} decodes running; inter-token latency (client side, per token) "
          f"of those decodes over {args.burst_window_s:g} s alone, and from the arrival of "
          f"{args.burst_prompts} prompts of {args.burst_prompt_tokens} tokens until the last of them ends "
          f"({args.burst_new_tokens} new tokens each); min / median / max of {args.repeats} run(s)")
    rows, goals = [], []
    for s in (a, b):
        without, burst = results[s.label][False], results[s.label][True]
        ratio = statistics.median(r["p99"] for r in burst) / statistics.median(r["p99"] for r in without)
        goals.append((s.label, ratio))
        rows.append([s.label, spread([r["p50"] * 1e3 for r in without]),
                     spread([r["p99"] * 1e3 for r in without]),
                     spread([r["p50"] * 1e3 for r in burst]), spread([r["p99"] * 1e3 for r in burst]),
                     f"{ratio:.2f}x", spread([r["window_s"] for r in burst], "{:.2f}"),
                     spread([statistics.median(r["burst_ttft"]) * 1e3 for r in burst], "{:.0f}")])
    table(["side", "ITL p50 ms alone", "ITL p99 ms alone", "ITL p50 ms burst", "ITL p99 ms burst",
           "p99 burst/alone (medians)", "burst window s", "burst TTFT median ms"], rows)
    for label, ratio in goals:
        print(f"goal: {label}: ITL p99 with the burst <= 2x without: {ratio:.2f}x {verdict(ratio <= 2)}")


def main() -> int:
    args = parse_args()
    scenarios = set(args.scenarios.split(","))
    MODEL = MODELS[args.model]

    try:
        check_binary(args.baseline_server, "--baseline-server", paged=False)
        check_binary(args.server, "--server", paged=not args.dense_both)
    except BenchError as e:
        print(f"paged_kv.py: {e}", file=sys.stderr)
        return 2

    work = pathlib.Path(tempfile.mkdtemp(prefix="strata-paged-kv-bench-"))
    stubs = IH.stubs_under(work)
    model_dir = work / "model"
    params = serve_speed.save(model_dir, MODEL)
    vocab = MODEL["vocab_size"]
    common, a_flags, b_flags = server_flags(args, model_dir)
    b_name = "B dense (test mode)" if args.dense_both else "B paged"

    began = time.perf_counter()
    servers: list[Server] = []
    try:
        a = Server(stubs, args.baseline_server, "A dense", a_flags, work / "a")
        servers.append(a)
        b = Server(stubs, args.server, b_name, b_flags, work / "b")
        servers.append(b)
        for server in (a, b):  # warm-up: a short and a long prompt
            server.generate([1, 2, 3], 4)
            server.generate([(7 * i) % (vocab - 1) + 1 for i in range(args.prompt_max)], 4)

        print_setup(args, params, vocab, common, b_flags)
        ok = True
        if "mix" in scenarios:
            ok &= scenario_mix(args, a, b, vocab)
        if "prefix" in scenarios:
            ok &= scenario_prefix(args, a, b, b_flags, stubs, work, servers, vocab)
        if "burst" in scenarios:
            scenario_burst(args, a, b, vocab)
    except AssertionError as e:  # a server that did not start (a flag it refuses, a crash): its output
        print(f"paged_kv.py: {e}", file=sys.stderr)
        return 2
    finally:
        for server in servers:
            server.stop()
    print(f"\nbench wall time {time.perf_counter() - began:.0f} s; server logs in {work}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
