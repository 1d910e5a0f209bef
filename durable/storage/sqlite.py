"""``SqliteStorage``: the log in one SQLite file, the embedded default.

Why SQLite: one file holds the whole log, a transaction spans every table, and several
processes may share the file safely. Every ``commit`` is one transaction, so entries, slots,
documents and request ids land together or not at all.

Durability. The journal is WAL and ``synchronous=FULL``: SQLite fsyncs the WAL on every
COMMIT, so a commit that returned survives a crash or a power cut (``NORMAL`` would only sync
at checkpoints and could lose the last commits). A COMMIT that fails with an I/O error leaves
the outcome unknown: ``StorageUncertain``, and the storage closes itself (reopen to see).

Serialisation. ``BEGIN IMMEDIATE`` takes the write lock *before* the counter, the request
index and the document revisions are read, so ``validate_batch`` judges the state the batch
is written onto. A second process waits on the lock (``busy_timeout``) and then sees the first
one's writes: its stale ``base_id`` is refused with ``LogConflict``. Any error before COMMIT
rolls the whole transaction back.

Fencing. With ``epoch=``, opening raises the one-row ``fence`` floor to that epoch, and every
commit reads the floor inside its own transaction before writing anything: a floor above the
epoch rolls back with ``StaleEpochError``. Because the floor read and the writes share one
transaction under the write lock, an older writer cannot land anything after a newer one's
open returned. The read costs one indexed single-row SELECT inside a transaction that already
pays an fsync. ``durable.fences.open_fenced_sqlite`` wraps this with a ``Fence`` view.

Epoch history. A fenced writer stamps every entry it commits with its epoch, and each raise
of the floor is recorded (``fence_raises``: the new epoch and the first entry id it governs),
in the same transactions. ``epoch_history()`` returns both, so an auditor can prove that no
entry of an older epoch landed after a newer one took the log over. Logs made before these
columns existed get them when opened (the old entries carry no epoch).

Foreign files. A ``meta`` table carries a magic marker and the schema version. A file that is
not SQLite at all, or a SQLite database without that marker, raises ``NotALog`` and is not
modified: the check reads the header bytes, then the schema through a read-only connection,
before anything (even the journal mode) is set.
"""

from __future__ import annotations

import json
import os
import sqlite3
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from ..errors import NotALog, StorageClosed, StorageError, StorageUncertain
from .base import validate_batch
from .epochs import EpochGuard
from .records import (
    Batch,
    ConversationRecord,
    DocRecord,
    EntryRecord,
    RequestRecord,
    SlotRecord,
    Snapshot,
    encode_json,
)

T = TypeVar("T")


@dataclass(frozen=True)
class EpochHistory:
    """Who wrote what, for auditing a fenced log (see the module docstring)."""

    #: (epoch, first entry id it governs, unix ms), one per raise of the floor, by epoch.
    raises: list[tuple[int, int, int]]
    #: entry id → the epoch of the writer that committed it (None: unfenced or older log).
    entry_epochs: dict[int, int | None]

#: Stored in ``meta`` under ``magic``: what makes a SQLite file a durable log.
MAGIC = "durable-log"
SCHEMA_VERSION = 1
_SQLITE_HEADER = b"SQLite format 3\x00"
_READ, _WRITE = "BEGIN", "BEGIN IMMEDIATE"
#: Primary result codes that say "not now" (a lock, the disk), not "not a log".
_TRANSIENT = {
    sqlite3.SQLITE_BUSY,
    sqlite3.SQLITE_LOCKED,
    sqlite3.SQLITE_IOERR,
    sqlite3.SQLITE_CANTOPEN,
    sqlite3.SQLITE_FULL,
    sqlite3.SQLITE_NOMEM,
}

_FENCE_RAISES = (
    "CREATE TABLE IF NOT EXISTS fence_raises (epoch INTEGER PRIMARY KEY,"
    " next_id INTEGER NOT NULL, raised_ms INTEGER NOT NULL)"
)

