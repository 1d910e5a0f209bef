"""Fencing and session identity with real Spaces, real SQLite logs and real processes: one
Space per session, one owner per epoch, keys that carry their session, and a driver that
refuses a bad environment with exit 78."""

from __future__ import annotations

import io
import json
import time
from collections.abc import Callable
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import pytest

from backends.local import LocalSpaces
from backends.space_client import HttpSpaceClient
from durable.adapter import DurableSpaces, WorkspaceSnapshots, durable_spaces
from durable.adapter.space_names import session_spaces, session_token, space_name
from durable.coding_tools import coding_tools
from durable.errors import EpochTaken, SpaceNotFound, StaleEpochError
from durable.fence_contract import Fence
from durable.harness import Harness, Outcome, Submission
from durable.models import PlannedCall, ScriptedModel
from durable.session_driver import (
    EXIT_FENCED,
    EXIT_OK,
    EXIT_PERMANENT,
    Session,
    SessionEnv,
    Started,
    run_durable_session,
)
from durable.session_log import open_for_audit, session_log
from durable.storage_fences import open_fenced_sqlite
from durable.tools import ToolRegistry
from spacesd.procfs import start_time
from tests.escapes import read_pid

#: The same calls (same ids, same commands) in every session: only identity tells them apart.
PLAN = [PlannedCall(0, "bash", {"command": "echo ran >> who.txt; cat who.txt"}),
        PlannedCall(1, "write", {"path": "done.txt", "content": "done\n"})]


def open_harness(log_dir: Path, spaces: LocalSpaces, session: str, epoch: int,
                 on_stale: Callable[[StaleEpochError], None] | None = None,
                 plan: list[PlannedCall] = PLAN) -> tuple[Harness, DurableSpaces]:
    log_dir.mkdir(parents=True, exist_ok=True)
    storage, fence = open_fenced_sqlite(log_dir / "log.sqlite", epoch)
    adapter = durable_spaces(session=session, spaces=spaces,
                             snapshots=WorkspaceSnapshots(spaces, "", None), mode="checkpoint",
                             fence=fence, epoch=epoch, on_stale=on_stale)
    registry = ToolRegistry(coding_tools())
    registry.extend(adapter.extension)
    harness = Harness.open(storage, models=ScriptedModel(plan), registry=registry,
                           env=adapter.env)
    harness.resume()
    return harness, adapter


def _checkpoint_spaces(local_spaces: LocalSpaces) -> Callable[[Fence, SessionEnv], DurableSpaces]:
    """The ``durable`` of a driver on ``local_spaces`` in checkpoint mode, without a store."""
    def build(fence: Fence, senv: SessionEnv) -> DurableSpaces:
        return durable_spaces(session=senv.name, spaces=local_spaces,
                              snapshots=WorkspaceSnapshots(local_spaces, "", None),
                              mode="checkpoint", fence=fence, epoch=senv.epoch)
    return build


def _starting(wrap: Callable[[Started], Started]) -> Callable[[Session], Started]:
    """A ``start`` that submits PLAN's task and hands its ``Started`` to ``wrap``."""
    def start(session: Session) -> Started:
        harness = session.open_harness(models=ScriptedModel(PLAN),
                                       registry=ToolRegistry(coding_tools()))
        return wrap(session.started(harness.root("a").submit(content="go",
                                                             request_id="r1")))
    return start


class _Handing:
    """A ``Started`` that hands every call to the standard one; a test overrides some."""

    def __init__(self, inner: Started) -> None:
        self.inner = inner

    def wait(self) -> Outcome:
        return self.inner.wait()

    def ensure_space(self) -> None:
        self.inner.ensure_space()

    def close(self) -> None:
        self.inner.close()


def test_session_tokens_are_safe_bounded_and_distinct() -> None:
    names = ["run-1", "a/b", "a_b", "a b", "x" * 200, "x" * 201, "é", ":@", "-lead"]
    tokens = [session_token(n) for n in names]
    assert tokens[0] == "run-1"
    assert len(set(tokens)) == len(tokens)
    for token in tokens:
        assert len(token) <= 33 and ":" not in token and "@" not in token
        name = space_name("cua", token, 12345)
        assert name[0].isalnum() and all(c.isalnum() or c in "._-" for c in name)
        # a session's Spaces share one prefix, whatever its token holds ("-c" included)
        assert session_spaces(name) + "7" == space_name("cua", token, 7)
    assert session_spaces(space_name("cua", "x-c1-c", 3)) == "cua-x-c1-c-c"
    with pytest.raises(ValueError, match="not a conversation's Space name"):
        session_spaces("cua-run-1")
    with pytest.raises(ValueError, match="non-empty name"):
        session_token("")


