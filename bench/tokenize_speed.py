#!/usr/bin/env python3
"""Encode throughput: strata-tokenize vs HF `tokenizers`, one thread each, same corpus, same run.

For each tokenizer family of the parity suite (trained here: tests/tokenizer_parity/tokenizer_fixtures.py)
it times encoding every line of the parity corpus:

- **tokenizers**: `Tokenizer.encode_batch_fast(lines)` (the fastest encode it offers: no offsets),
  with RAYON_NUM_THREADS=1 so the Rust side runs on one thread; Python call overhead is one call per
  batch. `Tokenizer.encode` per line is shown too.
- **strata**: `strata-tokenize --bench FILE --runs N`, which reads the lines once and times encoding
  them N times in-process (process start and file reading are not timed).

Both sides get one untimed warm-up pass (their word caches warm), then the median of N runs counts.
It also checks that both produce the same ids. See bench/README.md.
"""

from __future__ import annotations

import os

# One thread for the Rust side; must be set before `tokenizers` is imported.
os.environ["RAYON_NUM_THREADS"] = "1"
os.environ["TOKENIZERS_PARALLELISM"] = "false"

import argparse  # noqa: E402
import json  # noqa: E402
import pathlib  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "tokenizer_parity"))

import tokenizer_fixtures as F  # noqa: E402


def _median_seconds(fn, runs: int) -> float:
    fn()  # warm-up
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=5, help="timed runs per side; the median is reported")
    ap.add_argument("--repeat", type=int, default=1, help="use the corpus this many times over (more bytes)")
    ap.add_argument("--families", default=",".join(F.FAMILIES))
    ap.add_argument("--strata-tokenize", default=str(F.strata_tokenize_path()), help="the strata-tokenize binary")
    args = ap.parse_args(argv)

    binary = pathlib.Path(args.strata_tokenize)
    if not binary.is_file():
        print(f"tokenize_speed: {binary} does not exist: build strata first (or set STRATA_BUILD_DIR)", file=sys.stderr)
        return 2

    lines = F.build_corpus() * args.repeat
    nbytes = sum(len(line.encode("utf-8")) for line in lines)
    rows, all_equal = [], True
    with tempfile.TemporaryDirectory() as tmp:
        root = pathlib.Path(tmp)
        corpus = root / "corpus.jsonl"
        corpus.write_text("".join(json.dumps(x, ensure_ascii=False) + "\n" for x in lines), encoding="utf-8")
        built = F.build_all(root / "tokenizers")
        for name in args.families.split(","):
            directory, tok = built[name]
            hf_batch = _median_seconds(lambda: tok.encode_batch_fast(lines, add_special_tokens=False), args.runs)
            hf_each = _median_seconds(lambda: [tok.encode(x, add_special_tokens=False) for x in lines], args.runs)
            proc = subprocess.run([str(binary), "--tokenizer", str(directory), "--bench", str(corpus),
                                   "--runs", str(args.runs)], capture_output=True, text=True)
            if proc.returncode != 0:
                print(f"tokenize_speed: strata-tokenize failed: {proc.stderr}", file=sys.stderr)
                return 1
            strata = json.loads(proc.stdout)
            got = F.run_cli(binary, directory, lines[: len(lines) // args.repeat])
            want = [e.ids for e in tok.encode_batch(lines[: len(lines) // args.repeat], add_special_tokens=False)]
            equal = got == want
            all_equal &= equal
            hf_mbps = nbytes / 1e6 / hf_batch
            rows.append((name, hf_mbps, nbytes / 1e6 / hf_each, strata["mb_per_s"], strata["mb_per_s"] / hf_mbps,
                         "yes" if equal else "NO"))

    print(f"{len(lines)} lines, {nbytes / 1e6:.2f} MB of UTF-8; one thread each; median of {args.runs} runs after a warm-up")
    print("| tokenizer       | tokenizers MB/s (encode_batch_fast) | tokenizers MB/s (encode per line) | strata MB/s | ratio (strata/tokenizers) | ids equal |")
    print("|-----------------|-------------------------------------|-----------------------------------|-------------|---------------------------|-----------|")
    for name, hf, hf_each, st, ratio, eq in rows:
        print(f"| {name:<15} | {hf:>35.2f} | {hf_each:>33.2f} | {st:>11.2f} | {ratio:>24.2f}x | {eq:<9} |")
    return 0 if all_equal else 1


if __name__ == "__main__":
    sys.exit(main())
