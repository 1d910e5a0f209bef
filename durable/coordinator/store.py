"""The coordinator's store: sessions, Space leases and events, surviving any coordinator's
crash. One implementation of the rules over SQL, on two databases:

- SQLite (``SqliteStore``, the embedded default): one file, WAL, ``synchronous=FULL``;
  every write is one ``BEGIN IMMEDIATE`` transaction, so writers (several coordinators on
  one host, the CLI) are serialised and each reads the state it writes onto.
- PostgreSQL (``PostgresStore``): for coordinators on several machines sharing one
  database. Every write transaction first takes a transaction-level advisory lock of the
  store (``pg_advisory_xact_lock``), which serialises writers exactly as SQLite's write lock
  does; it is released by COMMIT or ROLLBACK, and by the server when a coordinator's
  connection dies. A ``?schema=NAME`` in the URL keeps a store in a schema of its own.

Why one lock and not row locks: every operation that matters (claiming a session, taking a
Space's lease, ending a session and releasing its lease) reads several rows and decides on
all of them; one lock makes each decision on a state no other writer changes meanwhile, on
both databases, with the same code. Coordinators write a few times a second; that is no
contention.

The rules (``conformance`` tests run them on both):

- ``claim``: a session is due when pending, in backoff past its retry time, or running
  under a claim that expired (its coordinator died). It is claimed only with its Space's
  lease: a session whose Space is leased to another live session stays pending, "held by
  session:<holder>". Claiming takes the next lease token the first time; a token that is no
  longer the Space's (it expired and another session took the Space) ends the session.
- ``save``: a compare-and-set on the claim: only the coordinator that holds it writes the
  session (``ClaimLost`` otherwise). Ending a session releases its lease in the same
  transaction, so the next session of the Space is due at once.
- leases: ``acquire``, ``renew``, ``release``; renew and release carry the token and refuse
  a superseded one (``LeaseSuperseded``); tokens only grow, per Space.
"""

from __future__ import annotations

import hashlib
import json
import os
import sqlite3
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Protocol, TypeVar
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from .records import (
    Claimed,
    ClaimLost,
    CoordinatorError,
    Event,
    Lease,
    LeaseHeld,
    LeaseSuperseded,
    SessionConflict,
    SessionRecord,
    SessionSpec,
    StoreUnavailable,
    UnknownSession,
)

SCHEMA_VERSION = 1
_T = TypeVar("_T")
_MAGIC = "durable.coordinator"


class CoordinatorStore(Protocol):
    """What a coordinator needs of its store (see the module docstring for the rules)."""

    url: str

    def submit(self, spec: SessionSpec, now: float) -> SessionRecord: ...
    def get(self, name: str) -> SessionRecord: ...
    def sessions(self) -> list[SessionRecord]: ...
    def events(self, session: str | None = None, after: int = 0) -> list[Event]: ...
    def claim(self, coordinator: str, now: float, claim_secs: float,
              lease_secs: float) -> Claimed | None: ...
    def save(self, record: SessionRecord, coordinator: str, now: float,
             events: Sequence[tuple[str, dict[str, Any]]] = ()) -> SessionRecord: ...
    def note(self, session: str, kind: str, data: dict[str, Any], now: float) -> None: ...
    def renew(self, coordinator: str, names: Sequence[str], now: float, claim_secs: float,
              lease_secs: float) -> dict[str, SessionRecord]: ...
    def release_claims(self, coordinator: str, now: float) -> list[str]: ...
    def cancel(self, name: str, now: float) -> SessionRecord: ...
    def acquire_lease(self, space: str, session: str, now: float,
                      lease_secs: float) -> Lease: ...
    def renew_lease(self, space: str, token: int, now: float, lease_secs: float) -> Lease: ...
    def release_lease(self, space: str, token: int, now: float) -> None: ...
    def lease(self, space: str) -> Lease | None: ...
    def while_quiet(self, action: Callable[[], _T],
                    undo: Callable[[_T], None]) -> _T | None: ...
    def close(self) -> None: ...


