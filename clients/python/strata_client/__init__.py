"""A small Python client of strata-server.

    from strata_client import Client
    with Client("127.0.0.1:50051") as client:
        for piece in client.generate_stream("Once upon a time", max_new_tokens=32):
            print(piece.text, end="", flush=True)

Over TLS, with a client certificate (mTLS) and an API key:

    Client("strata.example:50051", root_certificates=open("ca.pem", "rb").read(),
           certificate_chain=open("client.pem", "rb").read(), private_key=open("client.key", "rb").read(),
           api_key=os.environ["STRATA_API_KEY"])

The gRPC stubs are generated from proto/strata/v1/strata.proto with grpcio-tools the first time they
are needed, into a cache folder keyed by the proto's hash, so the package never carries stale stubs.
The proto is found through $STRATA_PROTO_DIR, else in the strata checkout this package lives in.
"""

from __future__ import annotations

import hashlib
import importlib
import json
import os
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator, Optional

import grpc

__all__ = ["Client", "Chunk", "Result", "stubs"]

_lock = threading.Lock()
_stubs = None


def _proto_dir() -> Path:
    env = os.environ.get("STRATA_PROTO_DIR")
    directory = Path(env) if env else Path(__file__).resolve().parents[3] / "proto"
    if not (directory / "strata" / "v1" / "strata.proto").is_file():
        raise FileNotFoundError(f"strata/v1/strata.proto not found under {directory}: set STRATA_PROTO_DIR")
    return directory


def stubs():
    """(strata_pb2, strata_pb2_grpc), generated once per proto version."""
    global _stubs
    with _lock:
        if _stubs is None:
            from grpc_tools import protoc

            proto_dir = _proto_dir()
            proto = proto_dir / "strata" / "v1" / "strata.proto"
            digest = hashlib.sha256(proto.read_bytes()).hexdigest()[:16]
            cache = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "strata" / "python-stubs" / digest
            if not (cache / "strata" / "v1" / "strata_pb2_grpc.py").is_file():
                # Generated into a temporary folder and renamed, so concurrent first uses never see half a
                # module.
                tmp = cache.with_name(f"{digest}.tmp{os.getpid()}")
                tmp.mkdir(parents=True, exist_ok=True)
                rc = protoc.main(["protoc", f"-I{proto_dir}", f"--python_out={tmp}", f"--grpc_python_out={tmp}",
                                  str(proto)])
                if rc != 0:
                    raise RuntimeError(f"grpc_tools.protoc failed on {proto}")
                try:
                    tmp.rename(cache)
                except OSError:
                    pass  # another process made it first
            sys.path.insert(0, str(cache))
            try:
                _stubs = (importlib.import_module("strata.v1.strata_pb2"),
                          importlib.import_module("strata.v1.strata_pb2_grpc"))
            finally:
                sys.path.remove(str(cache))
        return _stubs


@dataclass
class Chunk:
    """One streamed message: new text, its token ids and their log-probabilities."""
    text: str
    token_ids: list
    logprobs: list
    finish_reason: Optional[str] = None  # LENGTH, STOP, EOS or CANCELLED on the last chunk
    prompt_tokens: int = 0
    completion_tokens: int = 0


@dataclass
class Result:
    text: str = ""
    token_ids: list = field(default_factory=list)
    logprobs: list = field(default_factory=list)
    finish_reason: Optional[str] = None
    prompt_tokens: int = 0
    completion_tokens: int = 0


