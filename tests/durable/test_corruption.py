"""Damaged logs are detected, never silently dropped or reset.

Every state file of both persistent storages is flipped, truncated and emptied; each case is
either detected with a clear error (the file's bytes unchanged, compared before and after) or
harmless (the log reads back exactly as committed). Never a silent loss.
"""

from __future__ import annotations

import os
import random
import shutil
import signal
import sqlite3
import subprocess
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import partial
from pathlib import Path

import pytest

from durable.errors import CorruptLog, NotALog, StorageError
from durable.storage import (
    Batch,
    ConversationRecord,
    DocRecord,
    EntryRecord,
    JsonlStorage,
    RequestRecord,
    SlotRecord,
    Snapshot,
    SqliteStorage,
)
from durable.storage_fences import open_fenced_sqlite

REPO = Path(__file__).resolve().parents[2]
Storage = SqliteStorage | JsonlStorage


def populate(storage: Storage, n: int = 30) -> None:
    """A log using every record type: entries, slot upserts, both kinds of documents,
    requests; ``n`` entry batches after the root conversation."""
    storage.commit(Batch(base_id=1, next_id=2, conversations=[ConversationRecord(1, "main", None,
                                                                                 None, 5)]))
    for i in range(2, n + 2):
        call = f"call-{i % 4}"
        storage.commit(Batch(
            base_id=i, next_id=i + 1,
            entries=[EntryRecord(i, 1, "user", {"text": f"entry number {i}", "n": i}, 1000 + i)],
            slots=[SlotRecord(1, call, i, "tool", {"i": i}, "safe",
                              "done" if i % 2 else "running", None, f"p{i}", 2000 + i)],
            docs=[DocRecord(1, "plan" if i % 2 else "notes", 1, i // 2, {"v": i}, i,
                            "latest" if i % 2 else "rewindable")],
            requests=[RequestRecord(1, f"req-{i}", i)],
        ))


def read_back(opener: Callable[[], Storage]) -> Snapshot:
    storage = opener()
    try:
        return storage.load()
    finally:
        storage.close()


def outcome(opener: Callable[[], Storage], files: list[Path], good: Snapshot) -> str:
    """"detected" (a StorageError, every file unchanged), "harmless" (reads back as
    committed) or "silent" (opens and reads something else: the failure this suite exists
    to rule out)."""
    before = contents(files)
    try:
        snap = read_back(opener)
    except StorageError as exc:
        assert str(exc)
        after = contents(files)
        assert after == before, f"a refused open modified a file ({type(exc).__name__}: {exc})"
        return "detected"
    return "harmless" if snap == good else "silent"


def contents(files: list[Path]) -> dict[Path, bytes]:
    """Each file's bytes, a missing one as empty: SQLite's read-only look at a closed log
    leaves an empty -wal behind, which holds nothing."""
    return {f: f.read_bytes() if f.exists() else b"" for f in files}


