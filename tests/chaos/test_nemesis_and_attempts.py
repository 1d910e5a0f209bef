"""The nemesis contract, the fault schedule and the attempts scope, without a Space: every
fault ends in exactly one entry per operation, a broken nemesis makes the run unknown, no
timer fires into a later attempt, and every driver a scope started is reaped."""

from __future__ import annotations

import json
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from chaos.checks.model import Verdict
from chaos.errors import RunAborted
from chaos.faults.kinds import FaultNemesis
from chaos.faults.nemesis import Completion, NoopNemesis, Operation, Target, ValidatingNemesis
from chaos.faults.plans import Fault, FaultPlan
from chaos.faults.rendezvous import Hit
from chaos.faults.schedule import FaultSchedule
from chaos.modes.holds import Holds
from chaos.run.attempts import EXIT_TIMED_OUT, AttemptScope, FaultTimers
from chaos.run.record import RunRecord
from chaos.run.state import RunState
from durable.errors import SpaceNotFound, SpaceUnavailable
from tests.backends.pause_contract import until

AT_INTENT = Fault("kill_daemon", "failpoint", "call.intent", 1, kill_driver=False)
KILL_AT_RESULT = Fault("kill_driver", "failpoint", "call.result", 2)
TIMED = Fault("restart_space", "time", attempt=2, delay=0.1, kill_driver=False)


class Recording:
    """A nemesis that does nothing but say it did (or raises, or breaks the contract)."""

    def __init__(self, behave: str = "ok") -> None:
        self.behave = behave
        self.invoked: list[tuple[int, str]] = []

    def setup(self, target: Target) -> None:
        pass

    def invoke(self, op: Operation) -> Completion:
        self.invoked.append((op.index, op.action))
        if self.behave == "raise":
            raise RuntimeError("injected: the Space provider broke")
        if self.behave == "wrong":
            return Completion("info", "something_else", "")
        return Completion("info", op.action, op.fault.describe())

    def teardown(self) -> None:
        pass


def _nemesis(behave: str = "ok", *faults: Fault) -> tuple[ValidatingNemesis, RunState]:
    state = RunState()
    plan = FaultPlan(1, faults or (AT_INTENT, KILL_AT_RESULT, TIMED))
    return ValidatingNemesis(Recording(behave), plan, state), state


def _op(index: int, fault: Fault) -> Operation:
    return Operation(index, fault, fault.action, None, None)


def _nemesis_ops(state: RunState) -> list[tuple[str, str]]:
    return [(op["type"], op["f"]) for op in state.history() if op["process"] == "nemesis"]


def test_every_fault_ends_in_exactly_one_entry_per_operation() -> None:
    nemesis, state = _nemesis()
    assert nemesis.invoke(_op(0, AT_INTENT)).type == "info"
    assert nemesis.invoke(_op(1, KILL_AT_RESULT)).type == "info"
    nemesis.skip(2, "attempt 2 was never launched")
    nemesis.teardown()
    assert _nemesis_ops(state) == [("info", "kill_daemon"), ("info", "kill_driver"),
                                   ("info", "skipped")]
    assert state.counts()["daemon_kills"] == 1 and state.counts()["kills"] == 1
    assert state.errors() == []


def test_a_second_entry_or_a_fault_that_never_ended_breaks_the_contract() -> None:
    nemesis, state = _nemesis()
    nemesis.invoke(_op(0, AT_INTENT))
    nemesis.invoke(_op(0, AT_INTENT))  # the schedule fired it twice
    nemesis.skip(0, "it had fired")
    nemesis.teardown()  # faults 1 and 2 ended neither fired nor skipped
    errors = state.errors()
    assert len(errors) == 4 and all("NemesisContractError" in e for e in errors), errors
    assert "invoked after that fault had ended" in errors[0]
    assert "skipped after it had ended" in errors[1]
    assert "ended neither fired nor skipped" in errors[2]
    assert _nemesis_ops(state).count(("info", "kill_daemon")) == 1


@pytest.mark.parametrize("behave", ["raise", "wrong"])
def test_a_broken_nemesis_is_recorded_never_silent(behave: str) -> None:
    nemesis, state = _nemesis(behave)
    done = nemesis.invoke(_op(0, AT_INTENT))
    assert (done.type, done.f) == ("fail", "error")
    assert _nemesis_ops(state) == [("fail", "error")]
    assert state.counts()["daemon_kills"] == 0
    [error] = state.errors()
    assert ("injected: the Space provider broke" if behave == "raise"
            else "ended in Completion") in error


