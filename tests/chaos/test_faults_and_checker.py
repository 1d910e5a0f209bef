"""Fault plans are pure functions of the seed; the checker catches each kind of violation."""

from __future__ import annotations

import hashlib
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace
from typing import cast

import pytest

from chaos.campaign.summary import parse_summary, summarize, summary_line
from chaos.checks.checker import check
from chaos.checks.model import Observation, ObservedCall, merge
from chaos.faults.plans import (
    FOLLOW_UPS,
    HELD_KINDS,
    HOLD_REQUEST_TIMEOUT_S,
    RECOVERY_POINTS,
    Fault,
    FaultPlan,
    draw_plan,
    exhaustive_plans,
    on_virtual,
    with_held_faults,
)
from durable.coding_tools import apply_edits, bash_result
from durable.errors import ToolError
from durable.failpoints import POINTS as DRIVER_POINTS
from durable.tools import error_result
from scenarios import generate, load
from scenarios.plan import Scenario
from scenarios.preset import parse
from scenarios.workspace_model import WorkspaceModel
from spacesd.shim import LOST_OUTPUT


def test_plans_are_seeded() -> None:
    scenario = generate(1, load("default"))
    plans = [draw_plan(s, scenario, "checkpoint") for s in range(1, 30)]
    assert plans == [draw_plan(s, scenario, "checkpoint") for s in range(1, 30)]
    assert len({p.faults for p in plans}) > 20, "different seeds draw different plans"
    assert all(FaultPlan.from_json(p.to_json()) == p for p in plans)
    actions = {f.action for p in plans for f in p.faults}
    assert "kill_driver" in actions and actions & {"kill_daemon", "restart_space", "delete_space"}
    assert not any(f.action == "delete_space" for s in range(1, 60)
                   for f in draw_plan(s, scenario, "checkpoint", allow_delete=False).faults)


def test_exhaustive_enumerates_every_pair() -> None:
    counts = {"call.begin": 3, "space.running": 2, "recovery.begin": 4, "log.commit": 9,
              "spacesd.exec.exit_writing": 1, "spacesd.exec.recorded": 1}
    plans = exhaustive_plans(1, counts)  # no lead at a recovery or a park-only point
    leads = [(p.faults[0].action, p.faults[0].point, p.faults[0].occurrence) for p in plans]
    assert leads == [("kill_driver", "call.begin", 1), ("kill_driver", "call.begin", 2),
                     ("kill_driver", "call.begin", 3), ("kill_driver", "space.running", 1),
                     ("kill_driver", "space.running", 2),
                     ("kill_process", "spacesd.exec.exit_writing", 1),
                     ("kill_daemon", "spacesd.exec.recorded", 1)]
    follow = [p.faults[1] for p in plans]
    assert set(follow) == set(FOLLOW_UPS), "every kind of recovery fault is taken in turn"
    assert len(exhaustive_plans(1, counts, pairs=True)) == len(plans) * len(FOLLOW_UPS)


def test_plans_reach_inside_the_daemon_and_combine_faults() -> None:
    scenario = generate(1, load("default"))
    plans = [draw_plan(s, scenario, "checkpoint") for s in range(1, 200)]
    faults = [f for p in plans for f in p.faults]
    assert any(f.point and f.point.startswith("spacesd.") for f in faults)
    assert any(f.action == "kill_process" for f in faults)
    combined = [p for p in plans if any(f.point in RECOVERY_POINTS for f in p.faults[1:])]
    assert len(combined) > 20, "later faults aim at the recovery of earlier ones"
    assert sum(len(p.faults) for p in plans) / len(plans) > 2.5


