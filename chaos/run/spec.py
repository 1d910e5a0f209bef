"""What one run is: plain data, from the campaign's configuration or a stored record."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from chaos.faults.plans import FaultPlan, HeldAction
from durable.session_log import DEFAULT_LOG_STORAGE


@dataclass(frozen=True)
class RunSpec:
    index: int
    seed: int
    campaign_mode: str
    durable_mode: str
    backend: str
    preset: str
    steps: int | None
    work_dir: Path
    #: The fault plan; None: drawn from the seed (stale mode: no faults).
    plan: FaultPlan | None = None
    keep: bool = False
    #: The driver program: a module run with ``-m``, or a path to a ``.py`` file.
    driver: str = "chaos.driver"
    #: Stale mode's kind (``stale_kinds.KINDS``).
    stale_kind: str = "race"
    #: Checkpoints as ``workspace`` or ``machine`` snapshots (microvm); ``auto``: the
    #: backend's (``space_providers.snapshot_kind``).
    snapshots: str = "auto"
    #: Redrive mode's kind (``redrive.KINDS``); None: drawn from the seed.
    redrive_kind: str | None = None
    #: Redrive mode: the PostgreSQL server of the coordinator stores (a schema per run);
    #: None: a SQLite store in each run's directory.
    redrive_store: str | None = None
    #: Redrive mode: coordinators sharing the run's store.
    coordinators: int = 1
    #: Only these steps of the scenario (their indices), for a shrunk run; None: all.
    keep_steps: tuple[int, ...] | None = None
    #: Steps (indices, among those kept) replaced by the simplest step, a write of their
    #: marker, for a shrunk run (``scenarios.steps.simple_step``).
    simple_steps: tuple[int, ...] = ()
    #: Exhaustive: why earlier tries of this run missed their lead fault (retried then).
    lead_misses: tuple[str, ...] = ()
    #: The drivers' log storage (``durable.session_log``): ``sqlite`` or ``jsonl``.
    log_storage: str = DEFAULT_LOG_STORAGE
    #: A workload's golden run (``chaos.checks.golden``): no faults, no checks; its observation is
    #: the oracle of the faulted runs.
    golden: bool = False
    #: A drawn plan also holds these kinds of fault (``plans.HELD_KINDS``,
    #: ``plans.with_held_faults``); with one that outlasts requests, the faulted drivers wait
    #: ``plans.HOLD_REQUEST_TIMEOUT_S`` for an answer.
    held: tuple[HeldAction, ...] = ()
