"""Redrive mode: the coordinator drives the session while drivers, Spaces and the
coordinator itself are attacked (``chaos.modes.redrive``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from chaos.faults.plans import FaultPlan, reachable_points
from chaos.faults.rendezvous import Answer, Hit, Rendezvous
from chaos.modes.mode import CampaignMode, Group
from chaos.modes.redrive import DriverTracker, draw_redrive_plan, kind_of, run_redrive
from chaos.modes.redrive_stats import redrive_table
from chaos.run.context import RunContext


class Redrive(CampaignMode):
    name = "redrive"
    holds = True
    # The coordinator launches the drivers: no timer starts with them.
    held_timed = False
    coordinated = True
    groups: frozenset[Group] = frozenset({"redrive", "pauses"})

    def plan(self, run: RunContext) -> FaultPlan:
        spec = run.spec
        return draw_redrive_plan(spec.seed, kind_of(spec.seed, spec.redrive_kind),
                                 reachable_points(run.scenario, spec.durable_mode))

    def drive(self, run: RunContext, rv: Rendezvous) -> int | None:
        return run_redrive(run, rv)

    def on_hit(self, run: RunContext) -> Callable[[Hit], Answer] | None:
        # The tracker tells the coordinator's drivers apart first.
        return DriverTracker(run).on_hit

    def report(self, records: list[dict[str, Any]]) -> list[str]:
        return redrive_table(records)
