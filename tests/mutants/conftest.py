"""The mutation gate's score line: how many planted bugs the CI subset caught."""

from __future__ import annotations

from typing import Any

import pytest

_results: dict[str, str] = {}


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.when == "call" and "test_mutant_is_caught" in report.nodeid:
        _results[report.nodeid] = report.outcome


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if not _results:
        return
    caught = sum(outcome == "passed" for outcome in _results.values())
    terminalreporter.write_line(
        f"MUTATION SCORE {caught}/{len(_results)} planted bugs caught by the CI subset")
