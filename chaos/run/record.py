"""A run's record: one line of ``runs.jsonl``, what reports and ``chaos analyze`` read.

``to_json`` gives exactly the line campaigns have always written (the same keys, the same
values), so records of older campaigns and of this one read alike. History times are
seconds after ``started_at``; ``fired`` holds the indexes of the plan's faults that fired
(every other one is skipped in the history, with its reason).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from chaos.checks.model import Observation, Verdict
from chaos.faults.plans import FaultPlan
from durable.record_codec import JsonRecord


@dataclass(frozen=True)
class RunRecord(JsonRecord):
    index: int
    seed: int
    campaign_mode: str
    #: Stale mode's kind; None in every other mode.
    stale_kind: str | None
    durable_mode: str
    backend: str
    preset: str
    #: Steps of the run's scenario.
    steps: int
    plan: FaultPlan
    #: Operations ``{process, type, f, value, time}`` of the drivers, the nemesis and the
    #: agent's calls, by time.
    history: list[dict[str, Any]]
    #: The adapter's recovery events, as committed to the log.
    recoveries: list[dict[str, Any]]
    counts: dict[str, int]
    #: One per fault fired: when, whether it killed a driver, the next step, the end.
    latencies: list[dict[str, Any]]
    #: How often each failpoint was reached, across every process of the run.
    points_hit: dict[str, int]
    final_exit: int | None
    fired: list[int]
    verdict: Verdict
    #: What every check ran on; None when the run did not get that far.
    observation: Observation | None
    seconds: float
    #: Unix time of the run's start.
    started_at: float
    #: The run's directory, kept when the run did not pass (or ``keep``).
    run_dir: str | None
    #: Ended by the campaign's interruption, not by its own course.
    interrupted: bool
