"""Durable, atomic file replacement: write a temp file, fsync it, rename it over the target.

Readers (and a crash) see either the old file or the new one, never a torn mix. The temp
file lives in the daemon's own tmp directory when that is on the same filesystem as the
target (so a crash never leaves a stray temp file *inside the workspace*, where a scan
would count it), else next to the target under a dot-name.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import uuid
from collections.abc import Iterable, Iterator, Sequence


def fsync_dir(path: str) -> None:
    """Make a rename or a new entry in directory ``path`` durable."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


#: The end of the name of a record, in the tmp directory, of a temp entry made outside it.
_OUTSIDE = ".outside"


class StateDirError(OSError):
    """A write to the daemon's own state directory failed, not one to the workspace: the
    request fails for the daemon's disk (``no_space`` when it is full), never as the file
    tool's own error."""


class AtomicWriter:
    """``write`` and ``symlink`` take a path, or with ``dir_fd`` a name in that directory
    (file ops pass the fd of a directory ``paths.Walk`` opened, so the rename lands in it
    whatever happens to the path meanwhile)."""

    def __init__(self, tmp_dir: str) -> None:
        os.makedirs(tmp_dir, mode=0o700, exist_ok=True)
        self.tmp_dir = tmp_dir
        self._dev = os.stat(tmp_dir).st_dev
        # Temp files of a daemon that crashed are garbage now: those it made next to their
        # targets first (named by its records), then its own.
        for name in os.listdir(tmp_dir):
            if name.endswith(_OUTSIDE):
                with open(os.path.join(tmp_dir, name), "rb") as f:
                    left = os.fsdecode(f.read())
                with contextlib.suppress(FileNotFoundError, NotADirectoryError):
                    os.unlink(left)
        for name in os.listdir(tmp_dir):
            path = os.path.join(tmp_dir, name)
            if os.path.isdir(path) and not os.path.islink(path):
                shutil.rmtree(path, ignore_errors=True)
            else:
                os.unlink(path)

    def temp_path(self, target: str) -> str:
        """A fresh temp path on the same filesystem as ``target`` (its parent must exist)."""
        parent, name = os.path.split(target)
        if os.stat(parent).st_dev == self._dev:
            return os.path.join(self.tmp_dir, uuid.uuid4().hex)
        return os.path.join(parent, f".{name}.spacesd-{uuid.uuid4().hex[:12]}")

    @contextlib.contextmanager
    def _temp_at(self, dir_fd: int, name: str) -> Iterator[tuple[int, str]]:
        """(fd of a directory, name) for a fresh temp entry on ``dir_fd``'s filesystem: in
        the daemon's tmp directory if it is there, else next to ``name`` under a dot-name."""
        if os.fstat(dir_fd).st_dev == self._dev:
            tmp_fd = os.open(self.tmp_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
            try:
                yield tmp_fd, uuid.uuid4().hex
            finally:
                os.close(tmp_fd)
        else:
            tmp = f".{name[:100]}.spacesd-{uuid.uuid4().hex[:12]}"
            with self._recorded(os.path.join(os.readlink(f"/proc/self/fd/{dir_fd}"), tmp)):
                yield dir_fd, tmp

    @contextlib.contextmanager
    def _recorded(self, path: str) -> Iterator[None]:
        """While the temp entry ``path`` (outside the tmp directory) may exist: a record of
        it in the tmp directory, durable before the entry is made (a power cut keeps neither
        or the record), which the next daemon reads to remove it if this one dies first."""
        record = os.path.join(self.tmp_dir, uuid.uuid4().hex + _OUTSIDE)
        try:
            fd = os.open(record, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
            try:
                data = os.fsencode(path)
                if os.write(fd, data) != len(data):
                    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
                os.fsync(fd)
            finally:
                os.close(fd)
            fsync_dir(self.tmp_dir)
        except OSError as exc:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(record)
            raise StateDirError(exc.errno, f"the daemon's state directory: {exc.strerror}"
                                ) from exc
        try:
            yield
        finally:
            os.unlink(record)

    def _split(self, target: str, dir_fd: int | None) -> tuple[int, str]:
        if dir_fd is not None:
            return os.dup(dir_fd), target
        parent, name = os.path.split(os.path.abspath(target))
        return os.open(parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC), name

    def write(self, target: str, chunks: Iterable[bytes], *, mode: int,
              sync_dir: bool = True, dir_fd: int | None = None,
              extents: Sequence[tuple[int, int]] | None = None,
              mtime_ns: int | None = None) -> None:
        """Replace ``target`` with ``chunks`` and permissions ``mode`` (every bit, set-id
        and sticky included), atomically. ``extents``: only these ``(offset, length)`` of
        the content are written, the rest left holes (a sparse file, as it was);
        ``mtime_ns``: the modification time it gets (else now)."""
        parent_fd, name = self._split(target, dir_fd)
        try:
            with self._temp_at(parent_fd, name) as (tmp_fd, tmp):
                try:
                    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
                                 | os.O_CLOEXEC, 0o600, dir_fd=tmp_fd)
                    with open(fd, "wb") as f:
                        if extents is None:
                            f.writelines(chunks)
                            f.flush()
                        else:
                            os.ftruncate(fd, _write_extents(fd, chunks, extents))
                        os.fchmod(fd, mode)
                        if mtime_ns is not None:
                            os.utime(fd, ns=(mtime_ns, mtime_ns))
                        os.fsync(fd)
                    os.replace(tmp, name, src_dir_fd=tmp_fd, dst_dir_fd=parent_fd)
                except BaseException:
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(tmp, dir_fd=tmp_fd)
                    raise
            if sync_dir:
                os.fsync(parent_fd)
        finally:
            os.close(parent_fd)

    def symlink(self, target_path: str, link_target: str, *, dir_fd: int | None = None) -> None:
        """Make ``target_path`` a symlink to ``link_target``, replacing what is there."""
        parent_fd, name = self._split(target_path, dir_fd)
        try:
            with self._temp_at(parent_fd, name) as (tmp_fd, tmp):
                os.symlink(link_target, tmp, dir_fd=tmp_fd)
                try:
                    os.replace(tmp, name, src_dir_fd=tmp_fd, dst_dir_fd=parent_fd)
                except BaseException:
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(tmp, dir_fd=tmp_fd)
                    raise
            os.fsync(parent_fd)  # a link is an entry: it survives a power loss only so
        finally:
            os.close(parent_fd)


def _write_extents(fd: int, chunks: Iterable[bytes],
                   extents: Sequence[tuple[int, int]]) -> int:
    """Write the parts of the content ``chunks`` that lie in ``extents`` at their offsets
    and leave the rest a hole; the content's size. A part outside them that is not all
    zeros is written too: the content is what counts, the holes only where they hold."""
    at = 0
    for chunk in chunks:
        end = at + len(chunk)
        covered = at
        for start, length in sorted(extents):
            lo, hi = max(start, at), min(start + length, end)
            if lo >= hi:
                continue
            _unless_zeros(fd, chunk[covered - at:lo - at], covered)
            os.pwrite(fd, chunk[lo - at:hi - at], lo)
            covered = hi
        _unless_zeros(fd, chunk[covered - at:], covered)
        at = end
    return at


def _unless_zeros(fd: int, data: bytes, offset: int) -> None:
    if data and data.count(0) != len(data):
        os.pwrite(fd, data, offset)
