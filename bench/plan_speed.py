#!/usr/bin/env python3
"""Planning speed: strata-plan vs transformers, on the Llama-3.1-405B configuration.

For each strategy, times transformers' computation of the device map in-process
(`transformers.integrations.accelerate._get_device_map` on an already-built meta model: only the
placement, not the model construction) and strata's `PlaceSpec` (`strata-plan ... --bench N`, which
loads the model spec once, plans N times and prints {"bench_runs", "median_us", "min_us"}), checks
that both maps are equal, and prints a table. See bench/README.md.
"""

from __future__ import annotations

import argparse
import copy
import json
import pathlib
import statistics
import sys
import tempfile
import time

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "parity"))

import parity_helpers as H  # noqa: E402

GB = 10**9
# Eight 80 GB GPUs hold ~640 GB of the ~810 GB bfloat16 model; 128 GB of CPU RAM takes part of the
# rest (minus room for the largest layer) and the remainder goes to disk.
DEFAULT_MAX_MEMORY = {**{i: 80 * GB for i in range(8)}, "cpu": 128 * GB, "disk": 2000 * GB}


def _get_map(model, strategy, mm):
    from transformers.integrations.accelerate import _get_device_map

    return _get_device_map(model, strategy, mm, None)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=10, help="runs per side; the median is reported")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--strategies", default="balanced_low_0,auto")
    ap.add_argument("--strata-plan", default=str(H.strata_plan_path()), help="the strata-plan binary")
    args = ap.parse_args(argv)

    binary = pathlib.Path(args.strata_plan)
    if not binary.is_file():
        print(f"plan_speed: {binary} does not exist: build strata first (or set STRATA_BUILD_DIR)", file=sys.stderr)
        return 2

    t0 = time.perf_counter()
    model = H.meta_model("Llama-3.1-405B", args.dtype)
    build_s = time.perf_counter() - t0
    size = H.model_size(model)
    mm = DEFAULT_MAX_MEMORY
    print(f"Llama-3.1-405B ({args.dtype}, {size / GB:.1f} GB, built on meta in {build_s:.1f} s); "
          f"max_memory {H.max_memory_arg(mm)}; median of {args.runs} runs")

    rows = []
    ok = True
    with tempfile.TemporaryDirectory() as tmp:
        ckpt = H.write_checkpoint_dir(pathlib.Path(tmp) / "llama-3.1-405b", H.LLAMA_405B)
        for strategy in args.strategies.split(","):
            # transformers: placement only, on the already-built meta model.
            times = []
            expected = None
            for _ in range(args.runs):
                m = copy.deepcopy(mm)
                with H.stub_accelerators(H.num_gpus(mm)):
                    t = time.perf_counter()
                    expected = _get_map(model, strategy, m)
                    times.append(time.perf_counter() - t)
            tf_ms = statistics.median(times) * 1e3
            expected = {k: H.normalise_device(v) for k, v in expected.items()}
            kinds = {"gpu" if isinstance(v, int) else v for v in expected.values()}

            common = ["--model", ckpt, "--device-map", strategy, "--max-memory", H.max_memory_arg(mm),
                      "--dtype", args.dtype]
            bench = json.loads(H.run_strata_plan(binary, *common, "--bench", args.runs).stdout.strip().splitlines()[-1])
            strata_ms = bench["median_us"] / 1e3
            actual = H.strata_plan_json(binary, *common)["device_map"]
            equal = actual == expected
            ok &= equal
            rows.append((strategy, tf_ms, strata_ms, tf_ms / strata_ms if strata_ms > 0 else float("inf"), equal,
                         "+".join(sorted(kinds))))
            if not equal:
                print(f"{strategy}: maps differ:\n{H.map_diff(expected, actual)}", file=sys.stderr)

    header = ("strategy", "transformers ms", "strata ms", "ratio (transformers/strata)", "maps equal", "devices used")
    table = [header] + [(s, f"{a:.2f}", f"{b:.3f}", f"{r:.1f}x", "yes" if e else "NO", k) for s, a, b, r, e, k in rows]
    widths = [max(len(row[i]) for row in table) for i in range(len(header))]
    for i, row in enumerate(table):
        print("| " + " | ".join(c.ljust(w) for c, w in zip(row, widths)) + " |")
        if i == 0:
            print("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
