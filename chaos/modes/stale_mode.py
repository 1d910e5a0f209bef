"""Stale mode: another driver, or another session, meets the run's session
(``chaos.modes.stale_kinds`` has its kinds)."""

from __future__ import annotations

from chaos.faults.rendezvous import Rendezvous
from chaos.modes.mode import CampaignMode, Group
from chaos.modes.stale_kinds import run_kind
from chaos.run.context import RunContext
from chaos.run.spec import RunSpec


class Stale(CampaignMode):
    name = "stale"
    durable = "auto"
    holds = True
    # Its kinds launch the drivers and open the plan's faults once the older one is parked.
    held_timed = False
    gated = True
    # The session's re-drive after the other party must change nothing either.
    always_clean = True
    groups: frozenset[Group] = frozenset({"stale", "pauses"})

    def drive(self, run: RunContext, rv: Rendezvous) -> int | None:
        return run_kind(run, rv)

    def kind(self, spec: RunSpec) -> str | None:
        return spec.stale_kind

    def default_preset(self, kind: str | None) -> str:
        # The detached kind needs an agent with a detached step.
        return "detached" if kind == "detached" else self.preset