def test_space_pauses_are_drawn_beside_a_plan_and_leave_its_faults_alone() -> None:
    scenario = generate(1, load("default"))
    plans = [draw_plan(s, scenario, "checkpoint") for s in range(1, 120)]
    paused = [with_held_faults(p, "pause_space", scenario, "checkpoint") for p in plans]
    assert paused == [with_held_faults(p, "pause_space", scenario, "checkpoint") for p in plans]
    pauses = []
    for plan, more in zip(plans, paused, strict=True):
        assert more.faults[:len(plan.faults)] == plan.faults
        added = more.faults[len(plan.faults):]
        assert 1 <= len(added) <= 2 and {f.action for f in added} == {"pause_space"}
        assert more.max_attempts == plan.max_attempts + len(added)
        assert FaultPlan.from_json(more.to_json()) == more
        assert all("hold" not in f for f in plan.to_json()["faults"]), "older plans read the same"
        pauses += added
    holds = [f.hold or 0 for f in pauses]
    resent = sum(HOLD_REQUEST_TIMEOUT_S < h < 2 * HOLD_REQUEST_TIMEOUT_S for h in holds)
    unanswered = sum(h > 2 * HOLD_REQUEST_TIMEOUT_S for h in holds)
    assert 0.1 < resent / len(holds) < 0.35, "some pauses outlast one send of a request"
    assert 0.25 < unanswered / len(holds) < 0.55, "many outlast both sends: no answer at all"
    assert {f.trigger for f in pauses} == {"failpoint", "time"}
    assert any(f.point in RECOVERY_POINTS for f in pauses), "pauses aim at recoveries too"
    assert any((f.point or "").startswith("spacesd.") for f in pauses)
    guest = [f for p in plans for f in with_held_faults(p, "pause_space", scenario, "checkpoint",
                                                         guest=True).faults[len(p.faults):]]
    assert not any((f.point or "").startswith("spacesd.") for f in guest), \
        "a microVM's daemon reports no failpoints: its pauses land at the driver's"


def test_a_kind_with_points_of_its_own_is_drawn_there_or_at_a_time() -> None:
    """``pause_commands`` needs a command running: drawn at its points (four in five) or a
    seeded time, never where no command runs nor at a recovery's point; the other kinds
    draw as they did (the same seeds, the same plans)."""
    scenario = generate(1, load("default"))
    plans = [draw_plan(s, scenario, "checkpoint") for s in range(1, 120)]
    added = [f for p in plans
             for f in with_held_faults(p, "pause_commands", scenario, "checkpoint").faults[
                 len(p.faults):]]
    own = set(HELD_KINDS["pause_commands"].points)
    assert {f.point for f in added if f.trigger == "failpoint"} == own
    timed = sum(f.trigger == "time" for f in added) / len(added)
    assert 0.1 < timed < 0.3, timed
    assert HELD_KINDS["pause_space"].points == (), "the other kinds keep HOLD_POINTS"


def test_a_host_power_cut_strikes_once_at_a_drivers_point_and_holds_nothing() -> None:
    """``cut_host_power`` has no hold and no timer: it lands at its own driver points
    alone (where no commit is in flight, so G7 is exact), and kills the drivers itself."""
    scenario = generate(1, load("default"))
    plans = [draw_plan(s, scenario, "auto") for s in range(1, 120)]
    added = [f for p in plans
             for f in with_held_faults(p, "cut_host_power", scenario, "auto").faults[
                 len(p.faults):]]
    assert 120 <= len(added) <= 240
    assert {f.trigger for f in added} == {"failpoint"}
    assert {f.point for f in added} <= set(HELD_KINDS["cut_host_power"].points)
    assert all(f.hold is None and not f.kill_driver for f in added)
    assert all(p in DRIVER_POINTS for p in HELD_KINDS["cut_host_power"].points)
    with pytest.raises(ValueError, match="only they have one"):
        Fault("cut_host_power", "failpoint", "call.result", 1, kill_driver=False, hold=1.0)
    with pytest.raises(ValueError, match=r"pause_space: a .* fault needs hold"):
        Fault("pause_space", "failpoint", "call.result", 1, kill_driver=False)


def test_g7_fails_a_run_whose_power_cut_lost_a_commit_that_had_returned() -> None:
    from chaos.checks import durable_log
    from chaos.checks.model import CheckInput, Undecided

    def errors(cuts: list[dict[str, object]]) -> list[str]:
        obs = Observation(calls=[], workspace=[], log_txt="", effects=[], final_exit=0,
                          final_outcome_done=True, end_mode=None, image_hash=None,
                          image_stale=None, power_cuts=cuts)
        return durable_log.check(cast(CheckInput, SimpleNamespace(obs=obs)))

    before = ["conversation 1", "entry 2 input aa", "entry 3 tool_result bb", "doc 1/x v1 r1 cc"]
    assert errors([]) == []
    assert errors([{"fault": "cut_host_power at call.result#1", "before": before,
                    "after": before + ["entry 4 system dd"]}]) == []
    found = errors([{"fault": "cut_host_power at call.result#1", "before": before,
                     "after": before[:2]}])
    assert len(found) == 1
    assert "(cut_host_power at call.result#1) lost 2 of 4 commits" in found[0]
    assert "entry 3 tool_result bb; doc 1/x v1 r1 cc" in found[0]
    changed = errors([{"fault": "f", "before": before,
                       "after": [*before[:3], "doc 1/x v1 r1 ee"]}])
    assert changed and "doc 1/x v1 r1 cc" in changed[0], "a commit changed is a commit lost"
    unreadable = errors([{"fault": "f", "before": before, "after": [],
                          "after_error": "CorruptLog: the mark says 9 commits"}])
    assert unreadable == ["the host's power cut (f) left a log that cannot be read "
                          "(CorruptLog: the mark says 9 commits); it held 4 commits that had "
                          "returned"]
    with pytest.raises(Undecided, match="could not be read"):
        errors([{"fault": "f", "before": [], "after": [], "before_error": "OSError: gone"}])


