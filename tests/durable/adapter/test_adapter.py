"""The Space adapter in-process, on real local Spaces and real SQLite logs: lost Spaces,
auto's switch to checkpoint mode, forks, and fencing of an older epoch."""

from __future__ import annotations

import os
import signal
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import pytest

import durable.failpoints
from backends.local import LocalSpaces
from chaos.campaign.coverage import cell_of, reachable_cells
from durable.adapter import (
    SPACE_DOC,
    DirectoryCheckpointStore,
    DurableSpaces,
    TransactionalLimits,
    WorkspaceSnapshots,
    durable_spaces,
)
from durable.adapter.image import IMAGE_KEY, Image
from durable.adapter.snapshots import SnapshotProvider
from durable.coding_tools import coding_tools
from durable.errors import DurableError, PermanentFailure, StaleEpochError
from durable.harness import Harness
from durable.models import PlannedCall, ScriptedModel
from durable.spaces import Spaces
from durable.storage_fences import open_fenced_sqlite
from durable.tools import ToolRegistry
from spacesd import journal
from spacesd.audit import read_state
from spacesd.exec_files import Claim, read_claim
from spacesd.exec_ledger import replay
from spacesd.protocol import STATE_EXEC_DIR, STATE_LEDGER, workspace_hash
from tests.liveness import made_by_the_command, running


@dataclass
class Session:
    harness: Harness
    adapter: DurableSpaces


@pytest.fixture
def spaces(local_spaces: LocalSpaces) -> LocalSpaces:
    return local_spaces


SESSION = "s"
SPACE = "cua-s-c1"


def open_session(tmp_path: Path, spaces: Spaces, plan: list[PlannedCall], *, epoch: int,
                 mode: str, store: bool = True, max_files: int = 1000,
                 snapshots: SnapshotProvider | None = None) -> Session:
    """A driver of the session ``s`` on the log in ``tmp_path``; its checkpoints are
    ``snapshots``, by default workspace ones (in a store unless not ``store``)."""
    storage, fence = open_fenced_sqlite(tmp_path / "log.sqlite", epoch)
    if snapshots is None:
        snapshots = WorkspaceSnapshots(
            spaces, "", DirectoryCheckpointStore(tmp_path / "store") if store else None)
    adapter = durable_spaces(session=SESSION, spaces=spaces, snapshots=snapshots, mode=mode,
                             fence=fence,
                             epoch=epoch, transactional=TransactionalLimits(max_files=max_files))
    registry = ToolRegistry(coding_tools())
    registry.extend(adapter.extension)
    harness = Harness.open(storage, models=ScriptedModel(plan), registry=registry,
                           env=adapter.env)
    harness.resume()
    return Session(harness, adapter)


def steps(*calls: tuple[str, dict]) -> list[PlannedCall]:
    return [PlannedCall(i, name, args) for i, (name, args) in enumerate(calls)]


WRITE = ("write", {"path": "a.txt", "content": "alpha\n"})
EDIT = ("edit", {"path": "a.txt", "edits": [{"old_text": "alpha", "new_text": "beta"}]})
APPEND = ("bash", {"command": "printf 'step\\n' >> log.txt"})


def space_hash(s: Session) -> str:
    return workspace_hash(s.adapter.ensure_space(s.harness, 1).scan().entries)


def log_image(s: Session) -> Image:
    """The workspace image the log of ``s`` holds (its image entries folded in)."""
    image = Image()
    for e in s.harness.log.entries(1):
        if e.kind == "system" and IMAGE_KEY in e.data:
            image.fold(e.id, e.data[IMAGE_KEY])
    return image


def results(s: Session) -> list[dict]:
    return [e.data for e in s.harness.log.entries(1) if e.kind == "tool_result"]


def run(s: Session, request: str = "r1") -> None:
    outcome = s.harness.root("a").submit(content="go", request_id=request).wait()
    assert outcome.done, outcome


