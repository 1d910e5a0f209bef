"""The state and results the committed log implies, computed once for every check.

Start from the scenario's initial workspace and apply, in log order (by result entry), the
effect of every call that has a committed, non-interrupted result; each such call's result
must be the one its step gives on the workspace it ran on (``scenarios.steps.Step.apply``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from scenarios import Expected, Scenario, Step, WorkspaceModel

from ..checker import ObservedCall


@dataclass
class Implied:
    #: The workspace the log implies.
    workspace: WorkspaceModel
    #: call id → the result its step gives where the call ran (committed, non-interrupted).
    expected: dict[str, Expected] = field(default_factory=dict)
    #: Committed non-interrupted calls in log order, with their steps.
    applied: list[tuple[ObservedCall, Step]] = field(default_factory=list)
    #: Calls that do not match the scenario (unknown step, other arguments).
    strangers: list[str] = field(default_factory=list)


def implied(scenario: Scenario, calls: list[ObservedCall]) -> Implied:
    steps = dict(enumerate(scenario.steps))  # a call's step is its position in the script
    out = Implied(scenario.initial.copy())
    committed = [c for c in calls if c.result in ("ok", "fail")]
    for call in sorted(committed, key=lambda c: c.result_entry or 0):
        step = steps.get(call.step)
        if step is None:
            out.strangers.append(f"call {call.call_id} claims step {call.step}, not in the "
                                 "scenario")
            continue
        if call.args != step.args or call.tool != step.tool:
            out.strangers.append(f"call {call.call_id} of step {call.step} has arguments that "
                                 "differ from the scenario")
            continue
        out.expected[call.call_id] = step.apply(out.workspace)
        out.applied.append((call, step))
    return out