def test_g5_fails_a_command_read_lost_while_the_campaign_held_it_frozen() -> None:
    """A recovery caused by ``daemon_lost`` for the call of a key whose shim the campaign
    froze, committed while it was frozen, is a lie of the ledger (G5); before the freeze,
    after the thaw, or of another call it may be true. The freeze's bounds come from the
    history's ``commands_frozen`` and ``commands_thawing`` operations."""
    from chaos.checks import frozen_commands
    from chaos.faults.plans import FROZEN, THAWING, command_freezes

    history = [{"f": "pause_commands", "value": None},
               {"f": FROZEN, "value": {"keys": ["s1:1:3.0:1@2", "s1:1:4.0:1@2"], "ms": 1000}},
               {"f": THAWING, "value": {"ms": 6000}},
               {"f": FROZEN, "value": {"keys": ["s1:1:9.0:1@2"], "ms": 7000}}]  # never thawed
    freezes = command_freezes(history)
    assert freezes == [{"keys": ["s1:1:3.0:1@2", "s1:1:4.0:1@2"], "from_ms": 1000,
                        "to_ms": 6000}]

    def errors(*events: tuple[str, str, int]) -> list[str]:
        obs = Observation(calls=[], workspace=[], log_txt="", effects=[], final_exit=0,
                          final_outcome_done=True, end_mode=None, image_hash=None,
                          image_stale=None, command_freezes=freezes,
                          events=[{"kind": "restored", "cause": cause, "call_id": call,
                                   "conversation": 1, "time_ms": ms}
                                  for cause, call, ms in events])
        return frozen_commands.check(obs)

    found = errors(("daemon_lost", "4.0", 2500))
    assert len(found) == 1 and "call 4.0 was lost" in found[0] and "from 1000 to 6000" in found[0]
    assert errors(("daemon_lost", "4.0", 999), ("daemon_lost", "4.0", 6001),  # outside it
                  ("daemon_lost", "5.0", 2500),  # another call's command
                  ("running", "3.0", 2500),  # read as it is
                  ("daemon_lost", "9.0", 8000)) == []  # a freeze of unknown length


def test_pauses_reach_the_drivers_as_their_request_timeout(tmp_path: Path) -> None:
    """A run that pauses its Space gives its faulted drivers the short request timeout (a
    plan read back with pauses in it too), never its clean driver; and a pause on a virtual
    workspace, which has no Space, becomes a kill of the driver."""
    from chaos.driver import parse_args
    from chaos.run.launch import driver_argv
    from chaos.run.runner import Run
    from chaos.run.spec import RunSpec

    spec = RunSpec(index=0, seed=3, campaign_mode="transactional", durable_mode="transactional",
                   backend="local", preset="default", steps=4, work_dir=tmp_path)
    paused = Run(replace(spec, held=("pause_space",)))
    assert any(f.action == "pause_space" for f in paused.plan.faults)
    assert paused.request_timeout(faulted=True) == HOLD_REQUEST_TIMEOUT_S
    assert paused.request_timeout(faulted=False) is None
    assert Run(replace(spec, plan=paused.plan)).request_timeout(faulted=True) == \
        HOLD_REQUEST_TIMEOUT_S, "a stored plan with pauses keeps its timeout"
    assert Run(spec).request_timeout(faulted=True) is None
    argv = driver_argv(spec, tmp_path, None, request_timeout=HOLD_REQUEST_TIMEOUT_S)
    assert parse_args(argv[argv.index("--run-dir"):]).request_timeout == HOLD_REQUEST_TIMEOUT_S
    assert "--request-timeout" not in driver_argv(spec, tmp_path, None)
    virtual = on_virtual(paused.plan)
    assert {(f.action, f.hold) for f in virtual.faults} == {("kill_driver", None)}