def test_a_due_fault_that_never_fired_is_an_error() -> None:
    nemesis, state = _nemesis()
    nemesis.missed(0, "call.intent reached 3 times")
    [error] = state.errors()
    assert "kill_daemon at call.intent#1 was due (call.intent reached 3 times)" in error


def test_the_noop_nemesis_injures_nothing() -> None:
    state = RunState()
    nemesis = ValidatingNemesis(NoopNemesis(), FaultPlan(1, (AT_INTENT,)), state)
    assert nemesis.invoke(_op(0, AT_INTENT)).type == "fail"
    assert _nemesis_ops(state) == [("fail", "kill_daemon")] and state.errors() == []


class SlowSpaces:
    """Just enough of a Spaces provider for ``LoseSpace``: a loss waits for ``go``."""

    def __init__(self) -> None:
        self.go, self.losing = threading.Event(), threading.Event()
        self.lost: list[tuple[str, Path]] = []

    def lose(self, name: str, keep: Path) -> None:
        self.losing.set()
        assert self.go.wait(120)
        self.lost.append((name, keep))


def test_two_losses_due_at_once_lose_the_space_once(tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """A loss saves the Space's ledger and deletes it: a second loss due meanwhile would
    save the same generation again (G2 would then see its commands started twice)."""
    monkeypatch.setattr("chaos.faults.kinds.read_ledger", lambda dest, why: {"audit": {}})
    spaces, state, armed = SlowSpaces(), RunState(), threading.Event()
    armed.set()
    lose = Fault("delete_space", "failpoint", "call.result", 1, kill_driver=False)
    timed = Fault("delete_space", "time", attempt=1, delay=0.5, kill_driver=False)
    nemesis = ValidatingNemesis(FaultNemesis(), FaultPlan(1, (lose, timed)), state)
    nemesis.setup(Target(spaces, "cua-c1", tmp_path, state, armed))  # type: ignore[arg-type]
    first = threading.Thread(target=nemesis.invoke, args=(_op(0, lose),))
    first.start()
    assert spaces.losing.wait(120)
    second = nemesis.invoke(_op(1, timed))
    spaces.go.set()
    first.join(300)
    assert not first.is_alive(), "the first loss never ended"
    assert second.type == "fail"
    assert second.value == ("skipped delete_space at attempt 1 +0.50s: another fault is "
                            "deleting the Space at this moment")
    assert spaces.lost == [("cua-c1", tmp_path / "gen-00")]
    assert state.counts()["lost_spaces"] == 1 and state.errors() == []


class NamedSpaces:
    """A provider of named Spaces whose losses are recorded."""

    def __init__(self, *names: str) -> None:
        self.present = list(names)
        self.lost: list[str] = []

    def names(self) -> list[str]:
        return sorted(self.present)

    def lose(self, name: str, keep: Path) -> None:
        self.lost.append(name)
        self.present.remove(name)


def test_a_loss_strikes_the_forks_space_once_it_exists(tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """A forking agent works in its fork's Space once that exists: the fault strikes there
    (not another session's Space on the provider), and its ledger is the fork Space's."""
    monkeypatch.setattr("chaos.faults.kinds.read_ledger", lambda dest, why: {"audit": {}})
    state, armed = RunState(), threading.Event()
    armed.set()
    lose = Fault("delete_space", "failpoint", "call.result", 1, kill_driver=False)
    nemesis = ValidatingNemesis(FaultNemesis(), FaultPlan(1, (lose, lose)), state)
    spaces = NamedSpaces("cua-run-1-c1", "cua-run-10-c3")
    nemesis.setup(Target(spaces, "cua-run-1-c1", tmp_path, state, armed,  # type: ignore[arg-type]
                         forks=True))
    assert nemesis.invoke(_op(0, lose)).type == "info"
    spaces.present += ["cua-run-1-c1", "cua-run-1-c9"]
    assert nemesis.invoke(_op(1, lose)).type == "info"
    assert spaces.lost == ["cua-run-1-c1", "cua-run-1-c9"]
    assert len(state.ledgers("cua-run-1-c9")) == 1 and len(state.ledgers("cua-run-1-c1")) == 1


class BrokenLossSpaces:
    """A provider whose loss breaks off after the Space was harmed, or finds no Space."""

    def __init__(self, error: Exception) -> None:
        self.error = error

    def lose(self, name: str, keep: Path) -> None:
        raise self.error


@pytest.mark.parametrize("error, ledgers", [
    (SpaceUnavailable("copying state/ledger.jsonl out of the container failed"),
     [{"why": "deleted", "audit": None}]),
    (SpaceNotFound("no Space 'cua-c1'"), []),
])
def test_a_loss_whose_ledger_was_not_saved_leaves_the_audits_undecided(
        tmp_path: Path, error: Exception, ledgers: list[dict[str, object]]) -> None:
    """A generation with no saved ledger makes the run's observation hold no ledgers (its
    audits cannot decide), unless there was no Space to lose at all."""
    state, armed = RunState(), threading.Event()
    armed.set()
    lose = Fault("delete_space", "failpoint", "call.result", 1, kill_driver=False)
    nemesis = ValidatingNemesis(FaultNemesis(), FaultPlan(1, (lose,)), state)
    nemesis.setup(Target(BrokenLossSpaces(error), "cua-c1", tmp_path, state,  # type: ignore[arg-type]
                         armed))
    done = nemesis.invoke(_op(0, lose))
    assert done.type == "fail" and str(error) in str(done.value)
    assert state.ledgers("cua-c1") == ledgers


def _hit(point: str, occurrence: int, process: str | None = None) -> Hit:
    return Hit(point, occurrence, 4242, {"process": process} if process else {}, time.time())


def test_the_schedule_fires_each_due_fault_once_and_accounts_for_the_rest() -> None:
    state = RunState()
    plan = FaultPlan(1, (AT_INTENT, KILL_AT_RESULT, TIMED))
    inner = Recording()
    schedule = FaultSchedule(plan, ValidatingNemesis(inner, plan, state), state, Holds())
    assert schedule.on_hit(_hit("call.intent", 1)) == "continue"
    assert schedule.on_hit(_hit("call.intent", 1)) == "continue"  # fired once only
    assert schedule.armed.is_set(), "a call's failpoint arms Space losses"
    schedule.account({"call.intent": 3, "call.result": 1})
    assert inner.invoked == [(0, "kill_daemon")]
    assert state.fired() == [0]
    skipped = [op["value"] for op in state.history() if op["f"] == "skipped"]
    assert skipped == ["kill_driver at call.result#2: call.result was reached 1 time(s)",
                       "restart_space at attempt 2 +0.10s: attempt 2 was never launched"]
    assert state.errors() == []


def test_a_gated_schedule_fires_only_once_open_and_counts_from_there() -> None:
    """Stale mode: nothing fires before the older driver is parked; then a fault's
    occurrence counts the point's hits past the park, and ``account`` judges the same
    counts; a gate never opened skips every fault with the reason."""
    state = RunState()
    plan = FaultPlan(1, (AT_INTENT, KILL_AT_RESULT))
    inner = Recording()
    schedule = FaultSchedule(plan, ValidatingNemesis(inner, plan, state), state, Holds(),
                             gated=True)
    assert schedule.on_hit(_hit("call.intent", 1)) == "continue"
    assert inner.invoked == [], "a closed gate fired a fault"
    schedule.open({"call.intent": 1, "call.result": 3})
    schedule.on_hit(_hit("call.intent", 2))  # the first past the gate: occurrence 1
    assert inner.invoked == [(0, "kill_daemon")]
    schedule.account({"call.intent": 2, "call.result": 4})
    skipped = [op["value"] for op in state.history() if op["f"] == "skipped"]
    assert skipped == ["kill_driver at call.result#2: call.result was reached 1 time(s)"]

    closed_state = RunState()
    closed = FaultSchedule(plan, ValidatingNemesis(Recording(), plan, closed_state),
                           closed_state, Holds(), gated=True)
    closed.account({"call.intent": 5, "call.result": 5})
    reasons = [op["value"] for op in closed_state.history() if op["f"] == "skipped"]
    assert len(reasons) == 2 and all("never opened its faults" in r for r in reasons)


def test_a_kill_at_a_drivers_failpoint_ends_the_reporter() -> None:
    state = RunState()
    plan = FaultPlan(1, (KILL_AT_RESULT,))
    schedule = FaultSchedule(plan, ValidatingNemesis(Recording(), plan, state), state, Holds())
    assert schedule.on_hit(_hit("call.result", 1)) == "continue"
    assert schedule.on_hit(_hit("call.result", 2)) == "killed"


def test_a_timer_of_a_closed_attempt_never_fires() -> None:
    fired: list[str] = []
    timers = FaultTimers()
    timers.start(600, lambda: fired.append("late"))  # never due before the close
    timers.close()  # cancels and joins it
    assert fired == [], "a cancelled timer fired"
    # a timer past its wait when the attempt began to close does not start its fault
    timers._call(lambda: fired.append("past its wait"))
    assert fired == []
    with pytest.raises(RuntimeError):
        timers.start(0.0, lambda: None)


def test_closing_an_attempt_waits_for_a_fault_already_firing() -> None:
    started, done = threading.Event(), threading.Event()

    def slow_fault() -> None:
        started.set()
        time.sleep(0.3)
        done.set()

    timers = FaultTimers()
    timers.start(0.0, slow_fault)
    assert started.wait(120)
    timers.close()
    assert done.is_set(), "close returned while the attempt's fault was still firing"


SLEEPER = [sys.executable, "-c", "import time; time.sleep(60)"]


def test_the_scope_reaps_every_driver_it_started(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError), AttemptScope() as scope:
        older = scope.launch(SLEEPER, {}, tmp_path / "older.log")
        newer = scope.launch(SLEEPER, {}, tmp_path / "newer.log")
        raise RuntimeError("the race broke off")
    assert older.poll() is not None and newer.poll() is not None


def test_a_driver_past_its_timeout_is_ended_and_reaped(tmp_path: Path) -> None:
    with AttemptScope() as scope:
        driver = scope.launch(SLEEPER, {}, tmp_path / "d.log")
        assert scope.wait(driver, timeout=0.2) == EXIT_TIMED_OUT
        assert driver.poll() is not None


def test_a_cancelled_scope_kills_and_launches_nothing(tmp_path: Path) -> None:
    with AttemptScope() as scope:
        driver = scope.launch(SLEEPER, {}, tmp_path / "d.log")
        scope.cancel()
        assert scope.wait(driver) < 0, "killed by a signal"
        with pytest.raises(RunAborted):
            scope.launch(SLEEPER, {}, tmp_path / "e.log")


def test_a_run_record_is_the_line_every_campaign_wrote() -> None:
    state = RunState()
    plan = FaultPlan(3, (AT_INTENT,))
    record = RunRecord(
        index=0, seed=3, campaign_mode="checkpoint", stale_kind=None, durable_mode="checkpoint",
        backend="local", preset="small", steps=3, plan=plan, history=[], recoveries=[],
        counts=state.counts(), latencies=[], points_hit={}, final_exit=None, fired=[],
        verdict=Verdict("unknown", ["the run did not get to its check"]), observation=None,
        seconds=0.5, started_at=state.t0, run_dir=None, interrupted=False).to_json()
    assert set(record) == {
        "index", "seed", "campaign_mode", "stale_kind", "durable_mode", "backend", "preset",
        "steps", "plan", "history", "recoveries", "counts", "latencies", "points_hit",
        "final_exit", "fired", "verdict", "observation", "seconds", "started_at", "run_dir",
        "interrupted"}
    assert record["plan"] == plan.to_json() and record["observation"] is None
    assert record["verdict"] == {"valid": "unknown", "checks": [], "check": None,
                                 "errors": ["the run did not get to its check"]}
    assert list(record["counts"]) == ["kills", "daemon_kills", "space_restarts",
                                      "lost_spaces", "process_kills", "fenced", "timeouts",
                                      "attempts", "foreign", "drives", "refused_tokens",
                                      "coordinator_kills", "power_losses",
                                      "machine_checks", "pauses", "space_pauses",
                                      "link_cuts", "clock_jumps",
                                      "daemon_pauses", "state_disk_fills",
                                      "command_pauses", "work_disk_fills",
                                      "log_disk_fills", "host_power_cuts",
                                      "link_slowdowns"]  # appended only
    assert json.loads(json.dumps(record)) == record


def _pause(hold: float) -> Fault:
    return Fault("pause_space", "time", attempt=1, delay=0, kill_driver=False, hold=hold)


class _PauseThatBreaks:
    """A local provider whose pause freezes the Space and then reports a broken channel
    (as a QMP ``stop`` whose answer was lost): the Space is frozen all the same."""

    def __init__(self, spaces: object) -> None:
        self.inner = spaces

    def __getattr__(self, name: str) -> object:
        return getattr(self.inner, name)

    def pause(self, name: str) -> None:
        self.inner.pause(name)  # type: ignore[attr-defined]  # a LocalSpaces
        raise SpaceUnavailable("QMP stop: the machine's channel broke; whether it took effect "
                               "is unknown")

    def resume(self, name: str) -> None:
        self.inner.resume(name)  # type: ignore[attr-defined]  # a LocalSpaces


@pytest.fixture
def local_space(tmp_path: Path) -> Iterator[tuple[object, Callable[[], bool]]]:
    """A real local Space ``s`` and whether its daemon is stopped now."""
    import psutil

    from backends.local import LocalSpaces

    spaces = LocalSpaces(tmp_path / "spaces")
    spaces.create("s")

    def daemon_stopped() -> bool:
        found = spaces.get("s").daemon()
        assert found is not None
        return psutil.Process(found[0]).status() == psutil.STATUS_STOPPED

    try:
        yield spaces, daemon_stopped
    finally:
        spaces.delete_all()


def test_a_paused_space_is_thawed_by_its_timer_by_any_other_space_fault_and_at_teardown(
        tmp_path: Path, local_space: tuple[object, Callable[[], bool]]) -> None:
    """A real local Space frozen by the nemesis: its daemon stopped, then running again after
    the pause's hold, before a restart of the Space (a restart thaws first), and when the
    nemesis is torn down with a pause still holding it."""
    spaces, daemon_stopped = local_space
    state = RunState()
    brief, long = _pause(0.2), _pause(600)
    restart = Fault("restart_space", "time", attempt=1, delay=0, kill_driver=False)
    nemesis = ValidatingNemesis(FaultNemesis(), FaultPlan(1, (brief, long, restart, long)), state)
    nemesis.setup(Target(spaces, "s", tmp_path, state, threading.Event()))  # type: ignore[arg-type]

    assert nemesis.invoke(_op(0, brief)).type == "info"
    until("the brief pause's timer to thaw the daemon", lambda: not daemon_stopped())
    # (a SIGSTOP stops the daemon before it runs any more code of its own, but its state
    # shows it only once it is scheduled: on a busy machine a moment later)
    assert nemesis.invoke(_op(1, long)).type == "info"
    until("the long pause to stop the daemon", daemon_stopped)
    assert nemesis.invoke(_op(2, restart)).type == "info"
    assert not daemon_stopped(), "the restart thawed the Space first"
    assert nemesis.invoke(_op(3, long)).type == "info"
    until("the second long pause to stop the daemon", daemon_stopped)
    nemesis.teardown()
    assert not daemon_stopped(), "the teardown thawed it"
    assert state.counts()["space_pauses"] == 3 and state.errors() == []


@pytest.mark.parametrize("order", ["long first", "brief first"])
def test_overlapping_pauses_each_get_their_whole_hold(
        tmp_path: Path, local_space: tuple[object, Callable[[], bool]], order: str) -> None:
    spaces, daemon_stopped = local_space
    state = RunState()
    faults = (_pause(600), _pause(0.2)) if order == "long first" else (_pause(0.2), _pause(600))
    nemesis = ValidatingNemesis(FaultNemesis(), FaultPlan(1, faults), state)
    nemesis.setup(Target(spaces, "s", tmp_path, state, threading.Event()))  # type: ignore[arg-type]
    for index, fault in enumerate(faults):
        assert nemesis.invoke(_op(index, fault)).type == "info"
    time.sleep(1.0)  # the brief pause's timer is long due (a slow machine only passes this)
    assert daemon_stopped(), "the brief pause thawed the Space the long one holds"
    nemesis.teardown()
    assert not daemon_stopped() and state.errors() == []


def test_a_pause_that_broke_off_is_still_thawed(
        tmp_path: Path, local_space: tuple[object, Callable[[], bool]]) -> None:
    spaces, daemon_stopped = local_space
    state = RunState()
    fault = _pause(600)
    nemesis = ValidatingNemesis(FaultNemesis(), FaultPlan(1, (fault,)), state)
    nemesis.setup(Target(_PauseThatBreaks(spaces), "s", tmp_path, state,  # type: ignore[arg-type]
                         threading.Event()))
    done = nemesis.invoke(_op(0, fault))
    assert done.type == "fail" and "channel broke" in done.value
    until("the pause that broke off to have stopped the daemon", daemon_stopped)
    nemesis.teardown()
    assert not daemon_stopped(), "a pause that may have frozen the Space is thawed"
