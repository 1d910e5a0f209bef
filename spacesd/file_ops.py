"""File operations confined to the workspace root.

Confinement: the protocol path is checked by ``paths.split_rel`` (no absolute path, no
``..``, no NUL/newline/backslash), then walked by ``paths.Walk``: each directory is opened
with ``O_NOFOLLOW | O_DIRECTORY`` relative to the fd of the one before, from an fd of the
root, and the operation itself is done relative to the parent's fd (``openat``,
``renameat``, ``unlinkat``, ``mkdirat``, ``symlinkat``, ``fstatat`` without following).
Symlinks are followed only by reading them and walking their target the same way, and only
while they stay inside the root: one that leads outside is refused (``OutsideRoot``) before
anything is opened. Operations on an entry itself (stat, remove, symlink) follow links only
in the parent; operations on content (read, write, edit, list, mkdir) follow the last
component too, so a symlink that points inside the workspace works. Writes go to a temp
file renamed into the (real) parent directory, so they replace the link's target and keep
the link.

A process inside the Space that swaps a directory for a symlink between two steps cannot
redirect an operation: every step holds the fd of the directory it checked. (What it can
still do is move a directory the daemon has open out of the workspace, if it may write
there; commands run with the daemon's user, so they could write there themselves anyway.)

Modes: a mode ``write_file`` is asked for is applied without its set-user-id, set-group-id
and sticky bits (a call never creates them; a command may); an overwrite or an edit keeps
the file's whole mode, as a shell's ``>`` does. ``resolve`` (the cwd of commands) is textual
(``realpath``): a command runs with the daemon's user anyway.
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
from .errors import BadRequest, Conflict, NotFound, OpError, OutsideRoot, TooLarge
from .fsio import AtomicWriter, StateDirError
from .protocol import MAX_READ_LIMIT

DEFAULT_FILE_MODE = 0o644
#: The mode bits a ``write_file`` call may ask for: set-user-id, set-group-id and sticky
#: are stripped from the mode it asks for (never from a mode an overwrite keeps).
PERMISSION_BITS = 0o777


@contextmanager
def os_errors(path: str) -> Iterator[None]:
    """Turn the OS's refusals into protocol errors that name ``path``."""
    try:
        yield
    except StateDirError:
        raise  # the daemon's disk, not the path's
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

    def walk(self, path: str, *, follow: bool, make_dirs: bool = False) -> paths.Walk:
        """``paths.Walk`` from this root (close it, or use ``with``)."""
        return paths.Walk(self.root, path, follow=follow, make_dirs=make_dirs)

    @contextmanager
    def _open(self, path: str, flags: int) -> Iterator[int]:
        """An fd of protocol ``path`` (followed while inside the root), closed after."""
        with os_errors(path):
            for attempt in range(3):
                with self.walk(path, follow=True) as w:
                    try:
                        fd = os.open(w.name, flags | os.O_NOFOLLOW | os.O_CLOEXEC,
                                     dir_fd=w.fd)
                        break
                    except OSError as exc:
                        # ELOOP: it became a link since the walk looked: walk again.
                        if exc.errno != errno.ELOOP or attempt == 2:
                            raise
        try:
            yield fd
        finally:
            os.close(fd)

    # ---------------------------------------------------------------- operations

    def read(self, path: str, offset: int = 0, limit: int | None = None) -> bytes:
        """Up to ``limit`` bytes from ``offset``; without a limit, the rest of the file,
        refused (``TooLarge``) when that is more than one answer carries."""
        with self._open(path, os.O_RDONLY | os.O_NONBLOCK) as fd, os_errors(path):
            _regular(path, fd)
            os.set_blocking(fd, True)
            if limit is None:
                rest = os.fstat(fd).st_size - offset
                if rest > MAX_READ_LIMIT:
                    raise TooLarge(f"read_file: {path!r} has {rest} bytes from offset {offset}, "
                                   f"more than one answer carries ({MAX_READ_LIMIT}); read it "
                                   "in parts with offset and limit", limit=MAX_READ_LIMIT)
                limit = MAX_READ_LIMIT
            with open(fd, "rb", closefd=False) as f:
                f.seek(offset)
                return f.read(limit)

    def read_size(self, path: str, offset: int, limit: int | None) -> int:
        """How many bytes ``read`` would answer with (0 if it would refuse)."""
        try:
            with self._open(path, os.O_RDONLY | os.O_NONBLOCK) as fd:
                rest = max(0, os.fstat(fd).st_size - offset)
        except (OpError, OSError):
            return 0
        return min(rest, MAX_READ_LIMIT if limit is None else limit)

    def write(self, path: str, data: bytes, mode: int | None = None) -> None:
        """Replace the file at ``path`` (made, with its parents, if missing). ``mode``: its
        permission bits, without set-user-id, set-group-id and sticky (default: the whole
        mode of the file it replaces, else 0o644)."""
        with os_errors(path), self.walk(path, follow=True, make_dirs=True) as w:
            try:
                st = os.stat(w.name, dir_fd=w.fd, follow_symlinks=False)
            except FileNotFoundError:
                st = None
            if st is not None and stat.S_ISDIR(st.st_mode):
                raise Conflict(f"{path!r} is a directory; name a file")
            if mode is not None:
                mode &= PERMISSION_BITS
            elif st is not None and stat.S_ISREG(st.st_mode):
                mode = stat.S_IMODE(st.st_mode)
            else:
                mode = DEFAULT_FILE_MODE
            self.writer.write(w.name, [data], mode=mode, dir_fd=w.fd)

    def edit(self, path: str, old: str, new: str) -> None:
        """Replace the one occurrence of ``old`` with ``new``."""
        if not old:
            raise BadRequest("edit_file: 'old' is empty; give the exact text to replace")
        with self._edit_lock, os_errors(path), self.walk(path, follow=True) as w:
            fd = os.open(w.name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK,
                         dir_fd=w.fd)
            with open(fd, "rb") as f:
                st = _regular(path, fd)
                os.set_blocking(fd, True)
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
            self.writer.write(w.name, [data], mode=stat.S_IMODE(st.st_mode), dir_fd=w.fd)

    def stat(self, path: str) -> dict[str, Any] | None:
        with os_errors(path):
            try:
                w = self.walk(path, follow=False)
            except (FileNotFoundError, NotADirectoryError):
                return None  # a missing parent
            with w:
                try:
                    st = os.stat(w.name, dir_fd=w.fd, follow_symlinks=False)
                except (FileNotFoundError, NotADirectoryError):
                    return None
                return paths.describe(path, w.name, st, dir_fd=w.fd)

    def list(self, path: str) -> list[dict[str, Any]]:
        out = []
        with self._open(path, os.O_RDONLY | os.O_DIRECTORY) as fd, os_errors(path), \
                os.scandir(fd) as it:
            for de in it:
                try:
                    st = de.stat(follow_symlinks=False)
                    entry = paths.describe(de.name, de.name, st, dir_fd=fd)
                except FileNotFoundError:
                    continue
                entry["name"] = entry.pop("path")
                out.append(entry)
        return sorted(out, key=lambda e: e["name"])

    def remove(self, path: str, recursive: bool = False) -> bool:
        """Remove a file, link or directory; False if there was nothing to remove."""
        if not paths.split_rel(path):
            raise BadRequest("remove: refusing to remove the workspace root; remove its "
                             "entries instead")
        with os_errors(path):
            try:
                w = self.walk(path, follow=False)
            except (FileNotFoundError, NotADirectoryError):
                return False  # a missing parent
            with w:
                return self._remove_at(path, w.fd, w.name, recursive)

    @staticmethod
    def _remove_at(path: str, dir_fd: int, name: str, recursive: bool) -> bool:
        try:
            st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
        except (FileNotFoundError, NotADirectoryError):
            return False
        if not stat.S_ISDIR(st.st_mode):
            os.unlink(name, dir_fd=dir_fd)
        elif recursive:
            shutil.rmtree(name, dir_fd=dir_fd)  # fd-based: never follows a link
        else:
            try:
                os.rmdir(name, dir_fd=dir_fd)
            except OSError as exc:
                if exc.errno != errno.ENOTEMPTY:
                    raise
                raise Conflict(f"directory {path!r} is not empty; pass recursive=true "
                               "to remove it with its contents") from None
        os.fsync(dir_fd)  # the entry is gone for good, also after a power loss
        return True

    def mkdir(self, path: str) -> None:
        with os_errors(path), self.walk(path, follow=True, make_dirs=True) as w:
            if w.name == ".":
                return
            try:
                os.mkdir(w.name, 0o777, dir_fd=w.fd)
                os.fsync(w.fd)  # the new entry survives a power loss
            except FileExistsError:
                st = os.stat(w.name, dir_fd=w.fd, follow_symlinks=False)
                if not stat.S_ISDIR(st.st_mode):
                    raise Conflict(f"{path!r} exists and is not a directory") from None

    def symlink(self, path: str, target: str) -> None:
        """Make ``path`` a link to ``target`` (replacing a file or link, like ``ln -sfn``).
        The target must stay inside the workspace counted from the link's real parent
        directory (``paths.check_link_target``)."""
        parts = paths.split_rel(path)
        if not parts:
            raise BadRequest("symlink: the workspace root cannot become a link")
        paths.check_link_target(parts, target)  # before making any directory
        with os_errors(path), self.walk(path, follow=False, make_dirs=True) as w:
            paths.check_link_target([*w.parts, w.name], target)
            self.symlink_at(path, w.fd, w.name, target)

    def symlink_at(self, path: str, dir_fd: int, name: str, target: str) -> None:
        """``symlink`` once ``name`` in ``dir_fd`` is known (and its target checked)."""
        try:
            st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
        except FileNotFoundError:
            st = None
        if st is not None and stat.S_ISDIR(st.st_mode):
            raise Conflict(f"{path!r} is a directory; remove it first")
        self.writer.symlink(name, target, dir_fd=dir_fd)


def _regular(path: str, fd: int) -> os.stat_result:
    """The stat of open ``fd``, which must be a regular file (a FIFO would block)."""
    st = os.fstat(fd)
    if stat.S_ISDIR(st.st_mode):
        raise Conflict(f"{path!r} is a directory; name a file")
    if not stat.S_ISREG(st.st_mode):
        raise Conflict(f"{path!r} is not a regular file")
    return st