@pytest.mark.parametrize("fields, error", [
    ({"action": "pause_space"}, "needs hold"),
    ({"action": "cut_link"}, "needs hold"),
    ({"action": "kill_daemon", "hold": 1.0}, "only they have one"),
    ({"action": "pause_space", "hold": 0}, "is not seconds above 0"),
    ({"action": "pause_space", "hold": True}, "is not seconds above 0"),
])
def test_a_pause_without_a_hold_or_a_hold_without_a_pause_is_refused(
        fields: dict[str, object], error: str) -> None:
    with pytest.raises(ValueError, match=error):
        Fault(trigger="time", attempt=1, delay=0.5, kill_driver=False,
              **fields)  # type: ignore[arg-type]


def _clean_run(scenario: Scenario) -> Observation:
    """The observation of a perfect run: every step once, with the result it gives, the
    workspace as implied, one driver of epoch 1 and its ledger."""
    ws = scenario.initial.copy()
    calls = []
    keys = []
    for i, step in enumerate(scenario.steps):
        exp = step.apply(ws)
        call = ObservedCall(step.index, 1, f"{10 + i}.0", step.tool, step.args, i,
                            "fail" if exp.is_error else "ok", result_entry=100 + i,
                            content=exp.content,
                            content_sha256=hashlib.sha256(exp.content.encode()).hexdigest())
        calls.append(call)
        if step.tool == "bash":
            keys.append({"key": f"run-1:1:{call.call_id}:1@1", "command": step.args["command"],
                         "cwd": "/w", "epoch": 1, "started_ms": i, "spawned": True,
                         "exit_code": exp.exit_code, "signal": None, "ended_ms": i,
                         "fenced_by": None})
    log = (ws.content("log.txt") or b"").decode()
    effects = [(c.tool, scenario.steps[c.step].marker, c.call_id) for c in calls
               if c.tool.startswith("record_")]
    fences = [{"t": "advance", "epoch": 1, "floor_before": 0, "raised": True, "killed": [],
               "alive_after": [], "ms": 0}]
    return Observation(
        calls, ws.entries(), log, effects, 0, True, "transactional", ws.hash(), None,
        inputs=[(1, "campaign-input")], epoch_raises=[(1, 1, 0)],
        entry_epochs=[(i, 1) for i in range(1, 100 + len(calls))],
        ledgers=[{"why": "final", "audit": {"floor": 1, "keys": keys, "fences": fences}}],
        session="run-1")


def _scenario() -> Scenario:
    return generate(11, load("default"), steps=12)


def _verdict(obs: Observation, s: Scenario, mode: str = "transactional") -> tuple[list[str], str]:
    v = check(s, obs, campaign_mode=mode)
    assert v.to_json()["check"] == (v.checks[0] if v.checks else None)
    return v.checks, "\n".join(v.errors)


def test_a_clean_run_is_valid() -> None:
    s = _scenario()
    v = check(s, _clean_run(s), campaign_mode="transactional")
    assert v.valid is True, v.errors


def test_g1_catches_a_wrong_mode_a_wrong_link_and_a_missing_file() -> None:
    """And every other part of the state: an empty directory lost, a hardlink split, a
    sparse file written dense, a FIFO gone, a set mtime reset."""
    s = generate(11, parse({"name": "every-shape", "sequence": [
        "write", "empty_dir", "hardlink", "sparse", "fifo", "dated", "symlink", "append"]},
        "every-shape.yaml"))
    changes = {
        "mode": lambda e: e.kind == "file" and replace(e, mode=e.mode ^ 0o020),
        "link": lambda e: e.kind == "symlink" and replace(e, target="../elsewhere"),
        "missing": lambda e: e.kind == "file" and None,
        "empty dir": lambda e: e.path.startswith("empty/") and None,
        "hardlink": lambda e: e.link is not None and replace(e, link=None),
        "dense": lambda e: e.extents is not None and replace(e, extents=None),
        "fifo": lambda e: e.kind == "fifo" and None,
        "mtime": lambda e: e.mtime_ns is not None and e.kind == "file"
        and replace(e, mtime_ns=e.mtime_ns + 10**9),
    }
    for change, how in changes.items():
        obs = _clean_run(s)
        entries = []
        done = False
        for e in obs.workspace:
            got = False if done else how(e)
            if got is False:
                entries.append(e)
            else:
                done = True
                if got is not None:
                    entries.append(got)
        assert done, change
        obs.workspace = entries
        checks, text = _verdict(obs, s)
        assert checks[0] == "G1" and "path(s) differ" in text, (change, text)


