"""Linux inotify through ctypes (the standard library has no binding).

Only what the watched scan needs: an instance, watches added and removed by path, and the
events queued so far read without blocking. Events are read whole: the kernel never splits
one across two reads of a buffer at least one event long.
"""

from __future__ import annotations

import errno
import os
import struct
from dataclasses import dataclass
from typing import Any

IN_ACCESS = 0x001
IN_MODIFY = 0x002
IN_ATTRIB = 0x004
IN_CLOSE_WRITE = 0x008
IN_MOVED_FROM = 0x040
IN_MOVED_TO = 0x080
IN_CREATE = 0x100
IN_DELETE = 0x200
IN_DELETE_SELF = 0x400
IN_MOVE_SELF = 0x800
IN_UNMOUNT = 0x2000
IN_Q_OVERFLOW = 0x4000
IN_IGNORED = 0x8000
IN_ONLYDIR = 0x1000000
IN_DONT_FOLLOW = 0x2000000
IN_ISDIR = 0x40000000

_IN_NONBLOCK = os.O_NONBLOCK
_IN_CLOEXEC = os.O_CLOEXEC
_HEADER = struct.Struct("iIII")  # wd, mask, cookie, len
_READ_SIZE = 1 << 16


@dataclass(frozen=True)
class Event:
    wd: int
    mask: int
    #: The entry's name inside a watched directory; "" for an event of the watched inode.
    name: str


class InotifyUnavailable(OSError):
    """No inotify here (not Linux, no libc symbol, or the instance limit was reached)."""


def _libc() -> Any:
    """libc through ctypes, imported here: a Python built without ctypes (a minimal
    guest) still runs the daemon, whose scans then walk (``InotifyUnavailable``)."""
    import ctypes
    import ctypes.util

    name = ctypes.util.find_library("c") or "libc.so.6"
    libc = ctypes.CDLL(name, use_errno=True)
    for fn in ("inotify_init1", "inotify_add_watch", "inotify_rm_watch"):
        if not hasattr(libc, fn):
            raise InotifyUnavailable(errno.ENOSYS, f"libc has no {fn}")
    libc.inotify_add_watch.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_uint32]
    libc.inotify_rm_watch.argtypes = [ctypes.c_int, ctypes.c_int]
    return libc


def _errno() -> int:
    import ctypes

    return ctypes.get_errno()


class Inotify:
    """One inotify instance; close it (or use it as a context manager)."""

    def __init__(self) -> None:
        try:
            self._libc = _libc()
        except (ImportError, OSError) as exc:
            raise InotifyUnavailable(errno.ENOSYS, f"no inotify: {exc}") from exc
        fd = self._libc.inotify_init1(_IN_NONBLOCK | _IN_CLOEXEC)
        if fd < 0:
            err = _errno()
            raise InotifyUnavailable(err, f"inotify_init1: {os.strerror(err)}")
        self.fd: int = fd

    def add_watch(self, path: str, mask: int) -> int:
        """The watch descriptor of ``path``'s inode (the same one for every name of an
        inode already watched: the mask then replaces the old one). Raises OSError."""
        wd = self._libc.inotify_add_watch(self.fd, os.fsencode(path), mask)
        if wd < 0:
            err = _errno()
            raise OSError(err, os.strerror(err), path)
        return int(wd)

    def rm_watch(self, wd: int) -> None:
        """Remove a watch; one already gone (its inode was deleted) is no error."""
        self._libc.inotify_rm_watch(self.fd, wd)

    def read(self) -> list[Event]:
        """Every event queued so far, oldest first; [] when none is."""
        events: list[Event] = []
        while True:
            try:
                buf = os.read(self.fd, _READ_SIZE)
            except BlockingIOError:
                return events
            at = 0
            while at < len(buf):
                wd, mask, _cookie, length = _HEADER.unpack_from(buf, at)
                at += _HEADER.size
                name = buf[at:at + length].rstrip(b"\0")
                at += length
                events.append(Event(wd, mask, os.fsdecode(name)))

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def __enter__(self) -> Inotify:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
