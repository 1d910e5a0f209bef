"""The invariant checker: does the workspace equal what the committed log implies?

It works on an ``Observation`` (plain data taken from the log, the Space and the effects file
after a clean driver finished the run), so ``chaos analyze`` can re-check stored records
without re-running anything. The invariant (DESIGN.md):

1. the workspace hash equals the hash of the state implied by the committed log: the
   scenario's initial workspace with, in log order, the effect of every call that has a
   committed, non-interrupted result;
2. every step took effect exactly once (markers are unique; appends make duplicates visible;
   a never-tool ran at most once, exactly once when its result says it ran);
3. no call ended in an error other than ``interrupted``, and in transactional mode no
   workspace call ended interrupted either;
4. in transactional mode the log's image equals the workspace.

Plus: the run made progress (a committed step) and finished (a clean driver exited 0).

Verdicts are three-valued (Jepsen): ``True``, ``False``, or ``"unknown"`` when the checker
itself failed; a crashing checker never aborts the campaign.
"""

from __future__ import annotations

import traceback
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from scenarios.plan import LOG_FILE, Scenario
from spacesd.protocol import workspace_hash

Valid = bool | Literal["unknown"]


@dataclass
class ObservedCall:
    step: int
    attempt: int
    call_id: str
    tool: str
    args: dict[str, Any]
    invoked_ms: int
    #: "ok" | "fail" | "info" (interrupted) | None (no result committed)
    result: str | None
    result_entry: int | None = None
    content: str = ""
    completed_ms: int | None = None


@dataclass
class Observation:
    calls: list[ObservedCall]
    #: (path, kind, permission bits, sha256 or target) of the final workspace
    workspace: list[tuple[str, str, int, str]]
    #: file contents of the marker file, for exactly-once counts
    log_txt: str
    #: (tool, marker, call id) of every real run of a host tool
    effects: list[tuple[str, str, str]]
    final_exit: int | None
    final_outcome_done: bool
    end_mode: str | None
    image_hash: str | None
    image_stale: str | None
    mode_switch_entry: int | None = None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> Observation:
        raw = dict(raw)
        raw["calls"] = [ObservedCall(**c) for c in raw["calls"]]
        raw["workspace"] = [tuple(r) for r in raw["workspace"]]
        raw["effects"] = [tuple(e) for e in raw["effects"]]
        return cls(**raw)


@dataclass
class Verdict:
    valid: Valid
    errors: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {"valid": self.valid, "errors": self.errors}


def merge(verdicts: list[Valid]) -> Valid:
    """false > unknown > true."""
    if any(v is False for v in verdicts):
        return False
    if any(v == "unknown" for v in verdicts):
        return "unknown"
    return True


def check(scenario: Scenario, obs: Observation, *, campaign_mode: str) -> Verdict:
    try:
        errors = _check(scenario, obs, campaign_mode)
    except Exception as exc:  # the checker's own failure is "unknown", never an abort
        return Verdict("unknown", [f"checker crashed: {type(exc).__name__}: {exc}",
                                   traceback.format_exc(limit=5)])
    return Verdict(not errors, errors)


def _check(scenario: Scenario, obs: Observation, campaign_mode: str) -> list[str]:
    errors: list[str] = []
    steps = {s.index: s for s in scenario.steps}
    if obs.final_exit != 0 or not obs.final_outcome_done:
        errors.append(f"the clean driver did not finish the session (exit {obs.final_exit})")
    committed = [c for c in obs.calls if c.result is not None]
    if not committed:
        errors.append("no step was committed: a run that made no progress proves nothing")

    # 1. the workspace implied by the log
    expected = scenario.initial.copy()
    ok_by_step: dict[int, int] = {}
    for call in sorted(committed, key=lambda c: c.result_entry or 0):
        step = steps.get(call.step)
        if step is None:
            errors.append(f"call {call.call_id} claims step {call.step}, not in the scenario")
            continue
        if call.args != step.args or call.tool != step.tool:
            errors.append(f"call {call.call_id} of step {call.step} has arguments that differ "
                          "from the scenario")
        if call.result == "ok":
            ok_by_step[call.step] = ok_by_step.get(call.step, 0) + 1
            step.apply(expected)
    want = expected.hash()
    got = workspace_hash(obs.workspace)
    if want != got:
        exp_rows = {r[0]: r for r in expected.rows()}
        obs_rows = {r[0]: r for r in obs.workspace if r[1] in ("file", "symlink")}
        diffs = sorted(p for p in set(exp_rows) | set(obs_rows) if exp_rows.get(p) != obs_rows.get(p))
        errors.append(f"workspace hash {got[:12]} != log-implied {want[:12]}; paths that "
                      f"differ: {diffs[:10]}{' ...' if len(diffs) > 10 else ''}")

    # 2. exactly once
    for step_no, n in sorted(ok_by_step.items()):
        if n > 1:
            errors.append(f"step {step_no} has {n} committed successful calls (want at most 1)")
    lines = obs.log_txt.splitlines()
    for s in scenario.steps:
        if s.kind in ("append", "long", "background"):
            seen = lines.count(s.marker)
            want_n = 1 if ok_by_step.get(s.index) else 0
            if seen != want_n:
                errors.append(f"{s.marker} appears {seen} times in {LOG_FILE}, want {want_n}")
    for c in obs.calls:
        ran = obs.effects.count((c.tool, steps[c.step].marker if c.step in steps else "", c.call_id))
        if c.tool == "record_never":
            if ran > 1:
                errors.append(f"never-tool call {c.call_id} (step {c.step}) ran {ran} times")
            if c.result == "ok" and ran != 1:
                errors.append(f"never-tool call {c.call_id} reports success but ran {ran} times")
        if c.tool == "record_safe" and c.result == "ok" and ran < 1:
            errors.append(f"safe tool call {c.call_id} reports success but never ran")

    # 3. errors and interruptions
    for c in committed:
        if c.result == "fail":
            errors.append(f"step {c.step} ({c.tool}) ended in an error: {c.content[:200]}")
        if c.result == "info":
            if c.tool == "record_never" and "may have partially run" not in c.content:
                errors.append(f"interrupted never-call of step {c.step} does not say it may "
                              "have partly run")
            wrapped = c.tool in ("bash", "write", "edit")
            transactional_here = campaign_mode == "transactional" or (
                campaign_mode in ("auto", "stale", "exhaustive", "redrive")
                and obs.end_mode == "transactional")
            before_switch = (obs.mode_switch_entry is not None and c.result_entry is not None
                             and c.result_entry < obs.mode_switch_entry)
            if wrapped and (transactional_here or before_switch):
                errors.append(f"step {c.step} ({c.tool}) ended interrupted in transactional "
                              "mode; an unknown call must be reverted and run again")
    # 4. the image
    if obs.end_mode == "transactional" and not obs.image_stale and obs.image_hash != got:
        errors.append(f"the log's image {str(obs.image_hash)[:12]} != workspace {got[:12]}")
    return errors
