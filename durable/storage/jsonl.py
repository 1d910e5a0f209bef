"""``JsonlStorage``: the log as an append-only file of JSON lines, one per committed batch.

Why a second persistent storage: a log you can read with ``less`` and ``grep``, copy with
``cp``, and that a crash can damage in exactly one place, the end.

The directory holds:

- ``log.jsonl``: a header line naming the format and schema (written once, atomically, by
  rename), then one line per batch: ``<crc32 of the payload, 8 hex digits> <payload>\\n``,
  the payload being ``Batch.to_json()`` in the one stored JSON encoding.
- ``log.lock``: the commit lock (``fcntl.flock``, exclusive). Its content is the commit
  high-water mark: ``<bytes committed> <lines committed> <crc32>``, rewritten in place after
  each append.
- ``epoch-NNNNNNNN``: epoch markers of ``durable.storage_fences.FencedFileSystem``, each
  holding ``{"first": <first entry id that epoch governs>, "raised_ms": <unix ms>}``.

A fenced writer's lines carry its epoch (``"epoch"`` beside the batch), so
``epoch_history()`` gives an auditor what ``SqliteStorage.epoch_history`` gives: each raise
of the floor with the first entry it governs, and each entry's writer. A marker left empty
by a crash between its creation and its write (or holding only NUL bytes: a power cut's
leftover of a write that did not reach the disk) raised the floor (the fence holds) but
records no raise; lines of an unfenced writer, or older ones, carry no epoch (None).

Any other name in the directory, or a ``log.jsonl`` without the header, raises ``NotALog``
and nothing is changed.

Atomicity: a batch is one line appended with a single ``write`` under the lock, then
``fdatasync`` (with ``fsync=True``) before ``commit`` returns. A crash mid-write can only
leave a torn *final* line: whoever next holds the lock (an open, a load, a commit) truncates
it away and syncs. Everything else that does not decode is damage, reported as ``CorruptLog``
naming the file and line, with nothing changed: a bad line with lines after it, and a bad
final line that is complete (it ends in a newline, or is a valid record whose newline was
damaged) or lies below the high-water mark. One exception: a complete final line holding a
run of NUL bytes past the mark is what a filesystem leaves of an unsynced append after a power
cut, so it is torn too.

Damage detection and its limits. Each line carries a CRC-32 of its payload. The high-water
mark in ``log.lock`` is written after the append (and its sync) but not synced itself: after
a process crash it is exact, so a log cut back to a line boundary (lines lost without a torn
trace) and a deleted ``log.jsonl`` are detected; after a power cut it may lag behind or hold
nothing (empty or NUL bytes: read as no mark), which only weakens detection. With
``fsync=False`` a power cut can leave the mark ahead of the log: the open then reports the
lost commits (they were lost). An empty ``log.lock`` (logs made
before the mark existed) checks nothing. A ``log.lock`` whose mark is damaged is reported;
emptying it accepts the log as it is. Other files (the header, epoch markers) are checked by
their own readers; a damaged header is ``CorruptLog`` when ``log.lock`` holds a mark (else
the file is refused as ``NotALog``, not durable's).

Several processes: every commit takes the lock, first reads the lines other processes
appended since its last read, then validates against that up-to-date state, so a writer
built on a stale view is refused with ``LogConflict`` instead of corrupting the log.

The replayed log lives in a ``MemoryStorage``: it is the reference semantics, so replaying a
line and validating a commit apply exactly its rules (``validate_batch``, slot upsert,
document retention). A commit is applied there first (which validates it and changes nothing
when refused), then appended; if the append fails the in-memory state is ahead of the file,
so the storage closes itself with ``StorageUncertain``.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import stat
import threading
import warnings
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from ..atomic_file import fsync_dir
from ..errors import CorruptLog, NotALog, StorageClosed, StorageError, StorageUncertain
from ..failpoints import failpoint
from ..fence_contract import Fence
from . import commit_mark
from .base import MemoryStorage, rebased
from .epochs import EpochHistory
from .log_path import stat_existing
from .records import Batch, DocRecord, Snapshot, encode_json

LOG_NAME = "log.jsonl"
LOCK_NAME = "log.lock"
_TMP_NAME = "log.jsonl.tmp"
FORMAT = "durable-log/jsonl"
SCHEMA_VERSION = 1
HEADER = (encode_json({"format": FORMAT, "schema": SCHEMA_VERSION}) + "\n").encode()
#: Names of the epoch marker files a ``FencedFileSystem`` keeps beside the log.
EPOCH_MARKER = re.compile(r"epoch-(\d+)")

_datasync = getattr(os, "fdatasync", os.fsync)
#: A run of NULs in a line: unwritten blocks of an unsynced append, never in a record.
_ZEROS = b"\0" * 8


def epoch_marker_name(epoch: int) -> str:
    return f"epoch-{epoch:08d}"


def _encode(batch: Batch, epoch: int | None) -> tuple[bytes, Batch]:
    """The line for ``batch`` committed by a writer of ``epoch`` (None: unfenced), and the
    batch exactly as a reader will decode it later (so the in-memory state after a commit
    equals the state after a reopen)."""
    record = batch.to_json()
    if epoch is not None:
        record["epoch"] = epoch
    try:
        payload = encode_json(record)
    except (TypeError, ValueError) as exc:
        raise StorageError(
            f"the batch holds a value that cannot be stored as JSON ({exc}); store only "
            "JSON values (dict, list, str, int, float, bool, None)"
        ) from exc
    raw = payload.encode()
    line = b"%08x %s\n" % (zlib.crc32(raw), raw)
    return line, Batch.from_json(json.loads(payload))


def _decode(line: bytes) -> tuple[Batch, int | None] | None:
    """The batch of one line (without its newline) and its writer's epoch (None: unfenced),
    or ``None`` when it is not a valid record."""
    checksum, sep, raw = line.partition(b" ")
    if sep != b" " or len(checksum) != 8:
        return None
    try:
        if int(checksum, 16) != zlib.crc32(raw):
            return None
        record = json.loads(raw)
        epoch = record.get("epoch")
        if epoch is not None and (isinstance(epoch, bool) or not isinstance(epoch, int)):
            return None
        return Batch.from_json(record), epoch
    except (ValueError, TypeError, KeyError, AttributeError):
        return None


def read_marker(path: Path) -> tuple[int, int] | None:
    """(first entry id governed, unix ms raised) of an epoch marker; None when it holds
    nothing (``commit_mark.unwritten``: a crash between its creation and its write, or a
    power cut that lost the write). ``CorruptLog`` when it holds anything else: an audit must
    not trust a damaged record."""
    data = path.read_bytes()
    if commit_mark.unwritten(data):
        return None
    try:
        raw = json.loads(data)
        first, raised_ms = raw["first"], raw["raised_ms"]
        if all(isinstance(v, int) and not isinstance(v, bool) and v >= 0
               for v in (first, raised_ms)):
            return first, raised_ms
    except (ValueError, TypeError, KeyError):
        pass
    raise CorruptLog(f"the epoch marker {path} holds {data[:80]!r}, not the first entry its "
                     "epoch governs: it was edited or the disk is failing; restore it from a "
                     "copy (the floor it raises holds either way)")


def _not_a_log(directory: Path, why: str) -> NotALog:
    return NotALog(
        f"{directory} is not a durable JSONL log ({why}). Point JsonlStorage at a directory "
        "of its own (new, or created by durable); nothing was changed"
    )


def _check_file(path: Path) -> bool:
    """Tell whether ``path`` exists, refusing what must not be opened: a dangling symlink
    (``StorageError``), anything but a regular file (``NotALog``: a FIFO would block)."""
    st = stat_existing(path)
    if st is None:
        return False
    if not stat.S_ISREG(st.st_mode):
        raise _not_a_log(path.parent, f"{path.name} is not a regular file (a FIFO, socket, "
                                      "device or directory)")
    return True


def _check_header(directory: Path) -> bool:
    """Raise ``NotALog`` unless ``log.jsonl`` starts with our header (``CorruptLog`` when it
    is empty: a log is created atomically, never empty); False when it is missing."""
    path = directory / LOG_NAME
    if not _check_file(path):
        return False
    with path.open("rb") as f:
        first = f.readline(4096)
    if not first:
        raise CorruptLog(
            f"{path} is empty (0 bytes). durable creates a log atomically with its header, so "
            f"it was truncated: restore it from a copy, or delete it and {LOCK_NAME} to start a "
            "new log there; nothing was changed"
        )
    if first == HEADER:
        return True
    try:
        header = json.loads(first)
    except ValueError:
        header = None
    if isinstance(header, dict) and header.get("format") == FORMAT:
        raise _not_a_log(
            directory,
            f"{LOG_NAME} has schema {header.get('schema')!r} but this code reads schema "
            f"{SCHEMA_VERSION}; upgrade durable to read it",
        )
    lock = directory / LOCK_NAME
    if _check_file(lock) and lock.stat().st_size:  # a commit mark: durable wrote this log
        raise CorruptLog(
            f"{path} does not start with the durable log header, but {LOCK_NAME} records "
            "commits made to it: the header was damaged (the disk is failing, or the file was "
            "edited). Restore it from a copy; nothing was changed"
        )
    raise _not_a_log(directory, f"{LOG_NAME} does not start with the durable log header")


def _check_directory(directory: Path) -> None:
    """Create ``directory`` if missing; refuse a file, or a directory holding foreign names."""
    if directory.is_symlink() and not directory.exists():
        raise StorageError(
            f"{directory} is a symlink to {os.readlink(directory)}, which does not exist; "
            "restore what it points to, or remove the link"
        )
    if directory.exists() and not directory.is_dir():
        raise _not_a_log(directory, "it is a file, not a directory")
    try:
        directory.mkdir(parents=True, exist_ok=True)
        read_only = os.statvfs(directory).f_flag & os.ST_RDONLY
    except OSError as exc:
        raise StorageError(f"could not create or inspect {directory} ({exc}); check that its "
                           "parent exists and is writable") from exc
    if read_only:
        raise StorageError(
            f"{directory} is on a read-only filesystem; a JSONL log takes its commit lock and "
            "repairs torn writes in place. Remount it read-write, or copy the log to a "
            "writable place"
        )
    ours = {LOG_NAME, LOCK_NAME, _TMP_NAME}
    foreign = sorted(
        n for n in os.listdir(directory) if n not in ours and not EPOCH_MARKER.fullmatch(n)
    )
    if foreign:
        raise _not_a_log(directory, f"it holds files that are not part of a log: {foreign[:5]}")
    _check_file(directory / LOCK_NAME)
    _check_header(directory)


class JsonlStorage:
    """A log in the directory ``directory`` (created if missing); see the module docstring.

    ``fsync=False`` skips the sync after each append: a commit then survives a crash of the
    process but not of the machine. ``fence`` (see ``durable.storage_fences.FencedFileSystem``) is
    checked under the commit lock before every commit.
    """

    def __init__(
        self, directory: str | Path, *, fsync: bool = True, fence: Fence | None = None
    ) -> None:
        self.directory = Path(directory)
        self.path = self.directory / LOG_NAME
        self.fsync = fsync
        self._fence = fence
        self._lock = threading.RLock()
        self._state = MemoryStorage()
        self._offset = 0  # bytes of log.jsonl replayed into _state
        self._lines = 0  # lines of log.jsonl replayed (the header included)
        self._lock_fd: int | None = None
        self._log_fd: int | None = None
        #: entry id → the epoch of the writer that committed it (None: unfenced)
        self._entry_epochs: dict[int, int | None] = {}
        _check_directory(self.directory)
        try:
            self._lock_fd = os.open(
                self.directory / LOCK_NAME, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644
            )
            with self._flock():
                if not _check_header(self.directory):
                    if self._read_mark() is not None:
                        raise CorruptLog(
                            f"{self.path} is missing, but {self.directory / LOCK_NAME} records "
                            "commits made to it: restore it from a copy, or delete "
                            f"{LOCK_NAME} to start a new log there; nothing was changed"
                        )
                    self._create_log()
                self._log_fd = os.open(self.path, os.O_RDWR | os.O_APPEND | os.O_CLOEXEC)
                self._offset, self._lines = len(HEADER), 1
                self._catch_up()
        except BaseException:
            self.close()
            raise

    # ------------------------------------------------------------ the Storage protocol

    def load(self) -> Snapshot:
        with self.commit_lock():
            self._catch_up()
            return self._state.load()

    def commit(self, batch: Batch) -> None:
        failpoint("log.commit")
        with self.commit_lock():
            if self._fence is not None:
                self._fence.check()
            self._catch_up()
            epoch = None if self._fence is None else self._fence.epoch
            line, replayed = _encode(rebased(batch, self._state.next_id), epoch)
            self._state.commit(replayed)
            self._append(line)
            self._entry_epochs.update((e.id, epoch) for e in replayed.entries)

    def load_docs(self, conversation: int, kind: str) -> list[DocRecord]:
        with self.commit_lock():
            self._catch_up()
            return self._state.load_docs(conversation, kind)

    def epoch_history(self) -> EpochHistory:
        """Each floor raise (epoch, first entry id it governs, time) from the epoch markers,
        and each entry's writer epoch from its line (see the module docstring)."""
        with self.commit_lock():
            self._catch_up()
            raises = []
            for name in sorted(os.listdir(self.directory)):
                if (m := EPOCH_MARKER.fullmatch(name)) and \
                        (raised := read_marker(self.directory / name)) is not None:
                    raises.append((int(m[1]), *raised))
            return EpochHistory(raises, dict(self._entry_epochs))

    def pending_next_id(self) -> int:
        """The id the next committed entry gets. Call it holding ``commit_lock()``: the
        lines other processes appended are read first, and none can land until it is let go."""
        self._catch_up()
        return self._state.next_id

    def close(self) -> None:
        with self._lock:
            for fd in (self._log_fd, self._lock_fd):
                if fd is not None:
                    os.close(fd)
            self._log_fd = self._lock_fd = None
            self._state.close()

    # ------------------------------------------------------------ the commit lock

    @contextmanager
    def commit_lock(self) -> Iterator[None]:
        """Hold the commit lock: no commit of any process (using this directory) lands while
        it is held. ``FencedFileSystem`` raises the floor under it."""
        with self._lock:
            if self._log_fd is None:
                raise StorageClosed(
                    f"the JsonlStorage of {self.directory} is closed; open it again"
                )
            with self._flock():
                yield

    # ------------------------------------------------------------ internals

    @contextmanager
    def _flock(self) -> Iterator[None]:
        assert self._lock_fd is not None
        fcntl.flock(self._lock_fd, fcntl.LOCK_EX)
        try:
            yield
        finally:
            # A failed append closes the storage inside the lock; closing the fd released it.
            if self._lock_fd is not None:
                fcntl.flock(self._lock_fd, fcntl.LOCK_UN)

    def _create_log(self) -> None:
        tmp = self.directory / _TMP_NAME
        with tmp.open("wb") as f:
            f.write(HEADER)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.path)
        fsync_dir(self.directory)

    def _read_mark(self) -> tuple[int, int] | None:
        """(bytes, lines) committed, from ``log.lock``; None when it holds no mark."""
        assert self._lock_fd is not None
        data = os.pread(self._lock_fd, 128, 0)
        if commit_mark.unwritten(data):  # none yet, or a power cut lost its unsynced write
            return None
        size, lines = commit_mark.decode(
            data, mark=self.directory / LOCK_NAME, log=self.path, unseen="lost lines",
            remedy=f"If the log is intact, empty {LOCK_NAME}")
        return int(size), lines

    def _write_mark(self) -> None:
        """Record the committed size in ``log.lock`` (unsynced: see the module docstring)."""
        assert self._lock_fd is not None
        os.pwrite(self._lock_fd, commit_mark.encode(f"{self._offset:020d}", self._lines), 0)

    def _catch_up(self) -> None:
        """Replay the lines appended since the last read (under the lock). A torn final line
        is truncated away; any other bad line raises ``CorruptLog`` (see the module
        docstring)."""
        assert self._log_fd is not None
        size = os.fstat(self._log_fd).st_size
        mark = self._read_mark()
        committed = 0 if mark is None else mark[0]
        if size < max(self._offset, committed):
            raise CorruptLog(
                f"{self.path} is {size} bytes but {max(self._offset, committed)} bytes of "
                "commits were written to it: something outside durable truncated it. Restore "
                f"it from a copy (or, to accept the loss, empty {LOCK_NAME}); nothing was "
                "changed"
            )
        start = self._offset
        data = _read_exactly(self._log_fd, start, size - start)
        pos = 0
        while pos < len(data):
            end = data.find(b"\n", pos)
            decoded = None if end == -1 else _decode(data[pos:end])
            if decoded is None:
                final = end == -1 or end + 1 == len(data)
                tail = data[pos:] if end == -1 else data[pos:end]
                if final and start + pos >= committed and _torn(tail, complete=end != -1):
                    os.ftruncate(self._log_fd, self._offset)
                    _datasync(self._log_fd)
                    return
                why = "lines follow it" if not final else (
                    "it was committed before" if start + pos < committed
                    else "it is complete, so it is not a torn write")
                raise CorruptLog(
                    f"{self.path} line {self._lines + 1} is not a valid record (bad checksum or "
                    f"JSON) and {why}: the file was edited or the disk is failing. Restore it "
                    "from a copy; nothing was changed"
                )
            batch, epoch = decoded
            try:
                self._state.commit(batch)
            except StorageError as exc:
                raise CorruptLog(
                    f"{self.path} line {self._lines + 1} does not follow from the lines before "
                    f"it ({exc}): the file was edited. Restore it from a copy; nothing was changed"
                ) from exc
            self._entry_epochs.update((e.id, epoch) for e in batch.entries)
            pos = end + 1
            self._offset = start + pos
            self._lines += 1

    def _append(self, line: bytes) -> None:
        assert self._log_fd is not None
        try:
            written = os.write(self._log_fd, line)
            if written == len(line) and self.fsync:
                _datasync(self._log_fd)
        except OSError as exc:
            raise self._uncertain(str(exc)) from exc
        if written != len(line):
            raise self._uncertain(f"only {written} of {len(line)} bytes were written")
        self._offset += len(line)
        self._lines += 1
        try:
            self._write_mark()
        except OSError as exc:  # the line landed; only the loss detection is behind
            warnings.warn(
                f"could not update the commit mark in {self.directory / LOCK_NAME} ({exc}): "
                "the commit landed, but a later loss of lines may go undetected; check the "
                "directory",
                RuntimeWarning,
                stacklevel=3,
            )

    def _uncertain(self, why: str) -> StorageUncertain:
        self.close()
        return StorageUncertain(
            f"appending to {self.path} failed ({why}); the commit may or may not have landed "
            "and this storage closed itself: reopen the log to see what landed"
        )


def _torn(tail: bytes, *, complete: bool) -> bool:
    """Whether a bad final line (``tail``, without its newline) is what a crash leaves of an
    append that never returned: an unterminated prefix, or NUL-filled blocks. Not a record
    whose newline alone was damaged: that one was complete."""
    if complete:
        return _ZEROS in tail
    return _ZEROS in tail or _decode(tail[:-1]) is None


def _read_exactly(fd: int, offset: int, size: int) -> bytes:
    chunks = []
    while size > 0:
        chunk = os.pread(fd, size, offset)
        if not chunk:
            break
        chunks.append(chunk)
        offset += len(chunk)
        size -= len(chunk)
    return b"".join(chunks)
