"""The standard modes (the adapter in one mode under drawn faults), the exhaustive one
(a kill at every reachable failpoint) and the machine check."""

from __future__ import annotations

from chaos.faults.plans import FaultPlan, draw_plan, on_machine
from chaos.modes.machine_check import run_machine_check
from chaos.modes.mode import CampaignMode, Group
from chaos.run.context import RunContext
from chaos.run.record import RunRecord
from chaos.space_providers import backend


class Standard(CampaignMode):
    """``transactional``, ``checkpoint``, ``auto``: drivers of the adapter in that mode,
    relaunched under a plan drawn from the seed (``plans.draw_plan``)."""

    holds = True

    def __init__(self, name: str, *, preset: str = "default", virtual: bool = False) -> None:
        self.name, self.preset, self.durable, self.virtual = name, preset, name, virtual

    def plan(self, run: RunContext) -> FaultPlan:
        spec = run.spec
        plan = draw_plan(spec.seed, run.scenario, spec.durable_mode,
                         long_seconds=run.preset.long_seconds)
        # Where Spaces are machines, daemon-level kills become whole-machine faults
        # (``plans.on_machine``).
        return on_machine(plan) if backend(spec.backend).machines else plan


class Exhaustive(CampaignMode):
    """One run per reachable (failpoint, occurrence): the campaign makes each plan (a kill
    there, and one during the next driver's recovery)."""

    name = "exhaustive"
    preset = "small"
    enumerates = True
    virtual = True
    groups: frozenset[Group] = frozenset({"covered"})


class Machine(CampaignMode):
    """A process survives a whole-machine checkpoint and restore (``chaos.modes.machine_check``):
    no agent, no driver."""

    name = "machine"
    backend = "microvm"
    backend_why = "checks whole-machine checkpoints"
    has_agent = False

    def whole_run(self, run: RunContext) -> RunRecord | None:
        return run_machine_check(run)
