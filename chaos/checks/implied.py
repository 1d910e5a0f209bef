"""The state and results the committed log implies, computed once for every check.

Start from the scenario's initial workspace and apply, in log order (by result entry), the
effect of every call that has a committed, non-interrupted result; each such call's result
must be the one its step gives on the workspace it ran on (``scenarios.steps.Step.apply``).
A workload's calls have no model: its golden run (``chaos.golden``) gives the final state
and each call's result instead.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from scenarios import Scenario

from .model import Implied, ObservedCall

if TYPE_CHECKING:
    from ..golden import Golden


def implied(scenario: Scenario, calls: list[ObservedCall],
            golden: Golden | None = None) -> Implied:
    if scenario.workload is not None and golden is None:
        raise ValueError("a workload's run is checked against its golden run; none was given")
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
        if golden is None:
            out.expected[call.call_id] = step.apply(out.workspace)
        elif step.index not in golden.results:
            out.strangers.append(f"call {call.call_id} of step {call.step} took effect, but "
                                 "the golden run it is compared with left that call out")
            continue
        elif not step.params.get("nondeterministic"):
            out.expected[call.call_id] = golden.results[step.index]
        out.applied.append((call, step))
    out.state = out.workspace.entries() if golden is None else list(golden.entries)
    return out
