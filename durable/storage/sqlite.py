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
pays an fsync. ``durable.storage_fences.open_fenced_sqlite`` wraps this with a ``Fence`` view.

Epoch history. A fenced writer stamps every entry it commits with its epoch, and each raise
of the floor is recorded (``fence_raises``: the new epoch and the first entry id it governs),
in the same transactions. ``epoch_history()`` returns both, so an auditor can prove that no
entry of an older epoch landed after a newer one took the log over. Logs made before these
columns existed get them when opened (the old entries carry no epoch).

Foreign files. A ``meta`` table carries a magic marker and the schema version. A file that is
not SQLite at all, or a SQLite database without that marker, raises ``NotALog`` and is not
modified: the check reads the header bytes, then the schema through a read-only connection,
before anything (even the journal mode) is set. The file type is checked before the file is
opened (a FIFO would block), a dangling symlink or a read-only filesystem is a
``StorageError`` saying so, and an empty file is ``CorruptLog``: a log is created atomically
(built beside the path, then linked), so an empty one was truncated, and initialising it would
hide the loss (and, fenced, reset the epoch floor).

Damage detection. Every row of the tables in ``_CHECKED`` carries a CRC-32 (column ``crc``)
of its values, its key and table name included. ``meta`` holds a digest, itself checksummed
and updated in each commit's transaction: per table the row count and the sum of the row
CRCs, the id counter, the fence floor, the number of commits and a random id of the log. An
open checks the digest against the counter and the floor (cheap, through the read-only
connection, so a refused open leaves the -wal as it was: a read-write connection would
checkpoint it on close); every ``load`` and
``epoch_history`` verifies each row it reads and each table's count and sum, so a changed,
lost or duplicated row raises ``CorruptLog``; SQLite's own "malformed" errors do too. Indexes
are not verified (they are used by commits' look-ups, not by reads); a damaged index is left
to SQLite to notice. Logs made before checksums are migrated forward on open (columns added,
rows checksummed as they are, which cannot vouch for damage done before); the schema version
stays 1, so a durable from before checksums can still open such a log, and anything it
commits then fails verification here.

Lost ``-wal``. Commits live in the ``-wal`` until a checkpoint copies them into the main file,
so a ``-wal`` deleted after a crash, or a log copied without it, silently goes back in time.
What detects it lives outside the WAL: ``<log>-commits`` holds the log id and the number of
commits, rewritten after each COMMIT (under ``flock``, never lowered, not fsynced). An open
that finds fewer commits in the log than the mark raises ``CorruptLog``. Limits: the mark is
exact after a process crash, but after a power cut it may lag or hold nothing (its unsynced
write lost: empty or NUL bytes, read as no mark), and a WAL lost then goes unseen;
a log copied without both its ``-wal`` and its ``-commits`` cannot be checked; a mark of
another log (a different id) is ignored and overwritten. A log restored from an older backup
is reported the same way; deleting the mark accepts it.
"""

from __future__ import annotations

import fcntl
import json
import os
import sqlite3
import stat
import threading
import time
import uuid
import warnings
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from ..errors import CorruptLog, NotALog, StorageClosed, StorageError, StorageUncertain
from ..failpoints import failpoint
from . import commit_mark
from .base import rebased, validate_batch
from .epochs import EpochGuard, EpochHistory
from .log_path import stat_existing
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
    " next_id INTEGER NOT NULL, raised_ms INTEGER NOT NULL, crc INTEGER)"
)

_SCHEMA = (
    "CREATE TABLE meta (key TEXT PRIMARY KEY, value NOT NULL) WITHOUT ROWID",
    "CREATE TABLE fence (one INTEGER PRIMARY KEY CHECK (one = 1), floor INTEGER NOT NULL)",
    ("CREATE TABLE conversations (id INTEGER PRIMARY KEY, agent TEXT NOT NULL,"
    " parent_conversation INTEGER, parent_entry INTEGER, created_ms INTEGER NOT NULL,"
    " crc INTEGER)"),
    ("CREATE TABLE entries (id INTEGER PRIMARY KEY, conversation INTEGER NOT NULL,"
    " kind TEXT NOT NULL, data TEXT NOT NULL, created_ms INTEGER NOT NULL, epoch INTEGER,"
    " crc INTEGER)"),
    _FENCE_RAISES,
    # seq keeps first-insertion order: an upsert updates the row in place, as MemoryStorage does.
    ("CREATE TABLE slots (seq INTEGER PRIMARY KEY, conversation INTEGER NOT NULL,"
    " call_id TEXT NOT NULL, assistant_entry INTEGER NOT NULL, name TEXT NOT NULL,"
    " args TEXT NOT NULL, replay TEXT NOT NULL, state TEXT NOT NULL, result_entry INTEGER,"
    " progress TEXT NOT NULL, updated_ms INTEGER NOT NULL, crc INTEGER,"
    " UNIQUE (conversation, call_id))"),
    # seq is commit order: a new rowid is always above every existing one.
    ("CREATE TABLE docs (seq INTEGER PRIMARY KEY, conversation INTEGER NOT NULL,"
    " kind TEXT NOT NULL, version INTEGER NOT NULL, revision INTEGER NOT NULL,"
    " value TEXT NOT NULL, at INTEGER NOT NULL, history TEXT NOT NULL, crc INTEGER)"),
    "CREATE INDEX docs_by_key ON docs (conversation, kind, revision)",
    ("CREATE TABLE requests (seq INTEGER PRIMARY KEY, conversation INTEGER NOT NULL,"
    " request_id TEXT NOT NULL, entry INTEGER NOT NULL, crc INTEGER,"
    " UNIQUE (conversation, request_id))"),
)

#: The tables whose rows carry a CRC-32 (column ``crc``): each one's key column and the
#: columns the checksum covers (the key included, so a row moved to another key fails).
_CHECKED: dict[str, tuple[str, str]] = {
    "conversations": ("id", "id, agent, parent_conversation, parent_entry, created_ms"),
    "entries": ("id", "id, conversation, kind, data, created_ms, epoch"),
    "slots": ("seq", ("seq, conversation, call_id, assistant_entry, name, args, replay, state,"
                     " result_entry, progress, updated_ms")),
    "docs": ("seq", "seq, conversation, kind, version, revision, value, at, history"),
    "requests": ("seq", "seq, conversation, request_id, entry"),
    "fence_raises": ("epoch", "epoch, next_id, raised_ms"),
}
#: SQLite result codes that mean "the file is damaged" once its header was recognised.
_DAMAGED = {sqlite3.SQLITE_CORRUPT, sqlite3.SQLITE_NOTADB}


def _row_crc(table: str, values: Sequence[Any]) -> int:
    """The CRC-32 of one row (its table name included); -1 for values SQLite could only have
    produced from a damaged file (a BLOB where text was stored), which never match."""
    try:
        return zlib.crc32(encode_json([table, *values]).encode())
    except (TypeError, ValueError):
        return -1


@dataclass
class _Digest:
    """What the log's rows must add up to, kept in ``meta`` under ``digest`` and updated in
    every commit's transaction: per checked table the row count and the sum of the row CRCs,
    the id counter, the fence floor, and the number of commits. It carries its own CRC-32."""

    log_id: str
    commits: int
    next_id: int
    floor: int
    tables: dict[str, list[int]]

    def encode(self) -> str:
        body = encode_json([self.log_id, self.commits, self.next_id, self.floor, self.tables])
        return f"{zlib.crc32(body.encode()):08x} {body}"

    @classmethod
    def decode(cls, value: object) -> _Digest | None:
        """The digest stored as ``value``, or None when it is damaged."""
        if not isinstance(value, str) or value[8:9] != " ":
            return None
        body = value[9:]
        try:
            if int(value[:8], 16) != zlib.crc32(body.encode()):
                return None
            log_id, commits, next_id, floor, tables = json.loads(body)
            return cls(log_id, commits, next_id, floor, tables)
        except (ValueError, TypeError):
            return None

    def add(self, table: str, crc: int | None, sign: int = 1) -> None:
        count, total = self.tables.setdefault(table, [0, 0])
        self.tables[table] = [count + sign, (total + sign * (crc or 0)) % 2**64]


def _corrupt(path: Path, why: str) -> CorruptLog:
    return CorruptLog(
        f"{path} is damaged: {why}. The disk is failing or the file (or its -wal) was "
        "edited, truncated or lost: restore the log from a copy (with its -wal); it was not "
        "modified"
    )


def _damaged(exc: sqlite3.Error) -> bool:
    """Whether SQLite says the file is malformed (some of its errors carry no result code,
    "malformed database schema" among them)."""
    code = getattr(exc, "sqlite_errorcode", None)
    return (code is not None and code & 0xFF in _DAMAGED) or "malformed" in str(exc)


def _sqlite_error(path: Path, exc: sqlite3.Error, message: str) -> StorageError:
    """``CorruptLog`` when SQLite says the file is malformed, else ``StorageError(message)``."""
    if _damaged(exc):
        return _corrupt(path, f"SQLite reports {exc}")
    return StorageError(message)


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
    except UnicodeDecodeError as exc:  # text that SQLite stores as UTF-8 is not
        raise _corrupt(path, f"it holds text that is not UTF-8 ({exc})") from exc
    except sqlite3.DatabaseError as exc:
        if (getattr(exc, "sqlite_errorcode", None) or 0) & 0xFF in _TRANSIENT:
            raise StorageError(f"could not read {path} ({exc}); retry") from exc
        if _damaged(exc):  # the header said SQLite: it is damaged
            raise _corrupt(path, f"SQLite reports {exc}") from exc
        raise _not_a_log(path, f"SQLite could not read it as a log: {exc}") from exc
    if meta.get("magic") != MAGIC:
        raise _not_a_log(path, f"its meta table has no {MAGIC!r} marker")
    if meta.get("schema") != SCHEMA_VERSION:
        raise _not_a_log(
            path,
            f"schema {meta.get('schema')!r} but this code reads schema {SCHEMA_VERSION}; "
            "upgrade durable to read it",
        )


def _check_existing_file(
    path: Path, busy_timeout: float, check: Callable[[sqlite3.Connection], None]
) -> bool:
    """Verify a file already at ``path`` without modifying it; tell whether one exists.

    The file type is checked before anything opens it (a FIFO would block the open), then
    the header, then ``_verify_log`` through a read-only connection (which never checkpoints
    or rolls a journal into the file), then ``check`` on that connection, in one read
    transaction. Checking there matters: a read-write connection checkpoints the -wal into
    the file when it closes, even after a refused open. An empty file is refused:
    ``_create_file`` never leaves one, so it is a truncated log or a stranger's file, and
    initialising it could hide a loss.
    """
    st = stat_existing(path)
    _check_writable(path)
    if st is None:
        return False
    if stat.S_ISDIR(st.st_mode):
        raise _not_a_log(path, "it is a directory")
    if not stat.S_ISREG(st.st_mode):
        raise _not_a_log(path, "it is not a regular file (a FIFO, socket or device)")
    if st.st_size == 0:
        raise CorruptLog(
            f"{path} is empty (0 bytes). durable creates a log atomically and never leaves an "
            "empty one, so the log was truncated or the file is not durable's: restore the log "
            "from a copy, or delete the file to start a new log there; it was not modified"
        )
    with path.open("rb") as f:
        header = f.read(len(_SQLITE_HEADER))
    if header != _SQLITE_HEADER:
        raise _not_a_log(path, "it is not a SQLite file")
    ro = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True, timeout=busy_timeout)
    try:
        _verify_log(ro, path)
        ro.execute("BEGIN")
        check(ro)
    except UnicodeDecodeError as exc:  # text that SQLite stores as UTF-8 is not
        raise _corrupt(path, f"it holds text that is not UTF-8 ({exc})") from exc
    except sqlite3.Error as exc:
        raise _sqlite_error(path, exc, f"could not check {path} ({exc}); retry") from exc
    finally:
        ro.close()
    return True


def _check_writable(path: Path) -> None:
    """Refuse a log on a read-only filesystem up front: SQLite needs to write its -wal and
    -shm beside the log even to read it, and would fail with a vaguer error."""
    try:
        read_only = os.statvfs(path.parent).f_flag & os.ST_RDONLY
    except FileNotFoundError:
        return  # the open reports the missing directory
    if read_only:
        raise StorageError(
            f"{path.parent} is on a read-only filesystem; a SQLite log needs to write beside "
            "it (its -wal, -shm and -commits files). Remount it read-write, or copy the log "
            "(with its -wal) to a writable place"
        )


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

    ``epoch`` makes it fenced (``durable.storage_fences.open_fenced_sqlite`` is the usual way in).
    ``busy_timeout`` (seconds) is how long a commit waits for another process's write lock
    before giving up with ``StorageError``. One connection per object, guarded by a lock, so
    threads of one process may share it.
    """

    def __init__(
        self, path: str | Path, *, epoch: int | None = None, busy_timeout: float = 10.0
    ) -> None:
        self.path = Path(path)
        #: The commit high-water mark beside the log (see the module docstring).
        self.mark_path = self.path.with_name(f"{self.path.name}-commits")
        self.epoch_guard = None if epoch is None else EpochGuard(epoch)
        self._lock = threading.RLock()  # close() runs inside a failing commit too
        self._conn: sqlite3.Connection | None = None
        try:
            if not _check_existing_file(self.path, busy_timeout, self._check_digest):
                self._create_file()
                # Ours, or a racing creator's.
                _check_existing_file(self.path, busy_timeout, self._check_digest)
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
            if self._read_digest(conn) is None:
                self._transaction(_WRITE, self._add_checksums)
            if self.epoch_guard is not None:
                self._transaction(_WRITE, self._admit_epoch)
        except sqlite3.Error as exc:
            self.close()
            raise _sqlite_error(
                self.path, exc,
                f"could not open {self.path} ({exc}); check that its directory exists and is "
                "writable, and that no other process holds the write lock for long",
            ) from exc
        except BaseException:
            self.close()
            raise

    # ------------------------------------------------------------ the Storage protocol

    def load(self) -> Snapshot:
        with self._lock:
            return self._transaction(_READ, self._read_snapshot)

    def load_docs(self, conversation: int, kind: str) -> list[DocRecord]:
        """One document's stored writes, each row verified against its checksum."""
        def read(conn: sqlite3.Connection) -> list[DocRecord]:
            out = []
            for *values, crc in conn.execute(
                    f"SELECT {_CHECKED['docs'][1]}, crc FROM docs WHERE conversation = ? AND "
                    "kind = ? ORDER BY revision", (conversation, kind)):
                if crc != _row_crc("docs", values):
                    raise _corrupt(self.path, f"row {values[0]!r} of table docs does not "
                                              "match its checksum")
                _seq, c, k, version, revision, value, at, history = values
                out.append(DocRecord(c, k, version, revision, json.loads(value), at, history))
            return out

        with self._lock:
            return self._transaction(_READ, read)

    def commit(self, batch: Batch) -> None:
        def write(conn: sqlite3.Connection) -> _Digest:
            nonlocal batch
            if self.epoch_guard is not None:
                self._admit_epoch(conn)
            stored = conn.execute("SELECT value FROM meta WHERE key = 'next_id'").fetchone()[0]
            batch = rebased(batch, stored)
            rows = _rows(batch)
            validate_batch(
                batch,
                next_id=stored,
                has_request=lambda c, r: conn.execute(
                    "SELECT 1 FROM requests WHERE conversation = ? AND request_id = ?", (c, r)
                ).fetchone() is not None,
                doc_revision=lambda c, k: conn.execute(
                    "SELECT coalesce(max(revision), 0) FROM docs"
                    " WHERE conversation = ? AND kind = ?",
                    (c, k),
                ).fetchone()[0],
            )
            return self._write(conn, batch, rows,
                               None if self.epoch_guard is None else self.epoch_guard.epoch)

        failpoint("log.commit")
        with self._lock:
            digest = self._transaction(_WRITE, write)
            self._raise_mark(digest)

    def close(self) -> None:
        with self._lock:
            conn, self._conn = self._conn, None
            if conn is not None:
                conn.close()

    # ------------------------------------------------------------ fencing

    def epoch_history(self) -> EpochHistory:
        """Each floor raise (epoch, first entry id it governs, time) and each entry's epoch
        (None for entries of an unfenced writer or of a log older than these records).

        Every row is verified against its checksum first: an audit must not trust a damaged
        log (``CorruptLog``)."""
        def read(conn: sqlite3.Connection) -> EpochHistory:
            rows = self._verified_rows(conn)
            raises = [tuple(r) for r in rows["fence_raises"]]
            epochs = {r[0]: r[5] for r in rows["entries"]}
            return EpochHistory(raises, epochs)

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
        itself and raises ``StorageUncertain``. SQLite reporting a malformed file raises
        ``CorruptLog``, other sqlite3 errors ``StorageError`` (the original stays as
        ``__cause__``); durable's own errors pass through unchanged."""
        conn = self._conn
        if conn is None:
            raise StorageClosed(f"the SqliteStorage of {self.path} is closed; open it again")
        try:
            conn.execute(begin)
        except sqlite3.Error as exc:
            raise _sqlite_error(
                self.path, exc,
                f"could not start a transaction on {self.path} ({exc}); if another process "
                "holds the write lock, retry later or raise busy_timeout",
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
            if isinstance(exc, UnicodeDecodeError):  # text that SQLite stores as UTF-8 is not
                raise _corrupt(self.path, f"it holds text that is not UTF-8 ({exc})") from exc
            if isinstance(exc, sqlite3.Error):
                raise _sqlite_error(
                    self.path, exc,
                    f"SQLite refused the transaction on {self.path} ({exc}); nothing was written",
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

    # ------------------------------------------------------------ checksums

    def _read_digest(self, conn: sqlite3.Connection) -> _Digest | None:
        """The stored digest; None when the log predates checksums; ``CorruptLog`` when it
        is damaged."""
        row = conn.execute("SELECT value FROM meta WHERE key = 'digest'").fetchone()
        if row is None:
            return None
        digest = _Digest.decode(row[0])
        if digest is None:
            raise _corrupt(self.path, "its digest (meta 'digest') does not match its checksum")
        return digest

    def _digest(self, conn: sqlite3.Connection) -> _Digest:
        """The stored digest, checked against the counter it mirrors."""
        digest = self._read_digest(conn)
        if digest is None:
            raise _corrupt(self.path, "its digest (meta 'digest') is missing")
        next_id = conn.execute("SELECT value FROM meta WHERE key = 'next_id'").fetchone()
        if next_id is None or next_id[0] != digest.next_id:
            raise _corrupt(self.path, f"its id counter {next_id and next_id[0]!r} is not the "
                                      f"committed {digest.next_id}")
        return digest

    def _check_digest(self, conn: sqlite3.Connection) -> None:
        """The cheap check of an open: the digest is intact and mirrors the counter and the
        floor, and the log holds every commit the high-water mark says was made.

        The mark is read first, before the transaction's first read fixes its snapshot: a
        mark is raised only after its COMMIT, so the snapshot then holds at least as many
        commits, even while other processes commit."""
        mark = self._read_mark()
        if self._read_digest(conn) is None:
            return  # a log from before checksums: migrated next, nothing to check yet
        digest = self._digest(conn)
        self._check_floor(conn, digest)
        if mark is not None and mark[0] == digest.log_id and mark[1] > digest.commits:
            raise CorruptLog(
                f"{self.path} holds {digest.commits} commits but {mark[1]} were committed "
                f"(says {self.mark_path}): its -wal was lost (deleted after a crash, or the log "
                "was copied without it). Put the -wal back beside the log; if it is gone for "
                f"good and you accept losing those commits, delete {self.mark_path}. Nothing "
                "was modified"
            )

    def _check_floor(self, conn: sqlite3.Connection, digest: _Digest) -> None:
        floor = conn.execute("SELECT floor FROM fence").fetchone()
        if floor is None or floor[0] != digest.floor:
            raise _corrupt(self.path, f"its fence floor {floor and floor[0]!r} is not the "
                                      f"committed {digest.floor}")

    def _verified_rows(self, conn: sqlite3.Connection) -> dict[str, list[tuple[Any, ...]]]:
        """Every checked table's rows in key order, each verified against its CRC, and each
        table's count and CRC sum against the digest (a lost or duplicated row fails)."""
        digest = self._digest(conn)
        self._check_floor(conn, digest)
        tables: dict[str, list[tuple[Any, ...]]] = {}
        for table, (key, columns) in _CHECKED.items():
            rows, total = [], 0
            for *values, crc in conn.execute(
                f"SELECT {columns}, crc FROM {table} ORDER BY {key}"
            ):
                if crc != _row_crc(table, values):
                    raise _corrupt(self.path, f"row {values[0]!r} of table {table} does not "
                                              "match its checksum")
                rows.append(tuple(values))
                total += crc
            count, want = digest.tables.get(table, [0, 0])
            if (len(rows), total % 2**64) != (count, want):
                raise _corrupt(self.path, f"table {table} holds {len(rows)} rows that do not "
                                          f"add up to the {count} committed")
            tables[table] = rows
        return tables

    def _add_checksums(self, conn: sqlite3.Connection) -> None:
        """Bring a log made before checksums up to date (idempotent): add the ``crc`` columns,
        checksum the rows as they are now (they cannot be verified: they predate this), and
        store the digest. Logs are migrated forward in place; the schema version stays 1."""
        if self._read_digest(conn) is not None:
            return
        for table in _CHECKED:
            if "crc" not in {row[1] for row in conn.execute(f"PRAGMA table_info({table})")}:
                conn.execute(f"ALTER TABLE {table} ADD COLUMN crc INTEGER")
        next_id = conn.execute("SELECT value FROM meta WHERE key = 'next_id'").fetchone()[0]
        digest = _Digest(uuid.uuid4().hex, 0, next_id, self._floor(conn), {})
        for table, (key, columns) in _CHECKED.items():
            digest.tables[table] = [0, 0]
            for values in conn.execute(f"SELECT {columns} FROM {table}").fetchall():
                crc = _row_crc(table, values)
                conn.execute(f"UPDATE {table} SET crc = ? WHERE {key} = ?", (crc, values[0]))
                digest.add(table, crc)
        conn.execute("INSERT INTO meta (key, value) VALUES ('digest', ?)", (digest.encode(),))

    @staticmethod
    def _insert(conn: sqlite3.Connection, digest: _Digest, table: str,
                values: Sequence[Any]) -> None:
        crc = _row_crc(table, values)
        marks = ", ".join("?" * (len(values) + 1))
        conn.execute(f"INSERT INTO {table} ({_CHECKED[table][1]}, crc) VALUES ({marks})",
                     (*values, crc))
        digest.add(table, crc)

    @staticmethod
    def _delete(conn: sqlite3.Connection, digest: _Digest, table: str, where: str,
                args: tuple[Any, ...]) -> int | None:
        """Delete the rows ``where`` (taking them out of the digest); the key of the last."""
        key = _CHECKED[table][0]
        found = conn.execute(f"SELECT {key}, crc FROM {table} WHERE {where}", args).fetchall()
        for k, crc in found:
            conn.execute(f"DELETE FROM {table} WHERE {key} = ?", (k,))
            digest.add(table, crc, -1)
        return found[-1][0] if found else None

    @staticmethod
    def _next_seq(conn: sqlite3.Connection, table: str) -> int:
        seq: int = conn.execute(f"SELECT coalesce(max(seq), 0) + 1 FROM {table}").fetchone()[0]
        return seq

    # ------------------------------------------------------------ the commit mark

    def _read_mark(self) -> tuple[str, int] | None:
        """(log id, commits) from the mark file; None when there is none (or it holds
        nothing: ``commit_mark.unwritten``, as a power cut can leave it)."""
        try:
            with self.mark_path.open("rb") as f:
                data = f.read(128)
        except FileNotFoundError:
            return None
        if commit_mark.unwritten(data):
            return None
        return commit_mark.decode(
            data, mark=self.mark_path, log=self.path, unseen="a lost -wal",
            remedy="If the log and its -wal are intact, delete the mark file")

    def _raise_mark(self, digest: _Digest) -> None:
        """Record that ``digest.commits`` commits landed, unless the mark is already higher
        (another process committed later). Written after COMMIT, without fsync (see the
        module docstring). A failure only weakens detection, so it warns and goes on."""
        line = commit_mark.encode(digest.log_id, digest.commits)
        try:
            fd = os.open(self.mark_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)
                old = commit_mark.parse(os.pread(fd, 128, 0))
                if old is None or old[0] != digest.log_id or old[1] < digest.commits:
                    os.pwrite(fd, line, 0)
                    os.ftruncate(fd, len(line))
            finally:
                os.close(fd)  # releases the flock
        except OSError as exc:
            warnings.warn(
                f"could not update {self.mark_path} ({exc}): the commit landed, but a later "
                "loss of the -wal may go undetected; check that the directory is writable",
                RuntimeWarning,
                stacklevel=3,
            )

    # ------------------------------------------------------------ fencing internals

    @staticmethod
    def _floor(conn: sqlite3.Connection) -> int:
        floor: int = conn.execute("SELECT floor FROM fence").fetchone()[0]
        return floor

    def _admit_epoch(self, conn: sqlite3.Connection) -> None:
        """Inside a write transaction: refuse a stale or halted epoch, raise an older floor
        (and record the raise with the first entry id the new epoch governs)."""
        assert self.epoch_guard is not None
        if self.epoch_guard.admit(self._floor(conn)):
            epoch = self.epoch_guard.epoch
            digest = self._digest(conn)
            conn.execute("UPDATE fence SET floor = ?", (epoch,))
            self._delete(conn, digest, "fence_raises", "epoch = ?", (epoch,))
            self._insert(conn, digest, "fence_raises",
                         (epoch, digest.next_id, int(time.time() * 1000)))
            digest.floor = epoch
            conn.execute("UPDATE meta SET value = ? WHERE key = 'digest'", (digest.encode(),))

    @staticmethod
    def _has_epoch_history(conn: sqlite3.Connection) -> bool:
        columns = {row[1] for row in conn.execute("PRAGMA table_info(entries)")}
        return "epoch" in columns

    def _add_epoch_history(self, conn: sqlite3.Connection) -> None:
        """Bring a log made before epoch history existed up to date (idempotent)."""
        if not self._has_epoch_history(conn):
            conn.execute("ALTER TABLE entries ADD COLUMN epoch INTEGER")
        conn.execute(_FENCE_RAISES)

    # ------------------------------------------------------------ files and rows

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
                pass  # a racing creator won; the caller verifies what it made
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
        self._add_checksums(conn)

    def _write(
        self, conn: sqlite3.Connection, batch: Batch, rows: dict[str, list[tuple[Any, ...]]],
        epoch: int | None,
    ) -> _Digest:
        """Write ``batch`` with its row checksums and the updated digest; return the digest."""
        digest = self._digest(conn)
        for row in rows["conversations"]:
            self._insert(conn, digest, "conversations", row)
        for row in rows["entries"]:
            self._insert(conn, digest, "entries", (*row, epoch))
        for slot, row in zip(batch.slots, rows["slots"], strict=True):
            # An upsert keeps the slot's first-insertion place (seq), as MemoryStorage does.
            seq = self._delete(conn, digest, "slots", "conversation = ? AND call_id = ?",
                               (slot.conversation, slot.call_id))
            self._insert(conn, digest, "slots",
                         (self._next_seq(conn, "slots") if seq is None else seq, *row))
        for doc, row in zip(batch.docs, rows["docs"], strict=True):
            if doc.history == "latest":
                self._delete(conn, digest, "docs", "conversation = ? AND kind = ?",
                             (doc.conversation, doc.kind))
            self._insert(conn, digest, "docs", (self._next_seq(conn, "docs"), *row))
        for row in rows["requests"]:
            self._insert(conn, digest, "requests", (self._next_seq(conn, "requests"), *row))
        conn.execute("UPDATE meta SET value = ? WHERE key = 'next_id'", (batch.next_id,))
        digest.next_id = batch.next_id
        digest.commits += 1
        conn.execute("UPDATE meta SET value = ? WHERE key = 'digest'", (digest.encode(),))
        return digest

    def _read_snapshot(self, conn: sqlite3.Connection) -> Snapshot:
        rows = self._verified_rows(conn)
        return Snapshot(
            next_id=conn.execute("SELECT value FROM meta WHERE key = 'next_id'").fetchone()[0],
            conversations=[ConversationRecord(*row) for row in rows["conversations"]],
            entries=[
                EntryRecord(i, c, kind, json.loads(data), ms)
                for i, c, kind, data, ms, _epoch in rows["entries"]
            ],
            slots=[
                SlotRecord(c, call, entry, name, json.loads(args), replay, state, result, prog, ms)
                for _seq, c, call, entry, name, args, replay, state, result, prog, ms
                in rows["slots"]
            ],
            docs=[
                DocRecord(c, kind, version, revision, json.loads(value), at, history)
                for _seq, c, kind, version, revision, value, at, history in rows["docs"]
            ],
            requests=[RequestRecord(*row[1:]) for row in rows["requests"]],
        )
