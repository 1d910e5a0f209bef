"""The oracle of a workload: golden runs, one per (workload, mode, backend, calls kept).

No model can say what ``git gc`` or ``python3 -m venv`` does to a workspace, so a workload
run is compared with the same workload run without faults (differential testing): a fresh
Space of the same backend, the same adapter mode, no failpoint, no fault. The golden run's
final workspace and its results are what every faulted run must end with.

A call that a faulted run legitimately ended interrupted (checkpoint mode restores the
Space to the state before it and tells the model) took no effect; that run is compared with
a golden run of the workload without those calls (``Scenario.keep``), so a correct system
never fails the check, whichever calls a seed interrupted.

mtimes: a program sets some on purpose (``touch -d``, ``tar x``, ``git`` with fixed dates,
``cp -a``); those are far in the past and every run gives the same. The rest are "now" and
differ from run to run. A golden mtime older than the golden run by more than a day is
kept (compared exactly); the others are dropped (compared with nothing). A day is wider
than any clock skew between a host and its Spaces' machines.

An oracle must be one: each golden run is made twice, and when the two differ (a path's
content, a pinned mtime, a call's output) the workload is not deterministic and the runs get
no verdict (``unknown``), with the paths to declare ``volatile`` and the calls to mark
``output: nondeterministic`` (``Nondeterministic``); a recovery is never blamed for what
the workload does differently on its own. ``chaos workload from-log`` uses the same two
clean runs (``probe``) to write those declarations itself.

Golden runs are cached in the campaign's process (per key, computed once even when several
runs ask for it at once): a campaign of N runs costs two golden runs per interruption
pattern, usually one or two patterns.
"""

from __future__ import annotations

import glob
import hashlib
import threading
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

from chaos.faults.plans import FaultPlan
from chaos.run.record import RunRecord
from chaos.run.spec import RunSpec
from scenarios import Expected, Workload
from scenarios.workload import PREFIX, load
from spacesd.protocol import ScanEntry

if TYPE_CHECKING:
    from chaos.checks.model import Observation

#: Runs a run of a spec to its end (``chaos.run.runner.Run.execute``): how a clean run is made.
Execute = Callable[[RunSpec], RunRecord]
#: mtimes of a golden run older than its start by more than this are a program's own.
SET_MTIME_MARGIN_NS = 24 * 3600 * 10**9


class GoldenFailed(Exception):
    """The workload does not run cleanly without faults: the oracle itself has no answer.
    The message says how the golden run ended; run the workload alone to see why."""


class Nondeterministic(GoldenFailed):
    """Two clean runs of the workload ended differently: it has no single answer."""

    def __init__(self, workload: Workload, paths: list[str], steps: list[int]) -> None:
        self.paths, self.steps = paths, steps
        said, fixes = [], []
        if paths:
            said.append(f"path(s) {', '.join(map(repr, paths[:5]))}"
                        f"{f' and {len(paths) - 5} more' if len(paths) > 5 else ''} differ")
            fixes.append("declare such paths in its 'volatile:' list (globs, compared by kind "
                         "only)")
        if steps:
            said.append(f"the output of call(s) {', '.join(map(str, steps))} differs")
            fixes.append("mark such calls 'output: nondeterministic'")
        super().__init__(
            f"two clean runs of the workload {workload.name!r} ended differently: "
            f"{'; '.join(said)}. Make its commands deterministic (fixed dates, one thread) or "
            f"{' and '.join(fixes)}")


@dataclass(frozen=True)
class Golden:
    #: The final workspace: mtimes a program set kept, the others None.
    entries: list[ScanEntry]
    #: step index -> the result the call gave
    results: dict[int, Expected]


#: (workload path, its digest, durable mode, backend, snapshots, the step indices kept)
_Key = tuple[str, str, str, str, str, tuple[int, ...]]
_cache: dict[_Key, Golden | Nondeterministic] = {}
_computing: dict[_Key, threading.Lock] = {}
_lock = threading.Lock()


