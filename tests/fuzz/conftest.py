"""The session summary of the fuzz tests: each harness's executions per second and corpus size, as
scripts/fuzz.sh reports them (or the failure)."""

from __future__ import annotations

import pytest

# harness -> scripts/fuzz.sh's last line, filled by the tests through `record`.
_results: dict[str, str] = {}


@pytest.fixture
def record():
    def add(harness: str, line: str) -> None:
        _results[harness] = line
    return add


def pytest_terminal_summary(terminalreporter):
    if not _results:
        return
    terminalreporter.section("libFuzzer harnesses")
    for line in _results.values():
        terminalreporter.write_line(line)
