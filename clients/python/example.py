"""Streams a continuation from a running strata-server:

    python clients/python/example.py --server 127.0.0.1:50051 "Once upon a time"
"""

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # run from a checkout without installing
from strata_client import Client  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("prompt")
    parser.add_argument("--server", default="127.0.0.1:50051")
    parser.add_argument("--max-new-tokens", type=int, default=48)
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument("--seed", type=int)
    args = parser.parse_args()
    options = dict(max_new_tokens=args.max_new_tokens, temperature=args.temperature, add_special_tokens=True)
    if args.seed is not None:
        options["seed"] = args.seed
    with Client(args.server) as client:
        for chunk in client.generate_stream(args.prompt, **options):
            print(chunk.text, end="", flush=True)
            if chunk.finish_reason:
                print(f"\n[{chunk.finish_reason}: {chunk.completion_tokens} tokens]")


if __name__ == "__main__":
    main()
