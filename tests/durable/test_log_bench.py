"""The benchmark runs end to end and prints its table (numbers are never asserted)."""

from __future__ import annotations

import re

import pytest

from durable.log_bench import main


@pytest.mark.bench
def test_bench_prints_every_kind_and_the_fence_ratio(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--commits", "20"]) == 0
    out = capsys.readouterr().out
    assert "20 commits per storage" in out
    for kind in ("sqlite", "sqlite-fenced", "jsonl-fsync", "jsonl-nofsync"):
        assert re.search(rf"^{kind} +\d+\.\d +\d+\.\d{{3}}$", out, re.M), out
    assert re.search(r"^fenced/unfenced median latency ratio: \d+\.\d\d$", out, re.M), out
