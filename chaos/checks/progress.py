"""``run``: the clean driver finished the session, and the run made progress (a run that
committed nothing proves nothing)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from chaos.checks.model import CheckInput


def check(inp: CheckInput) -> list[str]:
    obs = inp.obs
    errors: list[str] = []
    if obs.final_exit != 0 or not obs.final_outcome_done:
        errors.append(f"the clean driver did not finish the session (exit {obs.final_exit})")
    if not any(c.result is not None for c in obs.calls):
        errors.append("no step was committed: a run that made no progress proves nothing")
    return errors
