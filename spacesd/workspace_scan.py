"""The workspace scan: every entry under the root with its kind, mode, size and digest.

Speed comes from a stat cache: a file whose (inode, size, mtime_ns, ctime_ns) did not change
since it was hashed is not read again. One trap (git calls it "racy clean"): file timestamps
come from a coarse kernel clock, so a file rewritten with the same size within one clock
tick of its previous write keeps the same mtime and ctime. An entry is therefore cached only
when its ctime is older than ``RACY_NS`` before the scan began; a younger one is hashed
again next time. ctime cannot be set by ``touch``, so it also catches a restored mtime.
"""

from __future__ import annotations

import errno
import fnmatch
import hashlib
import json
import os
import stat
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from io import BufferedReader

from . import paths
from .protocol import ScanEntry

#: How much of a file one read takes while it is hashed (as ``hashlib.file_digest``).
_READ_CHUNK = 1 << 18
#: What opening a file that was replaced meanwhile (by a symlink, a socket) fails with.
_REPLACED = (errno.ELOOP, errno.ENXIO)
#: Several ticks of the coarsest kernel clock in use (HZ=100 is 10 ms per tick).
RACY_NS = 50_000_000
#: Why an entry the daemon's user may not read is no state it can keep.
UNREADABLE = ("the daemon's user may not read it (mode 000 on a Space whose daemon is not "
              "root), so its content cannot be kept; give its owner read access (chmod u+r, "
              "u+rx for a directory)")
#: Why an entry whose path is longer than the kernel takes is no state the daemon can keep.
TOO_LONG = ("its path is longer than the kernel takes (PATH_MAX, 4096 bytes with the "
            "workspace's own), so the daemon cannot reach it and its content cannot be kept; "
            "give it a shorter path (shorter names, fewer levels)")
#: The refusals whose entries hold content the state would lose (a socket or a device holds
#: none): a checkpoint refuses to be made without them.
CANNOT_READ = (UNREADABLE, TOO_LONG)
_CANNOT_READ = {errno.EACCES: UNREADABLE, errno.EPERM: UNREADABLE,
                errno.ENAMETOOLONG: TOO_LONG}