@pytest.mark.parametrize("mode", ["transactional", "checkpoint"])
def test_lost_space_is_rebuilt(tmp_path: Path, spaces: LocalSpaces, mode: str) -> None:
    plan = steps(WRITE, APPEND, EDIT, APPEND)
    s = open_session(tmp_path, spaces, plan[:2], epoch=1, mode=mode)
    run(s)
    before = space_hash(s)
    s.harness.close()
    spaces.delete(SPACE)
    s = open_session(tmp_path, spaces, plan, epoch=2, mode=mode)
    run(s, "r2")  # the next call finds the Space gone and rebuilds it first
    kinds = [e.kind for e in s.adapter.events]
    assert kinds[0] == ("reimaged" if mode == "transactional" else "restored"), kinds
    rebuilt = s.adapter.events[0]
    assert (rebuilt.tool, rebuilt.cause, rebuilt.epoch) == ("space", "space_lost", 2)
    assert cell_of(asdict(rebuilt)) in reachable_cells(mode)
    client = s.adapter.ensure_space(s.harness, 1)
    assert client.read_file("a.txt") == b"beta\n"
    assert client.read_file("log.txt") == b"step\nstep\n"
    assert all(not r["is_error"] for r in results(s))
    assert before != space_hash(s)
    s.harness.close()


@pytest.mark.parametrize("mode", ["transactional", "checkpoint"])
def test_a_space_made_again_under_its_name_is_rebuilt_not_trusted(
        tmp_path: Path, spaces: LocalSpaces, mode: str) -> None:
    """A Space removed and placed anew under the same name between two drivers (by an
    operator, a coordinator) exists and answers, but holds none of the log's files: the
    next driver tells it by its id and rebuilds it, as a lost one."""
    plan = steps(WRITE, APPEND, EDIT, APPEND)
    s = open_session(tmp_path, spaces, plan[:2], epoch=1, mode=mode)
    run(s)
    first_id = s.adapter.ensure_space(s.harness, 1).describe()["space_id"]
    s.harness.close()
    spaces.delete(SPACE)
    spaces.create(SPACE)  # empty, healthy, same name
    s = open_session(tmp_path, spaces, plan, epoch=2, mode=mode)
    run(s, "r2")
    rebuilt = s.adapter.events[0]
    assert (rebuilt.kind, rebuilt.cause) == (
        "reimaged" if mode == "transactional" else "restored", "space_lost")
    client = s.adapter.ensure_space(s.harness, 1)
    assert client.describe()["space_id"] != first_id
    assert client.read_file("a.txt") == b"beta\n"
    assert client.read_file("log.txt") == b"step\nstep\n"
    assert all(not r["is_error"] for r in results(s))
    s.harness.close()


def test_a_space_keeps_its_id_across_restarts(tmp_path: Path, spaces: LocalSpaces) -> None:
    spaces.create(SPACE)
    first = spaces.connect(SPACE, epoch=0).describe()
    spaces.restart(SPACE)
    spaces.kill_daemon(SPACE)
    again = spaces.connect(SPACE, epoch=0).describe()
    assert again["space_id"] == first["space_id"] and len(first["space_id"]) == 32
    spaces.connect(SPACE, epoch=4).advance_epoch(4)
    assert spaces.connect(SPACE, epoch=0).describe()["floor"] == 4  # any epoch may read it


def test_lost_space_without_store_fails_permanently(tmp_path: Path, spaces: LocalSpaces) -> None:
    s = open_session(tmp_path, spaces, steps(WRITE), epoch=1, mode="checkpoint", store=False)
    run(s)
    s.harness.close()
    spaces.delete(SPACE)
    s = open_session(tmp_path, spaces, steps(WRITE, APPEND), epoch=2, mode="checkpoint",
                     store=False)
    with pytest.raises(PermanentFailure, match=r"CheckpointStore.*transactional mode"):
        run(s, "r2")
    s.harness.close()


def test_image_in_the_log_equals_the_workspace(tmp_path: Path, spaces: LocalSpaces) -> None:
    s = open_session(tmp_path, spaces, steps(WRITE, APPEND, EDIT, APPEND), epoch=1,
                     mode="transactional")
    run(s)
    assert log_image(s).hash() == space_hash(s)
    s.harness.close()


