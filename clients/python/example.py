"""Streams a continuation from a running strata-server:

    python clients/python/example.py --server 127.0.0.1:50051 "Once upon a time"
    STRATA_API_KEY=... python clients/python/example.py --tls-ca ca.pem --server strata.example:50051 "Hi"

Over TLS with --tls-ca (and --tls-cert/--tls-key for a server that requires client certificates); the API
key, when the server wants one, comes from $STRATA_API_KEY.
"""

import argparse
import os
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
    parser.add_argument("--tls-ca", type=Path, help="PEM CA of the server's certificate: connect over TLS")
    parser.add_argument("--tls-cert", type=Path, help="PEM client certificate (mTLS)")
    parser.add_argument("--tls-key", type=Path, help="PEM private key of --tls-cert")
    args = parser.parse_args()
    if (args.tls_cert or args.tls_key) and not args.tls_ca:
        parser.error("--tls-cert and --tls-key need --tls-ca")
    security = dict(api_key=os.environ.get("STRATA_API_KEY") or None)
    if args.tls_ca:
        security.update(root_certificates=args.tls_ca.read_bytes(),
                        certificate_chain=args.tls_cert.read_bytes() if args.tls_cert else None,
                        private_key=args.tls_key.read_bytes() if args.tls_key else None)
    options = dict(max_new_tokens=args.max_new_tokens, temperature=args.temperature, add_special_tokens=True)
    if args.seed is not None:
        options["seed"] = args.seed
    with Client(args.server, **security) as client:
        for chunk in client.generate_stream(args.prompt, **options):
            print(chunk.text, end="", flush=True)
            if chunk.finish_reason:
                print(f"\n[{chunk.finish_reason}: {chunk.completion_tokens} tokens]")


if __name__ == "__main__":
    main()