def test_g2_catches_a_command_started_twice_and_a_reused_key() -> None:
    s = _scenario()
    obs = _clean_run(s)
    assert obs.ledgers is not None
    keys = obs.ledgers[0]["audit"]["keys"]
    assert len(keys) >= 2
    again = {**keys[0], "key": keys[0]["key"].replace(":1@1", ":2@1")}
    obs.ledgers.append({"why": "final", "audit": {"floor": 1, "keys": [again], "fences": []}})
    checks, text = _verdict(obs, s, "checkpoint")
    assert checks == ["G2"] and "started its command 2 times" in text, text
    obs.events.append({"kind": "reverted", "call_id": keys[0]["key"].split(":")[2],
                       "entry": 50, "time_ms": 10, "epoch": 1})
    assert _verdict(obs, s)[0] == [], "a rerun after a recorded revert is allowed"
    obs = _clean_run(s)
    assert obs.ledgers is not None
    obs.ledgers[0]["audit"]["keys"][1]["command"] = keys[0]["command"]
    checks, text = _verdict(obs, s)
    assert "G2" in checks and "a key was reused" in text


def test_g2_catches_another_sessions_key_in_the_runs_space() -> None:
    s = _scenario()
    obs = _clean_run(s)
    assert obs.ledgers is not None
    keys = obs.ledgers[0]["audit"]["keys"]
    keys.append({**keys[0], "key": keys[0]["key"].replace("run-1:", "run-2:")})
    checks, text = _verdict(obs, s, "checkpoint")
    assert checks == ["G2"] and "two sessions shared one Space" in text, text


def test_g3_catches_an_older_process_alive_and_an_unfenced_restore() -> None:
    s = _scenario()
    obs = _clean_run(s)
    assert obs.ledgers is not None
    fences = obs.ledgers[0]["audit"]["fences"]
    fences.append({"t": "advance", "epoch": 2, "floor_before": 1, "raised": True,
                   "killed": [], "alive_after": ["run-1:1:10.0:1@1"], "ms": 5})
    fences.append({"t": "restore", "id": "c1", "epoch": 3, "floor": 2, "alive_older": [],
                   "ms": 6})
    obs.events.append({"kind": "restored", "call_id": "10.0", "entry": 60, "time_ms": 7,
                       "epoch": 4})
    checks, text = _verdict(obs, s, "checkpoint")
    assert checks == ["G3"], text
    assert "older epoch alive" in text and "restored by epoch 3 while the Space's floor " \
        "was 2" in text and "not preceded by advance_epoch(4)" in text


def test_g3_catches_the_restoring_drivers_own_process_alive_at_its_restore() -> None:
    """A driver restores in the middle of its run (its epoch unchanged) while a process it
    started earlier runs on: spacesd's restore record names it (issue 30.2)."""
    s = _scenario()
    obs = _clean_run(s)
    assert obs.ledgers is not None
    fences = obs.ledgers[0]["audit"]["fences"]
    floor = max(f.get("epoch", 0) for f in fences)
    fences.append({"t": "restore", "id": "c1", "epoch": floor, "floor": floor,
                   "alive_after": [f"run-1:1:3.0:1@{floor}"], "ms": 6})
    checks, text = _verdict(obs, s, "checkpoint")
    assert checks == ["G3"], text
    assert f"restore at epoch {floor} left 1 process(es) started at or below its epoch " \
        f"alive: ['run-1:1:3.0:1@{floor}']" in text, text


def test_g3_orders_by_the_journal_never_by_the_spaces_clock() -> None:
    """A microVM's clock is its own: one an hour ahead of the driver's (a clock jump) dates
    the advance after the restore that followed it; the journal's order decides. A restore
    the journal holds before any advance of its epoch is caught, however it is dated."""
    s = _scenario()
    obs = _clean_run(s)
    assert obs.ledgers is not None
    fences = obs.ledgers[0]["audit"]["fences"]
    floor = max(f.get("epoch", 0) for f in fences)
    hour_ahead = 10 + 3_600_000
    fences.append({"t": "advance", "epoch": floor + 1, "floor_before": floor, "raised": True,
                   "killed": [], "alive_after": [], "ms": hour_ahead})
    fences.append({"t": "restore", "id": "c1", "epoch": floor + 1, "floor": floor + 1,
                   "alive_after": [], "ms": hour_ahead + 5})
    obs.events.append({"kind": "restored", "call_id": "10.0", "entry": 60, "time_ms": 20,
                       "epoch": floor + 1})
    assert _verdict(obs, s, "checkpoint")[0] == [], _verdict(obs, s, "checkpoint")[1]
    # the same restore journalled before its epoch's advance (dated after it)
    fences.insert(len(fences) - 2, fences.pop())
    checks, text = _verdict(obs, s, "checkpoint")
    assert checks == ["G3"], text
    assert f"checkpoint c1 was restored by epoch {floor + 1} before any " \
        f"advance_epoch({floor + 1})" in text, text