def golden_for(spec: RunSpec, workload: Workload, interrupted: frozenset[int],
               execute: Execute) -> Golden:
    """The golden run of ``workload`` (``spec``'s) without the calls of ``interrupted``
    (their step indices), each clean run made by ``execute``, computed once per key in this
    process (a nondeterministic
    workload too; a clean run that did not finish is tried again by the next run)."""
    kept = tuple(i for i in range(len(workload.calls)) if i not in interrupted)
    spec = replace(spec, preset=PREFIX + workload.path)
    key: _Key = (workload.path, workload.digest, spec.durable_mode, spec.backend,
                 spec.snapshots, kept)
    with _lock:
        mine = _computing.setdefault(key, threading.Lock())
    with mine:
        with _lock:
            known = _cache.get(key)
        if known is None:
            try:
                known = _compute(spec, workload, kept, key, execute)
            except Nondeterministic as exc:
                known = exc
            with _lock:
                _cache[key] = known
    if isinstance(known, Nondeterministic):
        # A new exception per run: one raised again and again would pile up tracebacks
        # that keep every run's objects alive.
        raise Nondeterministic(workload, known.paths, known.steps)
    return known


def _compute(spec: RunSpec, workload: Workload, kept: tuple[int, ...], key: _Key,
             execute: Execute) -> Golden:
    """The golden run of ``key``, made twice: ``Nondeterministic`` when the two differ."""
    name = "golden-" + hashlib.sha256(repr(key).encode()).hexdigest()[:16]
    first, paths, steps = _twice(spec, workload, kept, spec.work_dir.parent / "goldens" / name,
                                 execute)
    if paths or steps:
        raise Nondeterministic(workload, paths, steps)
    return first


def _twice(spec: RunSpec, workload: Workload, kept: tuple[int, ...], work_dir: Path,
           execute: Execute) -> tuple[Golden, list[str], list[int]]:
    """Two clean runs under ``work_dir``: the first's oracle, and where they differ."""
    first, second = (_clean_run(spec, kept, work_dir / f"clean-{i}", execute) for i in (1, 2))
    return (first, *differences(workload, first, second))


def _clean_run(spec: RunSpec, kept: tuple[int, ...], work_dir: Path, execute: Execute
               ) -> Golden:
    golden_spec = replace(spec, index=0, plan=FaultPlan(spec.seed, ()), keep=False,
                          keep_steps=kept, simple_steps=(), golden=True, lead_misses=(),
                          work_dir=work_dir)
    record = execute(golden_spec)
    obs = record.observation
    if record.final_exit != 0 or obs is None:
        raise GoldenFailed(
            f"the golden run of {spec.preset} ({spec.durable_mode}, {spec.backend}) did not "
            f"finish cleanly (exit {record.final_exit}; {'; '.join(record.verdict.errors[:2])})")
    return of_observation(obs, int(record.started_at * 1e9), kept)


def differences(workload: Workload, a: Golden, b: Golden) -> tuple[list[str], list[int]]:
    """The paths (as the workload compares them) and the calls (their outputs, unless
    marked nondeterministic) in which two clean runs differ."""
    mine = {e.path: e.state() for e in workload.comparable(a.entries)}
    theirs = {e.path: e.state() for e in workload.comparable(b.entries)}
    paths = sorted(p for p in mine.keys() | theirs.keys() if mine.get(p) != theirs.get(p))
    steps = sorted(i for i in a.results.keys() | b.results.keys()
                   if not workload.calls[i].nondeterministic
                   and a.results.get(i) != b.results.get(i))
    return paths, steps


def probe(workload_path: str, execute: Execute, *, work_dir: Path,
          durable_mode: str = "checkpoint", backend: str = "local"
          ) -> tuple[list[str], list[int]]:
    """Run the workload twice without faults and say where the runs differ: the paths to
    declare volatile (exact, glob-escaped) and the calls whose output is nondeterministic.
    ``GoldenFailed`` when a clean run does not finish."""
    workload = load(workload_path)
    spec = RunSpec(index=0, seed=1, campaign_mode=durable_mode, durable_mode=durable_mode,
                   backend=backend, preset=PREFIX + workload.path, steps=None,
                   work_dir=work_dir)
    _first, paths, steps = _twice(spec, workload, tuple(range(len(workload.calls))), work_dir,
                                  execute)
    return [glob.escape(p) for p in paths], steps


def of_observation(obs: Observation, started_ns: int, kept: tuple[int, ...]) -> Golden:
    """The oracle a clean run's observation gives (``started_ns``: when the run began;
    ``kept``: the workload's calls it made, in order: a call's step is its position)."""
    entries = [e if e.mtime_ns is not None and e.mtime_ns < started_ns - SET_MTIME_MARGIN_NS
               else replace(e, mtime_ns=None) for e in obs.workspace]
    results = {kept[c.step]: Expected(c.content, c.result == "fail", None, c.content_sha256)
               for c in obs.calls if c.result in ("ok", "fail")}
    return Golden(entries, results)