class _Tx:
    """One write transaction's statements, in the store's parameter style."""

    def __init__(self, store: SqlStore, cur: Any) -> None:
        self.store, self.cur = store, cur

    def q(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        self.cur.execute(self.store.sql(sql), tuple(params))
        return list(self.cur.fetchall()) if self.cur.description else []

    # ---------------------------------------------------------------- rows

    def record(self, name: str) -> SessionRecord | None:
        rows = self.q("SELECT doc FROM coord_sessions WHERE name = ?", (name,))
        return SessionRecord.decode(rows[0][0]) if rows else None

    def put(self, rec: SessionRecord) -> None:
        self.q("UPDATE coord_sessions SET state = ?, doc = ? WHERE name = ?",
               (rec.state, rec.encode(), rec.name))

    def event(self, session: str, kind: str, data: dict[str, Any], now: float) -> None:
        self.q("INSERT INTO coord_events (session, at, kind, data) VALUES (?, ?, ?, ?)",
               (session, now, kind, json.dumps(data, sort_keys=True)))

    def lease(self, space: str) -> Lease | None:
        rows = self.q("SELECT token, session, expires_at FROM coord_leases WHERE space = ?",
                      (space,))
        return Lease(space, int(rows[0][0]), rows[0][1], float(rows[0][2])) if rows else None

    def put_lease(self, lease: Lease, new: bool) -> None:
        if new:
            self.q("INSERT INTO coord_leases (space, token, session, expires_at) "
                   "VALUES (?, ?, ?, ?)", (lease.space, lease.token, lease.session,
                                           lease.expires_at))
        else:
            self.q("UPDATE coord_leases SET token = ?, session = ?, expires_at = ? "
                   "WHERE space = ?", (lease.token, lease.session, lease.expires_at,
                                       lease.space))

    # ---------------------------------------------------------------- lease rules

    def acquire(self, space: str, session: str, now: float, lease_secs: float) -> Lease:
        cur = self.lease(space)
        if cur is not None and cur.live(now) and cur.session != session:
            raise LeaseHeld(f"Space {space} is leased to session:{cur.session} (token "
                            f"{cur.token}) until it ends", holder=str(cur.session))
        if cur is not None and cur.live(now):  # already this session's: renewed
            lease = Lease(space, cur.token, session, now + lease_secs)
        else:
            lease = Lease(space, (cur.token if cur else 0) + 1, session, now + lease_secs)
        self.put_lease(lease, new=cur is None)
        return lease

    def current(self, space: str, token: int) -> Lease:
        cur = self.lease(space)
        if cur is None or cur.token != token or cur.session is None:
            newest = "none" if cur is None else (
                f"token {cur.token}, " + (f"session:{cur.session}" if cur.session
                                          else "released"))
            raise LeaseSuperseded(f"lease token {token} of Space {space} is superseded "
                                  f"(the Space's lease now: {newest}); its holder must stop")
        return cur

    def release(self, space: str, token: int) -> Lease:
        cur = self.current(space, token)
        lease = Lease(space, cur.token, None, cur.expires_at)
        self.put_lease(lease, new=False)
        return lease


class SqlStore:
    """The rules over a DB-API connection; subclasses say how to connect and to lock."""

    url: str
    placeholder = "?"
    autoincrement = "INTEGER PRIMARY KEY AUTOINCREMENT"
    real = "REAL"

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._conn: Any = None
        #: The connection was lost: the next operation connects again.
        self._lost = False

    # ------------------------------------------------------------ dialect hooks

    def _begin_write(self, cur: Any) -> None:
        raise NotImplementedError

    def _others_waiting(self, tx: _Tx) -> bool:
        """Inside a write transaction: whether another connection waits for the lock in a
        way that takes it once this one ends, whatever its client does meanwhile."""
        return False

    def _connection_lost(self, exc: BaseException) -> bool:
        """Whether ``exc`` means the connection to the database is gone (not a rule's
        refusal): SQLite's file never goes away."""
        return False

    def _reconnect(self) -> None:
        raise NotImplementedError

    def sql(self, text: str) -> str:
        return text if self.placeholder == "?" else text.replace("?", self.placeholder)

    @contextmanager
    def _write(self) -> Iterator[_Tx]:
        """One write transaction. A lost connection raises ``StoreUnavailable`` and the next
        transaction connects again. The transaction may or may not have committed; trying
        it again is safe but not free: a claim that committed leaves its session claimed
        and undriven until the claim lapses, a save records its events twice."""
        with self._lock:
            if self._lost:
                self._reconnect()
                self._lost = False
            try:
                cur = self._conn.cursor()
                self._begin_write(cur)
            except Exception as exc:
                self._lose(exc)
                raise
            try:
                yield _Tx(self, cur)
            except BaseException as exc:
                try:
                    cur.execute("ROLLBACK")
                except Exception:  # noqa: BLE001 - a dead connection: the first error tells
                    pass
                self._lose(exc)
                raise
            else:
                try:
                    cur.execute("COMMIT")
                except Exception as exc:
                    self._lose(exc)
                    raise
            finally:
                cur.close()

    def _lose(self, exc: BaseException) -> None:
        """Turn a lost connection into ``StoreUnavailable`` (other errors pass through)."""
        if not self._connection_lost(exc):
            return
        self._lost = True
        try:
            self._conn.close()
        except Exception:  # noqa: BLE001 - closing what is already gone
            pass
        raise StoreUnavailable(f"the store {self.url} is unreachable "
                               f"({type(exc).__name__}: {str(exc).strip()})") from exc

    def _read(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        with self._write() as tx:  # a read under the lock sees one committed state
            return tx.q(sql, params)

    def _check_schema(self) -> None:
        """An existing store's marks: its magic and a schema this code reads."""
        with self._write() as tx:
            self._marks(tx)

    def _marks(self, tx: _Tx) -> None:
        rows = tx.q("SELECT value FROM coord_meta WHERE key = 'magic'")
        if not rows or rows[0][0] != _MAGIC:
            raise CoordinatorError(f"{self.url} holds tables of something else; point "
                                   "--store at a coordinator store or a new one")
        version = int(tx.q("SELECT value FROM coord_meta WHERE key = 'schema'")[0][0])
        if version > SCHEMA_VERSION:
            raise CoordinatorError(f"{self.url} was written by a newer coordinator "
                                   f"(schema {version} > {SCHEMA_VERSION}); upgrade this one")

    def _create_schema(self) -> None:
        with self._write() as tx:
            tx.q("CREATE TABLE IF NOT EXISTS coord_meta (key TEXT PRIMARY KEY, value TEXT)")
            tx.q("CREATE TABLE IF NOT EXISTS coord_sessions (name TEXT PRIMARY KEY, "
                 f"state TEXT NOT NULL, doc TEXT NOT NULL, created {self.real} NOT NULL)")
            tx.q("CREATE TABLE IF NOT EXISTS coord_leases (space TEXT PRIMARY KEY, "
                 f"token BIGINT NOT NULL, session TEXT, expires_at {self.real} NOT NULL)")
            tx.q(f"CREATE TABLE IF NOT EXISTS coord_events (seq {self.autoincrement}, "
                 f"session TEXT NOT NULL, at {self.real} NOT NULL, kind TEXT NOT NULL, "
                 "data TEXT NOT NULL)")
            if not tx.q("SELECT value FROM coord_meta WHERE key = 'magic'"):
                tx.q("INSERT INTO coord_meta (key, value) VALUES ('magic', ?)", (_MAGIC,))
                tx.q("INSERT INTO coord_meta (key, value) VALUES ('schema', ?)",
                     (str(SCHEMA_VERSION),))
            self._marks(tx)

    def while_quiet(self, action: Callable[[], _T], undo: Callable[[_T], None]) -> _T | None:
        """``action()``, run while no coordinator is inside a write transaction of this
        store (it holds the store's write lock). If, once it ran, another connection waits
        for the lock such that it would hold it next whatever its process does (PostgreSQL:
        its server takes the lock for it), ``undo(result)`` and None: try again. For a
        nemesis that freezes a coordinator (SIGSTOP): frozen inside a transaction, or queued
        for one, it would hold every other coordinator up for as long as it stays frozen."""
        with self._write() as tx:
            result = action()
            if self._others_waiting(tx):
                undo(result)
                return None
            return result

    def close(self) -> None:
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None

    # ------------------------------------------------------------ sessions

    def submit(self, spec: SessionSpec, now: float) -> SessionRecord:
        with self._write() as tx:
            existing = tx.record(spec.name)
            if existing is not None:
                if existing.spec != spec:
                    raise SessionConflict(f"session {spec.name!r} exists with another spec "
                                          "(submitting is idempotent for the same spec "
                                          "only); pick another name")
                return existing
            rec = SessionRecord(spec, created_at=now, updated_at=now)
            tx.q("INSERT INTO coord_sessions (name, state, doc, created) VALUES (?, ?, ?, ?)",
                 (spec.name, rec.state, rec.encode(), now))
            tx.event(spec.name, "submitted", {"space": spec.space}, now)
            return rec

    def get(self, name: str) -> SessionRecord:
        rows = self._read("SELECT doc FROM coord_sessions WHERE name = ?", (name,))
        if not rows:
            raise UnknownSession(f"no session {name!r} in {self.url}; `python -m "
                                 "durable.coordinator sessions` lists them")
        return SessionRecord.decode(rows[0][0])

    def sessions(self) -> list[SessionRecord]:
        rows = self._read("SELECT doc FROM coord_sessions ORDER BY created, name")
        return [SessionRecord.decode(r[0]) for r in rows]

    def events(self, session: str | None = None, after: int = 0) -> list[Event]:
        if session is None:
            rows = self._read("SELECT seq, session, at, kind, data FROM coord_events "
                              "WHERE seq > ? ORDER BY seq", (after,))
        else:
            rows = self._read("SELECT seq, session, at, kind, data FROM coord_events "
                              "WHERE session = ? AND seq > ? ORDER BY seq", (session, after))
        return [Event(int(r[0]), r[1], float(r[2]), r[3], json.loads(r[4])) for r in rows]

    def note(self, session: str, kind: str, data: dict[str, Any], now: float) -> None:
        with self._write() as tx:
            tx.event(session, kind, data, now)

    def claim(self, coordinator: str, now: float, claim_secs: float,
              lease_secs: float) -> Claimed | None:
        with self._write() as tx:
            rows = tx.q("SELECT doc FROM coord_sessions WHERE state NOT IN ('done', 'failed') "
                        "ORDER BY created, name")
            for (doc,) in rows:
                rec = SessionRecord.decode(doc)
                got = self._claim_one(tx, rec, coordinator, now, claim_secs, lease_secs)
                if got is not None:
                    return got
        return None

    def _claim_one(self, tx: _Tx, rec: SessionRecord, coordinator: str, now: float,
                   claim_secs: float, lease_secs: float) -> Claimed | None:
        claimed_live = rec.state == "running" and rec.owner is not None and \
            (rec.claim_until or 0) > now
        if rec.cancel_requested and not claimed_live:
            self._end(tx, rec, "failed", "cancelled", now)
            tx.event(rec.name, "cancelled", {}, now)
            return None
        due = (rec.state == "pending" or
               (rec.state == "backoff" and (rec.next_retry or 0) <= now) or
               (rec.state == "running" and not claimed_live))
        if not due:
            return None
        space = rec.spec.space
        if rec.lease_token is None:
            try:
                lease = tx.acquire(space, rec.name, now, lease_secs)
            except LeaseHeld as exc:
                reason = f"held by session:{exc.holder}"
                if rec.reason != reason:
                    tx.put(rec.evolve(reason=reason, updated_at=now))
                    tx.event(rec.name, "held", {"space": space, "holder": exc.holder}, now)
                return None
            rec = rec.evolve(lease_token=lease.token)
            tx.event(rec.name, "lease_acquired", {"space": space, "token": lease.token}, now)
        else:
            try:
                cur = tx.current(space, rec.lease_token)
            except LeaseSuperseded as exc:
                self._end(tx, rec, "failed", f"lease lost: {exc}", now)
                tx.event(rec.name, "lease_lost", {"space": space, "token": rec.lease_token},
                         now)
                return None
            tx.put_lease(Lease(space, cur.token, rec.name, now + lease_secs), new=False)
        orphan = None
        if rec.state == "running" and rec.driver_pid is not None:
            orphan = (rec.driver_pid, rec.driver_started or 0.0, rec.driver_host or "")
        before, previous = rec.state, rec.owner
        rec = rec.evolve(state="running", owner=coordinator, claim_until=now + claim_secs,
                         claim=rec.claim + 1, reason=f"claimed by {coordinator}",
                         updated_at=now)
        tx.put(rec)
        tx.event(rec.name, "claimed", {"coordinator": coordinator, "from_state": before,
                                       "from_owner": previous if before == "running" else None},
                 now)
        return Claimed(rec, orphan)

    def _end(self, tx: _Tx, rec: SessionRecord, state: str, reason: str, now: float) -> None:
        """End ``rec`` (``done``/``failed``) and release its lease in the same transaction."""
        if rec.lease_token is not None:
            try:
                tx.release(rec.spec.space, rec.lease_token)
                tx.event(rec.name, "lease_released", {"space": rec.spec.space,
                                                      "token": rec.lease_token}, now)
            except LeaseSuperseded:
                pass  # superseded already: nothing of ours to release
        tx.put(rec.evolve(state=state, reason=reason, owner=None, claim_until=None,
                          driver_pid=None, driver_started=None, driver_host=None,
                          next_retry=None, updated_at=now))

    def save(self, record: SessionRecord, coordinator: str, now: float,
             events: Sequence[tuple[str, dict[str, Any]]] = ()) -> SessionRecord:
        with self._write() as tx:
            cur = tx.record(record.name)
            if cur is None:
                raise UnknownSession(f"no session {record.name!r} in {self.url}")
            if cur.state != "running" or cur.owner != coordinator or cur.claim != record.claim:
                raise ClaimLost(f"session {record.name!r} is no longer claimed by "
                                f"{coordinator} under the claim its drive started with "
                                f"(state {cur.state}, owner {cur.owner}, claim {cur.claim}; "
                                f"the drive's: {record.claim}); stop driving it")
            # The claim's time is the renewals' (``renew``), never the drive's copy, which
            # is as old as the drive: written back, it would let the claim lapse early.
            record = record.evolve(cancel_requested=cur.cancel_requested, updated_at=now,
                                   claim_until=cur.claim_until if record.state == "running"
                                   else record.claim_until)
            for kind, data in events:
                tx.event(record.name, kind, data, now)
            if record.state in ("done", "failed"):
                self._end(tx, record, record.state, record.reason, now)
            else:
                tx.put(record)
            out = tx.record(record.name)
            assert out is not None
            return out

    def renew(self, coordinator: str, names: Sequence[str], now: float, claim_secs: float,
              lease_secs: float) -> dict[str, SessionRecord]:
        out: dict[str, SessionRecord] = {}
        with self._write() as tx:
            for name in names:
                rec = tx.record(name)
                if rec is None or rec.state != "running" or rec.owner != coordinator:
                    continue
                rec = rec.evolve(claim_until=now + claim_secs)
                tx.put(rec)
                if rec.lease_token is not None:
                    lease = tx.lease(rec.spec.space)
                    if lease and lease.token == rec.lease_token and lease.session == name:
                        tx.put_lease(Lease(lease.space, lease.token, name, now + lease_secs),
                                     new=False)
                out[name] = rec
        return out

    def release_claims(self, coordinator: str, now: float) -> list[str]:
        released = []
        with self._write() as tx:
            for (doc,) in tx.q("SELECT doc FROM coord_sessions WHERE state = 'running'"):
                rec = SessionRecord.decode(doc)
                if rec.owner != coordinator:
                    continue
                tx.put(rec.evolve(owner=None, claim_until=None, updated_at=now,
                                  reason=f"coordinator {coordinator} restarted"))
                tx.event(rec.name, "released", {"coordinator": coordinator}, now)
                released.append(rec.name)
        return released

    def cancel(self, name: str, now: float) -> SessionRecord:
        with self._write() as tx:
            rec = tx.record(name)
            if rec is None:
                raise UnknownSession(f"no session {name!r} in {self.url}")
            if rec.ended:
                return rec
            if rec.state == "running" and rec.owner is not None and \
                    (rec.claim_until or 0) > now:
                tx.put(rec.evolve(cancel_requested=True, updated_at=now))
                tx.event(name, "cancel_requested", {"coordinator": rec.owner}, now)
            else:
                self._end(tx, rec, "failed", "cancelled", now)
                tx.event(name, "cancelled", {}, now)
            out = tx.record(name)
            assert out is not None
            return out

    # ------------------------------------------------------------ leases

    def acquire_lease(self, space: str, session: str, now: float, lease_secs: float) -> Lease:
        with self._write() as tx:
            return tx.acquire(space, session, now, lease_secs)

    def renew_lease(self, space: str, token: int, now: float, lease_secs: float) -> Lease:
        with self._write() as tx:
            cur = tx.current(space, token)
            lease = Lease(space, token, cur.session, now + lease_secs)
            tx.put_lease(lease, new=False)
            return lease

    def release_lease(self, space: str, token: int, now: float) -> None:
        with self._write() as tx:
            tx.release(space, token)

    def lease(self, space: str) -> Lease | None:
        with self._write() as tx:
            return tx.lease(space)


class SqliteStore(SqlStore):
    """The store in one SQLite file.

    A new store is made only where no file is (``create``; with its parent directories),
    whole: built beside the path, mode 0600 (sessions keep their ``--env`` values), then
    linked into place. So a file at the path that is empty, not SQLite, fails SQLite's
    ``quick_check`` or lacks the store's tables was truncated, damaged or is someone else's:
    it is refused, never initialised over (its pending sessions would be forgotten).
    """

    def __init__(self, path: str | Path, *, create: bool = True) -> None:
        super().__init__()
        self.path = Path(path)
        self.url = f"sqlite:///{self.path}"
        if not self.path.exists() and not self.path.is_symlink():
            if not create:
                raise CoordinatorError(f"no coordinator store at {self.path}: submit a "
                                       "session first (it creates the store), or fix --store")
            self._create_file()
        elif not self.path.is_file():
            raise CoordinatorError(f"--store {self.path} exists and is not a file; point it at "
                                   "a coordinator store file or a new path")
        self._check_file()
        try:
            self._conn = self._connect(self.path)
            self._check_schema()
        except sqlite3.DatabaseError as exc:
            self.close()
            raise CoordinatorError(f"--store {self.path} is not a coordinator store or is "
                                   f"damaged ({exc}); restore it from a copy, or point "
                                   "--store at a new path") from None

    @staticmethod
    def _connect(path: Path) -> sqlite3.Connection:
        conn = sqlite3.connect(path, isolation_level=None, timeout=30.0,
                               check_same_thread=False)
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=FULL")
        return conn

    def _create_file(self) -> None:
        """A new store at ``self.path``, whole or not at all; a store another process made
        there meanwhile is kept."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(f".{self.path.name}.new-{os.getpid()}-{threading.get_ident()}")
        for leftover in (tmp, Path(f"{tmp}-wal"), Path(f"{tmp}-shm")):
            leftover.unlink(missing_ok=True)
        try:
            os.close(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
            self._conn = self._connect(tmp)
            self._create_schema()
            self._conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            self._conn.execute("PRAGMA journal_mode=DELETE")  # whole in one file to link
            self.close()
            os.fsync(fd := os.open(tmp, os.O_RDONLY))
            os.close(fd)
            try:
                os.link(tmp, self.path)
            except FileExistsError:
                pass  # another process made the store first: use theirs
            except OSError:  # a filesystem without hard links: a rename, checked first
                if not self.path.exists():
                    os.rename(tmp, self.path)
            dir_fd = os.open(self.path.parent, os.O_RDONLY | os.O_DIRECTORY)
            try:
                os.fsync(dir_fd)
            finally:
                os.close(dir_fd)
        except sqlite3.DatabaseError as exc:
            self.close()
            raise CoordinatorError(f"could not create a store at {self.path} ({exc})") from None
        finally:
            for leftover in (tmp, Path(f"{tmp}-wal"), Path(f"{tmp}-shm")):
                leftover.unlink(missing_ok=True)

    def _check_file(self) -> None:
        size = self.path.stat().st_size
        if size == 0:
            raise CoordinatorError(
                f"--store {self.path} is empty (0 bytes). A store is created whole, so this "
                "one was truncated and its sessions are lost from it: restore it from a copy, "
                "or delete the file to start a new store there; it was not modified")
        with self.path.open("rb") as f:
            if f.read(16) != b"SQLite format 3\x00":
                raise CoordinatorError(f"--store {self.path} is not a coordinator store (not a "
                                       "SQLite file); point it at one or at a new path; it was "
                                       "not modified")
        ro = sqlite3.connect(f"{self.path.resolve().as_uri()}?mode=ro", uri=True, timeout=30.0)
        try:
            bad = [r[0] for r in ro.execute("PRAGMA quick_check(5)")]
            has = ro.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND "
                             "name = 'coord_meta'").fetchall()
        except sqlite3.DatabaseError as exc:
            bad, has = [str(exc)], [(1,)]
        finally:
            ro.close()
        if bad != ["ok"]:
            raise CoordinatorError(
                f"--store {self.path} is damaged ({'; '.join(bad)}): restore it from a copy, "
                "or delete it (and its -wal) to start a new store; it was not modified")
        if not has:
            raise CoordinatorError(f"--store {self.path} is not a coordinator store (a SQLite "
                                   "file without its tables); point --store at one or at a "
                                   "new path; it was not modified")

    def _begin_write(self, cur: Any) -> None:
        cur.execute("BEGIN IMMEDIATE")

    def _reconnect(self) -> None:
        self._conn = self._connect(self.path)


class PostgresStore(SqlStore):
    """The store in a PostgreSQL database (``postgresql://user:password@host:port/db``,
    optionally ``?schema=NAME``), through psycopg 3 (the ``postgres`` extra)."""

    placeholder = "%s"
    autoincrement = "BIGSERIAL PRIMARY KEY"
    real = "DOUBLE PRECISION"

    def __init__(self, url: str, *, create: bool = True) -> None:
        super().__init__()
        try:
            import psycopg
        except ImportError:
            raise CoordinatorError("a PostgreSQL store needs psycopg: pip install -e "
                                   "'.[postgres]'") from None
        parts = urlsplit(url)
        query = dict(parse_qsl(parts.query))
        self.schema = query.pop("schema", "public")
        if not self.schema.replace("_", "").isalnum() or not self.schema[0].isalpha() or \
                not self.schema.isascii():
            raise CoordinatorError(f"schema must be letters, digits and _ starting with a "
                                   f"letter, got {self.schema!r}")
        if len(self.schema) > 63:
            # PostgreSQL cuts names at 63 bytes: two longer names would share tables while
            # taking different locks.
            raise CoordinatorError(f"schema is at most 63 characters (PostgreSQL cuts longer "
                                   f"names), got {len(self.schema)}")
        if self.schema.lower().startswith("pg_") or self.schema.lower() == "information_schema":
            raise CoordinatorError(f"schema {self.schema!r} is PostgreSQL's own; pick a name "
                                   "of the store's")
        dsn = urlunsplit(parts._replace(query=urlencode(query)))
        host = f"{parts.hostname or ''}{f':{parts.port}' if parts.port else ''}"
        # shown in messages and status: no user, no password
        self.url = urlunsplit(parts._replace(netloc=host, query=f"schema={self.schema}"))
        self._key = int.from_bytes(hashlib.sha256(f"{_MAGIC}:{self.schema}".encode())
                                   .digest()[:8], "big", signed=True)
        self._dsn = dsn
        try:
            self._conn = self._connect()
            if create:
                self._conn.execute("SELECT pg_advisory_lock(%s)", (self._key,))
                try:
                    self._conn.execute(f'CREATE SCHEMA IF NOT EXISTS "{self.schema}"')
                finally:
                    self._conn.execute("SELECT pg_advisory_unlock(%s)", (self._key,))
                self._create_schema()
            else:
                self._check_schema()
        except psycopg.errors.UndefinedTable:
            self.close()
            raise CoordinatorError(f"no coordinator store at {self.url}: submit a session "
                                   "first (it creates the store), or fix --store") from None
        except psycopg.Error as exc:
            self.close()
            raise CoordinatorError(f"--store {self.url}: {type(exc).__name__}: "
                                   f"{str(exc).strip()}") from None

    def _connect(self) -> Any:
        import psycopg

        # A cut link must fail an operation within seconds, not the kernel's 15 minutes of
        # retransmissions: keepalives, a TCP user timeout and a statement timeout, each
        # well below a claim (15 s by default).
        conn = psycopg.connect(self._dsn, autocommit=True, connect_timeout=5,
                               application_name=f"durable.coordinator:{self.schema}",
                               keepalives=1, keepalives_idle=2, keepalives_interval=1,
                               keepalives_count=3, tcp_user_timeout=5000,
                               options="-c statement_timeout=5000")
        conn.execute(f'SET search_path TO "{self.schema}"')
        return conn

    def _connection_lost(self, exc: BaseException) -> bool:
        import psycopg

        return isinstance(exc, psycopg.OperationalError | psycopg.InterfaceError) or \
            bool(self._conn is not None and self._conn.broken)

    def _reconnect(self) -> None:
        import psycopg

        try:
            self._conn = self._connect()
        except psycopg.Error as exc:
            raise StoreUnavailable(f"the store {self.url} is unreachable "
                                   f"({type(exc).__name__}: {str(exc).strip()})") from None

    def _begin_write(self, cur: Any) -> None:
        cur.execute("BEGIN")
        cur.execute("SELECT pg_advisory_xact_lock(%s)", (self._key,))

    def _others_waiting(self, tx: _Tx) -> bool:
        # A waiting backend is granted the lock when this transaction ends, even with its
        # client stopped (any advisory lock of the server: over-cautious, never wrong).
        rows = tx.q("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted")
        return bool(rows[0][0])

    def drop(self) -> None:
        """Remove the store's schema and everything in it, and close (a campaign run's store
        once its record holds what the coordinator did)."""
        with self._lock:
            self._conn.execute(f'DROP SCHEMA IF EXISTS "{self.schema}" CASCADE')
        self.close()


def open_store(url: str, *, create: bool = True) -> CoordinatorStore:
    """The store ``url`` names: ``postgresql://...`` (or ``postgres://``), ``sqlite:///PATH``
    or a plain path (SQLite). ``create``: make the store when there is none (else refuse)."""
    if url.startswith(("postgresql://", "postgres://")):
        return PostgresStore(url, create=create)
    if url.startswith("sqlite:///"):
        return SqliteStore(url[len("sqlite:///"):] or "coordinator.sqlite", create=create)
    if "://" in url:
        raise CoordinatorError(f"--store {url!r}: use postgresql://..., sqlite:///PATH or a "
                               "file path")
    return SqliteStore(url, create=create)