def test_g4_catches_a_stale_entry_and_a_refusal_as_a_result() -> None:
    s = _scenario()
    obs = _clean_run(s)
    obs.epoch_raises.append((2, 105, 0))
    obs.calls[0].content = "Error: epoch 1 is below this Space's floor 2: a newer owner"
    checks, text = _verdict(obs, s)
    assert "G4" in checks
    assert "entry 105 was committed by epoch 1 after epoch 2 took the log over" in text
    assert "recorded a fence refusal as its result" in text


def test_g5_catches_a_wrong_exit_status_a_second_input_and_a_duplicate() -> None:
    s = generate(4, load("default"), steps=30)
    obs = _clean_run(s)
    failing = next(c for c in obs.calls if c.result == "fail" and c.tool == "bash")
    failing.content_sha256 = hashlib.sha256(b"Command exited with code 0").hexdigest()
    obs.inputs.append((7, "campaign-input"))
    appends = [st for st in s.steps if st.appends]
    obs.log_txt += f"{appends[0].marker}\n"
    checks, text = _verdict(obs, s)
    assert "G5" in checks
    assert f"step {failing.step} ({s.steps[failing.step].kind}) returned" in text
    assert "admitted 2 times" in text
    assert f"{appends[0].marker} appears 2 times" in text


def test_g5_catches_never_tool_twice_and_errors_and_interrupts() -> None:
    s = generate(2, load("default"), steps=30)
    obs = _clean_run(s)
    never = next(c for c in obs.calls if c.tool == "record_never")
    obs.effects.append(("record_never", s.steps[never.step].marker, never.call_id))
    bash = next(c for c in obs.calls if c.tool == "bash")
    bash.result, bash.content = "info", "The bash tool was interrupted and may have partially run"
    write = next(c for c in obs.calls if c.tool == "write")
    write.result, write.content = "fail", "Error: disk full"
    checks, text = _verdict(obs, s)
    assert "G5" in checks
    assert f"never-tool call {never.call_id} (step {never.step}) ran 2 times" in text
    assert "ended in an error: 'Error: disk full'" in text
    assert "ended interrupted in transactional mode" in text


def test_every_check_runs_on_each_fork_and_a_missing_fork_fails_the_run() -> None:
    """A forking agent's run is valid only with its fork there and valid too: a fork whose
    Space lacks a file its history implies fails G1, named by the fork; the parent's
    recoveries in a fork's history were in the parent's Space (G3 leaves them to it)."""
    s = replace(_scenario(), fork_after=3)
    obs = _clean_run(s)
    checks, text = _verdict(obs, s)
    assert checks == ["run"] and "the log has no fork" in text, text
    fork = _clean_run(s)
    fork.conversation = 7
    fork.events.append({"kind": "restored", "call_id": "10.0", "entry": 60, "time_ms": 7,
                        "epoch": 4, "conversation": 1})
    obs.forks = [{"conversation": 7, "after_step": 3, "observation": fork.to_json()}]
    assert check(s, obs, campaign_mode="checkpoint").valid is True
    fork.workspace = fork.workspace[1:]
    obs.forks = [{"conversation": 7, "after_step": 3, "observation": fork.to_json()}]
    checks, text = _verdict(obs, s)
    assert checks == ["G1"] and text.startswith("fork c7 (after step 3): G1 state"), text


def test_checker_requires_progress_and_a_finished_session() -> None:
    s = _scenario()
    obs = _clean_run(s)
    obs.calls = []
    obs.final_exit = 1
    checks, text = _verdict(obs, s, "checkpoint")
    assert checks[0] == "run"
    assert "no step was committed" in text and "did not finish" in text


