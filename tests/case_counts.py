"""Counts the cases of a parity folder by kind, for the one-line summaries its conftest prints
("plan parity: 720/720 maps identical to transformers"). A case whose setup failed (a missing binary,
say) counts as failed, so a summary can never look better than the run."""

from __future__ import annotations

import collections


class CaseCounts:
    def __init__(self, counted: dict[str, str]):
        """counted: test nodeid fragment -> summary line with {passed} and {total}."""
        self.counted = counted
        self.results: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)

    def record(self, report) -> None:
        """Call from pytest_runtest_logreport."""
        nodeid = report.nodeid.replace("\\", "/")
        kind = next((k for k in self.counted if k in nodeid), None)
        if kind is None:
            return
        if report.when == "call" or (report.when == "setup" and not report.passed):
            self.results[kind]["total"] += 1
            self.results[kind]["passed" if report.passed else "failed"] += 1

    def write(self, terminalreporter, section: str, extra=lambda kind: "") -> None:
        """Call from pytest_terminal_summary; `extra(kind)` is appended to a kind's line."""
        if not self.results:
            return
        terminalreporter.section(section)
        for kind, fmt in self.counted.items():
            counts = self.results.get(kind)
            if not counts:
                continue
            line = fmt.format(passed=counts["passed"], total=counts["total"]) + extra(kind)
            if counts["failed"]:
                line += f" ({counts['failed']} differ or failed)"
            terminalreporter.write_line(line)