@pytest.mark.parametrize(("call", "reason", "cause"), [
    (("bash", {"command": "(sleep 60 >/dev/null 2>&1 &); echo started"}), "process running",
     "process_running"),
    (("bash", {"command": "mkdir -p many && for i in $(seq 1 12); do echo $i > many/f$i; done"}),
     "exceed max_files=10", "over_limits"),
])
def test_auto_switches_to_checkpoint(tmp_path: Path, spaces: LocalSpaces, call: tuple,
                                     reason: str, cause: str) -> None:
    s = open_session(tmp_path, spaces, steps(WRITE, call, APPEND), epoch=1, mode="auto",
                     max_files=10)
    run(s)
    doc = s.harness.log.read_doc(1, SPACE_DOC).value
    assert doc["mode"] == "checkpoint"
    assert reason in doc["mode_reason"]
    modes = [e for e in s.adapter.events if e.kind == "mode"]
    assert len(modes) == 1 and modes[0].mode == "checkpoint"
    assert (modes[0].tool, modes[0].cause, modes[0].epoch) == ("bash", cause, 1)
    assert doc["checkpoint"] is not None, "the switch is followed by a checkpoint"
    assert all(not r["is_error"] for r in results(s)), results(s)
    s.harness.close()


@pytest.mark.parametrize("mode", ["checkpoint", "transactional"])
def test_fork_gets_the_parents_state_at_the_fork_entry(tmp_path: Path, spaces: LocalSpaces,
                                                       mode: str) -> None:
    """A fork at a call's result starts from the workspace that call left: in
    transactional mode the call's image entry must precede its result in the log (it came
    after it, so a fork there lacked the call's own change: found by the campaign's forks
    preset, seed 1), in checkpoint mode its checkpoint must be read as of the result."""
    s = open_session(tmp_path, spaces, steps(WRITE, APPEND, EDIT), epoch=1, mode=mode)
    run(s)
    entries = s.harness.log.entries(1)
    after_append = [e for e in entries if e.kind == "tool_result"][1]
    child = s.harness.root("a").fork(after_append.id)
    client = s.adapter.ensure_space(s.harness, child.id)
    assert client.name != SPACE
    assert client.read_file("a.txt") == b"alpha\n", "the edit came after the fork entry"
    assert client.read_file("log.txt") == b"step\n"
    assert s.adapter.ensure_space(s.harness, 1).read_file("a.txt") == b"beta\n"
    s.harness.close()


def test_an_older_epoch_is_refused_by_log_and_space(tmp_path: Path,
                                                    spaces: LocalSpaces) -> None:
    old = open_session(tmp_path, spaces, steps(WRITE, APPEND), epoch=1, mode="transactional")
    run(old)
    old_client = old.adapter.ensure_space(old.harness, 1)
    new = open_session(tmp_path, spaces, steps(WRITE, APPEND), epoch=2, mode="transactional")
    new.adapter.ensure_space(new.harness, 1)
    with pytest.raises(StaleEpochError):
        old_client.write_file("a.txt", b"stale\n")
    with pytest.raises(StaleEpochError), old.harness.log.transaction() as tx:
        tx.append(1, "system", {"content": "stale"})
    assert new.adapter.ensure_space(new.harness, 1).read_file("a.txt") == b"alpha\n"
    old.harness.close()
    new.harness.close()


