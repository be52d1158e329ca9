"""Fixtures of the observability tests: a real strata-server (the tiny Llama of tests/generate with its
tokenizer, a 2-stage plan over two logical GPUs on the CPU, default budgets from the machine, and one
injected stage fault so the error panels have data) and a real Debian Prometheus on loopback scraping it
every second with deploy/prometheus/rules.yml loaded; both stopped at the end of the session."""

from __future__ import annotations

import contextlib
import json
import pathlib
import sys

import pytest

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "integration"))
sys.path.insert(0, str(HERE.parent / "runtime_parity"))
sys.path.insert(0, str(HERE.parent / "generate"))
sys.path.insert(0, str(HERE))
import integration_helpers as IH  # noqa: E402
import runtime_helpers as RH  # noqa: E402
import generate_helpers as GH  # noqa: E402
import observe_helpers as OH  # noqa: E402


@pytest.fixture(scope="session")
def dashboard() -> dict:
    return json.loads(OH.DASHBOARD_JSON.read_text())


@pytest.fixture(scope="session")
def observe_stubs(tmp_path_factory):
    return IH.generate_stubs(tmp_path_factory.mktemp("observe_proto_src"), tmp_path_factory.mktemp("observe_proto_py"))


@pytest.fixture(scope="session")
def observed_server(tmp_path_factory, observe_stubs):
    """A SERVING strata-server whose stage 1 throws on its 3rd micro-batch (once). No --max-memory: the
    budgets come from the machine, so strata_device_inventory_free_bytes is published too."""
    server_bin = IH.require_binary(IH.SERVER_BIN)
    directory = RH.make_checkpoint(tmp_path_factory.mktemp("observe_llama"), "llama_text")
    RH.train_tokenizer(vocab_size=300).save(str(directory / "tokenizer.json"))
    flags = ["--model", str(directory), "--device-map", json.dumps(GH.TWO_STAGE_MAP),
             "--physical-devices", "0=cpu,1=cpu", "--max-batch", "8", "--max-context", "256",
             "--inject-fault", "stage=1,call=3"]
    server = IH.ServerProcess(server_bin, flags, tmp_path_factory.mktemp("observe_server"))
    server.start(observe_stubs)
    yield server
    with contextlib.suppress(Exception):
        server.stop()


@pytest.fixture(scope="session")
def prometheus(tmp_path_factory, observed_server):
    port = IH.free_port()
    config = OH.live_config(f"127.0.0.1:{observed_server.metrics_port}")
    process = OH.PrometheusProcess(config, tmp_path_factory.mktemp("prometheus"), port).start()
    yield process
    process.stop()
