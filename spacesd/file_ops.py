"""File operations confined to the workspace root.

Confinement: the protocol path is checked by ``paths.split_rel`` (no absolute path, no
``..``, no NUL/newline/backslash), then resolved with ``realpath`` and required to stay under
the (resolved) root. Operations on an entry itself (stat, remove, symlink) resolve only its
parent, so a link is handled as a link; operations on content (read, write, edit, list,
mkdir) resolve the whole path, so a symlink that points inside the workspace works and one
that points outside is refused before anything is opened. Writes go to the resolved path
with a temp file and a rename, so they replace the link's target and keep the link.

What this does not stop: a process inside the Space swapping a directory for a symlink
between the check and the open. Commands in a Space run with the daemon's user and can
write anywhere it can anyway; confinement is about the paths requests name.
"""

from __future__ import annotations

import errno
import os
import shutil
import stat
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from . import paths
from .errors import BadRequest, Conflict, NotFound, OutsideRoot
from .fsio import AtomicWriter

DEFAULT_FILE_MODE = 0o644


@contextmanager
def os_errors(path: str) -> Iterator[None]:
    """Turn the OS's refusals into protocol errors that name ``path``."""
    try:
        yield
    except FileNotFoundError:
        raise NotFound(f"{path!r}: no such file or directory") from None
    except IsADirectoryError:
        raise Conflict(f"{path!r} is a directory; name a file") from None
    except NotADirectoryError:
        raise Conflict(f"{path!r}: a component of the path is not a directory") from None
    except PermissionError:
        raise Conflict(f"{path!r}: permission denied") from None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise OutsideRoot(f"{path!r}: too many levels of symbolic links") from None
        raise Conflict(f"{path!r}: {exc.strerror or exc}") from None


class Workspace:
    def __init__(self, root: str, writer: AtomicWriter) -> None:
        self.root = os.path.realpath(root)
        self.writer = writer
        self._edit_lock = threading.Lock()  # edits are read-modify-write

    # ---------------------------------------------------------------- resolution

    def resolve(self, path: str, *, follow: bool) -> str:
        """The absolute path of protocol ``path``; ``follow`` resolves the last component
        too. Raises ``OutsideRoot`` if it leads out of the workspace."""
        parts = paths.split_rel(path)
        if not parts:
            return self.root
        parent = os.path.realpath(os.path.join(self.root, *parts[:-1]))
        self._confine(parent, path)
        full = os.path.join(parent, parts[-1])
        if not follow:
            return full
        real = os.path.realpath(full)
        self._confine(real, path)
        return real

    def _confine(self, real: str, path: str) -> None:
        if not paths.inside(real, self.root):
            raise OutsideRoot(f"path {path!r} leads outside the workspace through a symlink; "
                              "use a path inside it")

    # ---------------------------------------------------------------- operations

    def read(self, path: str, offset: int = 0, limit: int | None = None) -> bytes:
        real = self.resolve(path, follow=True)
        with os_errors(path), open(real, "rb") as f:
            f.seek(offset)
            return f.read() if limit is None else f.read(limit)

    def write(self, path: str, data: bytes, mode: int | None = None) -> None:
        real = self.resolve(path, follow=True)
        with os_errors(path):
            if mode is None:
                mode = self._current_mode(real)
            os.makedirs(os.path.dirname(real), exist_ok=True)
            if os.path.isdir(real):
                raise Conflict(f"{path!r} is a directory; name a file")
            self.writer.write(real, [data], mode=mode & 0o7777)

    def edit(self, path: str, old: str, new: str) -> None:
        """Replace the one occurrence of ``old`` with ``new``."""
        if not old:
            raise BadRequest("edit_file: 'old' is empty; give the exact text to replace")
        real = self.resolve(path, follow=True)
        with self._edit_lock, os_errors(path):
            with open(real, "rb") as f:
                raw = f.read()
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError:
                raise Conflict(f"{path!r} is not UTF-8 text; rewrite it whole instead") from None
            count = text.count(old)
            if count == 0:
                raise Conflict(f"the old text was not found in {path!r}; read the file "
                               "again and give text that is in it, exactly")
            if count > 1:
                raise Conflict(f"the old text occurs {count} times in {path!r}; include "
                               "more surrounding text so that it occurs exactly once")
            data = text.replace(old, new, 1).encode("utf-8")
            self.writer.write(real, [data], mode=self._current_mode(real))

    def stat(self, path: str) -> dict[str, Any] | None:
        full = self.resolve(path, follow=False)
        try:
            st = os.lstat(full)
        except (FileNotFoundError, NotADirectoryError):
            return None
        return paths.describe(path, full, st)

    def list(self, path: str) -> list[dict[str, Any]]:
        real = self.resolve(path, follow=True)
        out = []
        with os_errors(path), os.scandir(real) as it:
            for de in it:
                try:
                    st = de.stat(follow_symlinks=False)
                except FileNotFoundError:
                    continue
                entry = paths.describe(de.name, de.path, st)
                entry["name"] = entry.pop("path")
                out.append(entry)
        return sorted(out, key=lambda e: e["name"])

    def remove(self, path: str, recursive: bool = False) -> bool:
        """Remove a file, link or directory; False if there was nothing to remove."""
        full = self.resolve(path, follow=False)
        if full == self.root:
            raise BadRequest("remove: refusing to remove the workspace root; remove its "
                             "entries instead")
        with os_errors(path):
            try:
                st = os.lstat(full)
            except (FileNotFoundError, NotADirectoryError):
                return False
            if not stat.S_ISDIR(st.st_mode):
                os.unlink(full)
            elif recursive:
                shutil.rmtree(full)
            else:
                try:
                    os.rmdir(full)
                except OSError as exc:
                    if exc.errno != errno.ENOTEMPTY:
                        raise
                    raise Conflict(f"directory {path!r} is not empty; pass recursive=true "
                                   "to remove it with its contents") from None
        return True

    def mkdir(self, path: str) -> None:
        real = self.resolve(path, follow=True)
        with os_errors(path):
            if os.path.lexists(real) and not os.path.isdir(real):
                raise Conflict(f"{path!r} exists and is not a directory")
            os.makedirs(real, exist_ok=True)

    def symlink(self, path: str, target: str) -> None:
        """Make ``path`` a link to ``target`` (replacing a file or link, like ``ln -sfn``)."""
        parts = paths.split_rel(path)
        if not parts:
            raise BadRequest("symlink: the workspace root cannot become a link")
        paths.check_link_target(parts, target)
        full = self.resolve(path, follow=False)
        with os_errors(path):
            os.makedirs(os.path.dirname(full), exist_ok=True)
            if os.path.isdir(full) and not os.path.islink(full):
                raise Conflict(f"{path!r} is a directory; remove it first")
            self.writer.symlink(full, target)

    @staticmethod
    def _current_mode(real: str) -> int:
        try:
            return stat.S_IMODE(os.stat(real).st_mode)
        except FileNotFoundError:
            return DEFAULT_FILE_MODE