_SCHEMA = (
    "CREATE TABLE meta (key TEXT PRIMARY KEY, value NOT NULL) WITHOUT ROWID",
    "CREATE TABLE fence (one INTEGER PRIMARY KEY CHECK (one = 1), floor INTEGER NOT NULL)",
    "CREATE TABLE conversations (id INTEGER PRIMARY KEY, agent TEXT NOT NULL,"
    " parent_conversation INTEGER, parent_entry INTEGER, created_ms INTEGER NOT NULL)",
    "CREATE TABLE entries (id INTEGER PRIMARY KEY, conversation INTEGER NOT NULL,"
    " kind TEXT NOT NULL, data TEXT NOT NULL, created_ms INTEGER NOT NULL, epoch INTEGER)",
    _FENCE_RAISES,
    # seq keeps first-insertion order: an upsert updates the row in place, as MemoryStorage does.
    "CREATE TABLE slots (seq INTEGER PRIMARY KEY, conversation INTEGER NOT NULL,"
    " call_id TEXT NOT NULL, assistant_entry INTEGER NOT NULL, name TEXT NOT NULL,"
    " args TEXT NOT NULL, replay TEXT NOT NULL, state TEXT NOT NULL, result_entry INTEGER,"
    " progress TEXT NOT NULL, updated_ms INTEGER NOT NULL, UNIQUE (conversation, call_id))",
    # seq is commit order: a new rowid is always above every existing one.
    "CREATE TABLE docs (seq INTEGER PRIMARY KEY, conversation INTEGER NOT NULL,"
    " kind TEXT NOT NULL, version INTEGER NOT NULL, revision INTEGER NOT NULL,"
    " value TEXT NOT NULL, at INTEGER NOT NULL, history TEXT NOT NULL)",
    "CREATE INDEX docs_by_key ON docs (conversation, kind, revision)",
    "CREATE TABLE requests (seq INTEGER PRIMARY KEY, conversation INTEGER NOT NULL,"
    " request_id TEXT NOT NULL, entry INTEGER NOT NULL, UNIQUE (conversation, request_id))",
)

_SLOT_UPSERT = (
    "INSERT INTO slots (conversation, call_id, assistant_entry, name, args, replay, state,"
    " result_entry, progress, updated_ms) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
    " ON CONFLICT (conversation, call_id) DO UPDATE SET assistant_entry = excluded.assistant_entry,"
    " name = excluded.name, args = excluded.args, replay = excluded.replay,"
    " state = excluded.state, result_entry = excluded.result_entry,"
    " progress = excluded.progress, updated_ms = excluded.updated_ms"
)


def _not_a_log(path: Path, why: str) -> NotALog:
    return NotALog(
        f"{path} is not a durable log ({why}). Point SqliteStorage at a log created by "
        "durable or at a new path; the file was not modified"
    )


def _verify_log(conn: sqlite3.Connection, path: Path) -> None:
    """Raise ``NotALog`` unless ``conn`` holds a durable log of this schema version."""
    try:
        tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        if "meta" not in tables:
            raise _not_a_log(path, "a SQLite database without durable's meta table")
        meta = dict(conn.execute("SELECT key, value FROM meta").fetchall())
    except sqlite3.DatabaseError as exc:
        if exc.sqlite_errorcode & 0xFF in _TRANSIENT:
            raise StorageError(f"could not read {path} ({exc}); retry") from exc
        raise _not_a_log(path, f"SQLite could not read it as a log: {exc}") from exc
    if meta.get("magic") != MAGIC:
        raise _not_a_log(path, f"its meta table has no {MAGIC!r} marker")
    if meta.get("schema") != SCHEMA_VERSION:
        raise _not_a_log(
            path,
            f"schema {meta.get('schema')!r} but this code reads schema {SCHEMA_VERSION}; "
            "upgrade durable to read it",
        )


def _check_existing_file(path: Path, busy_timeout: float) -> bool:
    """Verify a file already at ``path`` without modifying it; tell whether one exists.

    A missing or empty file is a new log. Anything else must start with the SQLite header and
    pass ``_verify_log`` through a read-only connection (which never checkpoints or rolls a
    journal into the file)."""
    if path.is_dir():
        raise _not_a_log(path, "it is a directory")
    try:
        with path.open("rb") as f:
            header = f.read(len(_SQLITE_HEADER))
    except FileNotFoundError:
        return False
    if not header:
        return False
    if header != _SQLITE_HEADER:
        raise _not_a_log(path, "it is not a SQLite file")
    ro = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True, timeout=busy_timeout)
    try:
        _verify_log(ro, path)
    finally:
        ro.close()
    return True