def test_missing_audits_make_the_run_unknown_not_valid() -> None:
    s = _scenario()
    obs = Observation.from_json({k: v for k, v in _clean_run(s).to_json().items()
                                 if k not in ("ledgers", "epoch_raises")})
    v = check(s, obs, campaign_mode="checkpoint")
    assert v.valid == "unknown" and {"G2", "G4"} <= set(v.checks), v.errors


def test_checker_crash_is_unknown() -> None:
    s = _scenario()
    obs = _clean_run(s)
    obs.workspace = None  # type: ignore[assignment]
    v = check(s, obs, campaign_mode="checkpoint")
    assert v.valid == "unknown" and v.checks == ["G1"]
    assert "check crashed: TypeError" in v.errors[0]


def test_merge_and_summary_line() -> None:
    assert merge([True, "unknown", True]) == "unknown"
    assert merge([True, False, "unknown"]) is False
    assert merge([True]) is True
    record = {"verdict": {"valid": True}, "counts": {"kills": 2, "lost_spaces": 1},
              "recoveries": [{"kind": "restored", "mode": "checkpoint", "tool": "bash",
                              "cause": "daemon_lost"}, {"kind": "mode"}],
              "observation": {"calls": [{"result": "info"}]}}
    line = summary_line(summarize(mode="checkpoint", backend="local", seed_base=1,
                                  records=[record], seconds=1.234))
    parsed = parse_summary(line)
    assert parsed["runs"] == "1" and parsed["ok"] == "1" and parsed["failed"] == "0"
    assert parsed["kills"] == "2" and parsed["lost_spaces"] == "1"
    assert parsed["restored"] == "1" and parsed["mode_switches"] == "1"
    assert parsed["interrupted"] == "1" and parsed["reattached"] == "0"
    assert line.startswith("SUMMARY mode=checkpoint backend=local") and "\n" not in line
    # only the groups that apply: no coordinator, exhaustive, stale or power-loss keys here
    assert not {"drives", "resume_p50_ms", "covered", "foreign", "pauses", "power_losses",
                "log", "space_pauses", "pause_spaces"} & set(parsed)
    paused = parse_summary(summary_line(summarize(
        mode="checkpoint", backend="local", seed_base=1, held=("pause_space",), seconds=1.0,
        records=[{**record, "counts": {**record["counts"], "space_pauses": 2}}, record])))
    assert paused["space_pauses"] == "2" and "pause_spaces" not in paused
    assert "clock_jumps" not in paused and "link_cuts" not in paused
    jumped = summary_line(summarize(
        mode="auto", backend="microvm", seed_base=1, held=("jump_clock",), seconds=1.0,
        records=[{**record, "counts": {**record["counts"], "clock_jumps": 3}}]))
    assert " pauses=" not in jumped and " link_cuts=0 clock_jumps=3 cells=" not in jumped
    assert " clock_jumps=3 cells=" in jumped, jumped
    jsonl = summary_line(summarize(mode="stale", backend="local", seed_base=1, records=[record],
                                   seconds=1.0, durable_mode="transactional",
                                   log_storage="jsonl"))
    assert jsonl.startswith("SUMMARY mode=stale backend=local log=jsonl seed_base=1 "), jsonl
    full = summarize(mode="redrive", backend="microvm", seed_base=1, records=[record],
                     seconds=1.0, durable_mode="auto")
    assert {"drives", "resume_p50_ms", "power_losses"} <= set(parse_summary(summary_line(full)))
    virtual = parse_summary(summary_line(summarize(mode="transactional", backend="virtual",
                                                   seed_base=1, records=[], seconds=1.0)))
    assert "cells" not in virtual and "restored" not in virtual and "interrupted" in virtual


def test_g5_takes_output_a_full_state_disk_lost_only_as_spacesd_says_it() -> None:
    """A command whose output a full state disk had no room for ran whole: its result is
    the step's output up to the byte spacesd names, then spacesd's line; anything else in
    its place (a different head, a claim to have lost nothing) is still caught."""
    s = generate(4, load("default"), steps=30)
    obs = _clean_run(s)
    call = next(c for c in obs.calls if c.tool == "bash" and c.result == "ok" and c.content)
    output = s.steps[call.step].apply(s.initial.copy()).output
    assert output is not None

    def lost(kept: str, at: int) -> None:
        call.content = bash_result(0, kept + LOST_OUTPUT.format(at)).content
        call.content_sha256 = hashlib.sha256(call.content.encode()).hexdigest()

    lost(output[:3], 3)
    assert _verdict(obs, s)[0] == [], _verdict(obs, s)[1]
    lost(output[:3] + "x", 3)  # more than the byte it names
    assert _verdict(obs, s)[0] == ["G5"]
    lost("", len(output) + 10)  # a byte past the output, with none of it kept
    assert _verdict(obs, s)[0] == ["G5"]


