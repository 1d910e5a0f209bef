"""The failpoints a driver reaches, in order, for every recovery decision and mode: pinned.

Seeded fault plans count occurrences of a point (``space.running`` #3), so a refactor that
reorders, adds or drops a failpoint on some path changes which moment a seed kills, without
any test failing. Each case here drives real drivers in-process (a real SQLite log, real
local Spaces, the coding tools, the scripted model) through a scenario: a driver stops at
the n-th hit of a point (an exception standing for its SIGKILL, or a Space fault injected
while it waits there and then let go on), the next driver (the next epoch) recovers. Every
point reported (harness and adapter alike) is recorded through ``durable.failpoints`` and
compared with ``failpoint_order.json``, with the recovery events each driver decided (so a
case that stops reaching its decision is seen too).

The golden was recorded on the adapter before its split into keepers (issue 13). When a
change of order is intended, the failure prints the observed case as JSON: review it, then
replace the case in the golden file.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

import durable.failpoints
from backends.local import LocalSpaces
from durable.adapter import (
    DirectoryCheckpointStore,
    TransactionalLimits,
    WorkspaceSnapshots,
    durable_spaces,
)
from durable.coding_tools import coding_tools
from durable.errors import DurableError
from durable.harness import Harness
from durable.models import PlannedCall, ScriptedModel
from durable.storage_fences import open_fenced_sqlite
from durable.tools import ToolRegistry
from tests.liveness import made_by_the_command

GOLDEN = Path(__file__).with_name("failpoint_order.json")
SESSION = "g"
SPACE = "cua-g-c1"

WRITE = ("write", {"path": "a.txt", "content": "alpha\n"})
EDIT = ("edit", {"path": "a.txt", "edits": [{"old_text": "alpha", "new_text": "beta"}]})
APPEND = ("bash", {"command": "printf 'step\\n' >> log.txt"})
#: Running when a driver stops at ``space.running`` until a newer epoch's advance fences
#: it: its first run sleeps ten minutes (a fixed 5 s could end by itself while a loaded
#: machine recovers, and the cause then read ``exited``), a rerun writes at once. Its mark is
#: beside the Spaces (``../..`` of the workspace): no revert, restore or loss reaches it.
LONG_MARK = "long-first-run"
LONG = ("bash", {"command": f"if mkdir ../../{LONG_MARK} 2>/dev/null; then sleep 600; fi; "
                            "printf 'long\\n' >> log.txt"})
#: Running when its daemon is killed or its machine restarted under it (``FAULT_DONE``,
#: beside the Spaces, appears once the fault is done), done soon after if it survived.
FAULT_DONE = "fault-done"
SHORT = ("bash", {"command": f"until [ -e ../../{FAULT_DONE} ]; do sleep 0.05; done; "
                             "printf 'short\\n' >> log.txt"})
#: Leaves a process running: auto switches to checkpoint mode.
DETACH = ("bash", {"command": "(sleep 60 >/dev/null 2>&1 &); echo started"})
#: Twelve files: over ``max_files=10``.
MANY = ("bash", {"command": "mkdir -p many && for i in $(seq 1 12); do echo $i > many/f$i; done"})


class Crash(DurableError):
    """Stands for a SIGKILL at a failpoint: propagates out of the harness."""


@dataclass(frozen=True)
class Stop:
    """What happens to a driver at the ``n``-th hit of ``point``: ``crash`` (it dies there),
    or a Space fault (``kill_daemon``: the daemon dies and comes back, commands live on;
    ``restart``: the daemon and every command die, the disk stays; ``delete``: the Space
    is lost), after which the driver goes on."""

    point: str
    n: int = 1
    fault: str = "crash"


@dataclass(frozen=True)
class Driver:
    stop: Stop | None = None
    #: Delete the Space after this driver ended (lost between two drivers).
    then_lose_space: bool = False


@dataclass(frozen=True)
class Case:
    id: str
    mode: str
    plan: tuple[tuple[str, dict[str, Any]], ...]
    drivers: tuple[Driver, ...]
    #: The Space exists before the first driver, with a file in it (as the campaign seeds
    #: it); otherwise the first driver builds it.
    seeded: bool = True
    store: bool = True
    max_files: int = 1000


def _crash(point: str, n: int = 1) -> Driver:
    return Driver(Stop(point, n))


CLEAN = Driver()
CASES: tuple[Case, ...] = (
    # ------------------------------------------------------------ uninterrupted
    Case("transactional-clean", "transactional", (WRITE, APPEND, EDIT), (CLEAN,)),
    Case("checkpoint-clean", "checkpoint", (WRITE, APPEND, EDIT), (CLEAN,)),
    Case("auto-clean", "auto", (WRITE, APPEND, EDIT), (CLEAN,)),
    Case("transactional-unseeded", "transactional", (WRITE, APPEND), (CLEAN,), seeded=False),
    Case("checkpoint-unseeded", "checkpoint", (WRITE, APPEND), (CLEAN,), seeded=False),
    Case("auto-switch-process-running", "auto", (WRITE, DETACH, APPEND), (CLEAN,)),
    Case("auto-switch-over-limits", "auto", (WRITE, MANY, APPEND), (CLEAN,), max_files=10),
    Case("transactional-over-limits", "transactional", (WRITE, MANY, APPEND), (CLEAN,),
         max_files=10),
    # ------------------------------------------------------------ run
    Case("transactional-run-no-start-mark", "transactional", (WRITE, APPEND),
         (_crash("call.intent", 2), CLEAN)),
    Case("checkpoint-run-no-start-mark", "checkpoint", (WRITE, APPEND),
         (_crash("call.intent", 2), CLEAN)),
    Case("transactional-run-key-unknown", "transactional", (WRITE, APPEND),
         (_crash("space.before_spawn"), CLEAN)),
    Case("checkpoint-run-key-unknown", "checkpoint", (WRITE, APPEND),
         (_crash("space.before_spawn"), CLEAN)),
    # ------------------------------------------------------------ replay, adopt
    Case("transactional-replay-exited", "transactional", (WRITE, APPEND),
         (_crash("space.exited"), CLEAN)),
    Case("checkpoint-replay-exited", "checkpoint", (WRITE, APPEND),
         (_crash("space.exited"), CLEAN)),
    Case("checkpoint-adopt-at-outcome", "checkpoint", (WRITE, APPEND),
         (_crash("space.outcome", 2), CLEAN)),
    Case("checkpoint-adopt-at-checkpoint-during", "checkpoint", (WRITE, APPEND),
         (_crash("checkpoint.during", 2), CLEAN)),
    Case("checkpoint-adopt-at-returned", "checkpoint", (WRITE, APPEND),
         (_crash("call.returned", 2), CLEAN)),
    Case("auto-adopt-after-switch", "auto", (WRITE, DETACH, APPEND),
         (_crash("space.outcome"), CLEAN)),
    # ------------------------------------------------------------ revert, restore
    Case("transactional-revert-fenced", "transactional", (WRITE, LONG),
         (_crash("space.running"), CLEAN)),
    Case("checkpoint-restore-interrupt-fenced", "checkpoint", (WRITE, LONG),
         (_crash("space.running"), CLEAN)),
    Case("transactional-revert-file-cut", "transactional", (WRITE, EDIT),
         (_crash("space.file_op", 2), CLEAN)),
    Case("checkpoint-restore-rerun-file-cut", "checkpoint", (WRITE, EDIT),
         (_crash("space.file_op", 2), CLEAN)),
    Case("transactional-replay-at-returned", "transactional", (WRITE, APPEND),
         (_crash("call.returned", 2), CLEAN)),
    # ------------------------------------------------------------ crashes during recovery
    Case("transactional-crash-at-decided", "transactional", (WRITE, EDIT),
         (_crash("space.file_op", 2), _crash("recovery.decided"), CLEAN)),
    Case("transactional-crash-at-reimage", "transactional", (WRITE, LONG),
         (_crash("space.running"), _crash("recovery.reimage"), CLEAN)),
    Case("checkpoint-crash-at-restore", "checkpoint", (WRITE, LONG),
         (_crash("space.running"), _crash("recovery.restore"), CLEAN)),
    Case("checkpoint-crash-at-begin", "checkpoint", (WRITE, EDIT),
         (_crash("space.file_op", 2), _crash("recovery.begin"), CLEAN)),
    # ------------------------------------------------------------ in-process recovery
    Case("transactional-daemon-killed-reattached", "transactional", (WRITE, SHORT),
         (Driver(Stop("space.running", 1, "kill_daemon")),)),
    Case("checkpoint-daemon-killed-reattached", "checkpoint", (WRITE, SHORT),
         (Driver(Stop("space.running", 1, "kill_daemon")),)),
    Case("transactional-restart-daemon-lost", "transactional", (WRITE, SHORT),
         (Driver(Stop("space.running", 1, "restart")),)),
    Case("checkpoint-restart-daemon-lost", "checkpoint", (WRITE, SHORT),
         (Driver(Stop("space.running", 1, "restart")),)),
    Case("transactional-deleted-mid-call", "transactional", (WRITE, EDIT),
         (Driver(Stop("space.file_op", 2, "delete")), CLEAN)),
    # ------------------------------------------------------------ lost Spaces
    Case("transactional-lost-between-drivers", "transactional", (WRITE, APPEND, EDIT),
         (Driver(then_lose_space=True), CLEAN)),
    Case("checkpoint-lost-between-drivers", "checkpoint", (WRITE, APPEND, EDIT),
         (Driver(then_lose_space=True), CLEAN)),
    Case("transactional-lost-during-call", "transactional", (WRITE, LONG),
         (Driver(Stop("space.running"), then_lose_space=True), CLEAN)),
    Case("checkpoint-lost-during-call", "checkpoint", (WRITE, LONG),
         (Driver(Stop("space.running"), then_lose_space=True), CLEAN)),
    Case("auto-lost-after-switch", "auto", (WRITE, DETACH, APPEND),
         (Driver(Stop("space.outcome"), then_lose_space=True), CLEAN)),
    Case("checkpoint-lost-without-store", "checkpoint", (WRITE, APPEND),
         (Driver(then_lose_space=True), CLEAN), store=False),
)



class Recorder:
    """A failpoint channel that records every point and acts at its ``Stop`` (one at
    ``space.running`` once the command made ``started``, if given: ``made_by_the_command``)."""

    enabled = True

    def __init__(self, stop: Stop | None, fault: Callable[[str], None],
                 started: Path | None = None) -> None:
        self.stop = stop
        self.fault = fault
        self.started = started
        self.points: list[str] = []
        self.hits: Counter[str] = Counter()

    def report(self, point: str, info: Any) -> None:
        self.points.append(point)
        self.hits[point] += 1
        if self.stop is not None and (point, self.hits[point]) == (self.stop.point,
                                                                    self.stop.n):
            if point == "space.running" and self.started is not None:
                made_by_the_command(self.started)
            if self.stop.fault == "crash":
                raise Crash(f"stopped at {point} #{self.stop.n}")
            self.fault(self.stop.fault)


def _drive(case: Case, driver: Driver, epoch: int, tmp_path: Path, spaces: LocalSpaces,
           monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """One driver of ``case`` at ``epoch``, as ``durable.session_driver`` runs it: open the log,
    resume, submit, bring the Space up, run, bring it up again."""

    def fault(kind: str) -> None:
        getattr(spaces, kind)(SPACE)
        (spaces.base_dir / FAULT_DONE).touch()

    recorder = Recorder(driver.stop, fault,
                        spaces.base_dir / LONG_MARK if LONG in case.plan else None)
    monkeypatch.setattr(durable.failpoints, "_channel", recorder)
    storage, fence = open_fenced_sqlite(tmp_path / "log.sqlite", epoch)
    store = DirectoryCheckpointStore(tmp_path / "store") if case.store else None
    adapter = durable_spaces(session=SESSION, spaces=spaces,
                             snapshots=WorkspaceSnapshots(spaces, "", store), mode=case.mode,
                             fence=fence, epoch=epoch,
                             transactional=TransactionalLimits(max_files=case.max_files))
    registry = ToolRegistry(coding_tools())
    registry.extend(adapter.extension)
    plan = [PlannedCall(i, name, args) for i, (name, args) in enumerate(case.plan)]
    harness = Harness.open(storage, models=ScriptedModel(plan), registry=registry,
                           env=adapter.env)
    ended = "done"
    try:
        harness.resume()
        submission = harness.root("a").submit(content="go", request_id="r")
        adapter.ensure_space(harness, submission.conversation)
        outcome = submission.wait()
        assert outcome.done, outcome
        adapter.ensure_space(harness, submission.conversation)
    except DurableError as exc:
        ended = type(exc).__name__
    finally:
        harness.close()
        monkeypatch.undo()
    return {"ended": ended, "points": recorder.points,
            "events": [[e.kind, e.cause, e.tool] for e in adapter.events]}


def observe(case: Case, tmp_path: Path, spaces: LocalSpaces,
            monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    """Every driver of ``case``: how it ended, its failpoints and its recovery events."""
    if case.seeded:
        spaces.create(SPACE)
        spaces.connect(SPACE, epoch=0).write_file("seed.txt", b"seed\n")
    observed = []
    for epoch, driver in enumerate(case.drivers, start=1):
        observed.append(_drive(case, driver, epoch, tmp_path, spaces, monkeypatch))
        if driver.then_lose_space:
            spaces.delete(SPACE)
    return observed


def _golden() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(GOLDEN.read_text())
    return data


def _ids() -> Iterator[str]:
    return (c.id for c in CASES)


@pytest.mark.parametrize("case", CASES, ids=list(_ids()))
def test_failpoint_order_is_unchanged(case: Case, tmp_path: Path, local_spaces: LocalSpaces,
                                      monkeypatch: pytest.MonkeyPatch) -> None:
    observed = observe(case, tmp_path, local_spaces, monkeypatch)
    expected = _golden().get(case.id)
    assert observed == expected, (
        f"case {case.id}: the failpoints (or decisions) differ from {GOLDEN.name}. If the "
        f"change is intended, put this in the golden file:\n"
        f"{json.dumps({case.id: observed}, indent=1)}")


def test_the_golden_has_exactly_the_cases() -> None:
    assert sorted(_golden()) == sorted(_ids())
