#!/usr/bin/env python3
"""Speculative decoding (issue 44): strata-generate with n-gram proposals (--speculative ngram) against without, in
one run, alternating; decode tokens/s, the proposals' acceptance, and whether the ids are equal.

Two checkpoints of the same random ~116M Llama (peer_llamacpp.make_checkpoint), bfloat16 on the CPU:

  repeating  its lm_head replaced so that each token's successor is fixed (row f(t) of lm_head is token t's embedding
             x 30, f a permutation of the ordinary tokens in cycles of --cycle ids) and every layer's o_proj and
             down_proj zero, so the layers still run (the same bytes are read and multiplied per step) but add
             nothing to the residual stream: its greedy output walks a cycle, and the prompt holds one turn of it. It stands for
             copy-heavy text (a summary quoting its source, a code edit): spans that occurred before come again. It is
             an upper bound of what n-gram lookup can gain, not a trained model that copies;
  random     the checkpoint as it is: its greedy output does not repeat (nothing to copy), the worst case, where the
             adaptive off-switch must hold the cost to a few per cent.

1 stream and --streams streams (each its own prompt), --new-tokens each, threads as given. strata-generate --warmup 1.

With --method draft, a draft model (--draft-model) instead, on pairs built from the same random checkpoint:

  alpha=A    the target: every layer after the first with its o_proj and down_proj scaled by A, so that those layers
             move the residual stream A times as much as the first; the draft: the target's embedding, first layer,
             norm and head alone (one layer of twelve). A sets how often the draft's argmax is the target's: a pair
             built to agree at a known rate, as a trained draft agrees with its target (measured and printed: the
             acceptance column), not a trained pair. alpha=1 is the random checkpoint itself and its first layer:
             the draft hardly ever agrees, the worst case.

With --penalised, both sides of every comparison get a repetition, frequency and presence penalty (PENALTIES):
strata verifies penalised requests too, each position counting the proposals before it (the repeating model's
scaled logits keep its cycle under these penalties; before the sampler counted them, such requests never proposed).

With --llama-cpp DIR (llama.cpp built with cmake, llama-server included): the checkpoints also go to GGUF (bfloat16,
its convert_hf_to_gguf.py), and one stream is served side by side by strata-server (gRPC) without and with
speculation, and by llama-server without and with its own (ngram: --spec-type ngram-simple, the last 3 tokens
looked up, 4 drafted: LLAMA_SPEC; draft: --spec-type draft-simple -md DRAFT.gguf, 4 drafted, no minimum probability:
LLAMA_DRAFT), greedy, the same prompt ids, tokens/s as the client sees them.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import statistics
import sys
import tempfile

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))
sys.path.insert(0, str(REPO / "tests" / "runtime_parity"))
sys.path.insert(0, str(REPO / "tests"))

import peer_llamacpp as P  # noqa: E402
import quantized_peer as Q  # noqa: E402

SPEC = ("--speculative", "ngram", "--num-speculative-tokens", "4")
LLAMA_SPEC = ("--spec-type", "ngram-simple", "--spec-ngram-simple-size-n", "3", "--spec-ngram-simple-size-m", "4",
              "--spec-draft-n-max", "4")
DRAFT_TOKENS = ("--num-speculative-tokens", "4")
LLAMA_DRAFT = ("--spec-type", "draft-simple", "--spec-draft-n-max", "4", "--spec-draft-n-min", "0",
               "--spec-draft-p-min", "0")
ALPHAS = (0.01, 0.03, 1.0)
# --penalised: what both sides of each comparison get.
PENALTIES = ("--repetition-penalty", "1.1", "--frequency-penalty", "0.3", "--presence-penalty", "0.3")


def make_draft_pair(source: pathlib.Path, work: pathlib.Path, alpha: float) -> tuple[pathlib.Path, pathlib.Path]:
    """The alpha=A pair (module docstring) from `source` (float32), in float32: (target, draft) folders."""
    import shutil

    from safetensors.torch import load_file, save_file

    target, draft = work / f"hf-alpha{alpha:g}", work / f"hf-alpha{alpha:g}-draft"
    if (target / "config.json").exists() and (draft / "config.json").exists():
        return target, draft
    for out in (target, draft):
        out.mkdir(parents=True, exist_ok=True)
        for f in source.iterdir():
            if f.is_file() and f.suffix != ".safetensors" and f.name != "model.safetensors.index.json":
                shutil.copy(f, out / f.name)
    tensors = {}
    for f in source.glob("*.safetensors"):
        tensors.update(load_file(f))
    scaled = {}
    for name, t in tensors.items():
        deep = name.startswith("model.layers.") and not name.startswith("model.layers.0.")
        scaled[name] = (t * alpha if deep and name.endswith(("o_proj.weight", "down_proj.weight")) else t)
    save_file({k: v.contiguous() for k, v in scaled.items()}, target / "model.safetensors", metadata={"format": "pt"})
    kept = {k: v for k, v in scaled.items() if not k.startswith("model.layers.") or k.startswith("model.layers.0.")}
    save_file({k: v.contiguous() for k, v in kept.items()}, draft / "model.safetensors", metadata={"format": "pt"})
    config = json.loads((draft / "config.json").read_text())
    config["num_hidden_layers"] = 1
    (draft / "config.json").write_text(json.dumps(config, indent=2))
    return target, draft


def make_repeating(source: pathlib.Path, out: pathlib.Path, cycle: int) -> list[int]:
    """The repeating checkpoint (module docstring) from `source` (float32); its cycle's order of ids."""
    import shutil

    import torch
    from safetensors.torch import load_file, save_file

    out.mkdir(parents=True, exist_ok=True)
    for f in source.iterdir():
        if f.suffix != ".safetensors":
            shutil.copy(f, out / f.name)
    config = json.loads((source / "config.json").read_text())
    vocab = config["vocab_size"]
    order = list(range(300, vocab))  # ordinary tokens (peer_llamacpp.prompt_ids)
    successor = {t: t for t in range(vocab)}
    for start in range(0, len(order) - cycle + 1, cycle):
        ring = order[start:start + cycle]
        for k, t in enumerate(ring):
            successor[t] = ring[(k + 1) % cycle]
    for f in source.glob("*.safetensors"):
        tensors = load_file(f)
        embed = tensors.get("model.embed_tokens.weight")
        for name in list(tensors):
            if name.endswith(("o_proj.weight", "down_proj.weight")):
                tensors[name] = torch.zeros_like(tensors[name])
        if embed is not None and "lm_head.weight" in tensors:
            head = torch.zeros_like(tensors["lm_head.weight"])
            for t, s in successor.items():
                head[s] = embed[t] * 30
            tensors["lm_head.weight"] = head
        save_file({k: v.to(torch.bfloat16).contiguous() for k, v in tensors.items()}, out / f.name,
                  metadata={"format": "pt"})
    return order[:cycle]


