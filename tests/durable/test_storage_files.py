"""What the persistent storages do with files they did not write, or that a crash damaged."""

from __future__ import annotations

import errno
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from durable.errors import (
    CorruptLog,
    LogConflict,
    NotALog,
    StorageClosed,
    StorageError,
    StorageUncertain,
)
from durable.storage import (
    Batch,
    ConversationRecord,
    EntryRecord,
    JsonlStorage,
    SqliteStorage,
    jsonl,
)

REPO = Path(__file__).resolve().parents[2]


def entry_batch(i: int, **data: object) -> Batch:
    return Batch(base_id=i, next_id=i + 1, entries=[EntryRecord(i, 1, "user", dict(data))])


def fill(storage: JsonlStorage | SqliteStorage, n: int) -> None:
    """Commit the root conversation, then entries 2..n."""
    storage.commit(Batch(base_id=1, next_id=2, conversations=[ConversationRecord(1, "main")]))
    for i in range(2, n + 1):
        storage.commit(entry_batch(i, text=f"entry {i}"))


# ---------------------------------------------------------------- JSONL


def test_jsonl_torn_final_line_is_removed_and_nothing_else_is_lost(tmp_path: Path) -> None:
    log = tmp_path / "log"
    s = JsonlStorage(log)
    fill(s, 4)
    before = s.load()
    s.close()
    good = (log / "log.jsonl").read_bytes()
    with (log / "log.jsonl").open("ab") as f:  # a crash in the middle of the next append
        f.write(b'0badc0de {"base_id":5,"next_id":6,"entr')

    s = JsonlStorage(log)
    try:
        assert s.load() == before
        assert (log / "log.jsonl").read_bytes() == good
        s.commit(entry_batch(5))
    finally:
        s.close()
    s = JsonlStorage(log)
    try:
        assert [e.id for e in s.load().entries] == [2, 3, 4, 5]
    finally:
        s.close()


def test_jsonl_corrupt_complete_final_line_is_removed(tmp_path: Path) -> None:
    log = tmp_path / "log"
    s = JsonlStorage(log)
    fill(s, 3)
    s.close()
    good = (log / "log.jsonl").read_bytes()
    with (log / "log.jsonl").open("ab") as f:  # zeros, as a filesystem may leave after a crash
        f.write(b"\0" * 40 + b"\n")
    s = JsonlStorage(log)
    try:
        assert [e.id for e in s.load().entries] == [2, 3]
        assert (log / "log.jsonl").read_bytes() == good
    finally:
        s.close()


def test_jsonl_corrupt_middle_line_raises_and_changes_nothing(tmp_path: Path) -> None:
    log = tmp_path / "log"
    s = JsonlStorage(log)
    fill(s, 4)
    s.close()
    lines = (log / "log.jsonl").read_bytes().splitlines(keepends=True)
    # Line 1 is the header, line 2 the root conversation, line 3 entry 2: flip its text.
    lines[2] = lines[2].replace(b"entry 2", b"entry X")
    damaged = b"".join(lines)
    (log / "log.jsonl").write_bytes(damaged)
    with pytest.raises(CorruptLog, match=r"log\.jsonl line 3 is not a valid record") as info:
        JsonlStorage(log)
    assert str(log / "log.jsonl") in str(info.value)
    assert (log / "log.jsonl").read_bytes() == damaged


def test_jsonl_line_that_does_not_follow_raises(tmp_path: Path) -> None:
    """A well-formed line with a stale base_id (e.g. pasted from another log) is corruption."""
    log = tmp_path / "log"
    s = JsonlStorage(log)
    fill(s, 3)
    s.close()
    lines = (log / "log.jsonl").read_bytes().splitlines(keepends=True)
    (log / "log.jsonl").write_bytes(b"".join(lines + [lines[-1]]))
    with pytest.raises(CorruptLog, match="line 5 does not follow"):
        JsonlStorage(log)


