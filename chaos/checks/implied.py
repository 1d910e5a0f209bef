"""The state and results the committed log implies, computed once for every check.

Start from the scenario's initial workspace and apply, in log order (by result entry), the
effect of every call that has a committed, non-interrupted result; each such call's result
must be the one its step gives on the workspace it ran on (``scenarios.steps.Step.apply``).
A workload's calls have no model: its golden run (``chaos.checks.golden``) gives the final state
and each call's result instead.

A run whose workspace disk was filled (``Observation.disk_filled``) may have calls that
met ``ENOSPC``: such a call's result is its real error, which says so. A write or an edit
that failed so took no effect (the tools are atomic); a command took what effect it got to
before the disk stopped it, so the paths its step changes are unsure from then on
(``WorkspaceModel.cut_short``), and so are those of a later step whose effect reads one.
Neither kind of call has a result the model can give. The scripted agent goes on as if
each call had done its whole work, so a later edit of a file whose write a full disk
refused fails: it gets the edit tool's own error (``_failed_edit``).
"""

from __future__ import annotations

import errno
import os
from typing import TYPE_CHECKING

from chaos.checks.model import Implied, ObservedCall
from durable.coding_tools import apply_edits
from durable.errors import ToolError
from durable.tools import error_result
from scenarios import Expected, Scenario, Step, WorkspaceModel

if TYPE_CHECKING:
    from chaos.checks.golden import Golden


#: What every program says of a write that met a full disk (bash, tee, cp, Python).
NO_SPACE = os.strerror(errno.ENOSPC)


def implied(scenario: Scenario, calls: list[ObservedCall],
            golden: Golden | None = None, *, disk_filled: bool = False) -> Implied:
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
            cut = disk_filled and call.result == "fail" and NO_SPACE in call.content
            expected = apply_step(step, out, cut, call.call_id)
            if expected is not None:
                out.expected[call.call_id] = expected
        elif step.index not in golden.results:
            out.strangers.append(f"call {call.call_id} of step {call.step} took effect, but "
                                 "the golden run it is compared with left that call out")
            continue
        elif not step.params.get("nondeterministic"):
            out.expected[call.call_id] = golden.results[step.index]
        out.applied.append((call, step))
    out.state = out.workspace.entries() if golden is None else list(golden.entries)
    return out


def apply_step(step: Step, out: Implied, cut: bool, call_id: str) -> Expected | None:
    """Apply ``step``'s effect (run as call ``call_id``) to the implied workspace; the result
    it gives, or None where no model can say (``cut``: a full disk cut the call short)."""
    ws = out.workspace
    if cut:
        out.cut_short.add(call_id)
    if cut and step.tool != "bash":
        return None  # an atomic tool that failed: no effect
    after = ws.copy()
    after.read_unsure = False
    try:
        expected = step.apply(after)
    except ValueError:  # an edit whose text the model cannot find
        if after.read_unsure:
            return None  # its outcome depends on an unsure file: no effect is one of them
        if step.tool != "edit" or not out.cut_short:
            raise
        return _failed_edit(step, ws)
    if cut or after.read_unsure:
        out.workspace = ws.cut_short(after)
        return None
    out.workspace = after
    return expected


def _failed_edit(step: Step, ws: WorkspaceModel) -> Expected | None:
    """An edit of this agent's that an earlier call a full disk cut short left without its
    text (the write it edits took no effect): it fails as the tool fails, and changes
    nothing. None when the file is not there at all: the tool's error then names the
    Space, which no model knows."""
    data = ws.content(step.args["path"])
    if data is None:
        return None
    try:
        apply_edits(data.decode(), step.args["edits"], step.args["path"])
    except ToolError as exc:
        return Expected(error_result(exc).content, True)
    raise ValueError(f"{step.marker}: the model and the edit tool disagree on its text")
