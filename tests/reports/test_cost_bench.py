"""The cost benchmark end to end with tiny parameters (2 calls per cell, 10 files), through
the CLI, with the microvm backend too: skipped with its reason where it cannot be had,
measured (with its machine mode) where it can. It prints numbers; nothing is timed."""

from __future__ import annotations

import csv
import subprocess
import sys
from pathlib import Path

import pytest

from reports.cost_bench import KINDS, MODES, ONLY_ON


@pytest.mark.bench
def test_cost_prints_every_mode_and_kind_and_writes_csv_and_plots(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "reports", "cost", "--backend", "local,microvm", "--repeat", "2",
         "--sizes", "10", "--out", str(tmp_path)],
        capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stderr
    microvm = "skipping backend microvm:" not in done.stderr
    local = [m for m in MODES if ONLY_ON.get(m, "local") == "local"]  # machine: microVMs
    if microvm:
        assert "**microvm, 10 files" in done.stdout and "| machine " in done.stdout
    rows = done.stdout.split("**microvm")[0].splitlines()
    rows = [line for line in rows if line.startswith("| ")]
    assert [c.strip() for c in rows[0].split("|")[1:-1]] == [
        "mode", "write", "edit", "bash append", "log KiB/call"]
    assert [r.split("|")[1].split()[0] for r in rows[1:]] == local
    assert "growth not fitted" in done.stdout
    with open(tmp_path / "samples.csv") as f:
        samples = list(csv.DictReader(f))
    assert len([s for s in samples if s["backend"] == "local"]) == len(local) * len(KINDS) * 2
    assert all(float(s["ms"]) > 0 for s in samples)
    assert {p.name for p in tmp_path.glob("*.png")} == {
        f"cost-{b}-{k}.png" for b in ("local", *(["microvm"] if microvm else []))
        for k in ("size", "log")}
