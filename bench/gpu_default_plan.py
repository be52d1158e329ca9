#!/usr/bin/env python3
"""The default plan on a GPU machine (no --max-memory: strata-plan discovers the GPUs and the CPU
memory itself) against transformers' from_pretrained(DIR, device_map=S).hf_device_map on the same
machine, for S in auto, balanced, balanced_low_0, sequential. Needs a CUDA device; run by
scripts/gpu-check.sh (step "plan").

Two scenarios on the same ~1B bfloat16 random Llama (bench/gpu_bench.py's checkpoint):
- "whole GPU": the model fits; every module on GPU 0 is expected;
- "squeezed": this process holds a ballast allocation so that the GPU's free memory is about half the
  model's size; both planners read the same free memory (cudaMemGetInfo), so the maps put part of the
  model on "cpu". strata-plan runs first, as a separate process, while this process has freed everything
  but the ballast; its own CUDA context (a few hundred MiB) is counted as used at that moment, which
  transformers' query does not see: a map differing by one module at the boundary may be that.
Writes default_plan.md and default_plan.json into --out; exit 1 if any map differs.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import pathlib
import subprocess
import sys

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))

import gpu_bench  # noqa: E402

STRATEGIES = ["auto", "balanced", "balanced_low_0", "sequential"]


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, type=pathlib.Path)
    p.add_argument("--strata-plan", type=pathlib.Path,
                   default=pathlib.Path(os.environ.get("STRATA_BUILD_DIR", REPO / "build")) / "planner" / "strata-plan")
    p.add_argument("--work", type=pathlib.Path, default=pathlib.Path("/tmp/strata-gpu-bench"))
    p.add_argument("--strategies", default=",".join(STRATEGIES))
    p.add_argument("--squeeze", type=float, default=0.5,
                   help="free GPU memory in the squeezed scenario, as a fraction of the checkpoint's bytes")
    args = p.parse_args(argv)
    args.strategies = args.strategies.split(",")
    for s in args.strategies:
        if s not in STRATEGIES:
            p.error(f"--strategies: unknown strategy {s!r} (one of {', '.join(STRATEGIES)})")
    if not 0 < args.squeeze < 1:
        p.error("--squeeze must be between 0 and 1")
    return args


def strata_map(binary: pathlib.Path, model_dir: pathlib.Path, strategy: str) -> dict:
    proc = subprocess.run([str(binary), "--model", str(model_dir), "--device-map", strategy, "--json"],
                          capture_output=True, text=True, timeout=120)
    if proc.returncode != 0:
        raise RuntimeError(f"strata-plan --device-map {strategy} failed ({proc.returncode}): {proc.stderr.strip()}")
    return json.loads(proc.stdout)["device_map"]


def transformers_map(model_dir: pathlib.Path, strategy: str) -> dict:
    import torch
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(model_dir, device_map=strategy)
    # transformers sets hf_device_map only when it dispatched the model; otherwise it is all on one device.
    result = dict(getattr(model, "hf_device_map", None) or {"": model.device.index if model.device.type == "cuda" else "cpu"})
    del model
    gc.collect()
    torch.cuda.empty_cache()
    return result


def describe(device_map: dict) -> str:
    counts: dict = {}
    for d in device_map.values():
        counts[str(d)] = counts.get(str(d), 0) + 1
    return ", ".join(f"{d}: {n}" for d, n in sorted(counts.items()))


def main(argv=None) -> int:
    args = parse_args(argv)
    if rc := gpu_bench.refusal("gpu_default_plan.py", "plan", args.strata_plan, "--strata-plan"):
        return rc
    import torch
    args.out.mkdir(parents=True, exist_ok=True)
    config = dict(gpu_bench.MODEL_1B)
    model_dir = args.work / f"llama_1b_bf16_{config['num_hidden_layers']}l"
    gpu_bench.write_random_llama(model_dir, config)
    model_bytes = sum(f.stat().st_size for f in model_dir.glob("*.safetensors"))
    torch.cuda.init()

    rows = []
    ballast = None
    for scenario in ("whole GPU", "squeezed"):
        if scenario == "squeezed":
            free = torch.cuda.mem_get_info(0)[0]
            hold = free - int(args.squeeze * model_bytes)
            if hold > 0:
                ballast = torch.empty(hold, dtype=torch.uint8, device="cuda:0")
        for strategy in args.strategies:
            free_before = torch.cuda.mem_get_info(0)[0]
            try:
                ours = strata_map(args.strata_plan, model_dir, strategy)
                theirs = transformers_map(model_dir, strategy)
                error = None
            except Exception as e:  # noqa: BLE001 - reported in the table, the other cases still run
                ours, theirs, error = {}, {}, str(e)
            equal = error is None and ours == theirs
            diff = sorted(k for k in set(ours) | set(theirs) if ours.get(k) != theirs.get(k))
            rows.append({"scenario": scenario, "strategy": strategy, "gpu_free_bytes": free_before,
                         "equal": equal, "strata": ours, "transformers": theirs, "differing_modules": diff,
                         "error": error})
            print(f"{scenario} {strategy}: {'equal' if equal else 'DIFFERENT'} (free {free_before / 2**30:.1f} GiB; "
                  f"strata {describe(ours)}; transformers {describe(theirs)}){' ' + error if error else ''}")
    del ballast
    torch.cuda.empty_cache()

    lines = ["## Default plan vs from_pretrained(device_map=S) (bench/gpu_default_plan.py)", "",
             f"{torch.cuda.get_device_name(0)}; checkpoint {model_bytes / 2**30:.2f} GiB bfloat16; no --max-memory", "",
             "| scenario | strategy | GPU free GiB | equal | strata | transformers | first differing modules |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['scenario']} | {r['strategy']} | {r['gpu_free_bytes'] / 2**30:.1f} | "
                     f"{'yes' if r['equal'] else 'no'} | {describe(r['strata'])} | {describe(r['transformers'])} | "
                     f"{r['error'] or ', '.join(r['differing_modules'][:4])} |")
    text = "\n".join(lines) + "\n"
    print(text)
    (args.out / "default_plan.md").write_text(text)
    (args.out / "default_plan.json").write_text(json.dumps({"model_bytes": model_bytes, "rows": rows}, indent=1))
    return 0 if all(r["equal"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
