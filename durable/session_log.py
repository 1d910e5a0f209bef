"""Where a session driver keeps its log, and how it opens it: one of the two fenced
storages, chosen with ``CUA_LOG_STORAGE`` (``sqlite``, the default, or ``jsonl``).

- ``sqlite``: ``<state>/log.sqlite``, fenced exactly (``open_fenced_sqlite``);
- ``jsonl``: the directory ``<state>/log``, fenced by epoch marker files
  (``FencedFileSystem``: best-effort on network filesystems, see ``durable.storage_fences``).

An auditor (the campaign's checker, ``chaos workload from-log``) opens whichever the state
directory holds with ``open_for_audit``: both give ``epoch_history()``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Protocol

from .errors import StorageError
from .fence_contract import Fence
from .storage.base import Storage
from .storage.epochs import EpochHistory
from .storage.jsonl import JsonlStorage
from .storage.sqlite import SqliteStorage
from .storage_fences import FencedFileSystem, open_fenced_sqlite

LOG_STORAGE_ENV = "CUA_LOG_STORAGE"
#: The storage kinds and the name of the log in the state directory.
LOG_NAMES = {"sqlite": "log.sqlite", "jsonl": "log"}
DEFAULT_LOG_STORAGE = "sqlite"


class AuditedStorage(Storage, Protocol):
    def epoch_history(self) -> EpochHistory: ...


def check_log_storage(kind: str) -> str:
    """``kind`` if it names a storage; else a ``ValueError`` that says which do."""
    if kind not in LOG_NAMES:
        raise ValueError(f"{LOG_STORAGE_ENV}={kind!r} names no log storage; use one of "
                         f"{', '.join(LOG_NAMES)} (default {DEFAULT_LOG_STORAGE})")
    return kind


def session_log(state_dir: Path, kind: str = DEFAULT_LOG_STORAGE) -> Path:
    """Where the session whose state is ``state_dir`` keeps its log of storage ``kind``."""
    return state_dir / LOG_NAMES[check_log_storage(kind)]


def open_fenced(state_dir: Path, epoch: int, kind: str = DEFAULT_LOG_STORAGE
                ) -> tuple[Storage, Fence]:
    """Open the session's log as the writer of ``epoch`` (``StaleEpochError`` when a newer
    epoch opened it)."""
    state_dir.mkdir(parents=True, exist_ok=True)
    path = session_log(state_dir, kind)
    if kind == "jsonl":
        return FencedFileSystem(path).open(epoch)
    return open_fenced_sqlite(path, epoch)


def open_log_at(path: Path) -> AuditedStorage:
    """The log at ``path``: a JSONL log's directory, or a SQLite log's file (unfenced)."""
    return JsonlStorage(path) if path.is_dir() else SqliteStorage(path)


def open_for_audit(state_dir: Path) -> AuditedStorage:
    """The log ``state_dir`` holds, of whichever storage, opened without a fence (to read
    it, and its epoch history)."""
    found = [kind for kind, name in LOG_NAMES.items() if (state_dir / name).exists()]
    if len(found) != 1:
        raise StorageError(
            f"{state_dir} holds {'no session log' if not found else 'two session logs'} "
            f"(looked for {', '.join(LOG_NAMES.values())}): point at a driver's state "
            "directory, whose one log its driver made")
    return open_log_at(state_dir / LOG_NAMES[found[0]])