def _rows(batch: Batch) -> dict[str, list[tuple[Any, ...]]]:
    """Encode every record of ``batch`` as table rows, before any lock is taken.

    A value that is not JSON raises ``StorageError`` here, so nothing is started."""
    try:
        return {
            "conversations": [
                (c.id, c.agent, c.parent_conversation, c.parent_entry, c.created_ms)
                for c in batch.conversations
            ],
            "entries": [
                (e.id, e.conversation, e.kind, encode_json(e.data), e.created_ms)
                for e in batch.entries
            ],
            "slots": [
                (s.conversation, s.call_id, s.assistant_entry, s.name, encode_json(s.args),
                 s.replay, s.state, s.result_entry, s.progress, s.updated_ms)
                for s in batch.slots
            ],
            "docs": [
                (d.conversation, d.kind, d.version, d.revision, encode_json(d.value), d.at,
                 d.history)
                for d in batch.docs
            ],
            "requests": [(r.conversation, r.request_id, r.entry) for r in batch.requests],
        }
    except (TypeError, ValueError) as exc:
        raise StorageError(
            f"the batch holds a value that cannot be stored as JSON ({exc}); store only "
            "JSON values (dict, list, str, int, float, bool, None)"
        ) from exc


class SqliteStorage:
    """A log in the SQLite file at ``path`` (created if missing); see the module docstring.

    ``epoch`` makes it fenced (``durable.fences.open_fenced_sqlite`` is the usual way in).
    ``busy_timeout`` (seconds) is how long a commit waits for another process's write lock
    before giving up with ``StorageError``. One connection per object, guarded by a lock, so
    threads of one process may share it.
    """

    def __init__(
        self, path: str | Path, *, epoch: int | None = None, busy_timeout: float = 10.0
    ) -> None:
        self.path = Path(path)
        self.epoch_guard = None if epoch is None else EpochGuard(epoch)
        self._lock = threading.RLock()  # close() runs inside a failing commit too
        self._conn: sqlite3.Connection | None = None
        try:
            if not _check_existing_file(self.path, busy_timeout):
                self._create_file()
            self._conn = conn = sqlite3.connect(
                self.path, isolation_level=None, check_same_thread=False, timeout=busy_timeout
            )
            mode = conn.execute("PRAGMA journal_mode=WAL").fetchone()[0]
            if mode != "wal":
                raise StorageError(
                    f"SQLite refused WAL mode for {self.path} (it stays {mode!r}); put the "
                    "log on a local filesystem that supports shared memory"
                )
            conn.execute("PRAGMA synchronous=FULL")
            if not self._has_epoch_history(conn):
                self._transaction(_WRITE, self._add_epoch_history)
            if self.epoch_guard is not None:
                self._transaction(_WRITE, self._admit_epoch)
        except sqlite3.Error as exc:
            self.close()
            raise StorageError(
                f"could not open {self.path} ({exc}); check that its directory exists and is "
                "writable, and that no other process holds the write lock for long"
            ) from exc
        except BaseException:
            self.close()
            raise

    # ------------------------------------------------------------ the Storage protocol

    def load(self) -> Snapshot:
        with self._lock:
            return self._transaction(_READ, self._read_snapshot)

    def commit(self, batch: Batch) -> None:
        rows = _rows(batch)

        def write(conn: sqlite3.Connection) -> None:
            if self.epoch_guard is not None:
                self._admit_epoch(conn)
            validate_batch(
                batch,
                next_id=conn.execute("SELECT value FROM meta WHERE key = 'next_id'").fetchone()[0],
                has_request=lambda c, r: conn.execute(
                    "SELECT 1 FROM requests WHERE conversation = ? AND request_id = ?", (c, r)
                ).fetchone() is not None,
                doc_revision=lambda c, k: conn.execute(
                    "SELECT coalesce(max(revision), 0) FROM docs"
                    " WHERE conversation = ? AND kind = ?",
                    (c, k),
                ).fetchone()[0],
            )
            self._write(conn, batch, rows,
                        None if self.epoch_guard is None else self.epoch_guard.epoch)

        with self._lock:
            self._transaction(_WRITE, write)

    def close(self) -> None:
        with self._lock:
            conn, self._conn = self._conn, None
            if conn is not None:
                conn.close()

    # ------------------------------------------------------------ fencing

    def epoch_history(self) -> EpochHistory:
        """Each floor raise (epoch, first entry id it governs, time) and each entry's epoch
        (None for entries of an unfenced writer or of a log older than these records)."""
        def read(conn: sqlite3.Connection) -> EpochHistory:
            raises = [tuple(r) for r in conn.execute(
                "SELECT epoch, next_id, raised_ms FROM fence_raises ORDER BY epoch")]
            epochs = dict(conn.execute("SELECT id, epoch FROM entries ORDER BY id").fetchall())
            return EpochHistory(raises, epochs)  # type: ignore[arg-type]

        with self._lock:
            return self._transaction(_READ, read)

    def read_floor(self) -> int:
        """The fence floor as stored now (0 when no fenced storage ever opened the log)."""
        with self._lock:
            return self._transaction(_READ, self._floor)

    # ------------------------------------------------------------ internals

    def _transaction(self, begin: str, work: Callable[[sqlite3.Connection], T]) -> T:
        """Run ``work`` in one ``_READ`` or ``_WRITE`` transaction: roll back on any error,
        else COMMIT.

        A failing COMMIT of a write transaction leaves its outcome unknown: the storage closes
        itself and raises ``StorageUncertain``. Other sqlite3 errors become ``StorageError``
        (the original stays as ``__cause__``); durable's own errors pass through unchanged."""
        conn = self._conn
        if conn is None:
            raise StorageClosed(f"the SqliteStorage of {self.path} is closed; open it again")
        try:
            conn.execute(begin)
        except sqlite3.Error as exc:
            raise StorageError(
                f"could not start a transaction on {self.path} ({exc}); if another process "
                "holds the write lock, retry later or raise busy_timeout"
            ) from exc
        try:
            result = work(conn)
        except BaseException as exc:
            try:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
            except sqlite3.Error as rollback_exc:
                exc.add_note(f"the rollback failed too ({rollback_exc}); the storage closed")
                self.close()
            if isinstance(exc, sqlite3.Error):
                raise StorageError(
                    f"SQLite refused the transaction on {self.path} ({exc}); nothing was written"
                ) from exc
            raise
        try:
            conn.execute("COMMIT")
        except sqlite3.Error as exc:
            self.close()
            if begin == _WRITE:
                raise StorageUncertain(
                    f"COMMIT on {self.path} failed ({exc}); the commit may or may not have "
                    "landed and this storage closed itself: reopen the log to see what landed"
                ) from exc
            raise StorageError(
                f"ending a read transaction on {self.path} failed ({exc}); the storage closed, "
                "reopen it"
            ) from exc
        return result

    @staticmethod
    def _floor(conn: sqlite3.Connection) -> int:
        return conn.execute("SELECT floor FROM fence").fetchone()[0]

    def _admit_epoch(self, conn: sqlite3.Connection) -> None:
        """Inside a write transaction: refuse a stale or halted epoch, raise an older floor
        (and record the raise with the first entry id the new epoch governs)."""
        assert self.epoch_guard is not None
        if self.epoch_guard.admit(self._floor(conn)):
            epoch = self.epoch_guard.epoch
            conn.execute("UPDATE fence SET floor = ?", (epoch,))
            next_id = conn.execute("SELECT value FROM meta WHERE key = 'next_id'").fetchone()[0]
            conn.execute("INSERT OR REPLACE INTO fence_raises (epoch, next_id, raised_ms)"
                         " VALUES (?, ?, ?)", (epoch, next_id, int(time.time() * 1000)))

    @staticmethod
    def _has_epoch_history(conn: sqlite3.Connection) -> bool:
        columns = {row[1] for row in conn.execute("PRAGMA table_info(entries)")}
        return "epoch" in columns

    def _add_epoch_history(self, conn: sqlite3.Connection) -> None:
        """Bring a log made before epoch history existed up to date (idempotent)."""
        if not self._has_epoch_history(conn):
            conn.execute("ALTER TABLE entries ADD COLUMN epoch INTEGER")
        conn.execute(_FENCE_RAISES)

    def _create_file(self) -> None:
        """Make the new log atomically: built in a temporary file beside ``path`` (schema,
        WAL mode), fsynced, then linked into place.

        A crash while it is built leaves no half-made log at ``path`` (a first driver
        SIGKILLed there once left a hot rollback journal that no later open could get past),
        only a temporary file that is never read. A concurrent creator that linked its own
        log first wins; ours is dropped."""
        tmp = self.path.with_name(f".{self.path.name}.new-{os.getpid()}-{threading.get_ident()}")
        tmp.unlink(missing_ok=True)
        try:
            conn = sqlite3.connect(tmp, isolation_level=None)
            try:
                conn.execute("PRAGMA journal_mode=WAL")
                conn.execute("BEGIN IMMEDIATE")
                self._create_schema(conn)
                conn.execute("COMMIT")
            finally:
                conn.close()  # the last connection checkpoints the WAL into the file
            with open(tmp, "rb+") as f:
                os.fsync(f.fileno())
            try:
                os.link(tmp, self.path)
            except FileExistsError:
                if self.path.stat().st_size == 0:  # an empty file stands for a new log
                    os.replace(tmp, self.path)
        finally:
            tmp.unlink(missing_ok=True)
        dirfd = os.open(self.path.parent, os.O_RDONLY)
        try:
            os.fsync(dirfd)
        finally:
            os.close(dirfd)

    def _create_schema(self, conn: sqlite3.Connection) -> None:
        # Another process may have created the log between our look at the file and our
        # write lock: then verify what it made instead of creating twice.
        if conn.execute("SELECT count(*) FROM sqlite_master").fetchone()[0]:
            _verify_log(conn, self.path)
            return
        for statement in _SCHEMA:
            conn.execute(statement)
        conn.executemany(
            "INSERT INTO meta (key, value) VALUES (?, ?)",
            [("magic", MAGIC), ("schema", SCHEMA_VERSION), ("next_id", 1)],
        )
        conn.execute("INSERT INTO fence (one, floor) VALUES (1, 0)")

    @staticmethod
    def _write(
        conn: sqlite3.Connection, batch: Batch, rows: dict[str, list[tuple[Any, ...]]],
        epoch: int | None,
    ) -> None:
        conn.executemany(
            "INSERT INTO conversations (id, agent, parent_conversation, parent_entry, created_ms)"
            " VALUES (?, ?, ?, ?, ?)",
            rows["conversations"],
        )
        conn.executemany(
            "INSERT INTO entries (id, conversation, kind, data, created_ms, epoch)"
            " VALUES (?, ?, ?, ?, ?, ?)",
            [(*row, epoch) for row in rows["entries"]],
        )
        conn.executemany(_SLOT_UPSERT, rows["slots"])
        for doc, row in zip(batch.docs, rows["docs"]):
            if doc.history == "latest":
                conn.execute(
                    "DELETE FROM docs WHERE conversation = ? AND kind = ?",
                    (doc.conversation, doc.kind),
                )
            conn.execute(
                "INSERT INTO docs (conversation, kind, version, revision, value, at, history)"
                " VALUES (?, ?, ?, ?, ?, ?, ?)",
                row,
            )
        conn.executemany(
            "INSERT INTO requests (conversation, request_id, entry) VALUES (?, ?, ?)",
            rows["requests"],
        )
        conn.execute("UPDATE meta SET value = ? WHERE key = 'next_id'", (batch.next_id,))

    @staticmethod
    def _read_snapshot(conn: sqlite3.Connection) -> Snapshot:
        return Snapshot(
            next_id=conn.execute("SELECT value FROM meta WHERE key = 'next_id'").fetchone()[0],
            conversations=[
                ConversationRecord(*row)
                for row in conn.execute(
                    "SELECT id, agent, parent_conversation, parent_entry, created_ms"
                    " FROM conversations ORDER BY id"
                )
            ],
            entries=[
                EntryRecord(i, c, kind, json.loads(data), ms)
                for i, c, kind, data, ms in conn.execute(
                    "SELECT id, conversation, kind, data, created_ms FROM entries ORDER BY id"
                )
            ],
            slots=[
                SlotRecord(c, call, entry, name, json.loads(args), replay, state, result, prog, ms)
                for c, call, entry, name, args, replay, state, result, prog, ms in conn.execute(
                    "SELECT conversation, call_id, assistant_entry, name, args, replay, state,"
                    " result_entry, progress, updated_ms FROM slots ORDER BY seq"
                )
            ],
            docs=[
                DocRecord(c, kind, version, revision, json.loads(value), at, history)
                for c, kind, version, revision, value, at, history in conn.execute(
                    "SELECT conversation, kind, version, revision, value, at, history"
                    " FROM docs ORDER BY seq"
                )
            ],
            requests=[
                RequestRecord(*row)
                for row in conn.execute(
                    "SELECT conversation, request_id, entry FROM requests ORDER BY seq"
                )
            ],
        )
