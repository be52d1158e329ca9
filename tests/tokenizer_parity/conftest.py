"""Fixtures and the session summary of the tokenizer parity tests.

The tests compare `strata-tokenize` ($STRATA_BUILD_DIR/tokenizer/strata-tokenize, default
<repo>/build) with the `tokenizers` library, live in this process, on tokenizers trained here (see
tokenizer_fixtures.py). A missing binary is a failure, not a skip.
"""

from __future__ import annotations

import collections

import pytest

import tokenizer_fixtures as F

# kind -> Counter(lines=..., identical=...), filled by the tests through `record`.
_counts: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)


@pytest.fixture(scope="session")
def strata_tokenize():
    path = F.strata_tokenize_path()
    if not path.is_file():
        pytest.fail(f"strata-tokenize is not built: {path} does not exist (build the project first, "
                    f"or point STRATA_BUILD_DIR at the build folder)", pytrace=False)
    return path


@pytest.fixture(scope="session")
def corpus() -> list[str]:
    return F.build_corpus()


@pytest.fixture(scope="session")
def families(tmp_path_factory):
    """{family: (directory with tokenizer.json, the `tokenizers` Tokenizer read from it)}"""
    return F.build_all(tmp_path_factory.mktemp("tokenizers"))


@pytest.fixture
def record():
    def add(kind: str, identical: int, total: int) -> None:
        _counts[kind]["identical"] += identical
        _counts[kind]["total"] += total
    return add


def pytest_terminal_summary(terminalreporter):
    if not _counts:
        return
    terminalreporter.section("tokenizer parity vs HF tokenizers")
    for kind, c in _counts.items():
        terminalreporter.write_line(f"{kind}: {c['identical']}/{c['total']} identical")
