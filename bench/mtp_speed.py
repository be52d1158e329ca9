#!/usr/bin/env python3
"""--speculative mtp (issue 44): strata-generate with a DeepSeek-V3 checkpoint's multi-token-prediction layer
proposing against without it, in one run, alternating; decode tokens/s, the proposals' acceptance, and whether the
ids are equal.

The model is deepseek_peer.py's random DeepSeek-V3-shaped ~150M checkpoint (MLA, 64 routed experts, 6 active; 7
layers), served in bfloat16 on the CPU, with an MTP layer added (tests/runtime_parity/runtime_helpers.add_mtp_layer:
a sparse decoder layer like the model's last, enorm, hnorm, eh_proj, shared_head.norm, its own embed_tokens, the
head shared with lm_head) two ways:

  bigram  the layer mostly predicts the model's own greedy continuation (its embedding of token a is lm_head's row of
          the token that followed a in the model's greedy outputs for the bench's prompts, measured here first without
          speculation; its decoder layer's own contributions scaled down): it stands for a trained MTP layer, which
          DeepSeek reports accepted 85-90% of the time, at whatever acceptance it reaches (printed). It is not a
          trained layer;
  random  the layer's weights as drawn: it hardly ever agrees, the worst case, where the adaptive off-switch stops the
          sequences proposing while the layer still runs in every pass.

The layer is one more decoder layer in every forward pass: here 1 of 7 (+14% of the layers' work), on DeepSeek-V3 1 of
61. 1 stream and --streams streams (each its own prompt), --new-tokens each, strata-generate --warmup 1, greedy.
"""

from __future__ import annotations

import argparse
import pathlib
import statistics
import sys
import tempfile

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))
sys.path.insert(0, str(REPO / "tests" / "runtime_parity"))
sys.path.insert(0, str(REPO / "tests"))

import deepseek_peer as D  # noqa: E402
import peer_llamacpp as P  # noqa: E402
import quantized_peer as Q  # noqa: E402
import runtime_helpers as RH  # noqa: E402
from speculative_speed import generate  # noqa: E402

SPEC = ("--speculative", "mtp")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--streams", type=int, default=16)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--dtype", choices=("bfloat16", "float32"), default="bfloat16")
    ap.add_argument("--cost-aware", action="store_true",
                    help="keep the cost-aware switch on (default: off, every step with a proposal proposes)")
    ap.add_argument("--work", help="directory for the checkpoints (default: a temporary one)")
    args = ap.parse_args(argv)
    work = pathlib.Path(args.work) if args.work else pathlib.Path(tempfile.mkdtemp(prefix="mtp_speed_"))
    base = work / "hf"
    if not (base / "config.json").exists():
        D.make_checkpoint(base)

    def prompts(n: int) -> list[list[int]]:
        return [P.prompt_ids(16, D.VOCAB, salt=i + 1) for i in range(n)]

    spec = SPEC if args.cost_aware else (*SPEC, "--speculative-cost-aware=false")
    models = {"bigram": work / "mtp-bigram", "random": work / "mtp-random"}
    if not (models["bigram"] / "config.json").exists():
        # The model's own greedy continuations, which the bigram layer is built to predict.
        plain = P.strata_generate(base, prompts(args.streams), args.new_tokens, args.threads, args.dtype)
        bigram = {}
        for prompt, result in zip(prompts(args.streams), plain["results"]):
            sequence = prompt + result["ids"]
            bigram.update(zip(sequence[:-1], sequence[1:]))
        RH.add_mtp_layer(base, models["bigram"], bigram)
    if not (models["random"] / "config.json").exists():
        RH.add_mtp_layer(base, models["random"])
    print(f"mtp_speed: DeepSeek-V3-shaped ~150M (7 layers) + its MTP layer, {args.dtype} on the CPU; {Q.cpu_line()}; "
          f"{args.threads} threads, {args.new_tokens} new tokens per stream, {' '.join(spec)}, {args.repeats} runs "
          "alternating", flush=True)
    rows = []
    for model, directory in models.items():
        for n in sorted({1, args.streams}):
            ps = prompts(n)
            off, on = P.alternating_runs(args.repeats, [
                lambda: generate(directory, ps, args.new_tokens, args.threads, (), args.dtype),
                lambda: generate(directory, ps, args.new_tokens, args.threads, spec, args.dtype)])
            pairs = [(x["ids"], y["ids"]) for a, b in zip(off, on) for x, y in zip(a["results"], b["results"])]
            firsts = [next(i for i, (u, v) in enumerate(zip(x, y)) if u != v) for x, y in pairs if x != y]
            same = f"{len(pairs) - len(firsts)}/{len(pairs)}" + (f" (others from token {min(firsts)})" if firsts else "")
            proposed = sum(r["engine"]["spec_proposed_tokens"] for r in on)
            accepted = sum(r["engine"]["spec_accepted_tokens"] for r in on)
            a = [r["tok_s"] for r in off]
            b = [r["tok_s"] for r in on]
            rows.append((model, n, P.summary(a), P.summary(b), statistics.median(b) / statistics.median(a),
                         f"{accepted / proposed:.0%}" if proposed else "-", proposed // len(on), same))
            print(f"  {model}, {n} stream(s): without {P.summary(a)}, with {P.summary(b)} tok/s", flush=True)
    print()
    print("| MTP layer | streams | without (tok/s, min / median / max) | with mtp | ratio of medians | acceptance | "
          "proposals per run | streams with equal ids |")
    print("|---|---|---|---|---|---|---|---|")
    for row in rows:
        print("| " + " | ".join(str(c) if not isinstance(c, float) else f"{c:.2f}x" for c in row) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
