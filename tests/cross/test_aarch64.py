"""The CPU kernels on aarch64 (Graviton, Grace: where CPU stages run beside GPUs): kernels/ and its tests
cross-compiled by scripts/cross-aarch64.sh (Debian's g++-aarch64-linux-gnu, the arm64 multiarch Highway) into
$STRATA_AARCH64_BUILD_DIR (default build-aarch64/; built here if missing), then the suite run under
qemu-aarch64: every test once per Highway target, NEON, SVE and SVE2 each required to run and pass.
The script installs the cross tool chain where it is missing (Debian's packages)."""

from __future__ import annotations

import os
import pathlib
import re
import subprocess

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]
BUILD = pathlib.Path(os.environ.get("STRATA_AARCH64_BUILD_DIR", REPO / "build-aarch64"))
TARGETS = ("NEON", "SVE", "SVE2")


@pytest.fixture(scope="module")
def suite() -> pathlib.Path:
    proc = subprocess.run([str(REPO / "scripts" / "cross-aarch64.sh")], cwd=REPO, capture_output=True, text=True,
                          timeout=1800)
    assert proc.returncode == 0, f"scripts/cross-aarch64.sh failed:\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"
    binary = BUILD / "tests" / "kernels" / "strata_kernels_tests"
    assert binary.exists(), binary
    return binary


def test_the_suite_is_an_aarch64_program(suite):
    header = suite.read_bytes()[:20]
    assert header[:4] == b"\x7fELF"
    assert int.from_bytes(header[18:20], "little") == 183, "e_machine is not EM_AARCH64"


def test_every_kernel_test_passes_on_neon_sve_and_sve2(suite):
    proc = subprocess.run(["qemu-aarch64", "-L", "/usr/aarch64-linux-gnu", str(suite)], capture_output=True,
                          text=True, timeout=900)
    assert proc.returncode == 0, f"kernel tests failed under qemu-aarch64:\n{proc.stdout[-8000:]}\n{proc.stderr[-2000:]}"
    passed = re.findall(r"^\[       OK \] \S+/(\w+) \(", proc.stdout, re.M)
    by_target = {target: passed.count(target) for target in set(passed)}
    for target in TARGETS:
        assert by_target.get(target, 0) > 0, f"no kernel test ran on {target}: {by_target}"
    counts = {by_target[target] for target in TARGETS}
    assert len(counts) == 1, f"the targets ran different numbers of tests: {by_target}"
    assert "FAILED" not in proc.stdout
