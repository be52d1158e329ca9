"""Fixtures and the session summary of the planner parity tests.

The tests compare `strata-plan` (built C++; $STRATA_BUILD_DIR/planner/strata-plan, default
<repo>/build) with transformers' own placement code, run live in this process. A missing binary is a
failure, not a skip: CI builds it before running these tests.
"""

from __future__ import annotations

import pathlib
import sys

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))
from case_counts import CaseCounts  # noqa: E402

import parity_helpers as H

# nodeid prefix -> what the summary calls its cases
_COUNTED = {
    "test_plan_parity.py::test_device_map_matches_transformers": "plan parity: {passed}/{total} maps identical to transformers",
    "test_module_tree_parity.py::test_print_module_tree_matches_export": "module tree parity: {passed}/{total} trees identical to tools/export_module_tree.py",
    "test_module_tree_parity.py::test_other_architecture_plan_matches_transformers": "any-architecture parity (--module-tree): {passed}/{total} maps identical to transformers",
    "test_family_plan_parity_gemma.py::test_family_device_map_matches_transformers": "Gemma 2/Gemma 3/Phi-3 plan parity: {passed}/{total} maps identical to transformers",
    "test_inventory_parity.py::test_default_budgets_match_transformers": "inventory parity: {passed}/{total} maps identical to transformers",
    "test_family_plan_parity_moe.py::test_moe_family_device_map_matches_transformers": "Qwen3/Qwen3-MoE/Mixtral/DeepSeek-V3/Kimi-K2/GLM-4.x/MiniMax-M2/gpt-oss plan parity: {passed}/{total} maps identical to transformers",
    "::test_full_deepseek_over_eight_80gb_gpus_and_cpu_matches_transformers": "DeepSeek-V3 671B and Kimi-K2-shaped over 8 x 80 GB + cpu: {passed}/{total} maps identical to transformers",
    "test_quantized_placement.py::test_quantized_device_map_matches_transformers": "quantized plan parity (--quantized-sizing transformers): {passed}/{total} maps identical to transformers",
    "test_quantized_placement.py::test_quantized_module_tree_matches_transformers": "quantized module trees: {passed}/{total} identical to transformers' quantizers'",
    "test_quantized_placement.py::test_mxfp4_": "gpt-oss MXFP4 under transformers' Mxfp4 quantizer (maps and trees): {passed}/{total} identical",
}
COUNTS = CaseCounts(_COUNTED)


@pytest.fixture(scope="session")
def strata_plan() -> pathlib.Path:
    path = H.strata_plan_path()
    if not path.is_file():
        pytest.fail(f"strata-plan is not built: {path} does not exist (build the project first, "
                    f"or point STRATA_BUILD_DIR at the build folder)", pytrace=False)
    return path


@pytest.fixture(scope="session")
def checkpoint_dir(tmp_path_factory):
    """checkpoint_dir(name) -> a directory holding the config.json of parity_helpers.CONFIGS[name]."""
    root = tmp_path_factory.mktemp("configs")
    made: dict[str, pathlib.Path] = {}

    def get(name: str) -> pathlib.Path:
        if name not in made:
            made[name] = H.write_checkpoint_dir(root / name, H.CONFIGS[name])
        return made[name]

    return get


def pytest_runtest_logreport(report):
    COUNTS.record(report)


def pytest_terminal_summary(terminalreporter):
    COUNTS.write(terminalreporter, "strata parity")