class Client:
    """A channel to one strata-server. Errors are grpc.RpcError with the server's status and message.

    Plaintext unless TLS is asked for: `root_certificates` (PEM bytes of the CA that signed the server's
    certificate) or `tls=True` (the system's roots). `certificate_chain` and `private_key` (PEM bytes) are
    the client certificate a server with --tls-client-ca requires; `server_name` overrides the name the
    server's certificate must carry. `api_key` is sent as "authorization: Bearer KEY" on every call (a
    server with --api-key-file answers UNAUTHENTICATED without it)."""

    def __init__(self, address: str = "127.0.0.1:50051", *, root_certificates: Optional[bytes] = None,
                 certificate_chain: Optional[bytes] = None, private_key: Optional[bytes] = None,
                 server_name: Optional[str] = None, api_key: Optional[str] = None, tls: bool = False):
        tls = tls or root_certificates is not None
        if (certificate_chain is None) != (private_key is None):
            raise ValueError("certificate_chain and private_key go together (the client certificate and its key)")
        if not tls and (certificate_chain is not None or server_name is not None):
            raise ValueError("a client certificate or server_name needs TLS: give root_certificates or tls=True")
        if api_key is not None and (not api_key or not all("!" <= c <= "~" for c in api_key)):
            raise ValueError("api_key must be printable ASCII without spaces")
        pb2, pb2_grpc = stubs()
        self._pb2 = pb2
        self._metadata = (("authorization", f"Bearer {api_key}"),) if api_key is not None else ()
        if tls:
            credentials = grpc.ssl_channel_credentials(root_certificates=root_certificates, private_key=private_key,
                                                       certificate_chain=certificate_chain)
            options = [("grpc.ssl_target_name_override", server_name)] if server_name else []
            self._channel = grpc.secure_channel(address, credentials, options=options)
        else:
            self._channel = grpc.insecure_channel(address)
        self._stub = pb2_grpc.InferenceServiceStub(self._channel)

    def close(self) -> None:
        self._channel.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def generate_stream(self, prompt=None, *, timeout: float = 600, **options) -> Iterator[Chunk]:
        """Streams a continuation. `prompt`: text (str) or token ids (list of int). Options are
        GenerateRequest's fields: max_new_tokens, temperature, top_p, top_k, repetition_penalty, seed, stop,
        top_logprobs, add_special_tokens, request_id, and one structured-output constraint: json_schema (a dict
        or its JSON text), json_object=True, regex, choice (a list of strings), grammar (EBNF/GBNF),
        structural_tag (a dict or JSON text), with strict=False to let unenforceable schema keywords go."""
        for name in ("json_schema", "structural_tag"):
            if isinstance(options.get(name), dict):
                options[name] = json.dumps(options[name])
        if isinstance(options.get("choice"), (list, tuple)):
            options["choice"] = {"choices": list(options["choice"])}
        if isinstance(prompt, str):
            options["prompt"] = prompt
        elif prompt is not None:
            options["prompt_ids"] = list(prompt)
        reasons = self._pb2.GenerateResponse.FinishReason
        for response in self._stub.Generate(self._pb2.GenerateRequest(**options), timeout=timeout,
                                            metadata=self._metadata):
            yield Chunk(text=response.text, token_ids=list(response.token_ids),
                        logprobs=[lp.logprob for lp in response.logprobs],
                        finish_reason=reasons.Name(response.finish_reason) if response.finish_reason else None,
                        prompt_tokens=response.usage.prompt_tokens,
                        completion_tokens=response.usage.completion_tokens)

    def generate(self, prompt=None, **options) -> Result:
        """generate_stream read to its end."""
        result = Result()
        for chunk in self.generate_stream(prompt, **options):
            result.text += chunk.text
            result.token_ids += chunk.token_ids
            result.logprobs += chunk.logprobs
            if chunk.finish_reason:
                result.finish_reason = chunk.finish_reason
                result.prompt_tokens, result.completion_tokens = chunk.prompt_tokens, chunk.completion_tokens
        return result

    def device_map(self, timeout: float = 30) -> dict:
        """The served plan: {"device_map": {module: device}, "stages": [(device, [modules])], "devices": [...]}."""
        reply = self._stub.GetDeviceMap(self._pb2.GetDeviceMapRequest(), timeout=timeout, metadata=self._metadata)
        return {
            "architecture": reply.architecture,
            "strategy": reply.strategy,
            "device_map": dict(reply.device_map),
            "stages": [(s.device, list(s.modules)) for s in reply.stages],
            "devices": [{"device": d.device, "budget_bytes": d.budget_bytes, "planned_bytes": d.planned_bytes,
                         "measured_allocated_bytes": d.measured.allocated_bytes if d.HasField("measured") else None}
                        for d in reply.devices],
        }
