"""Fault plans (the nemesis's schedule), drawn from a run's seed.

A plan is plain data: a list of faults, each with a trigger and an action.

Triggers:
- ``failpoint``: the ``occurrence``-th time any driver of the run reaches ``point`` (counted
  across attempts, so a plan can aim at recovery in a later driver);
- ``time``: ``delay`` seconds after the ``attempt``-th driver was launched, wherever it is.

Actions: ``kill_driver`` (SIGKILL of the driver's process group), ``kill_daemon`` (only the
Space's daemon; its commands survive), ``restart_space`` (daemon and every process gone,
disk kept), ``delete_space`` (the Space is lost). A Space fault at a failpoint may also kill
the driver (``kill_driver=True``) or let it run into the fault itself.

Drawing is pure: ``random.Random`` seeded from (seed, mode), so a plan is reproduced from
its seed alone, and ``exhaustive_plans`` enumerates plans without any randomness.
"""

from __future__ import annotations

import random
from dataclasses import asdict, dataclass
from typing import Any, Literal

from durable.failpoints import POINTS
from scenarios.plan import Scenario

Action = Literal["kill_driver", "kill_daemon", "restart_space", "delete_space"]
SPACE_ACTIONS: tuple[Action, ...] = ("kill_daemon", "restart_space", "delete_space")


@dataclass(frozen=True)
class Fault:
    action: Action
    trigger: Literal["failpoint", "time"]
    point: str | None = None
    occurrence: int | None = None
    attempt: int | None = None
    delay: float | None = None
    #: For a Space fault: also SIGKILL the driver (else it meets the fault itself).
    kill_driver: bool = True

    def describe(self) -> str:
        where = (f"{self.point}#{self.occurrence}" if self.trigger == "failpoint"
                 else f"attempt {self.attempt} +{self.delay:.2f}s")
        extra = " +kill driver" if self.action != "kill_driver" and self.kill_driver else ""
        return f"{self.action}{extra} at {where}"


@dataclass(frozen=True)
class FaultPlan:
    seed: int
    faults: tuple[Fault, ...]
    backoff: float = 0.0
    max_attempts: int = 8

    def to_json(self) -> dict[str, Any]:
        return {"seed": self.seed, "faults": [asdict(f) for f in self.faults],
                "backoff": self.backoff, "max_attempts": self.max_attempts}

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> FaultPlan:
        return cls(raw["seed"], tuple(Fault(**f) for f in raw["faults"]), raw["backoff"],
                   raw["max_attempts"])


def reachable_points(scenario: Scenario, durable_mode: str) -> dict[str, int]:
    """Each failpoint a run of ``scenario`` reaches without faults, with how often (an
    estimate for drawing; ``exhaustive`` measures instead of estimating)."""
    steps = len(scenario.steps)
    space = [s for s in scenario.steps if s.touches_workspace()]
    bash = [s for s in space if s.tool == "bash"]
    files = [s for s in space if s.tool != "bash"]
    out = {"call.begin": steps, "call.intent": steps, "call.returned": steps,
           "call.result": steps, "space.start_mark": len(space),
           "space.before_spawn": len(bash), "space.running": len(bash),
           "space.exited": len(bash), "space.file_op": len(files)}
    if durable_mode != "transactional":
        for p in ("space.outcome", "checkpoint.before", "checkpoint.after"):
            out[p] = len(space)
        out["checkpoint.during"] = len(space)
    return {p: n for p, n in out.items() if n > 0 and p in POINTS}


RECOVERY_POINTS = ("recovery.begin", "recovery.decided", "recovery.reimage", "recovery.restore")


def draw_plan(seed: int, scenario: Scenario, durable_mode: str, *,
              allow_delete: bool = True, long_seconds: float = 1.0) -> FaultPlan:
    """The seeded fault plan of one run: one to three faults, most at failpoints."""
    rng = random.Random(f"faults:{durable_mode}:{seed}")
    points = reachable_points(scenario, durable_mode)
    names = sorted(points)
    faults: list[Fault] = []
    for _ in range(rng.choice((1, 1, 2, 2, 3))):
        roll = rng.random()
        if roll < 0.70:
            action: Action = "kill_driver"
        else:
            choices = [a for a in SPACE_ACTIONS if allow_delete or a != "delete_space"]
            action = rng.choice(choices)
        kill = action == "kill_driver" or rng.random() < 0.5
        trigger = rng.random()
        if trigger < 0.60:
            point = rng.choice(names)
            faults.append(Fault(action, "failpoint", point, rng.randint(1, points[point]),
                                kill_driver=kill))
        elif trigger < 0.75 and faults:
            # a crash during the recovery of an earlier one
            faults.append(Fault(action, "failpoint", rng.choice(RECOVERY_POINTS), 1,
                                kill_driver=kill))
        else:
            budget = max(1.0, len(scenario.steps) * 0.15 + long_seconds)
            faults.append(Fault(action, "time", attempt=rng.randint(1, 2),
                                delay=round(rng.uniform(0.05, budget), 3), kill_driver=kill))
    backoff = rng.choice((0.0, 0.0, 0.05))
    return FaultPlan(seed, tuple(faults), backoff, max_attempts=len(faults) + 4)


def exhaustive_plans(seed: int, counts: dict[str, int], *, recovery: bool = True
                     ) -> list[FaultPlan]:
    """One plan per (point, occurrence) measured in a fault-free run: kill exactly there.
    With ``recovery``, each plan also kills the next driver at its first recovery point."""
    plans: list[FaultPlan] = []
    for point in sorted(counts):
        if point.startswith("recovery."):
            continue
        for occ in range(1, counts[point] + 1):
            faults = [Fault("kill_driver", "failpoint", point, occ)]
            if recovery:
                faults.append(Fault("kill_driver", "failpoint", "recovery.decided", 1))
            plans.append(FaultPlan(seed, tuple(faults), 0.0, max_attempts=len(faults) + 3))
    return plans