# --plan disk-behind: the embedding and the first six layers on plan GPU 0 (run on the CPU: --physical-devices), the
# other six, the norm and the head on "disk" (left in the mmapped checkpoint, paged in on use): a pass of two stages,
# the second reading its weights through the page cache. A draft model is planned beside it (sequential, in what the
# plan leaves: on GPU 0).
DISK_BEHIND = ("--device-map", json.dumps({"model.embed_tokens": 0, **{f"model.layers.{i}": 0 for i in range(6)},
                                           **{f"model.layers.{i}": "disk" for i in range(6, 12)},
                                           "model.norm": "disk", "lm_head": "disk"}),
               "--physical-devices", "0=cpu", "--max-memory", "0=4GiB,cpu=8GiB,disk=64GiB")
PLANS = {"cpu": P.CPU_ONLY, "disk-behind": DISK_BEHIND}


def generate(model: pathlib.Path, prompts: list[list[int]], new_tokens: int, threads: int, spec: tuple,
             dtype: str, plan: tuple = P.CPU_ONLY) -> dict:
    out = P.strata_generate(model, prompts, new_tokens, threads, dtype, plan=plan, extra=spec)
    t = out["timing"]
    total = sum(len(r["ids"]) for r in out["results"])
    out["tok_s"] = (total - len(prompts)) / t["decode_seconds"]  # tokens after each first, over the decode time
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--streams", type=int, default=16)
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--cycle", type=int, default=16, help="ids in each of the repeating model's cycles")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--work", help="directory for the checkpoints (default: a temporary one)")
    ap.add_argument("--llama-cpp", help="llama.cpp checkout built with cmake: also serve side by side with llama-server")
    ap.add_argument("--method", choices=("ngram", "draft"), default="ngram")
    ap.add_argument("--plan", choices=tuple(PLANS), default="cpu",
                    help="cpu: one stage; disk-behind: a disk stage behind a GPU stage run on the CPU (DISK_BEHIND)")
    ap.add_argument("--penalised", action="store_true",
                    help="both sides with PENALTIES (repetition, frequency and presence): each verified position "
                         "counts the proposals before it; strata-generate only")
    ap.add_argument("--dtype", choices=("bfloat16", "float32"),
                    help="serving dtype (default: bfloat16 for ngram; float32 for draft, whose pairs' scaled layers "
                         "leave near-ties that bfloat16's rounding of a verified chunk against a decode step parts)")
    args = ap.parse_args(argv)
    if args.penalised and args.llama_cpp:
        ap.error("--penalised runs strata-generate alone (no served comparison)")
    base = PENALTIES if args.penalised else ()
    dtype = args.dtype or ("bfloat16" if args.method == "ngram" else "float32")
    work = pathlib.Path(args.work) if args.work else pathlib.Path(tempfile.mkdtemp(prefix="speculative_speed_"))
    vocab = 8000
    f32 = work / "hf"
    if not (f32 / "config.json").exists():
        P.make_checkpoint(f32, vocab)
    if args.method == "ngram":
        models = {"random": work / "hf-bf16", "repeating": work / "hf-repeating"}
        if not (models["random"] / "config.json").exists():
            P.save_as(f32, models["random"], "bf16")
        ring = make_repeating(f32, models["repeating"], args.cycle)
        specs = {"random": SPEC, "repeating": SPEC}
        drafts = {}
    else:
        models, specs, drafts = {}, {}, {}
        for alpha in ALPHAS:
            target, draft = make_draft_pair(f32, work, alpha)
            models[f"alpha={alpha:g}"], drafts[f"alpha={alpha:g}"] = target, draft
            specs[f"alpha={alpha:g}"] = ("--draft-model", str(draft), *DRAFT_TOKENS)

    def prompts(model: str, n: int) -> list[list[int]]:
        if model == "repeating":  # one turn of a cycle, each stream its own cycle's
            return [[t + args.cycle * i for t in ring] for i in range(n)]
        return [P.prompt_ids(16, vocab, salt=i + 1) for i in range(n)]

    flags = " ".join(SPEC) if args.method == "ngram" else "--draft-model (1 layer of 12) " + " ".join(DRAFT_TOKENS)
    if base:
        flags += ", both sides " + " ".join(base)
    print(f"speculative_speed: Llama ~116M {dtype} on the CPU, plan {args.plan}; {Q.cpu_line()}; "
          f"{args.threads} threads, {args.new_tokens} new tokens per stream, {flags}, {args.repeats} runs "
          "alternating", flush=True)
    rows = []
    plan = PLANS[args.plan]
    for model in models:
        for n in sorted({1, args.streams}):
            ps = prompts(model, n)
            runs = P.alternating_runs(args.repeats, [
                lambda: generate(models[model], ps, args.new_tokens, args.threads, base, dtype, plan),
                lambda: generate(models[model], ps, args.new_tokens, args.threads, (*base, *specs[model]), dtype,
                                 plan)])
            off, on = runs
            # Streams whose ids are equal with and without, over every run, and where the others first differ.
            pairs = [(x["ids"], y["ids"]) for a, b in zip(off, on) for x, y in zip(a["results"], b["results"])]
            firsts = [next(i for i, (u, v) in enumerate(zip(x, y)) if u != v) for x, y in pairs if x != y]
            same = f"{len(pairs) - len(firsts)}/{len(pairs)}" + (f" (others from token {min(firsts)})" if firsts else "")
            proposed = sum(r["engine"]["spec_proposed_tokens"] for r in on)
            accepted = sum(r["engine"]["spec_accepted_tokens"] for r in on)
            verifications = sum(r["engine"]["spec_verifications"] for r in on)
            a = [r["tok_s"] for r in off]
            b = [r["tok_s"] for r in on]
            rows.append((model, n, P.summary(a), P.summary(b), statistics.median(b) / statistics.median(a),
                         f"{accepted / proposed:.0%}" if proposed else "-",
                         f"{accepted / verifications:.2f}" if verifications else "-", same))
            print(f"  {model}, {n} stream(s): without {P.summary(a)}, with {P.summary(b)} tok/s", flush=True)
    peers = serve_side_by_side(args, work, models, drafts, specs, prompts, dtype) if args.llama_cpp else []
    print()
    print(f"| model | streams | without (tok/s, min / median / max) | with {args.method}, K=4 | ratio of medians | "
          "acceptance | accepted per verification | streams with equal ids |")
    print("|---|---|---|---|---|---|---|---|")
    for row in rows:
        print("| " + " | ".join(str(c) if not isinstance(c, float) else f"{c:.2f}x" for c in row) + " |")
    if peers:
        print()
        peer = "ngram-simple" if args.method == "ngram" else "draft-simple"
        print("| model, 1 stream | strata without | strata with | strata with / without | llama.cpp without | "
              f"llama.cpp with ({peer}) | llama.cpp with / without | strata with / llama.cpp with |")
        print("|---|---|---|---|---|---|---|---|")
        for model, values in peers:
            med = {k: statistics.median(v) for k, v in values.items()}
            print(f"| {model} | {P.summary(values['strata'])} | {P.summary(values['strata+spec'])} | "
                  f"{med['strata+spec'] / med['strata']:.2f}x | {P.summary(values['llama.cpp'])} | "
                  f"{P.summary(values['llama.cpp+spec'])} | {med['llama.cpp+spec'] / med['llama.cpp']:.2f}x | "
                  f"{med['strata+spec'] / med['llama.cpp+spec']:.2f}x |")
    return 0