def _met_a_full_disk(obs: Observation, call: ObservedCall, ws: WorkspaceModel,
                     error: str) -> None:
    """``obs`` with ``call`` ended in its ENOSPC ``error`` and the Space as ``ws``."""
    call.result = "fail"
    call.content = error
    call.content_sha256 = hashlib.sha256(error.encode()).hexdigest()
    obs.workspace = ws.entries()
    obs.image_hash = ws.hash()
    obs.log_txt = (ws.content("log.txt") or b"").decode()
    obs.disk_filled = True


def test_a_call_a_full_workspace_disk_cut_short_is_its_real_error_and_no_more() -> None:
    """A command that met ENOSPC took what effect it got to: its paths are the Space's
    word from then on, its marker in log.txt once or not at all; a write that met it took
    none. Outside a run whose workspace disk was filled, the same error is a failure, and a
    marker twice or a write's content half there is caught."""
    s = generate(11, parse({"name": "full", "sequence": ["write", "append", "sums", "append",
                                                          "write"]}, "full.yaml"))
    no_space = bash_result(1, "bash: line 1: printf: write error: No space left on device\n"
                           ).content
    # The second step's append wrote nothing; the sums step after it hashed what was there.
    ws = s.initial.copy()
    for step in s.steps:
        if step.index != 1:
            step.apply(ws)
    obs = _clean_run(s)
    _met_a_full_disk(obs, obs.calls[1], ws, no_space)
    assert _verdict(obs, s)[0] == [], _verdict(obs, s)[1]
    obs.disk_filled = False
    checks, text = _verdict(obs, s)
    assert "G5" in checks and "step 1 (append) ended in an error" in text, text
    # ... or as far as its append got: the whole line, once; twice is caught.
    twice = s.initial.copy()
    for step in s.steps:
        step.apply(twice)
        if step.index == 1:
            step.apply(twice)
    obs = _clean_run(s)
    _met_a_full_disk(obs, obs.calls[1], twice, no_space)
    checks, text = _verdict(obs, s)
    assert checks == ["G5"] and "step-1 appears 2 times in log.txt, want 0 or 1" in text, text
    # A write that met a full disk is atomic: no part of its content may be there.
    last = s.steps[4]
    assert last.tool == "write"
    half = s.initial.copy()
    for step in s.steps:
        step.apply(half)
    half.write(last.args["path"], last.args["content"].encode()[:5], renamed=True)
    obs = _clean_run(s)
    _met_a_full_disk(obs, obs.calls[4], half, "[Errno 28] No space left on device")
    checks, text = _verdict(obs, s)
    assert checks == ["G1"] and repr(last.args["path"]) in text, text


def test_an_edit_of_what_a_full_disk_refused_fails_as_the_tool_does() -> None:
    """The scripted agent goes on as if each call had worked: an edit of a line whose
    earlier edit a full disk refused no longer finds its text, and the edit tool says so.
    That error is what the model gives; a success in its place is caught."""
    s = generate(2, parse({"name": "edits", "sequence": ["edit", "edit", "edit"]},
                           "edits.yaml"), steps=3)
    first, second = s.steps[0], s.steps[1]
    assert first.params["slot"] == second.params["slot"]
    ws = s.initial.copy()
    s.steps[2].apply(ws)  # only the third edit (another line) took effect
    text = ws.content(second.args["path"])
    assert text is not None
    with pytest.raises(ToolError) as refused:
        apply_edits(text.decode(), second.args["edits"], second.args["path"])
    obs = _clean_run(s)
    _met_a_full_disk(obs, obs.calls[0], ws, "Error: Space 'x': 'doc.txt': No space left on "
                                            "device")
    failed = error_result(refused.value).content
    obs.calls[1].result, obs.calls[1].content = "fail", failed
    obs.calls[1].content_sha256 = hashlib.sha256(failed.encode()).hexdigest()
    assert _verdict(obs, s)[0] == [], _verdict(obs, s)[1]
    obs.calls[1].result = "ok"  # the same text, but called a success
    checks, text_ = _verdict(obs, s)
    assert checks == ["G5"] and "step 1 (edit)" in text_, text_
