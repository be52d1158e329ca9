#!/usr/bin/env python3
"""The same 2-stage plan in one process and in a group of two processes (issue 24; see bench/README.md).

A Llama (float32, random weights, scaled so greedy ids are comparable) on two plan GPUs that run on the CPU:
  one process:   strata-server --device-map (layers 0-3 on GPU 0, 4-7 and the head on GPU 1)
                 --physical-devices 0=cpu,1=cpu
  two processes: the leader with GPU 0 (node 0) and a worker with GPU 1 (node 1), over UCX on loopback.
Both with one LibTorch intra-op thread per stage (a 2-vCPU machine: one core per stage on both sides), the same
micro-batches (one per stage), the same requests. Decode tokens/s at 1 and at 16 concurrent streams, time to
first token p50/p99 (client side), ids checked equal between the two; then the hop's transport latency p50/p99
and bandwidth at the sizes a decode step and a prefill chunk send (strata_transport_bench), and what the links
carried (the leader's strata_stage_transfer_* metrics).
"""

from __future__ import annotations

import argparse
import pathlib
import statistics
import subprocess
import sys
import tempfile

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "integration"))
sys.path.insert(0, str(REPO / "tests" / "generate"))
sys.path.insert(0, str(REPO / "tests" / "group"))
sys.path.insert(0, str(REPO / "bench"))

import generate_helpers as GH  # noqa: E402
import group_helpers as G  # noqa: E402
import integration_helpers as IH  # noqa: E402
import serve_speed as S  # noqa: E402

LAYERS = 8
TWO_STAGE = {"model.embed_tokens": 0, **{f"model.layers.{i}": (0 if i < LAYERS // 2 else 1) for i in range(LAYERS)},
             "model.norm": 1, "model.rotary_emb": 1, "lm_head": 1}


def cpu_name() -> str:
    for line in pathlib.Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return "unknown CPU"


def measure(stubs, server, streams: int, prompt_len: int, new_tokens: int, vocab: int, repeats: int) -> dict:
    requests = S.prompts(streams, prompt_len, vocab)
    runs = [S.run_streams(stubs, server, requests, new_tokens) for _ in range(repeats)]
    best = max(runs, key=lambda r: r["tokens_per_s"])
    return {"tokens_per_s": statistics.median(r["tokens_per_s"] for r in runs),
            "range": (min(r["tokens_per_s"] for r in runs), max(r["tokens_per_s"] for r in runs)),
            "ttft_p50": S.percentile(best["ttft"], 0.5) * 1000, "ttft_p99": S.percentile(best["ttft"], 0.99) * 1000,
            "ids": best["ids"]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--prompt", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    import json

    config = dict(S.MODEL, num_hidden_layers=LAYERS)
    server_bin = IH.require_binary(IH.SERVER_BIN)
    bench_bin = IH.SERVER_BIN.parents[1] / "bench" / "strata_transport_bench"
    work = pathlib.Path(tempfile.mkdtemp(prefix="strata_group_bench_"))
    params = S.save(work / "model", config)
    (work / "proto_src").mkdir()
    (work / "proto_py").mkdir()
    stubs = IH.generate_stubs(work / "proto_src", work / "proto_py")
    common = ["--max-batch", "16", "--max-context", "256", "--intra-op-threads", "1", "--micro-batches", "2"]
    rows = {}
    one = IH.ServerProcess(server_bin, ["--model", str(work / "model"), "--device-map", json.dumps(TWO_STAGE),
                                        "--physical-devices", "0=cpu,1=cpu", "--max-memory",
                                        "0=1GiB,1=1GiB,cpu=1GiB", *common], work / "one").start(stubs)
    try:
        rows["one process"] = {n: measure(stubs, one, n, args.prompt, args.new_tokens, config["vocab_size"],
                                          args.repeats) for n in (1, 16)}
    finally:
        one.stop()
    secret = work / "secret"
    secret.write_text("bench-group-secret-0123456789abcdef\n")
    group = G.Group(server_bin, stubs, work / "group", work / "model", secret, gpus=[1, 1],
                    map_json=json.dumps(TWO_STAGE), common=common)
    try:
        rows["two processes"] = {n: measure(stubs, group.leader, n, args.prompt, args.new_tokens,
                                            config["vocab_size"], args.repeats) for n in (1, 16)}
        url = group.leader.metrics_url
        links = {}
        for a, b in [(0, 1), (1, 0)]:
            labels = f'{{from="{a}",to="{b}"}}'
            links[(a, b)] = (GH.metric(url, f"strata_stage_transfer_messages_total{labels}", default=0),
                             GH.metric(url, f"strata_stage_transfer_bytes_total{labels}", default=0),
                             GH.metric(url, f"strata_stage_transfer_seconds_total{labels}", default=0))
    finally:
        group.stop()

    print(f"Group: Llama {params / 1e6:.1f}M (float32, random), the same 2-stage plan (layers 0-{LAYERS // 2 - 1} | "
          f"{LAYERS // 2}-{LAYERS - 1} + head) in one process and in two (leader + worker over UCX on loopback); "
          f"{args.prompt} prompt + {args.new_tokens} new tokens per stream; 1 intra-op thread per stage; "
          f"{cpu_name()}; median of {args.repeats}")
    print("| side          | streams | tokens/s | range         | vs one process | TTFT p50 ms | TTFT p99 ms |")
    print("|---------------|---------|----------|---------------|----------------|-------------|-------------|")
    for side, by_streams in rows.items():
        for n, r in by_streams.items():
            base = rows["one process"][n]["tokens_per_s"]
            print(f"| {side:13} | {n:7} | {r['tokens_per_s']:8.1f} | {r['range'][0]:6.1f}-{r['range'][1]:6.1f} | "
                  f"{r['tokens_per_s'] / base:13.2f}x | {r['ttft_p50']:11.1f} | {r['ttft_p99']:11.1f} |")
    same = all(rows["one process"][n]["ids"] == rows["two processes"][n]["ids"] for n in (1, 16))
    print(f"ids equal between one and two processes: {'yes' if same else 'NO'}")
    print()
    print("What the links carried (the leader's /metrics, whole run):")
    print("| link   | messages | MiB      | bytes per message | send time per message us |")
    print("|--------|----------|----------|-------------------|--------------------------|")
    for (a, b), (messages, nbytes, seconds) in links.items():
        per = nbytes / messages if messages else 0
        print(f"| {a} -> {b} | {messages:8.0f} | {nbytes / 2**20:8.2f} | {per:17.0f} | "
              f"{(seconds / messages * 1e6) if messages else 0:24.1f} |")
    hidden = config["hidden_size"]
    sizes = {"decode, 1 row": hidden * 4, "decode, 16 rows": 16 * hidden * 4,
             f"prefill, 16 x {args.prompt} tokens": 16 * args.prompt * hidden * 4}
    if bench_bin.is_file():
        print()
        print("The hop's transport (strata_transport_bench, activation bytes of each case; the hop adds its "
              "micro-batch's inputs, a few hundred bytes):")
        out = subprocess.run([str(bench_bin), "300", *map(str, sizes.values())], capture_output=True, text=True,
                             timeout=600).stdout
        lines = out.strip().splitlines()
        print("| hop                       | bytes   | p50 one-way us | p99 one-way us | bandwidth GiB/s |")
        print("|---------------------------|---------|----------------|----------------|-----------------|")
        for (name, size), line in zip(sizes.items(), lines[2:]):
            parts = line.split()
            print(f"| {name:25} | {size:7} | {float(parts[1]):14.1f} | {float(parts[3]):14.1f} | "
                  f"{float(parts[5]):15.2f} |")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
