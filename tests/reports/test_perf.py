"""``python -m reports perf`` end to end with tiny parameters and a short campaign: every
metric of the table, each with its goal and whether it was met. It prints numbers;
nothing is timed."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest


@pytest.mark.bench
def test_perf_prints_every_metric_beside_its_floor(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "reports", "perf", "--rounds", "2", "--repeat", "1",
         "--campaign-runs", "2", "--results", str(tmp_path / "results")],
        capture_output=True, text=True, timeout=900, check=False)
    assert done.returncode == 0, done.stderr
    rows = [line for line in done.stdout.splitlines() if line.startswith("| ")]
    assert [c.strip() for c in rows[0].split("|")[1:-1]] == [
        "metric", "now", "floor (same run)", "ratio", "goal", "met"]
    metrics = [r.split("|")[1].strip() for r in rows[1:]]
    assert metrics[0] == "no-op command through the exec ledger"
    assert any(m.startswith("checkpoint write with a CheckpointStore") for m in metrics)
    assert any(m.startswith("store growth per call") for m in metrics)
    assert any(m.startswith("campaign, 2 runs") for m in metrics)
    assert metrics[-1] == "kill -> next driver's first step, p50, less the plan's backoff"
    assert len(metrics) == 8
    for row in rows[1:]:
        cells = [c.strip() for c in row.split("|")[1:-1]]
        assert cells[5] in ("yes", "**no**"), row
        if cells[1] == "-":
            continue
        now = float(cells[1].split()[0])
        # a growth is the difference of two medians: one noisy sample each (--repeat 1) on a
        # busy machine can make it negative (seen in CI: -0.60 ms); every other figure is a
        # duration or a size
        assert now >= 0 or cells[0].startswith("growth of a"), row