def serve_side_by_side(args, work: pathlib.Path, models: dict, drafts: dict, specs: dict, prompts, dtype) -> list:
    """One stream on strata-server and llama-server, each without and with speculation (n-gram, or the model's draft
    in `drafts`), per model: [(model, {side: [tok/s per repeat]})]."""
    root = P.find_llama_cpp(args.llama_cpp)
    stubs = P.IH.stubs_under(work)
    context = 16 + args.new_tokens + 8
    out = []
    for model, directory in models.items():
        outtype = "bf16" if dtype == "bfloat16" else "f32"
        gguf = work / f"{model}-{outtype}.gguf"
        if not gguf.exists():
            P.convert(root, directory, gguf, outtype)
        llama_spec = LLAMA_SPEC
        if model in drafts:
            draft_gguf = work / f"{model}-draft-{outtype}.gguf"
            if not draft_gguf.exists():
                P.convert(root, drafts[model], draft_gguf, outtype)
            llama_spec = (*LLAMA_DRAFT, "--model-draft", str(draft_gguf))
        prompt = prompts(model, 1)[0]
        servers = {}
        try:
            for side, spec in (("strata", ()), ("strata+spec", specs[model])):
                servers[side] = P.start_strata_server(stubs, directory, work / f"serve-{model}-{side}", dtype, 1,
                                                      context, args.threads, prompt, extra=spec)
            for side, extra in (("llama.cpp", ()), ("llama.cpp+spec", llama_spec)):
                server = P.LlamaServer(root, gguf, args.threads, 1, context, work / f"llama-{model}-{side}.log", extra)
                servers[side] = server
                server.stream(prompt, 4)
            sides = list(servers)

            def one(side):
                server = servers[side]
                if side.startswith("strata"):
                    return P.concurrently(1, lambda i: P.strata_stream(stubs, server, prompt, args.new_tokens))
                return P.concurrently(1, lambda i: server.stream(prompt, args.new_tokens))

            runs = P.alternating_runs(args.repeats, [lambda side=side: one(side) for side in sides])
            out.append((model, dict(zip(sides, runs))))
            print(f"  served, {model}: " + "; ".join(f"{side} {P.summary(v)}" for side, v in zip(sides, runs)),
                  flush=True)
        finally:
            for server in servers.values():
                server.stop()
    return out


if __name__ == "__main__":
    sys.exit(main())