def test_two_sessions_on_one_provider_get_their_own_spaces_and_results(
        tmp_path: Path, local_spaces: LocalSpaces) -> None:
    outputs = {}
    for session in ("alpha", "beta"):
        harness, adapter = open_harness(tmp_path / session, local_spaces, session, epoch=1)
        try:
            outcome = harness.root("a").submit(content="go", request_id="r1").wait()
            assert outcome.done, outcome
            outputs[session] = next(e.data for e in harness.log.entries(1)
                                    if e.kind == "tool_result")
            assert adapter.space_name(1) == f"cua-{session}-c1"
        finally:
            harness.close()
    assert sorted(local_spaces.names()) == ["cua-alpha-c1", "cua-beta-c1"]
    for session in ("alpha", "beta"):
        client = local_spaces.connect(f"cua-{session}-c1", epoch=1)
        assert client.read_file("who.txt") == b"ran\n"  # never the other session's run
        assert outputs[session]["content"].rstrip().endswith("ran"), outputs[session]
        ledger = local_spaces.get(f"cua-{session}-c1").state / "ledger.jsonl"
        keys = [json.loads(line)["key"] for line in ledger.read_text().splitlines()
                if json.loads(line)["t"] == "start"]
        assert keys and all(k.startswith(f"{session}:1:") for k in keys), keys
        # the same call id, command and epoch: only the session in the key tells them apart
        other = "beta" if session == "alpha" else "alpha"
        twin = keys[0].replace(f"{session}:", f"{other}:", 1)
        assert client.exec_status(twin).state == "unknown"


def _driver_env(tmp_path: Path, epoch: str, state: Path | None = None) -> dict[str, str]:
    return {"CUA_SESSION_NAME": "s", "CUA_SESSION_EPOCH": epoch,
            "CUA_STATE_DIR": str(state or tmp_path / "state"),
            "CUA_SESSION_HEARTBEAT_SECS": "0.2"}


def _drive(tmp_path: Path, spaces: LocalSpaces, environ: dict[str, str]) -> tuple[int, str]:
    built: list[DurableSpaces] = []

    def build(fence: Fence, senv: SessionEnv) -> DurableSpaces:
        built.append(durable_spaces(session=senv.name, spaces=spaces,
                                    snapshots=WorkspaceSnapshots(spaces, "", None),
                                    mode="checkpoint", fence=fence, epoch=senv.epoch))
        return built[-1]

    def start(session: Session) -> Submission:
        registry = ToolRegistry(coding_tools())
        harness = session.open_harness(models=ScriptedModel(PLAN), registry=registry)
        return harness.root("a").submit(content="go", request_id="r1")

    out = io.StringIO()
    with redirect_stdout(out), redirect_stderr(out):
        code = run_durable_session(durable=build, start=start, environ=environ)
    return code, out.getvalue()


def test_a_space_raised_to_the_drivers_epoch_by_another_log_is_run_above_it(
        tmp_path: Path, local_spaces: LocalSpaces) -> None:
    """The seed's bug: a new log on a Space an earlier session raised to exactly the new
    driver's epoch must not share that epoch: it runs at e+1, which kills the other log's
    processes, and it never sees the other log's recorded results."""
    name = "cua-s-c1"
    local_spaces.create(name)
    other = local_spaces.connect(name, epoch=3)
    other.advance_epoch(3, owner="the-other-log")
    other.exec_start("s:1:0.0:1@3", "echo $$ > other.pid; exec sleep 300")
    pid = read_pid(local_spaces.get(name).work / "other.pid")
    assert start_time(pid) is not None

    code, out = _drive(tmp_path, local_spaces, _driver_env(tmp_path, "3"))
    assert code == EXIT_OK, out
    assert "CUA-EPOCH 4 " in out and "CUA-HEARTBEAT 3 " not in out.split("CUA-EPOCH 4")[1]
    deadline = time.monotonic() + 120
    while start_time(pid) is not None:
        assert time.monotonic() < deadline, f"the other log's process {pid} survived"
        time.sleep(0.02)
    storage, fence = open_fenced_sqlite(tmp_path / "state" / "log.sqlite", 4)
    try:
        assert fence.floor() == 4  # the epoch it actually ran at is the log's
    finally:
        storage.close()
    client = local_spaces.connect(name, epoch=4)
    assert client.read_file("who.txt") == b"ran\n"
    assert client.exec_status("s:1:0.0:1@3").state == "exited"  # killed, not replayed
    ledger = (local_spaces.get(name).state / "ledger.jsonl").read_text()
    assert '@4"' in ledger


