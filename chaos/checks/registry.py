"""The named checks of the invariant, registered in order (``_checks``) and run over one
observation (``run_checks``).

A check is a function of a ``CheckInput`` that returns its errors (empty: it holds) or
raises ``Undecided`` when the observation lacks what it needs (then the run is
``unknown``, never silently valid). See ``chaos.checks.checker`` for what each one guarantees.
"""

from __future__ import annotations

import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from chaos.checks import (
    coordinator,
    durable_log,
    fenced,
    never_twice,
    once_faithful,
    progress,
    stale_writers,
    state,
)
from chaos.checks.implied import implied
from chaos.checks.model import CheckInput, Observation, Undecided, Valid, Verdict, merge
from scenarios import Scenario

if TYPE_CHECKING:
    from chaos.checks.golden import Golden


@dataclass(frozen=True)
class Check:
    id: str
    name: str
    fn: Callable[[CheckInput], list[str]]


def _checks() -> list[Check]:
    return [
        Check("run", "finished", progress.check),
        Check("G1", "state", state.check),
        Check("G2", "never twice", never_twice.check),
        Check("G3", "fenced before restore", fenced.check),
        Check("G4", "stale writers", stale_writers.check),
        Check("G5", "once and faithful", once_faithful.check),
        Check("G6", "coordinator", coordinator.check),
        Check("G7", "durable", durable_log.check),
    ]


def run_checks(scenario: Scenario, obs: Observation, campaign_mode: str,
               skip: tuple[str, ...] = (), golden: Golden | None = None) -> Verdict:
    """Every check but those in ``skip`` (``chaos.checks.checker.check`` says when); a workload's
    ``golden`` run is its oracle (``chaos.checks.golden``)."""
    try:
        inp = CheckInput(scenario, obs, campaign_mode, implied(scenario, obs.calls, golden,
                                                           disk_filled=obs.disk_filled))
    except Exception as exc:  # noqa: BLE001 - the checker's own failure is "unknown", never an abort
        return Verdict("unknown", [f"checker crashed: {type(exc).__name__}: {exc}",
                                   traceback.format_exc(limit=5)], ["checker"])
    errors: list[str] = []
    failed: list[str] = []
    verdicts: list[Valid] = []
    for c in _checks():
        if c.id in skip:
            continue
        try:
            found = c.fn(inp)
            valid: Valid = not found
        except Undecided as exc:
            found, valid = [f"undecided: {exc}"], "unknown"
        except Exception as exc:  # noqa: BLE001 - a check's own crash: its verdict is unknown
            found = [f"check crashed: {type(exc).__name__}: {exc}",
                     traceback.format_exc(limit=5)]
            valid = "unknown"
        verdicts.append(valid)
        if valid is not True:
            failed.append(c.id)
            errors += [f"{c.id} {c.name}: {e}" for e in found]

    return Verdict(merge(verdicts), errors, failed)
