"""README.md's supported architectures are the ones strata-plan supports.

Both lists in README.md are checked: the rows of the "Supported architectures" table and the example error
message that strata-plan prints for an unsupported `architectures[0]`. Each is compared with that message as the
built binary prints it ($STRATA_BUILD_DIR/planner/strata-plan, default <repo>/build), which lists
planner/model_registry.cc's rows. A missing binary is a failure, not a skip: CI builds it before the tests.
"""

from __future__ import annotations

import json
import os
import pathlib
import re
import subprocess

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]
README = REPO / "README.md"
ARCHITECTURE = re.compile(r"\b[A-Z][A-Za-z0-9]*ForCausalLM\b")
SUPPORTED = re.compile(r"\(supported: ([^)]*)\)")


def strata_plan() -> pathlib.Path:
    path = pathlib.Path(os.environ.get("STRATA_BUILD_DIR", REPO / "build")) / "planner" / "strata-plan"
    if not path.is_file():
        pytest.fail(f"strata-plan is not built: {path} does not exist (build the project first, "
                    f"or point STRATA_BUILD_DIR at the build folder)", pytrace=False)
    return path


@pytest.fixture(scope="module")
def registry(tmp_path_factory) -> list[str]:
    """The architectures strata-plan lists when it refuses one, in its order."""
    model = tmp_path_factory.mktemp("unsupported")
    (model / "config.json").write_text(json.dumps({"architectures": ["FooForCausalLM"], "model_type": "foo"}))
    proc = subprocess.run([str(strata_plan()), "--model", str(model)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2, f"strata-plan exited {proc.returncode}, expected 2; stderr:\n{proc.stderr}"
    found = SUPPORTED.search(proc.stderr)
    assert found, f"strata-plan's error names no supported architectures:\n{proc.stderr}"
    names = [n.strip() for n in found.group(1).split(",")]
    assert names and all(ARCHITECTURE.fullmatch(n) for n in names), names
    return names


def readme_section(title: str) -> str:
    text = README.read_text(encoding="utf-8")
    start = text.index(f"\n## {title}\n")
    end = text.find("\n## ", start + 1)
    return text[start:end if end != -1 else len(text)]


def test_supported_architectures_table_lists_the_registry(registry):
    rows = [line for line in readme_section("Supported architectures").splitlines() if line.startswith("| `")]
    in_table = [name for row in rows for name in ARCHITECTURE.findall(row.split("|")[1])]
    assert len(in_table) == len(set(in_table)), f"README.md's table lists an architecture twice: {in_table}"
    assert sorted(in_table) == sorted(registry), (
        f"README.md's \"Supported architectures\" table and strata-plan differ:\n"
        f"  only in README.md: {sorted(set(in_table) - set(registry))}\n"
        f"  only in strata-plan: {sorted(set(registry) - set(in_table))}")


def test_readme_error_example_is_what_strata_plan_prints(registry):
    examples = SUPPORTED.findall(README.read_text(encoding="utf-8"))
    assert examples, "README.md shows no strata-plan error listing the supported architectures"
    for example in examples:
        assert [n.strip() for n in example.split(",")] == registry, (
            f"README.md's example error lists\n  {example}\nwhile strata-plan prints\n  {', '.join(registry)}")