def test_one_epoch_of_a_space_has_one_owner(local_spaces: LocalSpaces) -> None:
    local_spaces.create("sp")
    client = local_spaces.connect("sp", epoch=2)
    assert client.advance_epoch(2, owner="a")["floor"] == 2
    assert client.advance_epoch(2, owner="a")["floor"] == 2  # its owner again: a no-op
    client.exec_start("k@2", "sleep 300")
    with pytest.raises(EpochTaken) as taken:
        client.advance_epoch(2, owner="b")
    assert (taken.value.epoch, taken.value.floor) == (2, 2)
    assert "advance to 3 or above" in str(taken.value)
    assert client.exec_status("k@2").state == "running"  # the refusal killed nothing
    local_spaces.kill_daemon("sp")  # the owner is persisted with the floor
    with pytest.raises(EpochTaken):
        client.advance_epoch(2, owner="b")
    assert client.advance_epoch(2, owner="a")["killed"] == []
    assert client.with_epoch(3).advance_epoch(3, owner="b")["killed"] == ["k@2"]


@pytest.mark.parametrize("epoch", ["0", str(2**63), "-1", "1.5", "\uff11"])
def test_a_driver_with_an_impossible_epoch_exits_78(tmp_path: Path, local_spaces: LocalSpaces,
                                                    epoch: str) -> None:
    code, out = _drive(tmp_path, local_spaces, _driver_env(tmp_path, epoch))
    assert code == EXIT_PERMANENT, out
    expected = (f"CUA-EXIT 78 bad environment: CUA_SESSION_EPOCH must be an integer from 1 "
                f"to {2**63 - 1} (it grows with every launch), got {epoch!r}")
    assert out.strip().splitlines() == [expected]


def test_a_driver_whose_state_dir_is_a_file_exits_78(tmp_path: Path,
                                                     local_spaces: LocalSpaces) -> None:
    state = tmp_path / "state"
    state.write_text("not a directory")
    code, out = _drive(tmp_path, local_spaces, _driver_env(tmp_path, "1", state))
    assert code == EXIT_PERMANENT, out
    assert len(out.strip().splitlines()) == 1 and "is not a directory" in out
    assert state.read_text() == "not a directory"


