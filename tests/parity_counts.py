"""The session summary the parity suites print: per kind of case, how many rendered identically to the
reference out of how many (tests/tokenizer_parity, tests/chat_template_parity). A conftest makes one
`ParityCounts` and exposes its `record` fixture and its `terminal_summary` as pytest_terminal_summary."""

from __future__ import annotations

import collections

import pytest


class ParityCounts:
    def __init__(self, title: str, suffix: str = "") -> None:
        self.title = title
        self.suffix = suffix
        # kind -> Counter(identical=..., total=...), filled by the tests through `record`.
        self.counts: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)

    def fixture(self):
        @pytest.fixture
        def record():
            def add(kind: str, identical: int, total: int) -> None:
                self.counts[kind]["identical"] += identical
                self.counts[kind]["total"] += total
            return add
        return record

    def terminal_summary(self, terminalreporter) -> None:
        if not self.counts:
            return
        terminalreporter.section(self.title)
        for kind, c in self.counts.items():
            terminalreporter.write_line(f"{kind}: {c['identical']}/{c['total']}{self.suffix}")