def flip(path: Path, bit: int) -> None:
    data = bytearray(path.read_bytes())
    data[bit // 8] ^= 1 << (bit % 8)
    path.write_bytes(bytes(data))


@contextmanager
def deadline(seconds: int) -> Iterator[None]:
    """Fail instead of hanging (an open blocked on a FIFO)."""
    def expire(*_: object) -> None:
        raise TimeoutError(f"the open hung for {seconds} s")

    old = signal.signal(signal.SIGALRM, expire)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


# ---------------------------------------------------------------- SQLite


@pytest.fixture
def sqlite_log(tmp_path: Path) -> tuple[Path, Snapshot]:
    """A closed fenced SQLite log (so fence_raises has rows) and what it holds."""
    path = tmp_path / "log.sqlite"
    storage, _fence = open_fenced_sqlite(path, 3)
    populate(storage)
    good = storage.load()
    storage.close()
    return path, good


def sqlite_files(path: Path) -> list[Path]:
    return [path, path.with_name(path.name + "-wal"), path.with_name(path.name + "-commits")]


def test_sqlite_bit_flip_sweep_changes_no_committed_entry_undetected(
    sqlite_log: tuple[Path, Snapshot], tmp_path: Path
) -> None:
    path, good = sqlite_log
    original = path.read_bytes()
    rng = random.Random(20261201)
    counts = {"detected": 0, "harmless": 0, "silent": 0}
    work = tmp_path / "sweep" / "log.sqlite"
    for _ in range(2000):
        shutil.rmtree(work.parent, ignore_errors=True)
        work.parent.mkdir()
        work.write_bytes(original)
        flip(work, rng.randrange(len(original) * 8))
        counts[outcome(partial(SqliteStorage, work), [work], good)] += 1
    print(f"\nSQLite bit-flip sweep ({len(original)} bytes, 2000 seeded single-bit flips): "
          f"{counts['detected']} detected, {counts['harmless']} harmless, "
          f"{counts['silent']} changed the log undetected")
    assert counts["silent"] == 0


@pytest.mark.parametrize("fenced", [False, True], ids=["plain", "fenced"])
def test_sqlite_empty_file_is_refused_not_initialised(tmp_path: Path, fenced: bool) -> None:
    path = tmp_path / "log.sqlite"
    path.touch()
    with pytest.raises(CorruptLog, match=r"is empty \(0 bytes\).*delete the file to start"):
        open_fenced_sqlite(path, 5) if fenced else SqliteStorage(path)
    assert path.read_bytes() == b""
    assert sorted(p.name for p in tmp_path.iterdir()) == ["log.sqlite"]


def test_sqlite_truncated_main_file_is_detected_or_harmless(
    sqlite_log: tuple[Path, Snapshot],
) -> None:
    path, good = sqlite_log
    original = path.read_bytes()
    for size in sorted({0, 1, 15, 16, 99, 100, 4096, len(original) // 2, len(original) - 1}):
        path.write_bytes(original[:size])
        # Cutting only unused space off the last page changes nothing that was committed.
        want = {"detected"} if size <= 4096 else {"detected", "harmless"}
        assert outcome(lambda: SqliteStorage(path), [path], good) in want, size
    path.write_bytes(original)
    assert outcome(lambda: SqliteStorage(path), [path], good) == "harmless"


COMMIT_AND_DIE = """
import os, sys
from durable.storage import Batch, EntryRecord, SqliteStorage
s = SqliteStorage(sys.argv[1])
for i in range(int(sys.argv[2]), int(sys.argv[3])):
    s.commit(Batch(base_id=i, next_id=i + 1, entries=[EntryRecord(i, 1, "user", {"i": i})]))
os.kill(os.getpid(), 9)
"""


def crashed_with_wal(path: Path) -> Snapshot:
    """Commit more entries in a process that is then SIGKILLed: they live only in the -wal.
    Returns what the log holds (read from a copy, so the original stays as the crash left
    it)."""
    subprocess.run([sys.executable, "-c", COMMIT_AND_DIE, str(path), "32", "40"], cwd=REPO,
                   check=False)
    wal = path.with_name(path.name + "-wal")
    assert wal.stat().st_size > 0
    copy = path.parent / "copy" / path.name
    copy.parent.mkdir()
    for f in sqlite_files(path):
        shutil.copy(f, copy.parent / f.name)
    good = read_back(lambda: SqliteStorage(copy))
    assert [e.id for e in good.entries][-1] == 39
    shutil.rmtree(copy.parent)
    return good


def test_sqlite_wal_lost_after_sigkill_is_detected(sqlite_log: tuple[Path, Snapshot]) -> None:
    path, _ = sqlite_log
    crashed_with_wal(path)
    path.with_name(path.name + "-wal").unlink()
    before = path.read_bytes()
    with pytest.raises(CorruptLog, match=r"holds 31 commits but 39 were committed.*-wal was "
                                         r"lost.*Put the -wal back"):
        SqliteStorage(path)
    with pytest.raises(CorruptLog, match="-wal was lost"):
        open_fenced_sqlite(path, 9)  # and a fenced open does not raise the floor either
    assert path.read_bytes() == before


def test_sqlite_log_copied_without_its_wal_is_detected(tmp_path: Path) -> None:
    path = tmp_path / "log.sqlite"
    live = SqliteStorage(path)
    populate(live)
    copy = tmp_path / "copy" / "log.sqlite"
    copy.parent.mkdir()
    shutil.copy(path, copy)
    shutil.copy(path.with_name("log.sqlite-commits"), copy.with_name("log.sqlite-commits"))
    live.close()
    with pytest.raises(CorruptLog, match="-wal was lost"):
        SqliteStorage(copy)
    copy.with_name("log.sqlite-commits").unlink()  # the documented way to accept the loss
    assert read_back(lambda: SqliteStorage(copy)).next_id < read_back(
        lambda: SqliteStorage(path)).next_id


@pytest.mark.parametrize("suffix", ["-wal", "-shm"])
def test_sqlite_damaged_wal_or_shm_is_detected_or_harmless(
    sqlite_log: tuple[Path, Snapshot], suffix: str
) -> None:
    """The -wal and -shm a SIGKILL left behind, flipped, truncated, emptied. The -shm is a
    cache SQLite rebuilds (its own checksums), so it is not among the files compared."""
    path, _ = sqlite_log
    good = crashed_with_wal(path)
    target = path.with_name(path.name + suffix)
    files = [*sqlite_files(path), path.with_name(path.name + "-shm")]
    pristine = {f: f.read_bytes() for f in files}
    rng = random.Random(7)
    intact = pristine[target]
    damaged = [b"", intact[: len(intact) // 2], intact[:-1], intact[:32]]  # WAL header: 32
    for _ in range(60):
        bit = rng.randrange(len(intact) * 8)
        flipped = bytearray(intact)
        flipped[bit // 8] ^= 1 << (bit % 8)
        damaged.append(bytes(flipped))
    seen = {"detected": 0, "harmless": 0, "silent": 0}
    work = path.parent / "w"
    for content in damaged:
        for f, data in pristine.items():
            f.write_bytes(data)
        target.write_bytes(content)
        shutil.rmtree(work, ignore_errors=True)
        work.mkdir()
        for f in files:  # open a copy: a harmless open may checkpoint the -wal
            shutil.copy(f, work / f.name)
        seen[outcome(partial(SqliteStorage, work / path.name), sqlite_files(work / path.name),
                     good)] += 1
    print(f"\nSQLite {suffix} damage: {seen}")
    assert seen["silent"] == 0
    assert seen["detected"] > 0 or suffix == "-shm"


@pytest.mark.parametrize("damage", ["flip", "partly zeroed", "truncate", "empty", "zeroed",
                                    "delete"])
def test_sqlite_damaged_commit_mark_is_detected_or_harmless(
    sqlite_log: tuple[Path, Snapshot], damage: str
) -> None:
    """``zeroed``: what a power cut leaves of the unsynced mark on ext4 (its size on disk, its
    data not): no mark, not a damaged one, or the log could never be opened again after one
    (found by the --cut-host-power campaign: every run's log refused)."""
    path, good = sqlite_log
    mark = path.with_name(path.name + "-commits")
    if damage == "zeroed":
        mark.write_bytes(b"\0" * len(mark.read_bytes()))
    elif damage == "flip":
        flip(mark, 100)
    elif damage == "partly zeroed":  # not what a power cut leaves: damage
        mark.write_bytes(b"\0" * 20 + mark.read_bytes()[20:])
    elif damage == "truncate":
        mark.write_bytes(mark.read_bytes()[:30])
    elif damage == "empty":
        mark.write_bytes(b"")
    else:
        mark.unlink()
    result = outcome(lambda: SqliteStorage(path), sqlite_files(path), good)
    assert result == ("detected" if damage in ("flip", "partly zeroed", "truncate")
                      else "harmless")


def test_sqlite_changed_row_is_named(sqlite_log: tuple[Path, Snapshot]) -> None:
    path, _ = sqlite_log
    conn = sqlite3.connect(path)
    conn.execute("UPDATE entries SET data = '{\"text\":\"forged\"}' WHERE id = 5")
    conn.commit()
    conn.close()
    storage = SqliteStorage(path)
    try:
        with pytest.raises(CorruptLog, match="row 5 of table entries does not match its checksum"):
            storage.load()
        with pytest.raises(CorruptLog, match="row 5 of table entries"):
            storage.epoch_history()
    finally:
        storage.close()


def test_sqlite_log_from_before_checksums_is_migrated_forward(tmp_path: Path) -> None:
    path = tmp_path / "log.sqlite"
    storage = SqliteStorage(path)
    populate(storage, 5)
    good = storage.load()
    storage.close()
    conn = sqlite3.connect(path)  # make it as an older durable left it
    conn.execute("DELETE FROM meta WHERE key = 'digest'")
    for table in ("conversations", "entries", "slots", "docs", "requests", "fence_raises"):
        conn.execute(f"ALTER TABLE {table} DROP COLUMN crc")
    conn.commit()
    conn.close()
    path.with_name("log.sqlite-commits").unlink()
    storage = SqliteStorage(path)
    try:
        assert storage.load() == good
        storage.commit(Batch(base_id=7, next_id=8, entries=[EntryRecord(7, 1, "user", {})]))
    finally:
        storage.close()
    assert [e.id for e in read_back(lambda: SqliteStorage(path)).entries][-1] == 7


def test_sqlite_fifo_dangling_symlink_and_read_only_fs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fifo = tmp_path / "fifo.sqlite"
    os.mkfifo(fifo)
    with deadline(5), pytest.raises(NotALog, match="not a regular file"):
        SqliteStorage(fifo)
    link = tmp_path / "link.sqlite"
    link.symlink_to(tmp_path / "gone" / "log.sqlite")
    with pytest.raises(StorageError, match=r"is a symlink to .*which does not exist"):
        SqliteStorage(link)

    class ReadOnly:
        f_flag = os.ST_RDONLY

    monkeypatch.setattr(os, "statvfs", lambda _path: ReadOnly())
    with pytest.raises(StorageError, match="is on a read-only filesystem"):
        SqliteStorage(tmp_path / "new.sqlite")


# ---------------------------------------------------------------- JSONL


@pytest.fixture
def jsonl_log(tmp_path: Path) -> tuple[Path, Snapshot]:
    directory = tmp_path / "log"
    storage = JsonlStorage(directory)
    populate(storage, 12)
    good = storage.load()
    storage.close()
    return directory, good


def test_jsonl_bit_flip_sweep_is_always_detected_or_harmless(
    jsonl_log: tuple[Path, Snapshot]
) -> None:
    directory, good = jsonl_log
    files = [directory / "log.jsonl", directory / "log.lock"]
    pristine = {f: f.read_bytes() for f in files}
    rng = random.Random(11)
    counts = {"detected": 0, "harmless": 0, "silent": 0}
    for _ in range(1500):
        target = rng.choice(files)
        for f, data in pristine.items():
            f.write_bytes(data)
        flip(target, rng.randrange(len(pristine[target]) * 8))
        counts[outcome(lambda: JsonlStorage(directory), files, good)] += 1
    print(f"\nJSONL bit-flip sweep (1500 flips in log.jsonl and log.lock): {counts}")
    assert counts["silent"] == 0


def test_jsonl_flipped_complete_last_line_is_corrupt_not_cut(
    jsonl_log: tuple[Path, Snapshot]
) -> None:
    """Even without the commit mark (a log from before it, or a mark lagging after a power
    cut), a complete last record with a bad checksum is damage, not a torn write."""
    directory, _ = jsonl_log
    log = directory / "log.jsonl"
    (directory / "log.lock").write_bytes(b"")
    data = log.read_bytes()
    last = data.rindex(b"\n", 0, len(data) - 1) + 1
    for offset in (last + 3, last + 20, len(data) - 2, len(data) - 1):  # ... the newline too
        damaged = bytearray(data)
        damaged[offset] ^= 0x01
        log.write_bytes(bytes(damaged))
        with pytest.raises(CorruptLog, match="line 14 is not a valid record"):
            JsonlStorage(directory)
        assert log.read_bytes() == bytes(damaged)


def test_jsonl_truncation_is_detected_at_every_offset(jsonl_log: tuple[Path, Snapshot]) -> None:
    directory, good = jsonl_log
    log = directory / "log.jsonl"
    files = [log, directory / "log.lock"]
    data = log.read_bytes()
    for size in range(0, len(data), 7):
        log.write_bytes(data[:size])
        assert outcome(lambda: JsonlStorage(directory), files, good) == "detected", size
    log.write_bytes(data)
    assert outcome(lambda: JsonlStorage(directory), files, good) == "harmless"


def test_jsonl_empty_or_missing_log_is_refused(jsonl_log: tuple[Path, Snapshot]) -> None:
    directory, _ = jsonl_log
    log = directory / "log.jsonl"
    log.write_bytes(b"")
    with pytest.raises(CorruptLog, match=r"is empty \(0 bytes\)"):
        JsonlStorage(directory)
    assert log.read_bytes() == b""
    log.unlink()
    with pytest.raises(CorruptLog, match=r"is missing, but .*log\.lock records commits"):
        JsonlStorage(directory)
    assert not log.exists()
    (directory / "log.lock").write_bytes(b"")  # accepting the loss: a new log starts
    JsonlStorage(directory).close()


@pytest.mark.parametrize("damage", ["truncate", "empty", "zeroed", "delete"])
def test_jsonl_damaged_commit_mark(jsonl_log: tuple[Path, Snapshot], damage: str) -> None:
    """``zeroed``: a power cut's leftover of the unsynced mark, read as no mark."""
    directory, good = jsonl_log
    lock = directory / "log.lock"
    if damage == "zeroed":
        lock.write_bytes(b"\0" * len(lock.read_bytes()))
    elif damage == "truncate":
        lock.write_bytes(lock.read_bytes()[:20])
    elif damage == "empty":
        lock.write_bytes(b"")
    else:
        lock.unlink()
    result = outcome(lambda: JsonlStorage(directory), [directory / "log.jsonl", lock], good)
    assert result == ("detected" if damage == "truncate" else "harmless")


def test_jsonl_fifo_dangling_symlink_and_read_only_fs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "a").mkdir()
    os.mkfifo(tmp_path / "a" / "log.jsonl")
    with deadline(5), pytest.raises(NotALog, match=r"log\.jsonl is not a regular file"):
        JsonlStorage(tmp_path / "a")
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "log.jsonl").symlink_to(tmp_path / "gone")
    with pytest.raises(StorageError, match=r"is a symlink to .*which does not exist"):
        JsonlStorage(tmp_path / "b")
    (tmp_path / "c").symlink_to(tmp_path / "gone")
    with pytest.raises(StorageError, match=r"is a symlink to .*which does not exist"):
        JsonlStorage(tmp_path / "c")

    class ReadOnly:
        f_flag = os.ST_RDONLY

    monkeypatch.setattr(os, "statvfs", lambda _path: ReadOnly())
    with pytest.raises(StorageError, match="is on a read-only filesystem"):
        JsonlStorage(tmp_path / "d")


def test_sqlite_opens_during_another_process_commits_are_not_false_alarms(
    tmp_path: Path,
) -> None:
    """The commit mark is raised after each COMMIT and read before the open's snapshot, so a
    log being written by another process never looks behind its mark."""
    path = tmp_path / "log.sqlite"
    storage = SqliteStorage(path)
    populate(storage, 1)
    storage.close()
    writer = subprocess.Popen([sys.executable, "-c", COMMIT_AND_DIE, str(path), "3", "200"],
                              cwd=REPO)
    try:
        opens = 0
        while writer.poll() is None:
            read_back(partial(SqliteStorage, path))
            opens += 1
    finally:
        writer.wait()
    assert opens > 0
    assert [e.id for e in read_back(partial(SqliteStorage, path)).entries][-1] == 199


def test_jsonl_damaged_header_of_a_used_log_is_corrupt(jsonl_log: tuple[Path, Snapshot]) -> None:
    directory, _ = jsonl_log
    log = directory / "log.jsonl"
    flip(log, 8 * 5)
    damaged = log.read_bytes()
    with pytest.raises(CorruptLog, match="the header was damaged"):
        JsonlStorage(directory)
    assert log.read_bytes() == damaged
