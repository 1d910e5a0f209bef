"""Durable, atomic file replacement: write a temp file, fsync it, rename it over the target.

Readers (and a crash) see either the old file or the new one, never a torn mix. The temp
file lives in the daemon's own tmp directory when that is on the same filesystem as the
target (so a crash never leaves a stray temp file *inside the workspace*, where a scan
would count it), else next to the target under a dot-name.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import uuid
from collections.abc import Iterable


def fsync_dir(path: str) -> None:
    """Make a rename or a new entry in directory ``path`` durable."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class AtomicWriter:
    def __init__(self, tmp_dir: str) -> None:
        os.makedirs(tmp_dir, exist_ok=True)
        self.tmp_dir = tmp_dir
        self._dev = os.stat(tmp_dir).st_dev
        # Temp files of a daemon that crashed are garbage now.
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

    def write(self, target: str, chunks: Iterable[bytes], *, mode: int,
              sync_dir: bool = True) -> None:
        """Replace ``target`` with ``chunks`` and permissions ``mode``, atomically."""
        tmp = self.temp_path(target)
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
            with open(fd, "wb") as f:
                for chunk in chunks:
                    f.write(chunk)
                f.flush()
                os.fchmod(fd, mode)
                os.fsync(fd)
            os.replace(tmp, target)
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
            raise
        if sync_dir:
            fsync_dir(os.path.dirname(target))

    def symlink(self, target_path: str, link_target: str) -> None:
        """Make ``target_path`` a symlink to ``link_target``, replacing what is there."""
        tmp = self.temp_path(target_path)
        os.symlink(link_target, tmp)
        try:
            os.replace(tmp, target_path)
        except BaseException:
            os.unlink(tmp)
            raise
