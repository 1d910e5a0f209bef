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

Golden runs are cached in the campaign's process (per key, computed once even when several
runs ask for it at once): a campaign of N runs costs one golden run per interruption
pattern, usually one or two.
"""

from __future__ import annotations

import hashlib
import threading
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from scenarios import Expected, Workload
from scenarios.workload import PREFIX
from spacesd.protocol import ScanEntry

from .faults import FaultPlan
from .run_spec import RunSpec

if TYPE_CHECKING:
    from .checker import Observation

#: mtimes of a golden run older than its start by more than this are a program's own.
SET_MTIME_MARGIN_NS = 24 * 3600 * 10**9


class GoldenFailed(Exception):
    """The workload does not run cleanly without faults: the oracle itself has no answer.
    The message says how the golden run ended; run the workload alone to see why."""


@dataclass(frozen=True)
class Golden:
    #: The final workspace: mtimes a program set kept, the others None.
    entries: list[ScanEntry]
    #: step index -> the result the call gave
    results: dict[int, Expected]


_cache: dict[tuple, Golden] = {}
_computing: dict[tuple, threading.Lock] = {}
_lock = threading.Lock()


def golden_for(spec: RunSpec, workload: Workload, interrupted: frozenset[int]) -> Golden:
    """The golden run of ``workload`` (``spec``'s) without the calls of ``interrupted``
    (their step indices), computed once per key in this process."""
    kept = tuple(i for i in range(len(workload.calls)) if i not in interrupted)
    spec = replace(spec, preset=PREFIX + workload.path)
    key = (workload.path, workload.digest, spec.durable_mode, spec.backend, spec.snapshots,
           kept)
    with _lock:
        if key in _cache:
            return _cache[key]
        mine = _computing.setdefault(key, threading.Lock())
    with mine:
        with _lock:
            if key in _cache:
                return _cache[key]
        golden = _compute(spec, kept, key)
        with _lock:
            _cache[key] = golden
        return golden


def _compute(spec: RunSpec, kept: tuple[int, ...], key: tuple) -> Golden:
    from .runner import Run  # the runner imports this module

    name = "golden-" + hashlib.sha256(repr(key).encode()).hexdigest()[:16]
    golden_spec = replace(spec, index=0, plan=FaultPlan(spec.seed, ()), keep=False,
                          keep_steps=kept, simple_steps=(), golden=True, lead_misses=(),
                          work_dir=spec.work_dir.parent / "goldens" / name)
    record = Run(golden_spec).execute()
    obs = record.observation
    if record.final_exit != 0 or obs is None:
        raise GoldenFailed(
            f"the golden run of {spec.preset} ({spec.durable_mode}, {spec.backend}) did not "
            f"finish cleanly (exit {record.final_exit}; {'; '.join(record.verdict.errors[:2])})")
    return of_observation(obs, int(record.started_at * 1e9), kept)


def of_observation(obs: Observation, started_ns: int, kept: tuple[int, ...]) -> Golden:
    """The oracle a clean run's observation gives (``started_ns``: when the run began;
    ``kept``: the workload's calls it made, in order: a call's step is its position)."""
    entries = [e if e.mtime_ns is not None and e.mtime_ns < started_ns - SET_MTIME_MARGIN_NS
               else replace(e, mtime_ns=None) for e in obs.workspace]
    results = {kept[c.step]: Expected(c.content, c.result == "fail", None, c.content_sha256)
               for c in obs.calls if c.result in ("ok", "fail")}
    return Golden(entries, results)
