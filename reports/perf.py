"""``python -m reports perf``: the performance table, each metric beside its floor measured in
the same run (these machines are shared and noisy: the ratio is what to read).

| metric | floor (measured alongside) | goal |
|---|---|---|
| a no-op command through the exec ledger (start + wait) | ``subprocess.run`` of ``bash -c true`` | <= 2x the floor |
| a transactional write in a workspace of 100 files of 4 KiB | the same write unwrapped | <= floor + 3 ms |
| growth of a transactional / checkpoint write per 100 files (10 -> 1000 files) | - | <= +0.2 ms per 100 files |
| a checkpoint-mode write with a CheckpointStore, 1000 files | the same without a store | <= 2x the floor |
| the store's growth per such write | the bytes the write changed | = the floor |
| a campaign of ``--campaign-runs`` runs x 10 calls, local, checkpoint mode | - | < 90 s for 250 runs |
| a kill -> the next driver's first step, p50 (from that campaign), less the relaunch backoff its plan drew (0 or 50 ms) | a Python start-up that imports the driver's modules | <= 40 ms |

The calls are measured by the cost benchmark (``reports.cost_bench``: interleaved rounds,
from the intent's commit to the result's), the exec pair by the Space benchmark
(``backends.space_bench``), the campaign by ``chaos.campaign.campaign``. It prints numbers and
asserts nothing.
"""  # noqa: E501 - the table's rows are one line each

from __future__ import annotations

import io
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from backends.local import LocalSpaces
from backends.space_bench import bench_exec
from chaos.campaign.campaign import CampaignConfig, run_campaign

from . import cost_bench
from .markdown import table

MODES = ("unwrapped", "transactional", "checkpoint", "checkpoint+store")
SIZES = (10, 100, 1000)


@dataclass(frozen=True)
class Metric:
    what: str
    #: None when the run gave no sample of it (a campaign without a kill to resume from).
    now: float | None
    floor: float | None
    goal: str
    met: bool
    unit: str = "ms"

    def row(self) -> list[str]:
        ratio = "" if not self.floor or self.now is None else f"{self.now / self.floor:.2f}x"
        floor = "-" if self.floor is None else f"{self.floor:.2f} {self.unit}"
        now = "-" if self.now is None else f"{self.now:.2f} {self.unit}"
        return [self.what, now, floor, ratio, self.goal,
                "yes" if self.met else "**no**"]


def exec_metric(rounds: int) -> Metric:
    with tempfile.TemporaryDirectory(prefix="perf-exec-") as base:
        spaces = LocalSpaces(base)
        try:
            spaces.create("perf")
            ledger, plain = bench_exec(spaces.connect("perf", epoch=1), rounds)
        finally:
            spaces.delete_all()
    return Metric("no-op command through the exec ledger", ledger, plain,
                  "<= 2x the plain spawn", ledger <= 2 * plain)


def call_metrics(repeat: int) -> list[Metric]:
    """The write call's cost per mode and size (median over ``repeat`` interleaved rounds)."""
    with tempfile.TemporaryDirectory(prefix="perf-calls-") as tmp:
        work = Path(tmp)
        spaces = cost_bench.backend_spaces("local", work)
        with cost_bench.open_cells("local", spaces, MODES, SIZES, work) as cells:
            store = next(c.store_dir for c in cells
                         if c.mode == "checkpoint+store" and c.files == 1000)
            assert store is not None
            before = _size(store)  # the warm-up's first checkpoint copied every file
            samples = cost_bench.measure(cells, repeat, progress=lambda _line: None)
            per_call = (_size(store) - before) / (repeat * len(cost_bench.KINDS)) / 1024
    ms: dict[tuple[str, int], float] = {}
    for mode in MODES:
        for files in SIZES:
            xs = [s["ms"] for s in samples
                  if s["mode"] == mode and s["files"] == files and s["kind"] == "write"]
            ms[(mode, files)] = statistics.median(xs)
    out = [Metric("transactional write, 100 files of 4 KiB", ms[("transactional", 100)],
                  ms[("unwrapped", 100)], "<= unwrapped + 3 ms",
                  ms[("transactional", 100)] <= ms[("unwrapped", 100)] + 3)]
    span = (SIZES[-1] - SIZES[0]) / 100
    for mode in ("transactional", "checkpoint"):
        slope = (ms[(mode, SIZES[-1])] - ms[(mode, SIZES[0])]) / span
        out.append(Metric(f"growth of a {mode} write per 100 files ({SIZES[0]} -> "
                          f"{SIZES[-1]})", slope, None, "<= +0.2 ms per 100 files",
                          slope <= 0.2))
    with_store, without = ms[("checkpoint+store", 1000)], ms[("checkpoint", 1000)]
    out.append(Metric("checkpoint write with a CheckpointStore, 1000 files", with_store, without,
                      "<= 2x the checkpoint without a store", with_store <= 2 * without))
    out.append(Metric("store growth per call, 1000 files", per_call,
                      cost_bench.FILE_SIZE / 1024,
                      "= the changed bytes (a 4 KiB file or an append)",
                      per_call <= 2 * cost_bench.FILE_SIZE / 1024, unit="KiB"))
    return out


def _size(directory: Path) -> int:
    return sum(p.stat().st_size for p in directory.rglob("*") if p.is_file())


def startup_floor() -> float:
    """A Python start-up importing what the campaign's driver imports, without running it."""
    times = []
    for _ in range(5):
        start = time.perf_counter()
        subprocess.run([sys.executable, "-c", "import chaos.driver"], check=True,
                       cwd=Path(__file__).resolve().parents[1])
        times.append((time.perf_counter() - start) * 1000)
    return statistics.median(times)


def campaign_metrics(runs: int, results: Path) -> list[Metric]:
    out = io.StringIO()
    start = time.perf_counter()
    run_campaign(CampaignConfig(mode="checkpoint", runs=runs, steps=10, seed_base=1,
                                jobs=2 * (os.cpu_count() or 1), results_root=results), out)
    seconds = time.perf_counter() - start
    # Less the plan's relaunch backoff (0 or 50 ms, drawn per run): a pause the fault plan
    # asks for between a driver's death and the next, as a supervisor's would be, not time
    # the harness or the runtime spends.
    with (results / "latest" / "runs.jsonl").open() as f:
        resumes = [1000 * (lat["t_next_step"] - lat["t_fault"] - r["plan"]["backoff"])
                   for r in map(json.loads, f) for lat in r["latencies"]
                   if lat["killed"] and lat["t_next_step"] is not None]
    resume = statistics.median(resumes) if resumes else None
    floor = startup_floor()
    scaled = seconds * 250 / runs
    return [Metric(f"campaign, {runs} runs x 10 calls, local, checkpoint (scaled to 250)",
                   scaled, None, "< 90 s for 250 runs", scaled < 90, unit="s"),
            Metric("kill -> next driver's first step, p50, less the plan's backoff", resume,
                   floor,
                   "<= 40 ms", resume is not None and resume <= 40)]


def report(*, rounds: int, repeat: int, campaign_runs: int, results: Path) -> str:
    metrics = [exec_metric(rounds), *call_metrics(repeat)]
    if campaign_runs:
        metrics += campaign_metrics(campaign_runs, results)
    lines = [f"perf on {os.cpu_count()} cores, load {os.getloadavg()[0]:.2f} at the end, "
             f"python {sys.version.split()[0]}", ""]
    lines.append(table(["metric", "now", "floor (same run)", "ratio", "goal", "met"],
                       [m.row() for m in metrics], align=["l", "r", "r", "r", "l", "l"]))
    return "\n".join(lines)
