"""Write a file so that a crash leaves either the old content or the new, never a mix:
a temporary file in the same directory, fsynced, renamed over the target, and the directory
fsynced so the rename itself survives a power loss."""

from __future__ import annotations

import os
import tempfile
import threading
from collections.abc import Iterable
from pathlib import Path
from types import TracebackType


def write_atomic(path: Path, chunks: Iterable[bytes] | bytes | str) -> None:
    _rename_synced(_write_synced(path, chunks), path)


class StagedWrite:
    """``write_atomic`` in two halves, for a file that must not appear before other files
    are durable (a manifest, before the objects it names): the temporary file is written
    and fsynced in a thread of its own from the start, while the caller syncs the others,
    and ``commit`` renames it into place and syncs its directory. Leaving the ``with``
    without ``commit`` removes the temporary file, or has the thread remove it once written
    (a second Ctrl-C may cut the wait for it short)."""

    def __init__(self, path: Path, data: bytes) -> None:
        self.path = path
        self.size = len(data)
        self._lock = threading.Lock()
        self._tmp: str | None = None
        self._error: BaseException | None = None
        self._written = False
        self._abandoned = False
        self._thread = threading.Thread(target=self._write, args=(data,),
                                        name=f"staged-write {path.name}", daemon=True)
        self._thread.start()

    def _write(self, data: bytes) -> None:
        tmp = None
        try:
            tmp = _write_synced(self.path, data)
        except BaseException as exc:  # noqa: BLE001 - raised again by commit, in its thread
            self._error = exc
        with self._lock:
            self._written = True
            if not self._abandoned:
                self._tmp = tmp
                return
        if tmp is not None:
            os.unlink(tmp)

    def commit(self) -> None:
        self._thread.join()
        if self._error is not None:
            raise self._error
        with self._lock:
            tmp, self._tmp = self._tmp, None
        if tmp is None:
            raise RuntimeError(f"the staged write of {self.path} was committed twice")
        os.utime(tmp)  # dated when it became the file, not when its write began
        _rename_synced(tmp, self.path)

    def __enter__(self) -> StagedWrite:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        with self._lock:
            self._abandoned = True
            tmp, self._tmp = self._tmp, None
        if tmp is not None:
            os.unlink(tmp)
        self._thread.join()


def _write_synced(path: Path, chunks: Iterable[bytes] | bytes | str) -> str:
    """A temporary file beside ``path`` holding ``chunks``, fsynced: its name."""
    if isinstance(chunks, str):
        chunks = [chunks.encode("utf-8")]
    elif isinstance(chunks, bytes):
        chunks = [chunks]
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "wb") as f:
            for chunk in chunks:
                f.write(chunk)
            f.flush()
            os.fsync(f.fileno())
    except BaseException:
        os.unlink(tmp)
        raise
    return tmp


def _rename_synced(tmp: str, path: Path) -> None:
    try:
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    fsync_dir(path.parent)


def fsync_dir(directory: Path) -> None:
    """Make the directory's entries (a created or renamed file) durable."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
