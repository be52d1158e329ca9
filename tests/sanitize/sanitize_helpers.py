"""The sanitizer lanes (tests/sanitize/README.md): where their builds are, the environment their
processes run under (sanitize_env.sh, the one place the options are written), and the scan of a
process's output for sanitizer reports."""

from __future__ import annotations

import os
import pathlib
import subprocess

import pytest

HERE = pathlib.Path(__file__).resolve().parent
REPO = HERE.parents[1]

LANES = {
    "asan": pathlib.Path(os.environ.get("STRATA_ASAN_BUILD_DIR", REPO / "build-asan")),
    "tsan": pathlib.Path(os.environ.get("STRATA_TSAN_BUILD_DIR", REPO / "build-tsan")),
}

# The C++ suites each lane runs, by their path under the build directory (scripts/sanitize.sh builds
# them). ASan + UBSan run every suite; TSan those whose code runs on several threads (see the README for the choice
# and its cost).
SUITES = {
    "asan": ["tests/checkpoint/strata_checkpoint_tests", "tests/base/strata_base_tests", "tests/cli/strata_cli_tests",
             "tests/planner/strata_planner_tests", "tests/tokenizer/strata_tokenizer_tests",
             "tests/chat_template/strata_chat_template_tests", "tests/structured/strata_structured_tests",
             "tests/kernels/strata_kernels_tests", "tests/runtime/strata_runtime_tests",
             "tests/transport/strata_transport_tests", "tests/server/strata_server_tests"],
    "tsan": ["tests/runtime/strata_runtime_tests", "tests/transport/strata_transport_tests",
             "tests/tokenizer/strata_tokenizer_tests", "tests/structured/strata_structured_tests"],
}

# What each sanitizer prints when it reports: AddressSanitizer and LeakSanitizer errors, ThreadSanitizer
# warnings (a race, a lock-order inversion, a signal-unsafe call) and UBSan's "file:line:col: runtime
# error: ...".
REPORT_MARKERS = ("ERROR: AddressSanitizer", "ERROR: LeakSanitizer", "WARNING: ThreadSanitizer",
                  "ThreadSanitizer: reported", "runtime error:")
# The exit code sanitize_env.sh gives a process that reported.
REPORT_EXIT_CODE = 86


# The sanitizer runtimes a lane's binaries must load: a build without them would pass every test.
RUNTIMES = {"asan": ("libasan.so", "libubsan.so"), "tsan": ("libtsan.so",)}
# The compiler flags of each lane (cmake/sanitize.cmake), for the planted bugs of test_sanitizers.py.
FLAGS = {"asan": ["-fsanitize=address,undefined", "-fno-sanitize-recover=undefined"], "tsan": ["-fsanitize=thread"]}


def lane_binary(lane: str, relative: str) -> pathlib.Path:
    binary = LANES[lane] / relative
    if not binary.is_file():
        pytest.fail(f"{binary} is missing: build the {lane} lane first (scripts/sanitize.sh {lane}; scripts/test.sh "
                    f"does)")
    linked = subprocess.run(["ldd", str(binary)], capture_output=True, text=True, check=True).stdout
    for runtime in RUNTIMES[lane]:
        assert runtime in linked, f"{binary} does not load {runtime}: not a {lane} build\n{linked}"
    return binary


def lane_env(lane: str) -> dict[str, str]:
    """os.environ plus the sanitizers' options, read from sanitize_env.sh. Under TSan, LibTorch's OpenMP
    (its wheel's own libgomp, which TSan cannot see into) runs one thread: see the README."""
    dump = subprocess.run(["bash", "-c", 'source "$0" && env -0', str(HERE / "sanitize_env.sh")],
                          capture_output=True, check=True).stdout
    env = dict(entry.split("=", 1) for entry in dump.decode().split("\0") if "=" in entry)
    if lane == "tsan":
        env["OMP_NUM_THREADS"] = "1"
    return env


def reports(text: str) -> list[str]:
    """The lines of `text` that are sanitizer reports, with the 40 lines after the first one (its stack)."""
    lines = text.splitlines()
    hits = [i for i, line in enumerate(lines) if any(m in line for m in REPORT_MARKERS)]
    if not hits:
        return []
    return [lines[i] for i in hits] + ["--- first report:"] + lines[hits[0]:hits[0] + 40]