def test_a_space_half_made_by_a_crash_is_finished(tmp_path: Path, spaces: LocalSpaces,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """A driver crashed right after creating a lost Space's replacement, before bringing it
    to the log's state (its daemon is gone too): the next driver finishes the job."""
    s = open_session(tmp_path, spaces, steps(WRITE, APPEND), epoch=1, mode="transactional")
    run(s)
    s.harness.close()
    spaces.delete(SPACE)

    class Crash(Exception):
        pass

    real_create = spaces.create

    def create_then_crash(name: str) -> None:
        real_create(name)
        daemon = spaces.get(name).daemon()
        assert daemon is not None
        os.kill(daemon[0], signal.SIGKILL)
        raise Crash

    monkeypatch.setattr(spaces, "create", create_then_crash)
    s = open_session(tmp_path, spaces, steps(WRITE, APPEND), epoch=2, mode="transactional")
    with pytest.raises(Crash):
        s.adapter.ensure_space(s.harness, 1)
    s.harness.close()
    monkeypatch.setattr(spaces, "create", real_create)
    s = open_session(tmp_path, spaces, steps(WRITE, APPEND, EDIT), epoch=3, mode="transactional")
    run(s, "r2")
    client = s.adapter.ensure_space(s.harness, 1)
    assert client.read_file("a.txt") == b"beta\n"
    assert client.read_file("log.txt") == b"step\n"
    s.harness.close()


class Crash(DurableError):
    """Stands for a SIGKILL: propagates out of the harness and leaves the call running."""



class CrashAt:
    """A failpoint channel (``durable.failpoints``) that crashes at the ``nth`` hit of
    ``point``, wherever the point is reached (once the command made ``started``, if given:
    ``made_by_the_command``)."""

    enabled = True

    def __init__(self, point: str, nth: int = 1, started: Path | None = None) -> None:
        self.point = point
        self.nth = nth
        self.started = started
        self.hits = 0

    def report(self, point: str, _info: object) -> None:
        if point == self.point:
            self.hits += 1
            if self.hits == self.nth:
                if self.started is not None:
                    made_by_the_command(self.started)
                raise Crash(f"crashed at {point}")


#: Running until a newer epoch's advance fences it: its first run sleeps ten minutes (a
#: fixed 5 s could end by itself while a loaded machine recovers, and the cause then read
#: ``exited``, not ``fenced``), a rerun writes at once. Its mark is beside the Spaces
#: (``../..`` of the workspace): no revert, restore or loss of the Space reaches it.
LONG_MARK = "long-first-run"
LONG = ("bash", {"command": f"if mkdir ../../{LONG_MARK} 2>/dev/null; then sleep 600; fi; "
                            "printf 'long\\n' >> log.txt"})


@pytest.mark.parametrize(("mode", "call", "point", "events"), [
    ("checkpoint", WRITE, "call.intent", [("ran", "no_start_mark")]),
    ("transactional", APPEND, "space.before_spawn", [("ran", "key_unknown")]),
    ("checkpoint", APPEND, "space.exited", [("replayed", "exited")]),
    ("transactional", LONG, "space.running", [("reverted", "fenced")]),
    ("checkpoint", LONG, "space.running", [("restored", "fenced"), ("interrupted", "fenced")]),
    ("transactional", WRITE, "space.file_op", [("reverted", "file_cut")]),
    ("checkpoint", EDIT, "space.file_op", [("restored", "file_cut")]),
    # the edit reached the Space, its outcome did not reach the log: undone, then run once
    ("transactional", EDIT, "space.file_written", [("reverted", "file_cut")]),
    ("checkpoint", EDIT, "space.file_written", [("restored", "file_cut")]),
    ("checkpoint", APPEND, "space.outcome", [("adopted", "outcome_recorded")]),
])
def test_recovery_events_carry_tool_cause_and_epoch(
        tmp_path: Path, spaces: LocalSpaces, monkeypatch: pytest.MonkeyPatch, mode: str,
        call: tuple, point: str, events: list[tuple[str, str]]) -> None:
    """A driver crashes at ``point`` in the last call; the next one (epoch 2) recovers it
    through the executor and records the decision's events, one cell each."""
    plan = steps(WRITE, call)
    s = open_session(tmp_path, spaces, plan, epoch=1, mode=mode)
    # The first call (a write) reaches every point but the shell command's own.
    nth = 1 if point in ("space.before_spawn", "space.running", "space.exited") else 2
    monkeypatch.setattr(durable.failpoints, "_channel", CrashAt(
        point, nth, spaces.base_dir / LONG_MARK if call is LONG else None))
    with pytest.raises(Crash):
        run(s)
    s.harness.close()
    monkeypatch.undo()
    s = open_session(tmp_path, spaces, plan, epoch=2, mode=mode)
    run(s)
    got = [e for e in s.adapter.events if e.kind != "mode"]
    assert [(e.kind, e.cause) for e in got] == events
    tool = call[0]
    assert all((e.tool, e.epoch, e.call_id) == (tool, 2, got[0].call_id) for e in got)
    assert all(cell_of(asdict(e)) in reachable_cells(mode) for e in got)
    assert not any(r["is_error"] and not r.get("interrupted") for r in results(s)), results(s)
    s.harness.close()


@pytest.mark.parametrize(("mode", "events"), [
    ("transactional", [("reimaged", "space"), ("reverted", "bash")]),
    ("checkpoint", [("restored", "space"), ("restored", "bash"), ("interrupted", "bash")]),
])
def test_a_call_whose_space_was_lost(tmp_path: Path, spaces: LocalSpaces,
                                     monkeypatch: pytest.MonkeyPatch, mode: str,
                                     events: list[tuple[str, str]]) -> None:
    """The Space is lost while a command runs and the driver crashes: the next one rebuilds
    the Space, then recovers the call; every event says the Space was lost."""
    plan = steps(WRITE, LONG)
    s = open_session(tmp_path, spaces, plan, epoch=1, mode=mode)
    monkeypatch.setattr(durable.failpoints, "_channel",
                        CrashAt("space.running", started=spaces.base_dir / LONG_MARK))
    with pytest.raises(Crash):
        run(s)
    s.harness.close()
    monkeypatch.undo()
    spaces.delete(SPACE)
    s = open_session(tmp_path, spaces, plan, epoch=2, mode=mode)
    run(s)
    got = [e for e in s.adapter.events if e.kind != "mode"]
    assert [(e.kind, e.tool) for e in got] == events
    assert {(e.cause, e.epoch) for e in got} == {("space_lost", 2)}
    assert all(cell_of(asdict(e)) in reachable_cells(mode) for e in got)
    s.harness.close()


#: A bash call that leaves a process of its own behind (in a session of its own, so only the
#: Space's fence can end it) and prints its pid.
BACKGROUND = ("bash", {"command": "setsid sleep 300 >/dev/null 2>&1 </dev/null & echo $!"})


class KillShimAt:
    """A failpoint channel that SIGKILLs the shim of the command reported at the ``nth`` hit
    of ``space.running`` once that command made ``mark`` (the command itself lives on,
    orphaned): the driver finds its key lost and recovers the call in-process, at its own
    epoch."""

    enabled = True

    def __init__(self, spaces: LocalSpaces, nth: int, mark: Path) -> None:
        self.spaces, self.nth, self.mark = spaces, nth, mark
        self.hits = 0

    def report(self, point: str, info: dict[str, Any]) -> None:
        if point == "space.running":
            self.hits += 1
            if self.hits == self.nth:
                shim = _shim_pid(self.spaces, info["key"])
                # "running" is the shim's claim, which comes before it spawns the command:
                # killed before the command decided what it does (made its mark), the
                # driver's fence could end it first and its rerun take the first run's path
                made_by_the_command(self.mark)
                self.spaces.kill_process(SPACE, shim)


@pytest.mark.parametrize(("mode", "kind"), [("transactional", "reverted"),
                                            ("checkpoint", "restored")])
def test_an_in_process_restore_first_ends_the_drivers_own_earlier_processes(
        tmp_path: Path, spaces: LocalSpaces, monkeypatch: pytest.MonkeyPatch, mode: str,
        kind: str) -> None:
    """A command's shim is killed while the command runs on, orphaned, and a process the
    same driver started in an earlier call runs too. The driver finds the command's key lost
    and recovers the call at once, at its own epoch: it reverts (or restores) the workspace.
    No process started before that may survive it (the design restores "under a new
    epoch"): the driver fences its own epoch first (both die), which the daemon's fence
    journal records from a fresh look at /proc. Without that, the orphan appends to
    ``log.txt`` after the workspace was reverted (even when the revert had no file to
    change), and a background job outlives the restore.

    The orphan outlives any recovery (its first run sleeps 600 s, not ``LONG``'s 5 s, which
    a loaded machine's recovery could outlast), while the transactional rerun, which finds
    the marker outside the workspace, writes at once."""
    first_run = tmp_path / "first-run"
    orphan = ("bash", {"command": f"if mkdir {first_run} 2>/dev/null; then sleep 600; fi; "
                                  "printf 'long\\n' >> log.txt"})
    s = open_session(tmp_path, spaces, steps(BACKGROUND, WRITE, orphan), epoch=1, mode=mode)
    monkeypatch.setattr(durable.failpoints, "_channel", KillShimAt(spaces, 2, first_run))
    run(s)
    monkeypatch.undo()
    got = [(e.kind, e.cause, e.epoch) for e in s.adapter.events if e.kind not in ("mode",)]
    assert (kind, "daemon_lost", 1) in got, got
    background_pid = int(results(s)[0]["content"].split()[0])
    assert not running(background_pid), "a process of an earlier call outlived the restore"
    state = read_state(str(spaces.get(SPACE).state))
    own = [f for f in state.fences if f["t"] == "advance" and f.get("own")]
    assert len(own) == 1, state.fences
    background_key, long_key = (k.key for k in state.keys[:2])  # (then its rerun)
    assert own[0]["killed"] == sorted([background_key, long_key]), own[0]
    assert own[0]["alive_after"] == [], own[0]
    assert all(f["alive_after"] == [] for f in state.fences if f["t"] == "restore")
    # the workspace holds what the log says: the rerun's line (transactional) or none
    log_txt = spaces.get(SPACE).dir / "work" / "log.txt"
    assert (log_txt.read_text() if log_txt.exists() else None) == (
        "long\n" if mode == "transactional" else None)
    s.harness.close()
def _shim_pid(spaces: LocalSpaces, key: str) -> int:
    """The pid of ``key``'s shim, from its claim (written as the shim starts: waited for)."""
    state = spaces.get(SPACE).state
    (rec,) = [r for r in replay(journal.load(str(state / STATE_LEDGER)).records).values()
              if r.key == key]
    deadline = time.monotonic() + 120
    while not isinstance(claim := read_claim(rec.file(str(state / STATE_EXEC_DIR), ".claim")),
                         Claim):
        assert time.monotonic() < deadline, f"the shim of {key} never wrote its claim"
        time.sleep(0.01)
    return claim.pid


def test_the_image_follows_a_write_a_full_disk_refused(tmp_path: Path) -> None:
    """A write that met a full disk changed no content, but on a workspace on a filesystem
    of its own its temp file came and went next to the target, and the directory's mtime
    with it: the log's image must follow the workspace after a failed call too (it kept the
    mtime before it, and the campaign's G1 found the image and the workspace apart)."""
    if os.geteuid() != 0:
        pytest.skip("a workspace disk of its own is a tmpfs mount, which needs root")
    spaces = LocalSpaces(tmp_path / "spaces", work_disk=1024 * 1024)
    try:
        fill = ("bash", {"command": "mkdir -p files && head -c 2000000 /dev/zero > ballast"})
        big = ("write", {"path": "files/w.txt", "content": "w" * 20000})
        s = open_session(tmp_path, spaces, steps(fill, big), epoch=1, mode="transactional")
        run(s)
        got = results(s)
        assert [r["is_error"] for r in got] == [True, True], got
        assert "No space left on device" in got[1]["content"], got[1]
        assert log_image(s).hash() == space_hash(s)
        s.harness.close()
    finally:
        spaces.delete_all()


@pytest.mark.parametrize("mode", ["transactional", "checkpoint"])
def test_a_start_its_driver_gave_up_on_runs_once_when_it_arrives_after_the_rerun(
        tmp_path: Path, spaces: LocalSpaces, monkeypatch: pytest.MonkeyPatch,
        mode: str) -> None:
    """A command's start times out on its way (a slow network holds it); the driver
    recovers in-process, finds the key unknown and runs the call again; the held start then
    arrives. The rerun uses the same key, so the ledger runs the command once (a new key
    ran it twice; found by review of the slow-links fix)."""
    from backends.space_client import HttpSpaceClient
    from durable.errors import SpaceUnavailable

    held: list[tuple[HttpSpaceClient, str, str]] = []
    start = HttpSpaceClient.exec_start

    def held_on_the_way(self: HttpSpaceClient, key: str, command: str,
                        **kw: Any) -> Any:
        if not held:
            held.append((self, key, command))
            raise SpaceUnavailable("the start timed out on its way (held by the test)")
        return start(self, key, command, **kw)

    monkeypatch.setattr(HttpSpaceClient, "exec_start", held_on_the_way)
    s = open_session(tmp_path, spaces, steps(APPEND), epoch=1, mode=mode)
    run(s)
    assert [(e.kind, e.cause) for e in s.adapter.events if e.tool == "bash"] == \
        [("ran", "key_unknown")]
    client, key, command = held[0]
    info = start(client, key, command)  # the held start arrives, after the rerun
    assert info.state == "exited", info
    assert s.adapter.ensure_space(s.harness, 1).read_file("log.txt") == b"step\n"
    s.harness.close()
