"""Helpers for the integration tests: where the built binaries are, the small Llama config, the public
health and reflection protos, and ServerProcess (a real strata-server on free loopback ports).

The binaries come from $STRATA_BUILD_DIR (default <repo>/build): server/strata-server and
planner/strata-plan.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import importlib
import sys
import time
import types
from pathlib import Path

import grpc
import pytest

REPO = Path(__file__).resolve().parents[2]
BUILD_DIR = Path(os.environ.get("STRATA_BUILD_DIR", REPO / "build"))
SERVER_BIN = BUILD_DIR / "server" / "strata-server"
PLAN_BIN = BUILD_DIR / "planner" / "strata-plan"

# A small Llama: four decoder layers, about 1.1 MB in float32, so that byte budgets of a few hundred
# kilobytes give multi-device plans.
SMALL_LLAMA_CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 1000,
    "max_position_embeddings": 256,
    "rms_norm_eps": 1e-5,
    "rope_theta": 10000.0,
    "tie_word_embeddings": False,
    "hidden_act": "silu",
    "torch_dtype": "float32",
}

# grpc.health.v1 as published in grpc/grpc-proto. The file name keeps the generated module away from
# the installed `grpc` package; the package line is what the wire sees.
HEALTH_PROTO = """
syntax = "proto3";
package grpc.health.v1;
message HealthCheckRequest { string service = 1; }
message HealthCheckResponse {
  enum ServingStatus { UNKNOWN = 0; SERVING = 1; NOT_SERVING = 2; SERVICE_UNKNOWN = 3; }
  ServingStatus status = 1;
}
service Health {
  rpc Check(HealthCheckRequest) returns (HealthCheckResponse);
  rpc Watch(HealthCheckRequest) returns (stream HealthCheckResponse);
}
"""

# grpc.reflection.v1alpha as published in grpc/grpc-proto: the version gRPC 1.51's C++ server serves.
REFLECTION_PROTO = """
syntax = "proto3";
package grpc.reflection.v1alpha;
service ServerReflection {
  rpc ServerReflectionInfo(stream ServerReflectionRequest) returns (stream ServerReflectionResponse);
}
message ServerReflectionRequest {
  string host = 1;
  oneof message_request {
    string file_by_filename = 3;
    string file_containing_symbol = 4;
    ExtensionRequest file_containing_extension = 5;
    string all_extension_numbers_of_type = 6;
    string list_services = 7;
  }
}
message ExtensionRequest { string containing_type = 1; int32 extension_number = 2; }
message ServerReflectionResponse {
  string valid_host = 1;
  ServerReflectionRequest original_request = 2;
  oneof message_response {
    FileDescriptorResponse file_descriptor_response = 4;
    ExtensionNumberResponse all_extension_numbers_response = 5;
    ListServiceResponse list_services_response = 6;
    ErrorResponse error_response = 7;
  }
}
message FileDescriptorResponse { repeated bytes file_descriptor_proto = 1; }
message ExtensionNumberResponse { string base_type_name = 1; repeated int32 extension_number = 2; }
message ListServiceResponse { repeated ServiceResponse service = 1; }
message ServiceResponse { string name = 1; }
message ErrorResponse { int32 error_code = 1; string error_message = 2; }
"""

STARTUP_TIMEOUT_S = 30.0


def require_binary(binary: Path) -> Path:
    if not binary.is_file():
        pytest.fail(f"{binary} is missing: build it first (scripts/test.sh, or set STRATA_BUILD_DIR)")
    return binary


def free_port() -> int:
    # Bind port 0 and release it: another process could take it before the server does (ServerProcess
    # then starts again on other ports).
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_plan(plan_bin: Path, flags: list[str]) -> dict:
    """strata-plan --json for the same flags the server gets."""
    done = subprocess.run([str(plan_bin), *flags, "--json"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, f"strata-plan {flags} failed: {done.stderr}"
    return json.loads(done.stdout)


class PortTaken(Exception):
    """The server could not bind a port free_port() had chosen: another process took it first."""


class ServerProcess:
    """A strata-server started with `flags` on free loopback ports; stdout/stderr go to files. `credentials`:
    the channel credentials its gRPC port needs (a server with --tls-cert); None: plaintext."""

    def __init__(self, server_bin: Path, flags: list[str], log_dir: Path, env: dict | None = None,
                 credentials: grpc.ChannelCredentials | None = None, http: bool = False):
        self.env = env
        self.http = http  # also serve the HTTP API (--http-listen) on a free port: self.http_url
        self.credentials = credentials
        self.server_bin = server_bin
        self.flags = flags
        self.pick_ports()
        log_dir.mkdir(parents=True, exist_ok=True)
        self.stdout_path = log_dir / "stdout.txt"
        self.stderr_path = log_dir / "stderr.txt"
        self.process: subprocess.Popen | None = None
        self.channel: grpc.Channel | None = None

    def pick_ports(self) -> None:
        self.grpc_port = free_port()
        self.metrics_port = free_port()
        self.grpc_address = f"127.0.0.1:{self.grpc_port}"
        self.metrics_url = f"http://127.0.0.1:{self.metrics_port}/metrics"
        self.args = [str(self.server_bin), *self.flags, "--listen", self.grpc_address,
                     "--metrics-listen", f"127.0.0.1:{self.metrics_port}"]
        if self.http:
            self.http_port = free_port()
            self.http_url = f"http://127.0.0.1:{self.http_port}"
            self.args += ["--http-listen", f"127.0.0.1:{self.http_port}"]

    def output(self) -> str:
        return f"stdout:\n{self.stdout_path.read_text()}\nstderr:\n{self.stderr_path.read_text()}"

    def start(self, stubs, attempts: int = 3) -> "ServerProcess":
        """Starts the server and waits until it is SERVING. A port free_port() chose but another process took
        in between ends the server at once ("port in use"): it is started again on other ports."""
        for attempt in range(attempts):
            try:
                return self.start_once(stubs)
            except PortTaken:
                if attempt + 1 == attempts:
                    raise AssertionError(f"strata-server found its ports taken {attempts} times\n{self.output()}")
                self.pick_ports()
        raise AssertionError("unreachable")

    def start_once(self, stubs) -> "ServerProcess":
        with open(self.stdout_path, "w") as out, open(self.stderr_path, "w") as err:
            self.process = subprocess.Popen(self.args, stdout=out, stderr=err, env=self.env)
        self.channel = (grpc.secure_channel(self.grpc_address, self.credentials) if self.credentials is not None
                        else grpc.insecure_channel(self.grpc_address))
        health = stubs.health_grpc.HealthStub(self.channel)
        request = stubs.health.HealthCheckRequest(service="strata.v1.InferenceService")
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while True:
            if self.process.poll() is not None:
                self.channel.close()
                if "port in use" in self.stderr_path.read_text():
                    raise PortTaken()
                raise AssertionError(f"strata-server exited with {self.process.returncode}\n{self.output()}")
            try:
                reply = health.Check(request, timeout=1.0)
                if reply.status == stubs.health.HealthCheckResponse.SERVING:
                    break
            except grpc.RpcError:
                pass  # not listening yet, or the service not registered yet
            if time.monotonic() > deadline:
                self.stop()
                raise AssertionError(f"strata-server not SERVING after {STARTUP_TIMEOUT_S}s\n{self.output()}")
            time.sleep(0.1)
        return self

    def stop(self, sig: int = signal.SIGTERM) -> int:
        """Sends `sig` and returns the exit code."""
        if self.channel is not None:
            self.channel.close()
            self.channel = None
        if self.process is None:
            return 0
        if self.process.poll() is None:
            self.process.send_signal(sig)
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
                raise AssertionError(f"strata-server ignored signal {sig}\n{self.output()}")
        return self.process.returncode




def started_servers(server_bin: Path, stubs, log_dir, base_flags: list[str] = (), **defaults):
    """The body of a server-starting fixture: yields start(flags, **kwargs) -> a SERVING ServerProcess with
    `base_flags` + flags (kwargs: ServerProcess's env, credentials, http, over `defaults`; `log_dir(i)` names
    the i-th one's log directory), and stops every server started once the fixture is torn down."""
    started: list[ServerProcess] = []

    def start(flags: list[str], **kwargs) -> ServerProcess:
        server = ServerProcess(server_bin, [*base_flags, *flags], log_dir(len(started)), **{**defaults, **kwargs})
        started.append(server)
        return server.start(stubs)

    yield start
    for server in started:
        with contextlib.suppress(Exception):
            server.stop()


def generate_stubs(src: Path, out: Path) -> types.SimpleNamespace:
    """strata_pb2/_grpc, health_pb2/_grpc and reflection_pb2/_grpc, generated with grpc_tools.protoc from
    proto/strata/v1/strata.proto and the public protos above (written into `src`), into `out`."""
    from grpc_tools import protoc

    (src / "strata_health.proto").write_text(HEALTH_PROTO)
    (src / "strata_reflection.proto").write_text(REFLECTION_PROTO)
    jobs = [
        (REPO / "proto", "strata/v1/strata.proto"),
        (src, "strata_health.proto"),
        (src, "strata_reflection.proto"),
    ]
    for include, proto in jobs:
        rc = protoc.main(
            ["protoc", f"-I{include}", f"--python_out={out}", f"--grpc_python_out={out}", str(include / proto)]
        )
        assert rc == 0, f"grpc_tools.protoc failed on {proto}"
    sys.path.insert(0, str(out))
    try:
        return types.SimpleNamespace(
            strata=importlib.import_module("strata.v1.strata_pb2"),
            strata_grpc=importlib.import_module("strata.v1.strata_pb2_grpc"),
            health=importlib.import_module("strata_health_pb2"),
            health_grpc=importlib.import_module("strata_health_pb2_grpc"),
            reflection=importlib.import_module("strata_reflection_pb2"),
            reflection_grpc=importlib.import_module("strata_reflection_pb2_grpc"),
        )
    finally:
        sys.path.remove(str(out))


def stubs_under(work: Path) -> types.SimpleNamespace:
    """generate_stubs into `work`/proto_src and `work`/proto_py (created if need be): for the benches."""
    (work / "proto_src").mkdir(exist_ok=True)
    (work / "proto_py").mkdir(exist_ok=True)
    return generate_stubs(work / "proto_src", work / "proto_py")
