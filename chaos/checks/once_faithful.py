"""G5 once and faithful: every call with a result took effect exactly once, in order, and
returned what its step gives.

- each step has at most one committed, non-interrupted result (a reissued step is a new
  call; its earlier interrupted call took no effect);
- each appending step's marker is in ``log.txt`` once if its call took effect, else never,
  and the markers are in log order;
- every result equals the one its step gives on the workspace it ran on: a command's real
  exit status and output (also when replayed from the ledger's tail or adopted from a
  recorded outcome; or its output up to where a full state disk lost the rest, followed by
  spacesd's line saying so), a file tool's text; so no unplanned error either, but for the
  real ``ENOSPC`` error of a call a full workspace disk cut short, whose marker may then
  be in ``log.txt`` once or not at all (``chaos.checks.implied``);
- the input was admitted once per request id;
- a never-tool ran at most once (exactly once when it reports success), a safe one at least
  once when it reports success, and an interrupted call says it may have partly run;
- in transactional mode no workspace call ends interrupted: an unknown call is reverted
  and runs again;
- no recovery took a command the campaign held frozen for lost (``frozen_commands``).
"""

from __future__ import annotations

import hashlib
import re
from collections import Counter
from typing import TYPE_CHECKING

from chaos.checks import frozen_commands
from chaos.modes.registry import MODES
from durable.adapter import WRAPPED
from durable.coding_tools import bash_result
from scenarios.steps import APPENDING, Expected
from spacesd.shim import LOST_OUTPUT

if TYPE_CHECKING:
    from chaos.checks.model import CheckInput, ObservedCall

MARKER = re.compile(r"^step-\d+$")


def check(inp: CheckInput) -> list[str]:
    obs, imp = inp.obs, inp.implied
    errors: list[str] = []
    steps = dict(enumerate(inp.scenario.steps))  # by position, as the calls name them

    took_effect = Counter(call.step for call, _ in imp.applied)
    for index, n in sorted(took_effect.items()):
        if n > 1:
            errors.append(f"step {index} has {n} committed results that took effect (want 1)")

    lines = [x for x in obs.log_txt.splitlines() if MARKER.match(x)]
    # A step a full disk cut short appended its marker or not (``implied``).
    cut = {step.marker for call, step in imp.applied if call.call_id in imp.cut_short}
    lines = [x for x in lines if x not in cut]
    want_order = [step.marker for call, step in imp.applied
                  if step.kind in APPENDING and step.marker not in cut]
    for s in inp.scenario.steps:
        if s.kind in APPENDING:
            seen, want = lines.count(s.marker), want_order.count(s.marker)
            if s.marker in cut:
                seen = obs.log_txt.splitlines().count(s.marker)
                if seen > 1:
                    errors.append(f"{s.marker} appears {seen} times in log.txt, want 0 or 1 "
                                  "(a full disk cut its call short)")
            elif seen != want:
                errors.append(f"{s.marker} appears {seen} times in log.txt, want {want}")
    if sorted(lines) == sorted(want_order) and lines != want_order:
        errors.append(f"log.txt has the markers out of log order: {lines} (log order "
                      f"{want_order})")

    for call, step in imp.applied:
        exp = imp.expected.get(call.call_id)
        if exp is None:
            continue  # a workload call whose output is nondeterministic
        got_error = call.result == "fail"
        want_sha = exp.sha256 or hashlib.sha256(exp.content.encode()).hexdigest()
        if call.content_sha256 == want_sha and got_error == exp.is_error:
            continue
        if _output_lost_to_a_full_disk(call, exp):
            continue
        if got_error and not exp.is_error:
            errors.append(f"step {step.index} ({step.kind}) ended in an error: "
                          f"{call.content[:200]!r}")
        else:
            errors.append(f"step {step.index} ({step.kind}) returned {_brief(call.content)}, "
                          f"but the step gives {_brief(exp.content)}"
                          + (f" (exit {exp.exit_code})" if exp.exit_code is not None else ""))

    requests = Counter(r for _, r in obs.inputs)
    for request, n in requests.items():
        if n > 1:
            errors.append(f"the input of request {request!r} was admitted {n} times")
    if len(obs.inputs) != 1:
        errors.append(f"{len(obs.inputs)} input entries; the campaign submits exactly one")

    for c in obs.calls:
        marker = steps[c.step].marker if c.step in steps else ""
        ran = obs.effects.count((c.tool, marker, c.call_id))
        if c.tool == "record_never":
            if ran > 1:
                errors.append(f"never-tool call {c.call_id} (step {c.step}) ran {ran} times")
            if c.result == "ok" and ran != 1:
                errors.append(f"never-tool call {c.call_id} reports success but ran {ran} "
                              "times")
        if c.tool == "record_safe" and c.result == "ok" and ran < 1:
            errors.append(f"safe tool call {c.call_id} reports success but never ran")
        if c.result == "info" and "may have partially run" not in c.content:
            errors.append(f"interrupted call of step {c.step} ({c.tool}) does not say it may "
                          "have partly run")
        if c.result == "info" and c.tool in WRAPPED and _transactional_at(inp, c.result_entry):
            errors.append(f"step {c.step} ({c.tool}) ended interrupted in transactional mode; "
                          "an unknown call must be reverted and run again")
    return errors + frozen_commands.check(obs)


#: The line a command's output ends with when a full state disk lost the rest.
LOST = re.compile(re.escape(LOST_OUTPUT).replace(re.escape("{}"), r"(\d+)"))


def _output_lost_to_a_full_disk(call: ObservedCall, exp: Expected) -> bool:
    """Whether ``call`` is its command's real result with the output a full state disk had
    no room for lost, as spacesd says it (``spacesd.shim.LOST_OUTPUT``): the step's output
    up to the byte the line names, then the line, and the step's exit status."""
    found = LOST.search(call.content)
    if exp.output is None or found is None:
        return False
    kept = exp.output.encode()[:int(found.group(1))].decode("utf-8", "replace")
    result = bash_result(exp.exit_code, kept + found.group(0))
    return (hashlib.sha256(result.content.encode()).hexdigest() == call.content_sha256 and
            result.is_error == (call.result == "fail"))


def _transactional_at(inp: CheckInput, entry: int | None) -> bool:
    """Whether the conversation was in transactional mode when ``entry`` was committed."""
    obs = inp.obs
    mode = MODES.get(inp.campaign_mode)
    if mode is not None and mode.durable == "transactional":  # the adapter never leaves it
        return True
    if obs.mode_switch_entry is not None and entry is not None:
        return entry < obs.mode_switch_entry
    return obs.end_mode == "transactional"  # one mode all along (a checkpoint run never is)


def _brief(text: str) -> str:
    flat = text.replace("\n", "\\n")
    return repr(flat if len(flat) <= 80 else flat[:38] + " ... " + flat[-38:])
