"""Fault plans are pure functions of the seed; the checker catches each kind of violation."""

from __future__ import annotations

from chaos.checker import Observation, ObservedCall, check, merge
from chaos.faults import FaultPlan, draw_plan, exhaustive_plans
from chaos.summary import parse_summary, summarize, summary_line
from scenarios import generate, load
from scenarios.plan import Scenario


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
    plans = exhaustive_plans(1, {"call.begin": 3, "space.running": 2, "recovery.begin": 4})
    pairs = [(p.faults[0].point, p.faults[0].occurrence) for p in plans]
    assert pairs == [("call.begin", 1), ("call.begin", 2), ("call.begin", 3),
                     ("space.running", 1), ("space.running", 2)]


def _clean_run(scenario: Scenario) -> Observation:
    """The observation of a perfect run: every step once, workspace as implied."""
    ws = scenario.initial.copy()
    calls = []
    for i, step in enumerate(scenario.steps):
        step.apply(ws)
        calls.append(ObservedCall(step.index, 1, f"c{i}", step.tool, step.args, i, "ok",
                                  result_entry=10 + i))
    log = ws.files.get("log.txt", (b"", False))[0].decode()
    effects = [(c.tool, scenario.steps[c.step].marker, c.call_id) for c in calls
               if c.tool.startswith("record_")]
    return Observation(calls, ws.rows(), log, effects, 0, True, "transactional", ws.hash(), None)


def _scenario() -> Scenario:
    return generate(11, load("default"), steps=12)


def test_a_clean_run_is_valid() -> None:
    s = _scenario()
    assert check(s, _clean_run(s), campaign_mode="transactional").valid is True


def test_checker_catches_a_wrong_workspace() -> None:
    s = _scenario()
    obs = _clean_run(s)
    obs.workspace = obs.workspace[1:]
    v = check(s, obs, campaign_mode="transactional")
    assert v.valid is False and "paths that differ" in v.errors[0]


def test_checker_catches_a_duplicate_effect() -> None:
    s = _scenario()
    obs = _clean_run(s)
    appends = [st for st in s.steps if st.kind == "append"]
    assert appends
    obs.log_txt += f"{appends[0].marker}\n"
    v = check(s, obs, campaign_mode="checkpoint")
    assert v.valid is False
    assert any(f"{appends[0].marker} appears 2 times" in e for e in v.errors)


def test_checker_catches_never_tool_twice_and_errors_and_interrupts() -> None:
    s = generate(2, load("default"), steps=30)
    obs = _clean_run(s)
    never = next(c for c in obs.calls if c.tool == "record_never")
    obs.effects.append(("record_never", s.steps[never.step].marker, never.call_id))
    bash = next(c for c in obs.calls if c.tool == "bash")
    bash.result = "info"
    write = next(c for c in obs.calls if c.tool == "write")
    write.result, write.content = "fail", "Error: disk full"
    v = check(s, obs, campaign_mode="transactional")
    text = "\n".join(v.errors)
    assert v.valid is False
    assert f"never-tool call {never.call_id} (step {never.step}) ran 2 times" in text
    assert "ended in an error: Error: disk full" in text
    assert "ended interrupted in transactional mode" in text


def test_checker_requires_progress_and_a_finished_session() -> None:
    s = _scenario()
    obs = _clean_run(s)
    obs.calls = []
    obs.final_exit = 1
    v = check(s, obs, campaign_mode="checkpoint")
    assert any("no step was committed" in e for e in v.errors)
    assert any("did not finish" in e for e in v.errors)


def test_checker_crash_is_unknown() -> None:
    s = _scenario()
    obs = _clean_run(s)
    obs.calls[0].step = None  # type: ignore[assignment]
    obs.workspace = None  # type: ignore[assignment]
    assert check(s, obs, campaign_mode="checkpoint").valid == "unknown"


def test_merge_and_summary_line() -> None:
    assert merge([True, "unknown", True]) == "unknown"
    assert merge([True, False, "unknown"]) is False
    assert merge([True]) is True
    record = {"verdict": {"valid": True}, "counts": {"kills": 2, "lost_spaces": 1},
              "recoveries": [{"kind": "restored"}, {"kind": "mode"}],
              "observation": {"calls": [{"result": "info"}]}}
    line = summary_line(summarize(mode="checkpoint", backend="local", seed_base=1,
                                  records=[record], seconds=1.234))
    parsed = parse_summary(line)
    assert parsed["runs"] == "1" and parsed["ok"] == "1" and parsed["failed"] == "0"
    assert parsed["kills"] == "2" and parsed["lost_spaces"] == "1"
    assert parsed["restored"] == "1" and parsed["mode_switches"] == "1"
    assert parsed["interrupted"] == "1" and parsed["reattached"] == "0"
    assert line.startswith("SUMMARY mode=checkpoint backend=local") and "\n" not in line
