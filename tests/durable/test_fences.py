"""Fences: a newer epoch shuts every older writer out, atomically, across real processes."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from durable.errors import CorruptLog, NotALog, StaleEpochError, StorageClosed
from durable.fence_contract import Fence
from durable.storage import (
    Batch,
    ConversationRecord,
    DocRecord,
    EntryRecord,
    JsonlStorage,
    RequestRecord,
    SlotRecord,
    SqliteStorage,
    Storage,
)
from durable.storage_fences import (
    FencedFileSystem,
    FileFence,
    SqliteFence,
    open_fenced_sqlite,
    open_fenced_sqlite_storage,
)

REPO = Path(__file__).resolve().parents[2]

Opened = tuple[SqliteStorage | JsonlStorage, SqliteFence | FileFence]
OpenFenced = Callable[[int], Opened]


@pytest.fixture(params=["sqlite", "jsonl"])
def open_fenced(request: pytest.FixtureRequest, tmp_path: Path) -> OpenFenced:
    if request.param == "sqlite":
        return lambda epoch: open_fenced_sqlite(tmp_path / "log.sqlite", epoch)
    return FencedFileSystem(tmp_path / "log").open


def mixed_batch(base: int) -> Batch:
    """Touches every table, so "nothing landed" is checked everywhere."""
    return Batch(
        base_id=base,
        next_id=base + 2,
        conversations=[ConversationRecord(base, "sub", parent_conversation=1, parent_entry=2)],
        entries=[EntryRecord(base + 1, base, "user", {"n": base})],
        slots=[SlotRecord(base, "c", base + 1, "bash", {}, "never", "pending")],
        docs=[DocRecord(base, "plan", 1, 1, {"n": base}, base + 1)],
        requests=[RequestRecord(base, "r", base + 1)],
    )


def test_fences_implement_the_protocol(open_fenced: OpenFenced) -> None:
    storage, fence = open_fenced(1)
    try:
        assert isinstance(fence, Fence)
        assert isinstance(storage, Storage)
        assert fence.epoch == 1
        assert not fence.halted
    finally:
        storage.close()


def test_open_raises_the_floor_and_refuses_an_older_epoch(open_fenced: OpenFenced) -> None:
    old, old_fence = open_fenced(3)
    assert old_fence.floor() == 3
    new, new_fence = open_fenced(5)
    try:
        assert new_fence.floor() == 5
        assert old_fence.floor() == 5  # read fresh, not cached
        with pytest.raises(StaleEpochError) as info:
            open_fenced(4)
        assert (info.value.epoch, info.value.floor) == (4, 5)
        again, _ = open_fenced(5)  # a restarted process of the same epoch
        again.close()
        assert new_fence.floor() == 5
    finally:
        old.close()
        new.close()


def test_older_epoch_commit_is_refused_atomically(open_fenced: OpenFenced) -> None:
    old, old_fence = open_fenced(1)
    old.commit(Batch(base_id=1, next_id=3, conversations=[ConversationRecord(1, "main")],
                     entries=[EntryRecord(2, 1, "user", {})]))
    new, new_fence = open_fenced(2)
    try:
        before = new.load()
        with pytest.raises(StaleEpochError, match="below the log's floor 2") as info:
            old.commit(mixed_batch(3))
        assert (info.value.epoch, info.value.floor) == (1, 2)
        with pytest.raises(StaleEpochError):
            old_fence.check()
        assert new.load() == before
        new_fence.check()
        new.commit(mixed_batch(3))
        assert new.load().next_id == 5
    finally:
        old.close()
        new.close()


def test_halt_refuses_every_later_commit(open_fenced: OpenFenced) -> None:
    storage, fence = open_fenced(1)
    try:
        storage.commit(Batch(base_id=1, next_id=2, conversations=[ConversationRecord(1, "main")]))
        fence.halt("the Space could not be fenced")
        assert fence.halted
        with pytest.raises(StaleEpochError, match="halted \\(the Space could not be fenced\\)"):
            storage.commit(mixed_batch(2))
        with pytest.raises(StaleEpochError, match="halted"):
            fence.check()
        assert storage.load().next_id == 2
    finally:
        storage.close()


def test_invalid_epoch_is_refused_before_touching_disk(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="epoch=0"):
        open_fenced_sqlite(tmp_path / "log.sqlite", 0)
    with pytest.raises(ValueError, match="type=str"):
        FencedFileSystem(tmp_path / "log").open("2")  # type: ignore[arg-type]
    assert list(tmp_path.iterdir()) == []


def test_sqlite_commit_raises_a_lowered_floor_in_the_same_transaction(tmp_path: Path) -> None:
    path = tmp_path / "log.sqlite"
    storage, fence = open_fenced_sqlite(path, 7)
    try:
        conn = sqlite3.connect(path)
        conn.execute("UPDATE fence SET floor = 0")  # as if written before fencing existed
        conn.commit()
        conn.close()
        assert fence.floor() == 0
        storage.commit(Batch(base_id=1, next_id=2, conversations=[ConversationRecord(1, "main")]))
        assert fence.floor() == 7
    finally:
        storage.close()


def test_the_storage_only_opener_fences_as_the_pair_does(tmp_path: Path) -> None:
    """``open_fenced_sqlite_storage(path, epoch)``: no ``Fence`` returned, the same fence
    enforced: it raises the floor, an older epoch's commit lands nothing, and an older
    epoch cannot open the log at all."""
    path = tmp_path / "log.sqlite"
    old = open_fenced_sqlite_storage(path, 1)
    new = open_fenced_sqlite_storage(path, 2)
    try:
        assert isinstance(new, SqliteStorage) and new.read_floor() == 2
        with pytest.raises(StaleEpochError):
            old.commit(mixed_batch(1))
        new.commit(mixed_batch(1))
        assert SqliteFence(new).floor() == 2
        with pytest.raises(StaleEpochError):
            open_fenced_sqlite_storage(path, 1)
    finally:
        old.close()
        new.close()


def test_sqlite_unfenced_storage_leaves_the_floor_alone(tmp_path: Path) -> None:
    path = tmp_path / "log.sqlite"
    plain = SqliteStorage(path)
    try:
        assert plain.read_floor() == 0
        with pytest.raises(ValueError, match="opened without an epoch"):
            SqliteFence(plain)
    finally:
        plain.close()
    with pytest.raises(StorageClosed):
        plain.read_floor()


def test_sqlite_fence_on_a_foreign_file_is_not_a_log(tmp_path: Path) -> None:
    path = tmp_path / "x.db"
    path.write_text("hello")
    with pytest.raises(NotALog):
        open_fenced_sqlite(path, 1)
    assert path.read_text() == "hello"


def test_jsonl_epoch_markers(tmp_path: Path) -> None:
    fs = FencedFileSystem(tmp_path / "log")
    a, _ = fs.open(3)
    b, _ = fs.open(7)
    try:
        with pytest.raises(StaleEpochError):
            fs.open(5)
        names = sorted(p.name for p in (tmp_path / "log").iterdir())
        assert names == ["epoch-00000003", "epoch-00000007", "log.jsonl", "log.lock"]
        # The markers are part of the log directory: a plain JsonlStorage opens it.
        JsonlStorage(tmp_path / "log").close()
    finally:
        a.close()
        b.close()


def test_jsonl_epoch_history_reads_back_as_written(tmp_path: Path) -> None:
    """A JSONL log's audit record: each marker holds the first entry its epoch governs,
    each line its writer's epoch; an unfenced writer's lines have none; a marker a crash
    left empty raised the floor but records no raise; a damaged one is refused."""
    path = tmp_path / "log"
    plain = JsonlStorage(path)
    plain.commit(Batch(base_id=1, next_id=2, conversations=[ConversationRecord(1, "main")]))
    plain.commit(Batch(base_id=2, next_id=3, entries=[EntryRecord(2, 1, "note", {})]))
    plain.close()
    fs = FencedFileSystem(path)
    three, _ = fs.open(3)
    three.commit(Batch(base_id=3, next_id=5, entries=[EntryRecord(3, 1, "note", {}),
                                                      EntryRecord(4, 1, "note", {})]))
    three.close()
    (path / "epoch-00000004").touch()  # created, then the process died before writing it
    # created and written, then the host lost power before the write reached the disk:
    # ext4 kept its size, not its data (a marker's write is synced; one of an older build,
    # or a disk that lies, may not be)
    (path / "epoch-00000006").write_bytes(b"\0" * 40)
    five, _ = FencedFileSystem(path).open(7)
    five.commit(Batch(base_id=5, next_id=6, entries=[EntryRecord(5, 1, "note", {})]))
    five.close()

    audit = JsonlStorage(path)  # reopened: everything comes from the files
    try:
        history = audit.epoch_history()
        assert [(e, first) for e, first, _ms in history.raises] == [(3, 3), (7, 5)]
        assert all(ms > 0 for _e, _first, ms in history.raises)
        assert history.entry_epochs == {2: None, 3: 3, 4: 3, 5: 7}
        (path / "epoch-00000007").write_text("{not json")
        with pytest.raises(CorruptLog, match="epoch-00000007"):
            audit.epoch_history()
        (path / "epoch-00000007").write_bytes(b"\0" * 20 + b"{")  # partly NUL: damage
        with pytest.raises(CorruptLog, match="epoch-00000007"):
            audit.epoch_history()
    finally:
        audit.close()


# ---------------------------------------------------------------- the race, with processes

STALE_EXIT = 3

#: Epoch 1 commits an entry per loop and prints each id whose commit returned. It must end
#: with StaleEpochError (exit 3): any other error (a LogConflict would mean a newer writer's
#: commit landed under it) exits 1 with a traceback. It pauses 1 ms between commits, as a
#: driver does work between them: SQLite's busy handler is not fair, and a writer that
#: re-takes the lock at once can starve the epoch-2 open for seconds.
WRITER = f"""
import sys
import time
from durable.errors import StaleEpochError
from durable.storage_fences import FencedFileSystem, open_fenced_sqlite
from durable.storage import Batch, EntryRecord
kind, path = sys.argv[1], sys.argv[2]
storage, fence = open_fenced_sqlite(path, 1) if kind == "sqlite" else FencedFileSystem(path).open(1)
i = storage.load().next_id
print("open", flush=True)
try:
    while True:
        note = EntryRecord(i, 1, "note", {{"epoch": 1}})
        storage.commit(Batch(base_id=i, next_id=i + 1, entries=[note]))
        print(i, flush=True)
        i += 1
        time.sleep(0.001)
