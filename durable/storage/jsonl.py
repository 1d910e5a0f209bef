"""``JsonlStorage``: the log as an append-only file of JSON lines, one per committed batch.

Why a second persistent storage: a log you can read with ``less`` and ``grep``, copy with
``cp``, and that a crash can damage in exactly one place, the end.

The directory holds:

- ``log.jsonl``: a header line naming the format and schema (written once, atomically, by
  rename), then one line per batch: ``<crc32 of the payload, 8 hex digits> <payload>\\n``,
  the payload being ``Batch.to_json()`` in the one stored JSON encoding.
- ``log.lock``: the commit lock (``fcntl.flock``, exclusive).
- ``epoch-NNNNNNNN``: epoch markers of ``durable.fences.FencedFileSystem``.

Any other name in the directory, or a ``log.jsonl`` without the header, raises ``NotALog``
and nothing is changed.

Atomicity: a batch is one line appended with a single ``write`` under the lock, then
``fdatasync`` (with ``fsync=True``) before ``commit`` returns. A crash mid-write can only
leave a torn *final* line: whoever next holds the lock (an open, a load, a commit) truncates
it away and syncs. A bad line with lines after it cannot come from a crash (the file was
edited or the disk fails): ``CorruptLog`` naming the file and line, and nothing is changed.

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
import threading
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from ..errors import CorruptLog, NotALog, StorageClosed, StorageError, StorageUncertain
from ..fence import Fence
from .base import MemoryStorage
from .records import Batch, Snapshot, encode_json

LOG_NAME = "log.jsonl"
LOCK_NAME = "log.lock"
_TMP_NAME = "log.jsonl.tmp"
FORMAT = "durable-log/jsonl"
SCHEMA_VERSION = 1
HEADER = (encode_json({"format": FORMAT, "schema": SCHEMA_VERSION}) + "\n").encode()
#: Names of the epoch marker files a ``FencedFileSystem`` keeps beside the log.
EPOCH_MARKER = re.compile(r"epoch-(\d+)")

_datasync = getattr(os, "fdatasync", os.fsync)


def epoch_marker_name(epoch: int) -> str:
    return f"epoch-{epoch:08d}"


def fsync_dir(directory: Path) -> None:
    """Make the directory's entries (a created or renamed file) durable."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _encode(batch: Batch) -> tuple[bytes, Batch]:
    """The line for ``batch``, and the batch exactly as a reader will decode it later (so the
    in-memory state after a commit equals the state after a reopen)."""
    try:
        payload = encode_json(batch.to_json())
    except (TypeError, ValueError) as exc:
        raise StorageError(
            f"the batch holds a value that cannot be stored as JSON ({exc}); store only "
            "JSON values (dict, list, str, int, float, bool, None)"
        ) from exc
    raw = payload.encode()
    line = b"%08x %s\n" % (zlib.crc32(raw), raw)
    return line, Batch.from_json(json.loads(payload))


def _decode(line: bytes) -> Batch | None:
    """The batch of one line (without its newline), or ``None`` when it is not a valid record."""
    checksum, sep, raw = line.partition(b" ")
    if sep != b" " or len(checksum) != 8:
        return None
    try:
        if int(checksum, 16) != zlib.crc32(raw):
            return None
        return Batch.from_json(json.loads(raw))
    except (ValueError, TypeError, KeyError, AttributeError):
        return None


def _not_a_log(directory: Path, why: str) -> NotALog:
    return NotALog(
        f"{directory} is not a durable JSONL log ({why}). Point JsonlStorage at a directory "
        "of its own (new, or created by durable); nothing was changed"
    )


def _check_header(directory: Path) -> bool:
    """Raise ``NotALog`` unless ``log.jsonl`` starts with our header; False when it is missing."""
    try:
        with (directory / LOG_NAME).open("rb") as f:
            first = f.readline(4096)
    except FileNotFoundError:
        return False
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
    raise _not_a_log(directory, f"{LOG_NAME} does not start with the durable log header")


def _check_directory(directory: Path) -> None:
    """Create ``directory`` if missing; refuse a file, or a directory holding foreign names."""
    if directory.exists() and not directory.is_dir():
        raise _not_a_log(directory, "it is a file, not a directory")
    directory.mkdir(parents=True, exist_ok=True)
    ours = {LOG_NAME, LOCK_NAME, _TMP_NAME}
    foreign = sorted(
        n for n in os.listdir(directory) if n not in ours and not EPOCH_MARKER.fullmatch(n)
    )
    if foreign:
        raise _not_a_log(directory, f"it holds files that are not part of a log: {foreign[:5]}")
    _check_header(directory)


class JsonlStorage:
    """A log in the directory ``directory`` (created if missing); see the module docstring.

    ``fsync=False`` skips the sync after each append: a commit then survives a crash of the
    process but not of the machine. ``fence`` (see ``durable.fences.FencedFileSystem``) is
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
        _check_directory(self.directory)
        try:
            self._lock_fd = os.open(
                self.directory / LOCK_NAME, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644
            )
            with self._flock():
                if not _check_header(self.directory):
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
        line, replayed = _encode(batch)
        with self.commit_lock():
            if self._fence is not None:
                self._fence.check()
            self._catch_up()
            self._state.commit(replayed)
            self._append(line)

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

    def _catch_up(self) -> None:
        """Replay the lines appended since the last read (under the lock). A torn or corrupt
        final line is truncated away; a bad line followed by others raises ``CorruptLog``."""
        assert self._log_fd is not None
        size = os.fstat(self._log_fd).st_size
        if size < self._offset:
            raise CorruptLog(
                f"{self.path} shrank to {size} bytes below the {self._offset} already read: "
                "something outside durable truncated it. Restore it from a copy"
            )
        start = self._offset
        data = _read_exactly(self._log_fd, start, size - start)
        pos = 0
        while pos < len(data):
            end = data.find(b"\n", pos)
            batch = None if end == -1 else _decode(data[pos:end])
            if batch is None:
                if end == -1 or end + 1 == len(data):
                    os.ftruncate(self._log_fd, self._offset)
                    _datasync(self._log_fd)
                    return
                raise CorruptLog(
                    f"{self.path} line {self._lines + 1} is not a valid record (bad checksum or "
                    "JSON) and lines follow it, so it is not a torn write: the file was edited "
                    "or the disk is failing. Restore it from a copy; nothing was changed"
                )
            try:
                self._state.commit(batch)
            except StorageError as exc:
                raise CorruptLog(
                    f"{self.path} line {self._lines + 1} does not follow from the lines before "
                    f"it ({exc}): the file was edited. Restore it from a copy; nothing was changed"
                ) from exc
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

    def _uncertain(self, why: str) -> StorageUncertain:
        self.close()
        return StorageUncertain(
            f"appending to {self.path} failed ({why}); the commit may or may not have landed "
            "and this storage closed itself: reopen the log to see what landed"
        )


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