def _stat_key(st: os.stat_result) -> tuple[int, int, int, int]:
    return (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


@dataclass
class _Cached:
    key: tuple[int, int, int, int]
    sha256: str
    #: Its data extents when sparse (``data_extents``), None when dense.
    extents: tuple[tuple[int, int], ...] | None = None
    #: The scan entry made from it, kept so that a rescan allocates nothing for the file
    #: (the mode is part of it; a chmod changes ctime, so the key covers it too).
    entry: ScanEntry | None = None
    #: ``entry`` encoded as JSON, kept so that a rescan does not encode it again.
    json: bytes | None = None


def _encode(entry: ScanEntry) -> bytes:
    return json.dumps(entry.to_json(), separators=(",", ":")).encode()


def _digest_of(f: BufferedReader) -> tuple[str, int]:
    """(sha256, size) of what ``f`` holds from where it is to its end, as read."""
    h = hashlib.sha256()
    size = 0
    buf = bytearray(_READ_CHUNK)
    view = memoryview(buf)
    while got := f.readinto(view):
        h.update(view[:got])
        size += got
    return h.hexdigest(), size


def data_extents(fd: int, size: int) -> tuple[tuple[int, int], ...] | None:
    """The data extents of the open file ``fd`` of ``size`` bytes, as ``(offset,
    length)``; None when it has no hole (dense)."""
    out: list[tuple[int, int]] = []
    at = 0
    while at < size:
        try:
            start = os.lseek(fd, at, os.SEEK_DATA)
        except OSError as exc:
            if exc.errno == errno.ENXIO:  # only a hole from here to the end
                break
            if exc.errno == errno.EINVAL:  # no SEEK_DATA on this file system: dense
                return None
            raise
        end = min(os.lseek(fd, start, os.SEEK_HOLE), size)
        out.append((start, end - start))
        at = end
    if out == [(0, size)]:
        return None
    return tuple(out)


def excluded(rel: str, patterns: Sequence[str]) -> bool:
    """Whether ``rel`` matches one of the glob ``patterns`` (relative to the root; ``*``
    crosses '/', and ``dir/**`` excludes ``dir`` itself too)."""
    for pat in patterns:
        if fnmatch.fnmatchcase(rel, pat):
            return True
        if pat.endswith("/**") and rel == pat[:-3]:
            return True
    return False


class Scanner:
    def __init__(self, root: str) -> None:
        self.root = os.path.realpath(root)
        self._cache: dict[str, _Cached] = {}
        self._lock = threading.Lock()

    def walk(self, exclude: Sequence[str] | None = None, refused: list[str] | None = None, *,
             top: str = "", entering: Callable[[str], None] | None = None
             ) -> Iterator[tuple[str, os.stat_result]]:
        """(relative path, lstat) of every entry under ``top`` (the root by default),
        parents before children; an excluded directory is not entered. Entries vanishing
        meanwhile are skipped; one the walk cannot reach, whose content it therefore cannot
        know, is added to ``refused`` as ``"<path>: <why>"`` (``CANNOT_READ``): a directory
        the daemon's user may not read (mode 000 on a Space whose daemon is not root), a
        path longer than the kernel takes. ``entering`` is called with each directory
        before it is listed."""
        patterns = exclude or []
        stack = [top]
        while stack:
            rel_dir = stack.pop()
            if entering is not None:
                entering(rel_dir)
            try:
                it = os.scandir(os.path.join(self.root, rel_dir) if rel_dir else self.root)
            except (FileNotFoundError, NotADirectoryError):
                continue
            except OSError as exc:
                if exc.errno not in _CANNOT_READ:
                    raise
                if refused is not None:
                    refused.append(f"{rel_dir}: {_CANNOT_READ[exc.errno]}")
                continue
            with it:
                for de in it:
                    rel = f"{rel_dir}/{de.name}" if rel_dir else de.name
                    if patterns and excluded(rel, patterns):
                        continue
                    try:
                        st = de.stat(follow_symlinks=False)
                    except FileNotFoundError:
                        continue
                    except PermissionError:  # a directory without search permission
                        if refused is not None:
                            refused.append(f"{rel_dir}: {UNREADABLE}")
                        break
                    except OSError as exc:
                        if exc.errno != errno.ENAMETOOLONG:
                            raise
                        if refused is not None:
                            refused.append(f"{rel}: {TOO_LONG}")
                        continue
                    yield rel, st
                    if stat.S_ISDIR(st.st_mode):
                        stack.append(rel)

    def _content(self, rel: str, st: os.stat_result, scan_start_ns: int
                 ) -> tuple[str, int, tuple[tuple[int, int], ...] | None] | None:
        """(sha256, size, data extents) of the regular file ``rel``, all read through one fd
        (a hole punched between two reads would pair a digest with the wrong extents); from
        the cache when the file did not change; None if it vanished. The size is what was
        read, not ``st``'s: a file written to while read (a log appended to) has a digest
        of more or fewer bytes than its lstat said, and an entry pairing that digest with
        the lstat's size was a checkpoint no restore could take (its object's size is not
        the manifest's).

        The extents are sought after the whole file was read: a range allocated but never
        written (``fallocate`` past a hole) is a hole to ``SEEK_DATA`` on ext4 only while
        none of its pages is cached, so sought first it was a hole at the first scan and
        data at every later one (the reading had cached it), and states that were equal
        compared unequal (found driving the watched scan with real programs)."""
        key = _stat_key(st)
        cached = self._cache.get(rel)
        if cached is not None and cached.key == key:
            return cached.sha256, st.st_size, cached.extents
        full = os.path.join(self.root, rel)
        try:
            fd = os.open(full, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        except (FileNotFoundError, NotADirectoryError):
            return None
        except OSError as exc:
            if exc.errno in _REPLACED:
                return None  # replaced meanwhile by a symlink (ELOOP) or a socket (ENXIO)
            raise
        with open(fd, "rb") as f:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                return None  # replaced meanwhile (by a FIFO, say): not this file
            os.set_blocking(fd, True)
            sha, size = _digest_of(f)
            extents = data_extents(fd, size) if st.st_blocks * 512 < size else None
            after = os.fstat(fd)
        if _stat_key(after) != key or size != st.st_size:
            extents = None  # it changed while read: its holes are unknown, say none
        # Cached only if it did not change while being read, and is out of the racy window.
        elif after.st_ctime_ns < scan_start_ns - RACY_NS:
            with self._lock:
                self._cache[rel] = _Cached(key, sha, extents)
        return sha, size, extents

    def _file_entry(self, rel: str, st: os.stat_result, scan_start_ns: int) -> ScanEntry | None:
        cached = self._cache.get(rel)
        if cached is not None and cached.entry is not None and cached.key == _stat_key(st):
            return cached.entry
        try:
            content = self._content(rel, st, scan_start_ns)
        except (FileNotFoundError, NotADirectoryError):
            return None
        if content is None:
            return None
        sha, size, extents = content
        entry = ScanEntry(rel, "file", paths.is_exec(st.st_mode), size, sha256=sha,
                          mode=stat.S_IMODE(st.st_mode), mtime_ns=st.st_mtime_ns,
                          extents=extents)
        cached = self._cache.get(rel)
        if cached is not None and cached.key == _stat_key(st):
            cached.entry = entry
        return entry

    def entry_of(self, rel: str, st: os.stat_result, scan_start_ns: int
                 ) -> tuple[ScanEntry | None, str | None]:
        """(the entry of ``rel`` whose lstat is ``st``, why it is refused): one of the two,
        or neither when it vanished meanwhile. Without its hardlink group (``link``)."""
        kind = paths.kind_of(st.st_mode)
        if kind == "file":
            try:
                return self._file_entry(rel, st, scan_start_ns), None
            except PermissionError:
                return None, f"{rel}: {UNREADABLE}"
        if kind == "symlink":
            try:
                return ScanEntry(rel, "symlink", target=os.readlink(
                    os.path.join(self.root, rel)), mtime_ns=st.st_mtime_ns), None
            except (FileNotFoundError, NotADirectoryError):
                return None, None
            except OSError as exc:
                if exc.errno == errno.EINVAL:  # replaced meanwhile by what is no link
                    return None, None
                raise
        if kind in ("dir", "fifo"):
            return ScanEntry(rel, kind, mode=stat.S_IMODE(st.st_mode),
                             mtime_ns=st.st_mtime_ns), None
        return None, f"{rel}: {paths.unkept_kind(st.st_mode)}"

    def scan(self, exclude: list[str] | None = None) -> tuple[list[ScanEntry], list[str]]:
        """(entries sorted by path, refused entries, each ``"<path>: <why>"``)."""
        start_ns = time.time_ns()
        entries: list[ScanEntry] = []
        refused: list[str] = []
        inodes: dict[tuple[int, int], list[int]] = {}  # hardlink groups: entry indices
        for rel, st in self.walk(exclude, refused):
            entry, why = self.entry_of(rel, st, start_ns)
            if why is not None:
                refused.append(why)
            if entry is None:
                continue
            if entry.kind == "file" and st.st_nlink > 1:
                inodes.setdefault((st.st_dev, st.st_ino), []).append(len(entries))
            entries.append(entry)
        for group in inodes.values():
            if len(group) > 1:
                first = min(entries[i].path for i in group)
                for i in group:
                    if entries[i].path != first:
                        entries[i] = replace(entries[i], link=first)
        self._prune({e.path for e in entries}, exclude or [])
        entries.sort(key=lambda e: e.path)
        refused.sort()
        return entries, refused

    def encode(self, entries: list[ScanEntry]) -> bytes:
        """``entries`` as a JSON array. Half the cost of a rescan was encoding (and the
        other half decoding on the host): an unchanged file's encoding is reused."""
        parts = []
        for e in entries:
            cached = self._cache.get(e.path) if e.kind == "file" else None
            if cached is not None and cached.entry is e:
                if cached.json is None:
                    cached.json = _encode(e)
                parts.append(cached.json)
            else:
                parts.append(_encode(e))
        return b"[" + b",".join(parts) + b"]"

    def forget(self, rel: str) -> None:
        """Drop what the cache knows of ``rel`` (it is gone)."""
        with self._lock:
            self._cache.pop(rel, None)

    def _prune(self, seen: set[str], exclude: list[str]) -> None:
        """Forget files that are gone (those merely excluded from this scan stay)."""
        with self._lock:
            for rel in [r for r in self._cache if r not in seen]:
                if not excluded(rel, exclude):
                    del self._cache[rel]