def test_jsonl_directory_with_a_foreign_file_is_not_a_log(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("mine\n")
    with pytest.raises(NotALog, match=rf"{tmp_path} is not a durable JSONL log .*notes\.txt"):
        JsonlStorage(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt"]


def test_jsonl_foreign_log_file_is_not_a_log_and_unchanged(tmp_path: Path) -> None:
    (tmp_path / "log.jsonl").write_bytes(b'{"some": "other jsonl"}\n{"x": 1}')
    with pytest.raises(NotALog, match="does not start with the durable log header"):
        JsonlStorage(tmp_path)
    assert (tmp_path / "log.jsonl").read_bytes() == b'{"some": "other jsonl"}\n{"x": 1}'
    assert sorted(p.name for p in tmp_path.iterdir()) == ["log.jsonl"]


def test_jsonl_path_that_is_a_file_is_not_a_log(tmp_path: Path) -> None:
    (tmp_path / "f").write_text("x")
    with pytest.raises(NotALog, match="it is a file, not a directory"):
        JsonlStorage(tmp_path / "f")


def test_jsonl_without_fsync_reads_back(tmp_path: Path) -> None:
    s = JsonlStorage(tmp_path / "log", fsync=False)
    fill(s, 3)
    s.close()
    s = JsonlStorage(tmp_path / "log")
    try:
        assert s.load().next_id == 4
    finally:
        s.close()


def test_jsonl_two_writers_the_stale_one_is_refused(tmp_path: Path) -> None:
    a, b = JsonlStorage(tmp_path / "log"), JsonlStorage(tmp_path / "log")
    try:
        a.commit(Batch(base_id=1, next_id=2, conversations=[ConversationRecord(1, "main")]))
        with pytest.raises(LogConflict):
            b.commit(Batch(base_id=1, next_id=2, conversations=[ConversationRecord(1, "other")]))
        assert b.load().conversations == [ConversationRecord(1, "main")]
        b.commit(entry_batch(2))
        assert [e.id for e in a.load().entries] == [2]
    finally:
        a.close()
        b.close()


#: A child that appends ``n`` entries, rebuilding its batch from ``load()`` on every conflict.
CONTENDER = """
import sys
from durable.errors import LogConflict
from durable.storage import Batch, EntryRecord, JsonlStorage, SqliteStorage
kind, path, name, n = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
s = JsonlStorage(path) if kind == "jsonl" else SqliteStorage(path)
done = conflicts = 0
while done < n:
    i = s.load().next_id
    try:
        s.commit(Batch(base_id=i, next_id=i + 1, entries=[EntryRecord(i, 1, "user", {"by": name})]))
        done += 1
    except LogConflict:
        conflicts += 1
s.close()
print(conflicts)
"""


@pytest.mark.parametrize("kind", ["jsonl", "sqlite"])
def test_two_processes_appending_do_not_corrupt_each_other(tmp_path: Path, kind: str) -> None:
    path = tmp_path / ("log" if kind == "jsonl" else "log.sqlite")
    s = JsonlStorage(path) if kind == "jsonl" else SqliteStorage(path)
    s.commit(Batch(base_id=1, next_id=2, conversations=[ConversationRecord(1, "main")]))
    n = 40
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", CONTENDER, kind, str(path), name, str(n)],
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for name in ("a", "b")
    ]
    try:
        for p in procs:
            _out, err = p.communicate(timeout=120)
            assert p.returncode == 0, err
        snap = s.load()
        assert [e.id for e in snap.entries] == list(range(2, 2 * n + 2))
        assert sorted(e.data["by"] for e in snap.entries) == ["a"] * n + ["b"] * n
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
            p.communicate()  # waits, and closes the pipes
        s.close()


# ---------------------------------------------------------------- SQLite


def test_sqlite_plain_text_file_is_not_a_log_and_unchanged(tmp_path: Path) -> None:
    path = tmp_path / "notes.db"
    path.write_bytes(b"just some text\n" * 100)
    with pytest.raises(NotALog, match=rf"{path} is not a durable log \(it is not a SQLite file\)"):
        SqliteStorage(path)
    assert path.read_bytes() == b"just some text\n" * 100
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.db"]


@pytest.mark.parametrize(
    "statements",
    [
        ["CREATE TABLE t (x)", "INSERT INTO t VALUES (1)"],
        [
            "CREATE TABLE meta (key TEXT PRIMARY KEY, value)",
            "INSERT INTO meta VALUES ('magic', 'other')",
        ],
        ["CREATE TABLE meta (a, b, c)"],
    ],
    ids=["other-tables", "other-magic", "other-meta-shape"],
)
def test_sqlite_foreign_database_is_not_a_log_and_unchanged(
    tmp_path: Path, statements: list[str]
) -> None:
    path = tmp_path / "other.db"
    conn = sqlite3.connect(path)
    for statement in statements:
        conn.execute(statement)
    conn.commit()
    conn.close()
    before = path.read_bytes()
    with pytest.raises(NotALog, match=rf"{path} is not a durable log"):
        SqliteStorage(path)
    assert path.read_bytes() == before


def test_sqlite_directory_is_not_a_log(tmp_path: Path) -> None:
    with pytest.raises(NotALog, match="it is a directory"):
        SqliteStorage(tmp_path)


def test_sqlite_newer_schema_is_refused_with_upgrade_advice(tmp_path: Path) -> None:
    path = tmp_path / "log.sqlite"
    SqliteStorage(path).close()
    conn = sqlite3.connect(path)
    conn.execute("UPDATE meta SET value = 99 WHERE key = 'schema'")
    conn.commit()
    conn.close()
    with pytest.raises(NotALog, match="schema 99 but this code reads schema 1; upgrade durable"):
        SqliteStorage(path)


def test_sqlite_uses_wal_and_two_objects_see_each_other(tmp_path: Path) -> None:
    path = tmp_path / "log.sqlite"
    a, b = SqliteStorage(path), SqliteStorage(path)
    try:
        a.commit(Batch(base_id=1, next_id=2, conversations=[ConversationRecord(1, "main")]))
        with pytest.raises(LogConflict):
            b.commit(Batch(base_id=1, next_id=2, conversations=[ConversationRecord(1, "other")]))
        b.commit(entry_batch(2))
        assert [e.id for e in a.load().entries] == [2]
        conn = sqlite3.connect(path)
        try:
            assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        finally:
            conn.close()
    finally:
        a.close()
        b.close()


def test_sqlite_failed_commit_statement_is_uncertain_and_closes(tmp_path: Path) -> None:
    """Fault injection: SQLite refuses the COMMIT statement itself (an authorizer stands in
    for a disk I/O error there). The storage cannot know what landed: StorageUncertain,
    closed; a reopen shows the truth (here: rolled back)."""
    path = tmp_path / "log.sqlite"
    s = SqliteStorage(path)
    fill(s, 2)

    def deny_commit(action: int, arg1: str | None, *_: object) -> int:
        is_commit = action == sqlite3.SQLITE_TRANSACTION and arg1 == "COMMIT"
        return sqlite3.SQLITE_DENY if is_commit else sqlite3.SQLITE_OK

    s._conn.set_authorizer(deny_commit)  # type: ignore[union-attr]  # the injected fault
    with pytest.raises(StorageUncertain, match="reopen the log to see what landed"):
        s.commit(entry_batch(3))
    with pytest.raises(StorageClosed):
        s.load()
    s = SqliteStorage(path)
    try:
        assert s.load().next_id == 3
        s.commit(entry_batch(3))
    finally:
        s.close()


def test_jsonl_failed_sync_is_uncertain_and_closes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Fault injection: fdatasync fails with EIO after the line was written. The storage
    cannot know whether it is on disk: StorageUncertain, closed; a reopen shows the truth."""
    s = JsonlStorage(tmp_path / "log")
    fill(s, 2)

    def eio(fd: int) -> None:
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(jsonl, "_datasync", eio)
    with pytest.raises(StorageUncertain, match=r"Input/output error.*reopen the log"):
        s.commit(entry_batch(3))
    with pytest.raises(StorageClosed):
        s.load()
    monkeypatch.undo()
    s = JsonlStorage(tmp_path / "log")
    try:
        assert s.load().next_id == 4  # here the write had reached the file
        s.commit(entry_batch(4))
    finally:
        s.close()


def test_sqlite_in_a_missing_directory_says_so(tmp_path: Path) -> None:
    with pytest.raises(StorageError, match="check that its directory exists"):
        SqliteStorage(tmp_path / "missing" / "log.sqlite")


def test_a_crash_while_creating_the_log_leaves_no_half_made_log(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A driver killed while the log is being created must not leave a file that no later
    open gets past (it once left a hot rollback journal: NotALog forever)."""
    path = tmp_path / "log.sqlite"

    class Killed(BaseException):
        pass

    def die(self: SqliteStorage, conn: object) -> None:
        raise Killed

    with monkeypatch.context() as mp:
        mp.setattr(SqliteStorage, "_create_schema", die)
        with pytest.raises(Killed):
            SqliteStorage(path)
    assert not path.exists()
    storage = SqliteStorage(path)
    assert storage.load().next_id == 1
    storage.close()
    again = SqliteStorage(path)
    assert again.load().next_id == 1
    again.close()
    assert sorted(p.name for p in tmp_path.iterdir() if not p.name.startswith("log.sqlite-")) \
        == ["log.sqlite"]
