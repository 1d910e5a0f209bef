"""The rules for paths the protocol accepts, shared by file ops, scans and checkpoints.

A protocol path is relative to the workspace root, '/'-separated, never absolute, never
climbing with ``..``, and free of NUL (which no Linux name holds). Any other byte is a name's
own: newline, carriage return, backslash (what unzip leaves of a Windows archive), a leading
dash, bytes that are not UTF-8 (carried as ``os.fsdecode`` does, surrogate escapes, which
JSON escapes as ``\\udcXX``). The workspace hash and every record of a name are JSON, so no
name is ambiguous in them.

``Walk`` resolves a protocol path without a window between check and use: it opens each
directory with ``O_NOFOLLOW | O_DIRECTORY`` relative to the fd of the one before, starting
at an fd of the root, and follows a symlink only by reading it (``readlink`` at the
directory fd) and walking its target the same way, so a ``..`` that would climb above the
root, or an absolute target outside it, is refused. A process that swaps a directory for a
symlink after a step cannot redirect it: the step already holds the directory's fd.

Symlink targets (``check_link_target``): relative, inside the workspace counted from the
link's *real* parent directory, and of the form ``../../name/name`` (every ``..`` first).
A ``..`` after a name is refused because that name may be, or later become, a symlink (the
``a/b -> ..`` then ``a/b/c -> ..`` chain): with every ``..`` first, each link lands inside
the workspace whatever the other links are.
"""

from __future__ import annotations

import errno
import os
import re
import stat
from typing import Any, Literal, Self

from .errors import OutsideRoot
from .protocol import EntryKind

_NOT_A_NAME = re.compile("[\x00\ud800-\udc7f\udd00-\udfff]")


def bad_char(name: str) -> str | None:
    """What makes ``name`` no Linux name, or None: a NUL byte, or a surrogate that stands
    for no byte (``os.fsdecode`` makes only U+DC80..U+DCFF, one per byte that is not
    UTF-8)."""
    found = _NOT_A_NAME.search(name)
    if found is None:
        if name.isascii() or os.fsdecode(os.fsencode(name)) == name:
            return None
        # Escapes of bytes that form UTF-8 (\udcc3\udca9 for "é"): another spelling of a
        # name that has its own, which scans report; two spellings would be two entries.
        return "surrogate escapes of bytes that are UTF-8 (spell the name as text)"
    return "a NUL byte" if found.group() == "\x00" else (
        f"the lone surrogate U+{ord(found.group()):04X}, which stands for no byte")


def split_rel(path: str) -> list[str]:
    """The components of a protocol path (``""`` and ``"."`` are the root itself)."""
    if path.startswith("/"):
        raise OutsideRoot(f"path {path!r} is absolute; give a path relative to the "
                          "workspace root")
    what = bad_char(path)
    if what:
        raise OutsideRoot(f"path {path!r} contains {what}; such names are not allowed")
    parts = [p for p in path.split("/") if p not in ("", ".")]
    if ".." in parts:
        raise OutsideRoot(f"path {path!r} climbs with '..'; give a path inside the "
                          "workspace without '..'")
    return parts


def check_link_target(rel_parts: list[str], target: str) -> None:
    """Refuse a symlink target that leads outside the root from the link at ``rel_parts``
    (the link's path with its *real* parent directory: ``Walk.parts`` plus its name)."""
    what = bad_char(target)
    if not target or what:
        raise OutsideRoot(f"symlink target {target!r} is empty or contains {what}")
    if target.startswith("/"):
        raise OutsideRoot(f"symlink target {target!r} is absolute; use a target relative "
                          "to the link, inside the workspace")
    comps = [c for c in target.split("/") if c not in ("", ".")]
    ups = 0
    while ups < len(comps) and comps[ups] == "..":
        ups += 1
    if ".." in comps[ups:]:
        raise OutsideRoot(f"symlink target {target!r} climbs with '..' after a name; put "
                          "every '..' first (like '../../dir/file')")
    if ups > len(rel_parts) - 1:
        raise OutsideRoot(f"symlink target {target!r} leads outside the workspace")


