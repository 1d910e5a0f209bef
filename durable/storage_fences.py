"""Fenced storages: epochs that only grow, so a newer driver shuts every older one out.

SQLite (exact): ``open_fenced_sqlite(path, epoch)`` opens a ``SqliteStorage`` that raises the
one-row floor to ``epoch`` when it opens and re-reads the floor inside every commit's own
``BEGIN IMMEDIATE`` transaction, before writing anything. The floor read and the writes are
one transaction under SQLite's write lock, so once a newer epoch's open has returned, no
commit of an older epoch can land. The ``SqliteFence`` returned beside it is only a view on
that storage (its epoch, a fresh floor read, halt): the logic lives in the storage so a
fenced commit costs one more single-row SELECT, nothing else.

Files (BEST-EFFORT): ``FencedFileSystem(directory).open(epoch)`` keeps the floor as epoch
marker files beside a ``JsonlStorage`` (``epoch-00000007``, created with ``O_EXCL``; the
floor is the highest marker) and checks it before every commit. Between processes of one
machine that all go through ``JsonlStorage``, the check and the append happen under the same
``flock`` the newer epoch holds while it creates its marker, which closes the window. But
``flock`` is advisory, and on network filesystems (NFS, SMB) it may do nothing or hold only
within one client: there, and against any writer that does not take the lock, a stale writer
that passed the check just before the floor was raised can land one write. Use the SQLite
fence when that matters.
"""

from __future__ import annotations

import os
import time
from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path

from .atomic_file import fsync_dir
from .storage.epochs import EpochGuard
from .storage.jsonl import EPOCH_MARKER, JsonlStorage, epoch_marker_name
from .storage.records import encode_json
from .storage.sqlite import SqliteStorage

__all__ = ["FencedFileSystem", "FileFence", "SqliteFence", "open_fenced_sqlite"]

# ---------------------------------------------------------------- the shared part


class _GuardedFence(ABC):
    """What both fences share: the epoch, halting, and ``check`` against ``floor()``."""

    _guard: EpochGuard

    @property
    def epoch(self) -> int:
        return self._guard.epoch

    @abstractmethod
    def floor(self) -> int:
        """The highest epoch that opened the log, read fresh from where this fence keeps it."""

    def check(self) -> None:
        """Raise ``StaleEpochError`` if a newer epoch opened the log or this fence was halted."""
        self._guard.admit(self.floor())

    def halt(self, reason: str) -> None:
        self._guard.halt(reason)

    @property
    def halted(self) -> bool:
        return self._guard.halted


# ---------------------------------------------------------------- SQLite


class SqliteFence(_GuardedFence):
    """The ``Fence`` of a fenced ``SqliteStorage``: a view; the storage enforces it."""

    def __init__(self, storage: SqliteStorage) -> None:
        if storage.epoch_guard is None:
            raise ValueError(
                f"the SqliteStorage of {storage.path} was opened without an epoch; open it "
                "with open_fenced_sqlite(path, epoch) to fence it"
            )
        self._storage = storage
        self._guard = storage.epoch_guard

    def floor(self) -> int:
        return self._storage.read_floor()


def open_fenced_sqlite(
    path: str | Path, epoch: int, *, busy_timeout: float = 10.0
) -> tuple[SqliteStorage, SqliteFence]:
    """Open the SQLite log at ``path`` as the writer of ``epoch``.

    Raises ``StaleEpochError`` (nothing changed) when a newer epoch already opened it; an
    equal epoch is admitted (a restarted process of the same epoch)."""
    storage = open_fenced_sqlite_storage(path, epoch, busy_timeout=busy_timeout)
    return storage, SqliteFence(storage)


def open_fenced_sqlite_storage(
    path: str | Path, epoch: int, *, busy_timeout: float = 10.0
) -> SqliteStorage:
    """The storage alone of ``open_fenced_sqlite``, for callers that need no ``Fence`` view
    (the storage enforces the epoch at every commit either way; ``SqliteFence(storage)``
    gives the view later)."""
    return SqliteStorage(path, epoch=epoch, busy_timeout=busy_timeout)


# ---------------------------------------------------------------- files (best-effort)


class FileFence(_GuardedFence):
    """The ``Fence`` of a ``FencedFileSystem`` log: the floor is the highest marker file."""

    def __init__(self, directory: Path, epoch: int) -> None:
        self.directory = directory
        self._guard = EpochGuard(epoch)

    def floor(self) -> int:
        markers = (EPOCH_MARKER.fullmatch(n) for n in os.listdir(self.directory))
        return max((int(m[1]) for m in markers if m), default=0)

    def mark(self, first: int) -> None:
        """Raise the floor to this epoch: create its marker (kept if it exists) durably,
        recording ``first``, the first entry id this epoch governs, for audits."""
        try:
            fd = os.open(
                self.directory / epoch_marker_name(self.epoch),
                os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC,
                0o644,
            )
        except FileExistsError:
            return
        try:
            os.write(fd, encode_json({"first": first, "raised_ms": int(time.time() * 1000)})
                     .encode() + b"\n")
            os.fsync(fd)
        finally:
            os.close(fd)
        fsync_dir(self.directory)


@dataclass(frozen=True)
class FencedFileSystem:
    """JSONL logs in ``directory`` fenced by epoch marker files (best-effort, see above)."""

    directory: str | Path
    fsync: bool = True

    def open(self, epoch: int) -> tuple[JsonlStorage, FileFence]:
        """Open the log as the writer of ``epoch``: refuse with ``StaleEpochError`` (nothing
        changed) when a newer marker exists, else create this epoch's marker under the commit
        lock, so no commit of an older epoch lands after this returns."""
        fence = FileFence(Path(self.directory), epoch)
        storage = JsonlStorage(self.directory, fsync=self.fsync, fence=fence)
        try:
            with storage.commit_lock():
                fence.check()
                fence.mark(storage.pending_next_id())
        except BaseException:
            storage.close()
            raise
        return storage, fence
