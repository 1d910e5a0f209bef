"""What every campaign mode is (``CampaignMode``); each mode is a subclass in this package."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal

from chaos.faults.plans import FaultPlan
from chaos.faults.rendezvous import Answer, Hit, Rendezvous
from chaos.run.context import RunContext
from chaos.run.record import RunRecord
from chaos.run.spec import RunSpec

#: The SUMMARY's groups of keys a mode adds (``chaos.campaign.summary.printed_keys``).
Group = Literal["covered", "stale", "redrive", "pauses"]


class CampaignMode:
    """A campaign mode. Its attributes describe it; its methods are the run's phases that
    differ between modes (the defaults are the standard modes')."""

    name: str
    #: The agent a run plays when ``--preset`` names none.
    preset: str = "default"
    #: The adapter mode its drivers run when ``--durable-mode`` names none.
    durable: str = "checkpoint"
    #: Its drawn plans may also hold faults (``--pause-spaces``...; ``plans.HELD_KINDS``).
    holds: bool = False
    #: Where they hold faults, they may fall at seeded times too (else at points alone: the
    #: mode's own code or a coordinator launches the drivers, no timer starts with them).
    held_timed: bool = True
    #: Its plans' faults fire only once the mode's own code opens them
    #: (``FaultSchedule.open``).
    gated: bool = False
    #: One run per reachable (failpoint, occurrence), instead of plans drawn from seeds.
    enumerates: bool = False
    #: It runs on the virtual backend (no Space: the workspace in the log).
    virtual: bool = False
    #: The one backend it needs (None: any with Spaces), and why.
    backend: str | None = None
    backend_why: str = ""
    #: Its runs have an agent (a scenario, calls, an observation).
    has_agent: bool = True
    #: Every run ends with a clean driver, even after one that finished the session.
    always_clean: bool = False
    #: It takes the coordinator's options (``--store``, ``--coordinators``,
    #: ``--redrive-kind``).
    coordinated: bool = False
    #: The SUMMARY groups it adds.
    groups: frozenset[Group] = frozenset()

    def plan(self, run: RunContext) -> FaultPlan:
        """The run's plan before its held faults (``plans.with_held_faults``)."""
        return FaultPlan(run.spec.seed, ())

    def drive(self, run: RunContext, rv: Rendezvous) -> int | None:
        """Phase 2: the drivers under the plan's faults; the last one's exit code."""
        return run.attempts(rv.address)

    def on_hit(self, run: RunContext) -> Callable[[Hit], Answer] | None:
        """The rendezvous's handler, when the mode has one of its own (else the schedule's)."""
        return None

    def whole_run(self, run: RunContext) -> RunRecord | None:
        """The run's record when the mode makes the whole run itself (no agent, no
        drivers); None: the runner's phases."""
        return None

    def default_preset(self, kind: str | None) -> str:
        """The agent of a run of ``kind`` (``--stale-kind``) when ``--preset`` names none."""
        return self.preset

    def kind(self, spec: RunSpec) -> str | None:
        """The run's kind within the mode, as its record names it (stale's)."""
        return None

    def report(self, records: list[dict[str, Any]]) -> list[str]:
        """Lines the campaign prints before its SUMMARY."""
        return []
