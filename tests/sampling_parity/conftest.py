"""Fixtures and the session summary of the sampling parity tests.

The tests compare strata's device sampler (runtime/executor/sampler.h, through the test-only probe
$STRATA_BUILD_DIR/tests/runtime/strata_sampler_probe, default <repo>/build) with transformers' own logits
processors, and a real strata-server's greedy Generate with repetition_penalty against transformers'
generate(), both run live in this process. A missing binary is a failure, not a skip.
"""

from __future__ import annotations

import collections
import contextlib
import pathlib
import sys

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))
from case_counts import CaseCounts  # noqa: E402

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "integration"))
sys.path.insert(0, str(HERE.parent / "runtime_parity"))
sys.path.insert(0, str(HERE.parent / "generate"))
sys.path.insert(0, str(HERE))
import integration_helpers as IH  # noqa: E402
import runtime_helpers as RH  # noqa: E402

PROBE_BIN = IH.BUILD_DIR / "tests" / "runtime" / "strata_sampler_probe"

# nodeid part -> what the summary calls its cases
_COUNTED = {
    "test_sampling_parity.py::test_sampler_matches_transformers_processors":
        "sampling parity: {passed}/{total} batches with transformers' processed distribution (1e-5), removed "
        "tokens and inverse-CDF ids",
    "test_sampling_parity.py::test_greedy_repetition_penalty_equals_generate":
        "repetition penalty parity (strata-server): {passed}/{total} greedy generations equal to generate()",
}
COUNTS = CaseCounts(_COUNTED)
# Filled by the tests: rows compared, and sampled ids that differ where the uniform lands within 1e-6 of
# a CDF step (allowed, counted).
STATS: collections.Counter = collections.Counter()


@pytest.fixture(scope="session")
def probe() -> pathlib.Path:
    if not PROBE_BIN.is_file():
        pytest.fail(f"strata_sampler_probe is not built: {PROBE_BIN} does not exist (build the target "
                    f"strata_sampler_probe, or point STRATA_BUILD_DIR at the build folder)", pytrace=False)
    return PROBE_BIN


@pytest.fixture(scope="session")
def stats() -> collections.Counter:
    return STATS


@pytest.fixture(scope="session")
def server_bin() -> pathlib.Path:
    return IH.require_binary(IH.SERVER_BIN)


@pytest.fixture(scope="session")
def stubs(tmp_path_factory):
    return IH.generate_stubs(tmp_path_factory.mktemp("proto_src"), tmp_path_factory.mktemp("proto_py"))


@pytest.fixture(scope="session")
def text_model(tmp_path_factory) -> pathlib.Path:
    """The llama_text checkpoint of tests/runtime_parity (vocab 320, 4 layers)."""
    return RH.make_checkpoint(tmp_path_factory.mktemp("llama_text"), "llama_text")


@pytest.fixture(scope="session")
def two_stage_server(server_bin, stubs, text_model, tmp_path_factory):
    """strata-server on the 2-stage logical plan of tests/generate (both stages on the CPU), pipelined."""
    import generate_helpers as GH

    server = IH.ServerProcess(server_bin, ["--model", str(text_model), *GH.TWO_STAGE_FLAGS, "--max-batch", "8",
                                           "--max-context", "256", "--micro-batches", "2"],
                              tmp_path_factory.mktemp("server"))
    server.start(stubs)
    yield server
    with contextlib.suppress(Exception):
        server.stop()


def pytest_runtest_logreport(report):
    COUNTS.record(report)


def pytest_terminal_summary(terminalreporter):
    def extra(kind: str) -> str:
        if not kind.endswith("processors"):
            return ""
        return (f"; {STATS['rows']} rows ({STATS['sampled']} sampled), "
                f"{STATS['near_step']} ids differ within 1e-6 of a CDF step")

    COUNTS.write(terminalreporter, "strata sampling parity", extra)
