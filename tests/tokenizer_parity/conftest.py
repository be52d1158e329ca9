"""Fixtures and the session summary of the tokenizer parity tests.

The tests compare `strata-tokenize` ($STRATA_BUILD_DIR/tokenizer/strata-tokenize, default
<repo>/build) with the `tokenizers` library, live in this process, on tokenizers trained here (see
tokenizer_fixtures.py). A missing binary is a failure, not a skip.
"""

from __future__ import annotations

import pathlib
import sys

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
from parity_counts import ParityCounts  # noqa: E402

import tokenizer_fixtures as F

_parity = ParityCounts("tokenizer parity vs HF tokenizers", " identical")


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


record = _parity.fixture()
pytest_terminal_summary = _parity.terminal_summary