def test_on_stale_fires_once_per_refusal(tmp_path: Path, local_spaces: LocalSpaces,
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """A refusal met deep down (``advance_epoch`` inside a call's ``ensure``, here lost to a
    newer driver that advanced the Space between the probe and the advance) passes through
    the call's own handler too: ``on_stale`` still hears of it once."""
    harness, _adapter = open_harness(tmp_path, local_spaces, "s", epoch=1, plan=PLAN[:1])
    try:
        assert harness.root("a").submit(content="go", request_id="r1").wait().done
    finally:
        harness.close()
    probe = HttpSpaceClient.capabilities

    def probe_then_lose_the_race(client: HttpSpaceClient) -> set[str]:
        found = probe(client)
        if client.epoch == 1:
            client.with_epoch(5).advance_epoch(5, owner="newer")
        return found

    monkeypatch.setattr(HttpSpaceClient, "capabilities", probe_then_lose_the_race)
    seen: list[StaleEpochError] = []
    harness, _adapter = open_harness(tmp_path, local_spaces, "s", epoch=1, on_stale=seen.append)
    try:
        with pytest.raises(StaleEpochError):
            harness.root("a").submit(content="again", request_id="r2").wait()
    finally:
        harness.close()
    assert len(seen) == 1 and seen[0].floor == 5, seen


@pytest.mark.parametrize("interval", ["inf", "nan", "0", "1e-9", "-1", "x"])
def test_a_driver_with_an_impossible_heartbeat_exits_78(tmp_path: Path,
                                                        local_spaces: LocalSpaces,
                                                        interval: str) -> None:
    environ = {**_driver_env(tmp_path, "1"), "CUA_SESSION_HEARTBEAT_SECS": interval}
    code, out = _drive(tmp_path, local_spaces, environ)
    assert code == EXIT_PERMANENT, out
    assert len(out.strip().splitlines()) == 1 and "CUA_SESSION_HEARTBEAT_SECS" in out, out


def test_a_driver_with_an_unknown_log_storage_exits_78(tmp_path: Path,
                                                       local_spaces: LocalSpaces) -> None:
    environ = {**_driver_env(tmp_path, "1"), "CUA_LOG_STORAGE": "postgres"}
    code, out = _drive(tmp_path, local_spaces, environ)
    assert code == EXIT_PERMANENT, out
    assert out.strip().splitlines() == [
        "CUA-EXIT 78 bad environment: CUA_LOG_STORAGE='postgres' names no log storage; use "
        "one of sqlite, jsonl (default sqlite)"]
    assert not (tmp_path / "state").exists()


def test_a_driver_on_a_jsonl_log_runs_and_records_who_wrote_what(
        tmp_path: Path, local_spaces: LocalSpaces) -> None:
    """``CUA_LOG_STORAGE=jsonl``: the log is the directory ``log`` in the state directory,
    fenced by epoch markers; a second driver resumes from it and the audit sees both."""
    for epoch in ("1", "2"):
        code, out = _drive(tmp_path, local_spaces,
                           {**_driver_env(tmp_path, epoch), "CUA_LOG_STORAGE": "jsonl"})
        assert code == 0, out
    state = tmp_path / "state"
    assert sorted(p.name for p in state.iterdir()) == ["log"]
    storage = open_for_audit(state)
    try:
        history = storage.epoch_history()
        assert [epoch for epoch, _first, _ms in history.raises] == [1, 2]
        assert set(history.entry_epochs.values()) <= {1, 2}
        assert 1 in history.entry_epochs.values()
    finally:
        storage.close()


def test_raise_epoch_fences_a_space_by_name_before_its_first_use(
        tmp_path: Path, local_spaces: LocalSpaces) -> None:
    """``DurableSpaces.raise_epoch(name)``: an older epoch's command dies and that epoch is
    refused from then on; a driver of an older epoch than the Space's is refused itself
    (``on_stale`` told once), and a Space that does not exist is ``SpaceNotFound``."""
    name = "cua-s-c1"
    local_spaces.create(name)
    old = local_spaces.connect(name, epoch=1)
    old.advance_epoch(1, owner="an-older-driver")
    old.exec_start("s:1:0.0:1@1", "sleep 300")
    stale: list[StaleEpochError] = []
    _harness, adapter = open_harness(tmp_path / "two", local_spaces, "s", epoch=2,
                                     on_stale=stale.append)
    try:
        assert adapter.raise_epoch(name) == {"floor": 2, "round": 0,
                                            "killed": ["s:1:0.0:1@1"]}
        assert old.with_epoch(2).exec_status("s:1:0.0:1@1").fenced_by == 2
        with pytest.raises(StaleEpochError):
            old.write_file("late.txt", b"too late")
        assert adapter.raise_epoch(name) == {"floor": 2, "round": 0, "killed": []}  # a no-op
        with pytest.raises(SpaceNotFound):
            adapter.raise_epoch("cua-s-c9")
    finally:
        _harness.close()
    older_harness, older = open_harness(tmp_path / "one", local_spaces, "s", epoch=1,
                                        on_stale=stale.append)
    try:
        with pytest.raises(StaleEpochError):
            older.raise_epoch(name)
        assert len(stale) == 1
    finally:
        older_harness.close()


def test_the_driver_raises_the_spaces_epoch_before_start(
        tmp_path: Path, local_spaces: LocalSpaces) -> None:
    """The design's order: the driver opens the log, raises the Space's epoch, and only
    then calls ``start``: when ``start`` runs, the command an older driver left running in
    the session's Space is dead and the Space's floor is this driver's epoch."""
    name = "cua-s-c1"
    local_spaces.create(name)
    old = local_spaces.connect(name, epoch=1)
    old.advance_epoch(1, owner="an-older-driver")
    old.exec_start("s:1:0.0:1@1", "sleep 300")
    seen: list[tuple[int, str]] = []

    build = _checkpoint_spaces(local_spaces)

    def start(session: Session) -> Submission:
        probe = local_spaces.connect(name, epoch=2)
        seen.append((probe.describe()["floor"], probe.exec_status("s:1:0.0:1@1").state))
        harness = session.open_harness(models=ScriptedModel(PLAN),
                                       registry=ToolRegistry(coding_tools()))
        return harness.root("a").submit(content="go", request_id="r1")

    out = io.StringIO()
    with redirect_stdout(out), redirect_stderr(out):
        code = run_durable_session(durable=build, start=start,
                                   environ=_driver_env(tmp_path, "2"))
    assert code == EXIT_OK, out.getvalue()
    assert seen == [(2, "exited")]
    assert old.with_epoch(2).exec_status("s:1:0.0:1@1").fenced_by == 2


def test_start_gets_the_session_its_log_fence_and_on_stale(
        tmp_path: Path, local_spaces: LocalSpaces) -> None:
    """``start(session)``: the session's name, epoch and input, the opened log and its
    fence; ``session.on_stale`` (a refusal the app caught itself) halts the log's fence at
    once and ends the attempt fenced (75), whatever ``start`` returns."""
    got: list[tuple[str, int, str, bool]] = []

    build = _checkpoint_spaces(local_spaces)

    def start(session: Session) -> Submission:
        got.append((session.env.name, session.env.epoch, session.env.input,
                    session.fence.floor() == session.env.epoch))
        harness = session.open_harness(models=ScriptedModel(PLAN),
                                       registry=ToolRegistry(coding_tools()))
        submission = harness.root("a").submit(content=session.env.input, request_id="r1")
        session.on_stale(StaleEpochError("epoch 2 is below the floor 3 of the app's store"))
        assert session.harness is not None
        with pytest.raises(StaleEpochError, match="app's store"), \
                session.harness.log.transaction() as tx:  # halted at once
            tx.append(1, "system", {"content": "too late"})
        return submission

    out = io.StringIO()
    with redirect_stdout(out), redirect_stderr(out):
        code = run_durable_session(durable=build, start=start, environ={
            **_driver_env(tmp_path, "2"), "CUA_SESSION_INPUT": "do the thing"})
    assert code == EXIT_FENCED, out.getvalue()
    assert got == [("s", 2, "do the thing", True)]
    assert "CUA-EXIT 75 fenced: epoch 2 is below the floor 3 of the app's store" in out.getvalue()


def test_start_returns_wait_ensure_space_and_close_and_the_driver_calls_them_in_order(
        tmp_path: Path, local_spaces: LocalSpaces) -> None:
    """``start`` returns the design's ``{wait, close, ensure_space}`` (``Started``): the
    driver ensures the Space before the wait and after it, and closes last; an app's own
    ``Started`` is used as it is (here one that records its calls around the standard one),
    and anything else ends the attempt permanently (78), saying what to return."""
    calls: list[str] = []

    build = _checkpoint_spaces(local_spaces)

    class Recorded(_Handing):
        def wait(self) -> Outcome:
            calls.append("wait")
            return self.inner.wait()

        def ensure_space(self) -> None:
            calls.append("ensure_space")
            self.inner.ensure_space()

        def close(self) -> None:
            calls.append("close")
            self.inner.close()

    start = _starting(Recorded)

    out = io.StringIO()
    with redirect_stdout(out), redirect_stderr(out):
        code = run_durable_session(durable=build, start=start,
                                   environ=_driver_env(tmp_path / "own", "1"))
        wrong = run_durable_session(durable=build, start=lambda session: None,  # type: ignore[arg-type, return-value]
                                    environ=_driver_env(tmp_path / "wrong", "2"))
    assert code == EXIT_OK, out.getvalue()
    assert calls == ["ensure_space", "wait", "ensure_space", "close"]
    assert wrong == EXIT_PERMANENT
    assert "start returned NoneType, not something to run: return the Submission" in \
        out.getvalue()


def test_a_driver_overtaken_after_its_last_commit_exits_fenced_not_finished(
        tmp_path: Path, local_spaces: LocalSpaces) -> None:
    """A driver whose run settled, but that a newer epoch overtook before it reported (the
    stale-paused race: SIGSTOPped after its last commit, woken once a newer driver had
    finished the session), has nothing left a fence refuses; it must still exit fenced
    (75), not report the session finished (0) for its epoch. Found by a stale campaign
    with --stale-kind paused (seed 304: the older driver paused 12 ms after its last
    command's space.exited exited 0)."""
    log = tmp_path / "state"

    build = _checkpoint_spaces(local_spaces)

    class Overtaken(_Handing):
        """The standard ``Started``, with a newer driver opening the log once it settled."""

        def wait(self) -> Outcome:
            outcome = self.inner.wait()
            newer, _fence = open_fenced_sqlite(session_log(log), 2)
            newer.close()
            return outcome

    start = _starting(Overtaken)

    out = io.StringIO()
    with redirect_stdout(out), redirect_stderr(out):
        code = run_durable_session(durable=build, start=start, environ={
            **_driver_env(tmp_path, "1", log), "CUA_SESSION_HEARTBEAT_SECS": "3600"})
    assert code == EXIT_FENCED, out.getvalue()
    assert "CUA-EXIT 75 fenced: epoch 1 is below the log's floor 2" in out.getvalue()
