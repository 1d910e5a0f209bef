"""The second session of a redrive race: another conversation driven on the run's Space
after the first (``chaos.modes.redrive``), and how the checker draws its agent again
(``chaos.checks.checker``)."""

from __future__ import annotations

from typing import Any

from scenarios import Scenario, generate, load

#: The race's second session: its agent (no edits: the first session changed doc.txt), its
#: seed (added to the run's) and the index of its first step (its markers never meet the
#: first session's).
SECOND_PRESET = "second"
SECOND_SEED_OFFSET = 7919
SECOND_FIRST_STEP = 100


def second_scenario_params(seed: int) -> dict[str, Any]:
    """How the race's second session's agent is drawn (the checker draws it again)."""
    steps = load(SECOND_PRESET).steps
    return {"seed": seed + SECOND_SEED_OFFSET, "preset": SECOND_PRESET,
            "steps": SECOND_FIRST_STEP + steps,
            "keep": [SECOND_FIRST_STEP + i for i in range(steps)]}


def second_scenario(params: dict[str, Any]) -> Scenario:
    return generate(params["seed"], load(params["preset"]), steps=params["steps"],
                    keep=tuple(params["keep"]))