except StaleEpochError:
    sys.exit({STALE_EXIT})
finally:
    storage.close()
"""


@pytest.mark.parametrize("kind", ["sqlite", "jsonl"])
def test_no_epoch_1_commit_lands_after_epoch_2_opened(tmp_path: Path, kind: str) -> None:
    path = tmp_path / ("log.sqlite" if kind == "sqlite" else "log")
    seed = SqliteStorage(path) if kind == "sqlite" else JsonlStorage(path)
    seed.commit(Batch(base_id=1, next_id=2, conversations=[ConversationRecord(1, "main")]))
    seed.close()

    # Its output is read only through ``child.stdout`` (never ``communicate``, which reads
    # the pipe itself and so loses the lines ``readline`` had already buffered: under load
    # the writer runs ahead and they are many); its errors go to a file, so that no pipe of
    # its fills while the test waits.
    errors = tmp_path / "writer.err"
    with open(errors, "w") as err_file:
        child = subprocess.Popen(
            [sys.executable, "-c", WRITER, kind, str(path)],
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=err_file,
            text=True,
        )
    storage = None
    try:
        assert child.stdout is not None
        reported: list[int] = []
        line = child.stdout.readline()
        assert line == "open\n", f"the epoch-1 writer did not open: {errors.read_text()}"
        while len(reported) < 10:  # epoch 1 is in full swing
            line = child.stdout.readline()
            assert line, f"the epoch-1 writer died early: {errors.read_text()}"
            reported.append(int(line))

        if kind == "sqlite":
            storage, _ = open_fenced_sqlite(path, 2)
        else:
            storage, _ = FencedFileSystem(path).open(2)
        first_after = storage.load().next_id
        storage.commit(Batch(base_id=first_after, next_id=first_after + 1,
                             entries=[EntryRecord(first_after, 1, "note", {"epoch": 2})]))

        # Its next commit must fail: its output is read to its end (beside the test, so a
        # pipe it filled meanwhile never blocks it), with a deadline only a hang reaches.
        rest: list[str] = []
        reader = threading.Thread(target=lambda: rest.append(child.stdout.read()))
        reader.start()
        child.wait(timeout=120)
        reader.join(timeout=120)
        reported += [int(x) for x in "".join(rest).split()]
        assert child.returncode == STALE_EXIT, errors.read_text()

        entries = storage.load().entries
        epoch1 = [e.id for e in entries if e.data["epoch"] == 1]
        assert epoch1 == reported  # every commit that returned landed, and nothing else
        assert max(epoch1) < first_after
        assert [(e.id, e.data["epoch"]) for e in entries[-1:]] == [(first_after, 2)]
        # what an audit reads (check G4) tells the same story
        history = storage.epoch_history()
        assert [(epoch, first) for epoch, first, _ms in history.raises] == [(1, 2),
                                                                            (2, first_after)]
        assert {i: history.entry_epochs[i] for i in [*epoch1, first_after]} == \
            {**dict.fromkeys(epoch1, 1), first_after: 2}
    finally:
        if child.poll() is None:
            child.kill()
        child.wait()
        if child.stdout is not None:
            child.stdout.close()
        if storage is not None:
            storage.close()
