"""The local Space benchmark runs (small) and prints every measurement; no timing asserts."""

from __future__ import annotations

import pytest

from backends import space_bench


@pytest.mark.bench
def test_the_benchmark_prints_its_lines(capsys) -> None:
    assert space_bench.main(["--small"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[1] for line in lines] == ["setup", "exec", "scan", "scan", "checkpoint"]
    for line in lines[1:]:
        fields = dict(kv.split("=", 1) for kv in line.split()[2:])
        assert all(fields.values()), line
    assert "files=1000" in lines[3] and "ratio=" in lines[3]