MAX_LINKS = 40
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def _link_at(name: str, dir_fd: int) -> str | None:
    """The target of ``name`` in ``dir_fd`` if it is a symlink, None if it is not."""
    try:
        return os.readlink(name, dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno == errno.EINVAL:
            return None
        raise


class Walk:
    """An open chain of directories from the workspace root to the (real) parent of a path.

    ``Walk(root, path, follow=..., make_dirs=...)`` walks protocol ``path``; then ``fd`` is
    the parent directory's fd and ``name`` the last component (not opened, maybe missing;
    ``"."`` when the path is a directory reached as a whole, like the root), ``parts`` the
    real parent's path from the root. ``follow``: a symlink as last component is followed
    too (content ops); else it is the entry itself (stat, remove, symlink). ``make_dirs``:
    missing parent directories are created. Symlinks along the way are followed when they
    stay inside the root, else ``OutsideRoot``; a missing parent raises FileNotFoundError
    and a file as parent NotADirectoryError (as the OS would). Close it (or use ``with``).
    """

    def __init__(self, root: str, path: str, *, follow: bool, make_dirs: bool = False,
                 parts: list[str] | None = None) -> None:
        self.root = root
        self.path = path
        self._stack: list[tuple[int, str]] = [
            (os.open(root, _DIR_FLAGS), "")]
        try:
            self.name = self._walk(split_rel(path) if parts is None else list(parts),
                                   follow=follow, make_dirs=make_dirs)
        except BaseException:
            self.close()
            raise

    @property
    def fd(self) -> int:
        return self._stack[-1][0]

    @property
    def parts(self) -> list[str]:
        return [name for _, name in self._stack[1:]]

    def close(self) -> None:
        while self._stack:
            os.close(self._stack.pop()[0])

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _outside(self) -> OutsideRoot:
        return OutsideRoot(f"path {self.path!r} leads outside the workspace through a "
                           "symlink; use a path inside it")

    def _expand(self, target: str, todo: list[str]) -> list[str]:
        """The components left to walk after following a link to ``target``."""
        self._links += 1
        if self._links > MAX_LINKS:
            raise OSError(errno.ELOOP, "too many levels of symbolic links", self.path)
        if target.startswith("/"):
            if not inside(target, self.root):
                raise self._outside()
            while len(self._stack) > 1:  # an absolute link into the workspace: restart
                os.close(self._stack.pop()[0])
            target = target[len(self.root):]
        return target.split("/") + todo

    def _walk(self, todo: list[str], *, follow: bool, make_dirs: bool) -> str:
        self._links = 0
        made = 0  # retries: directories made, or entries that changed kind meanwhile
        while todo:
            name = todo.pop(0)
            if name in ("", "."):
                if not todo:
                    return "."
                continue
            if name == "..":
                if len(self._stack) == 1:
                    raise self._outside()
                os.close(self._stack.pop()[0])
                if not todo:
                    return "."
                continue
            if not todo:  # the last component
                if not follow:
                    return name
                try:
                    target = _link_at(name, self.fd)
                except FileNotFoundError:
                    return name
                if target is None:
                    return name
                todo = self._expand(target, todo)
                continue
            try:
                fd = os.open(name, _DIR_FLAGS, dir_fd=self.fd)
            except FileNotFoundError:
                if not make_dirs or made > MAX_LINKS:
                    raise
                made += 1
                try:
                    os.mkdir(name, 0o777, dir_fd=self.fd)
                    os.fsync(self.fd)  # the new entry survives a power loss
                except FileExistsError:
                    pass
                todo.insert(0, name)
                continue
            except OSError as exc:
                if exc.errno not in (errno.ENOTDIR, errno.ELOOP):
                    raise
                target = _link_at(name, self.fd)
                if target is None:
                    st = os.stat(name, dir_fd=self.fd, follow_symlinks=False)
                    if not stat.S_ISDIR(st.st_mode) or made > MAX_LINKS:
                        raise
                    made += 1  # a link a moment ago, a directory now: look again
                    todo.insert(0, name)
                    continue
                todo = self._expand(target, todo)
                continue
            self._stack.append((fd, name))
        return "."


def inside(real: str, root: str) -> bool:
    """Whether the resolved path ``real`` is ``root`` or under it."""
    return real == root or real.startswith(root.rstrip("/") + "/")


def kind_of(mode: int) -> EntryKind | Literal["other"]:
    if stat.S_ISREG(mode):
        return "file"
    if stat.S_ISDIR(mode):
        return "dir"
    if stat.S_ISLNK(mode):
        return "symlink"
    if stat.S_ISFIFO(mode):
        return "fifo"
    return "other"


def unkept_kind(mode: int) -> str:
    """Why an entry of this mode is no workspace state (``kind_of`` says ``other``)."""
    what = ("a socket" if stat.S_ISSOCK(mode) else "a character device" if stat.S_ISCHR(mode)
            else "a block device" if stat.S_ISBLK(mode) else "of an unknown file type")
    return (f"{what}: no Space keeps one across a restore; remove it (a program's socket "
            "belongs in /tmp, outside the workspace)")


def is_exec(mode: int) -> bool:
    """The exec bit that counts in the workspace hash: the owner's."""
    return bool(mode & stat.S_IXUSR)


def describe(path: str, full: str, st: os.stat_result,
             dir_fd: int | None = None) -> dict[str, Any]:
    """The protocol's description of one entry (``stat``, ``list_dir``); ``full`` is
    relative to ``dir_fd`` when that is given."""
    kind = kind_of(st.st_mode)
    return {
        "path": path,
        "kind": kind,
        "size": st.st_size if kind == "file" else 0,
        "mode": stat.S_IMODE(st.st_mode),
        "exec": kind == "file" and is_exec(st.st_mode),
        "mtime_ns": st.st_mtime_ns,
        "target": os.readlink(full, dir_fd=dir_fd) if kind == "symlink" else None,
    }
