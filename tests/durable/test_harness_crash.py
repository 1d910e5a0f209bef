"""Crash a real harness process with SIGKILL at chosen points and reopen its log.

The child (``harness_child.py``) runs a four-step script: a never-replay host tool, a
safe-replay host tool, a coding ``write`` and another never-tool. The test kills it at a
failpoint of one call (before the intent, right after the intent, in the middle of the tool,
after the tool returned but before its result), then runs a clean process on the same log
and checks what every call did, from the side-effect file and the log.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from pathlib import Path

import pytest

from chaos.faults.rendezvous import Hit, Rendezvous
from chaos.run.processes import OwnedProcess
from durable.harness import Harness
from durable.models import ScriptedModel
from durable.storage.sqlite import SqliteStorage

CHILD = str(Path(__file__).with_name("harness_child.py"))
ROOT = str(Path(__file__).resolve().parents[2])
# step -> (effect line written when it really runs, replay rule)
STEPS = {0: ("never:n0", "never"), 1: ("safe:s1", "safe"), 2: (None, "never"),
         3: ("never:n3", "never")}
KILL_AT = {
    "before_intent": "call.begin",
    "after_intent": "call.intent",
    "mid_tool": "call.intent",  # then the kill lands once the tool wrote its effect
    "after_tool": "call.returned",
}
#: Only a hang waits this long.
DEADLINE_S = 120


def run_child(state: Path, env_extra: dict[str, str]) -> tuple[int, str]:
    env = {**os.environ, "PYTHONPATH": ROOT, **env_extra}
    with OwnedProcess([sys.executable, CHILD, str(state)], env=env) as p:
        out, _ = p.proc.communicate(timeout=DEADLINE_S)
        return p.proc.returncode, out.decode()


def kill_once_it_ran(state: Path, line: str, pid: int) -> None:
    """SIGKILL ``pid``'s group once the tool wrote its effect ``line`` (it then holds)."""
    effects, deadline = state / "effects", time.monotonic() + DEADLINE_S
    while line not in (effects.read_text().splitlines() if effects.exists() else []):
        assert time.monotonic() < deadline, f"the tool never wrote {line!r}"
        time.sleep(0.01)
    os.killpg(os.getpgid(pid), 9)


# mid-tool kills need a host tool, which holds until it is killed: steps 0 and 1
CASES = [(w, s) for w in sorted(KILL_AT) for s in sorted(STEPS) if w != "mid_tool" or s in (0, 1)]


@pytest.mark.parametrize(("where", "step"), CASES)
def test_sigkill_then_resume(tmp_path: Path, where: str, step: int) -> None:
    point = KILL_AT[where]
    killed: list[Hit] = []
    killer: list[threading.Thread] = []
    held = tmp_path / f"hold-{(STEPS[step][0] or '').split(':')[-1]}"
    if where == "mid_tool":
        held.touch()  # the tool of this step holds until it is killed

    def on_hit(hit: Hit) -> str:
        # occurrence k of a call.* point is the call of step k - 1 (one call per step)
        if hit.point != point or hit.occurrence != step + 1 or killed:
            return "continue"
        killed.append(hit)
        if where == "mid_tool":  # let the tool run, then kill it in the middle
            line = STEPS[step][0]
            assert line is not None
            killer.append(threading.Thread(target=kill_once_it_ran,
                                           args=(tmp_path, line, hit.pid)))
            killer[0].start()
            return "continue"
        os.killpg(os.getpgid(hit.pid), 9)
        return "killed"

    with Rendezvous(str(tmp_path / "fp.sock"), on_hit) as rv:
        code, out = run_child(tmp_path, {"CUA_FAILPOINTS": rv.address})
    for thread in killer:
        thread.join(DEADLINE_S)
    assert killed, f"failpoint {point} #{step + 1} was never reached; output:\n{out}"
    assert code == -9, f"the child was not killed (exit {code}):\n{out}"

    held.unlink(missing_ok=True)  # the resumed process's tools do not hold
    code, out = run_child(tmp_path, {})
    assert code == 0 and "OUTCOME done" in out, out

    effects_file = tmp_path / "effects"
    effects = effects_file.read_text().splitlines() if effects_file.exists() else []
    harness = Harness.open(SqliteStorage(tmp_path / "log.sqlite"), models=ScriptedModel([]))
    try:
        entries = harness.log.entries(1)
        inputs = [e for e in entries if e.kind == "input"]
        assert len(inputs) == 1, "the request id was admitted more than once"
        results = {}
        for e in entries:
            if e.kind == "assistant" and e.data["tool_calls"]:
                results.setdefault(e.data["meta"]["step"], []).append(e.data["tool_calls"][0]["id"])
        by_call = {e.data["call_id"]: e.data for e in entries if e.kind == "tool_result"}
    finally:
        harness.close()

    assert sorted(results) == [0, 1, 2, 3], "every step was issued"
    for s, (line, replay) in STEPS.items():
        assert len(results[s]) == 1, f"step {s} was issued {len(results[s])} times"
        result = by_call[results[s][0]]
        ran = effects.count(line) if line else None
        interrupted_here = s == step and where != "before_intent"
        if not interrupted_here:
            assert not result["interrupted"] and not result["is_error"], (s, result)
            if line:
                assert ran == 1, f"step {s} ran {ran} times, want exactly once"
        elif replay == "safe":
            assert not result["interrupted"], "a safe call is run again, not interrupted"
            assert ran == (1 if where == "after_intent" else 2), (where, effects)
        else:
            assert result["interrupted"] and result["is_error"], result
            assert "interrupted and may have partially run" in result["content"]
            if line:
                assert ran == (0 if where == "after_intent" else 1), (where, effects)
    if step == 2 and where != "before_intent":
        # the write was cut off after its intent: it may or may not have landed, never twice
        assert not (tmp_path / "work" / "a.txt").exists() or (
            (tmp_path / "work" / "a.txt").read_text() == "one\n")
    else:
        assert (tmp_path / "work" / "a.txt").read_text() == "one\n"
