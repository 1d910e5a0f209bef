"""Scans that cost what changed: the workspace state kept between scans, brought up to date
from inotify events, and answered as its difference since a token the client holds.

The first scan walks the whole workspace (as ``Scanner.scan`` does) and watches every
directory, and every file, FIFO and symlink on its own inode. A later scan reads the events
queued since and looks again only at the paths they name: an entry's name, its directory
(whose mtime a create or delete changes) and, for an event on an inode's own watch, every
name of that inode (a write through one hardlink changes the others; a link made from
outside the workspace changes the link count). A directory that appears, moves in or is
replaced is walked again, with its whole subtree. Looking again at a path that did not
change costs an lstat and is harmless; the state is therefore always what a full scan
would answer, provided every change made a kernel event, which is what watching each inode
as well as its directory is for.

A scan is a full walk again whenever the events cannot be trusted: the first scan of a
daemon (a restarted daemon starts empty, so tokens of the last one are unknown to it), an
event queue that overflowed (``fs.inotify.max_queued_events``), a change that raced the
scan itself, another exclude list asked for twice in a row (once, it gets a walk of its own
and leaves the kept state alone), the workspace root replaced, or mounts inside it that
came or went. While it cannot watch, every scan walks, and it tries again every
``RETRY_WATCH_EVERY`` scans: a mount inside the workspace (changes under it make no events
here), a path the daemon's user may not read, more entries than ``budget`` (a watch per
entry, at most a quarter of ``fs.inotify.max_user_watches``: the limit is shared by all
of the user's processes, the programs in the Space among them) or the limit reached, or
no inotify (``fs.inotify.max_user_instances``).

What inotify cannot see, and a full scan can: a write through a shared memory map of a file
whose every descriptor was closed before the write (a mapping of a file still open is seen
when it is closed), and changes made by another machine to a network file system.
"""

from __future__ import annotations

import errno
import os
import secrets
import stat
import threading
import time
from collections import deque
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace

from . import inotify
from .mount_table import MountWatch
from .protocol import ScanEntry
from .workspace_scan import UNREADABLE, Scanner, excluded

_DIR_MASK = (inotify.IN_MODIFY | inotify.IN_ATTRIB | inotify.IN_CLOSE_WRITE
             | inotify.IN_MOVED_FROM | inotify.IN_MOVED_TO | inotify.IN_CREATE
             | inotify.IN_DELETE | inotify.IN_DELETE_SELF | inotify.IN_MOVE_SELF
             | inotify.IN_ONLYDIR | inotify.IN_DONT_FOLLOW)
_INODE_MASK = (inotify.IN_MODIFY | inotify.IN_ATTRIB | inotify.IN_CLOSE_WRITE
               | inotify.IN_DONT_FOLLOW)
#: Events that make or take a name: with IN_ISDIR, a whole subtree came or went.
_STRUCTURAL = (inotify.IN_CREATE | inotify.IN_DELETE | inotify.IN_MOVED_FROM
               | inotify.IN_MOVED_TO)
_ROOT_GONE = inotify.IN_DELETE_SELF | inotify.IN_MOVE_SELF | inotify.IN_UNMOUNT
#: How many scans back a token is still answered as a difference.
HISTORY = 32
RETRY_WATCH_EVERY = 32
NOT_WATCHING = "not watching"


@dataclass(frozen=True)
class ScanAnswer:
    #: Names this state for a later ``since``; None when no later scan can start from it.
    token: str | None
    #: True: ``entries`` is the whole state; False: only the entries that changed since
    #: the token the request gave, and ``removed`` the paths that left the state.
    full: bool
    entries: list[ScanEntry]
    removed: list[str]
    refused: list[str]


@dataclass
class _Node:
    dev: int
    ino: int
    nlink: int
    mode: int
    #: The watch on this inode (directories, files and FIFOs), None when it has none.
    wd: int | None = None


def _entry_hash(e: ScanEntry | None) -> int:
    """A 64-bit hash of everything an entry says (0 for none); stable within a process,
    which is all a token's digest needs (another daemon process has another boot)."""
    if e is None:
        return 0
    return hash((e.path, e.kind, e.exec, e.size, e.sha256, e.target, e.mode, e.mtime_ns,
                 e.link, e.extents)) & 0xFFFF_FFFF_FFFF_FFFF


def _watch_budget() -> int:
    try:
        with open("/proc/sys/fs/inotify/max_user_watches") as f:
            return max(int(f.read()) // 4, 1)
    except (OSError, ValueError):
        return 8192 // 4  # the kernel's old default limit


def _ancestors(p: str) -> Iterator[str]:
    """``a/b/c`` -> ``a/b``, ``a``."""
    while "/" in p:
        p = p.rpartition("/")[0]
        yield p


class _Unwatchable(Exception):
    """A path of the workspace cannot be watched: full scans until a rebuild succeeds."""


class WatchedScan:
    """The workspace state of ``scanner``'s root, kept up to date by inotify. One lock
    serialises scans; ``close`` ends the inotify instance."""

    def __init__(self, scanner: Scanner) -> None:
        self.scanner = scanner
        self._root = scanner.root
        self._lock = threading.Lock()
        self._boot = secrets.token_hex(8)
        self._gen = 0
        #: XOR of ``_entry_hash`` over the state: kept as entries change, in each token.
        self._digest = 0
        #: (generation, the paths that changed to reach it, its digest), oldest first.
        self._history: deque[tuple[int, frozenset[str], int]] = deque(maxlen=HISTORY)
        # What the last answer said (with hardlink groups applied).
        self._entries: dict[str, ScanEntry] = {}
        self._refused: dict[str, str] = {}
        # What the watched state needs besides; empty while not watching.
        self._exclude: tuple[str, ...] | None = None
        self._nodes: dict[str, _Node] = {}
        self._children: dict[str, set[str]] = {}
        self._dir_wds: dict[int, str] = {}
        self._inode_wds: dict[int, set[str]] = {}
        self._inodes: dict[tuple[int, int], set[str]] = {}  # hardlink groups
        self._ino: inotify.Inotify | None = None
        self._watching = False
        self._unwatched_scans = 0
        #: Why the last scan was a full walk ("" when it was not): for tests and benches.
        self.last_walk = ""
        # Per scan: the old entry of every path touched, the groups and watches touched.
        self._before: dict[str, ScanEntry | None] = {}
        self._groups: set[tuple[int, int]] = set()
        self._orphans: set[int] = set()
        self._unwatched_why = ""
        #: The most watches one workspace takes: a quarter of the user's limit.
        self.budget = _watch_budget()
        #: The exclude list of the last request (see ``scan``).
        self._asked: tuple[str, ...] | None = None
        #: The root's identity and the mounts inside it, as of the last full walk.
        self._marks: tuple[tuple[int, int], tuple[str, ...]] = ((0, 0), ())
        self._mount_watch = MountWatch()

    # ------------------------------------------------------------------ the answer

    def scan(self, exclude: Sequence[str] | None = None, since: str | None = None, *,
             passing: bool = False) -> ScanAnswer:
        """The state, whole or as its difference since ``since``. The state is kept for one
        exclude list: another list gets a full walk of its own, with no token, unless it is
        asked for twice in a row (the adapter scans before and after each call with its
        list; a checker's scan in between does not take the state away). ``passing``: this
        request never takes the state to its list, nor counts as asked (a checkpoint's
        scan, which excludes nothing, between the adapter's with its list)."""
        with self._lock:
            start_ns = time.time_ns()
            patterns = tuple(exclude or ())
            asked = self._asked
            if not passing:
                self._asked = patterns
            if self._gen and patterns != self._exclude and (patterns != asked or passing):
                entries, refused = self.scanner.scan(list(patterns))
                self.last_walk = "another exclude list, once"
                return ScanAnswer(None, True, entries, [], refused)
            if self._watching and patterns == self._exclude:
                why = self._marks_changed()
                changed = (self._update(start_ns) if not why else
                           self._rebuild(patterns, start_ns, why))
            else:
                changed = self._rebuild(patterns, start_ns,
                                        "first scan" if self._gen == 0 else
                                        "another exclude list" if patterns != self._exclude
                                        else f"{NOT_WATCHING}: {self._unwatched_why}")
            self._gen += 1
            self._history.append((self._gen, frozenset(changed), self._digest))
            return self._answer(since)

    def close(self) -> None:
        with self._lock:
            self._unwatch()
            self._mount_watch.close()
            self._entries, self._refused = {}, {}

    def _answer(self, since: str | None) -> ScanAnswer:
        token = f"{self._boot}.{self._gen}.{self._digest:x}"
        refused = sorted(self._refused.values())
        paths = self._changed_since(since)
        if paths is None:
            entries = sorted(self._entries.values(), key=lambda e: e.path)
            return ScanAnswer(token, True, entries, [], refused)
        changed = sorted(p for p in paths if p in self._entries)
        removed = sorted(p for p in paths if p not in self._entries)
        return ScanAnswer(token, False, [self._entries[p] for p in changed], removed, refused)

    def _changed_since(self, since: str | None) -> set[str] | None:
        """The paths that changed since the state ``since`` named, None if it is not one
        this daemon still knows. The token's digest must be the one this daemon had at
        that generation: a daemon brought back from a machine checkpoint has the same boot
        and counts the same generations again, but not through the same states."""
        boot, gen_text, digest_text = ((since or "").split(".") + ["", ""])[:3]
        if boot != self._boot or not gen_text.isdigit():
            return None
        gen = int(gen_text)
        known = [d for g, _, d in self._history if g == gen]
        if not known or f"{known[0]:x}" != digest_text:
            return None
        paths: set[str] = set()
        for g, changed, _ in self._history:
            if g > gen:
                paths |= changed
        return paths

    # ------------------------------------------------------------------ full walks

    def _rebuild(self, patterns: tuple[str, ...], start_ns: int, why: str) -> set[str]:
        """Walk the whole workspace again (watched if it can be); the paths whose entry
        differs from the last answer. If it raises, the last answer stays the state."""
        old_entries, old_refused = self._entries, self._refused
        self._unwatch()
        self._entries, self._refused = {}, {}
        self._exclude = patterns
        self._unwatched_scans += 1
        try:
            if (self._unwatched_scans >= RETRY_WATCH_EVERY
                    or not why.startswith(NOT_WATCHING)):
                try:
                    self._walk_watched(patterns, start_ns)
                    self._watching = True
                    self._unwatched_scans = 0
                except _Unwatchable as exc:
                    why = f"{why}; cannot watch: {exc}"
                    self._unwatched_why = f"cannot watch: {exc}"
                    self._unwatch()
                    self._entries, self._refused = {}, {}
            if not self._watching:
                entries, refused = self.scanner.scan(list(patterns))
                self._entries = {e.path: e for e in entries}
                self._refused = {r: r for r in refused}
        except BaseException:
            self._unwatch()
            self._entries, self._refused = old_entries, old_refused
            self._unwatched_scans = RETRY_WATCH_EVERY  # the next scan tries watching again
            raise
        self.last_walk = why
        self._digest = 0
        for e in self._entries.values():
            self._digest ^= _entry_hash(e)
        return {p for p in old_entries.keys() | self._entries.keys()
                if old_entries.get(p) != self._entries.get(p)}

    def _walk_watched(self, patterns: tuple[str, ...], start_ns: int) -> None:
        self._marks = self._read_marks()
        if self._marks[1]:
            raise _Unwatchable(f"a mount inside the workspace, at {self._marks[1][0]!r}: "
                               "its changes make no events here")
        try:
            self._ino = inotify.Inotify()
        except inotify.InotifyUnavailable as exc:
            raise _Unwatchable(str(exc)) from exc
        self._children[""] = set()
        self._add_tree("", None, start_ns)
        self._apply_groups()

    def _unwatch(self) -> None:
        if self._ino is not None:
            self._ino.close()  # every watch goes with the instance
            self._ino = None
        self._watching = False
        self._nodes, self._children = {}, {}
        self._dir_wds, self._inode_wds, self._inodes = {}, {}, {}
        self._groups, self._orphans = set(), set()

    # ------------------------------------------------------------------ updates

    def _update(self, start_ns: int) -> set[str]:
        assert self._ino is not None
        self._before.clear()
        dirty: dict[str, bool] = {}  # path -> whether its subtree must be walked again
        for ev in self._ino.read():
            if ev.mask & inotify.IN_Q_OVERFLOW:
                return self._rebuild(self._exclude or (), start_ns, "event queue overflow")
            if ev.mask & inotify.IN_IGNORED:
                self._forget_wd(ev.wd)
                continue
            d = self._dir_wds.get(ev.wd)
            if d is not None:
                if ev.name:
                    p = f"{d}/{ev.name}" if d else ev.name
                    whole = bool(ev.mask & inotify.IN_ISDIR and ev.mask & _STRUCTURAL)
                    dirty[p] = dirty.get(p, False) or whole
                    if d:
                        dirty.setdefault(d, False)
                elif not d and ev.mask & (_ROOT_GONE | inotify.IN_ATTRIB):
                    return self._rebuild(self._exclude or (), start_ns,
                                         "the workspace root itself changed")
                elif d:
                    dirty[d] = dirty.get(d, False) or bool(ev.mask & _ROOT_GONE)
            for p in self._inode_wds.get(ev.wd, ()):
                dirty.setdefault(p, False)
        try:
            walked: set[str] = set()
            for p in sorted(dirty, key=lambda p: (p.count("/"), p)):
                if any(a in walked for a in _ancestors(p)):
                    continue  # walked with its directory this scan
                if self._refresh(p, dirty[p], start_ns):
                    walked.add(p)
            self._apply_groups()
            self._drop_orphans()
        except (OSError, _Unwatchable) as exc:  # unwatchable, or changed mid-scan
            for p, old in self._before.items():  # the last answer, the rebuild's base
                if old is None:
                    self._entries.pop(p, None)
                else:
                    self._entries[p] = old
            why = (f"cannot watch: {exc}" if isinstance(exc, _Unwatchable) else
                   f"an update failed: {exc!r}")
            return self._rebuild(self._exclude or (), start_ns, why)
        self.last_walk = ""
        changed = set()
        for p, old in self._before.items():
            new = self._entries.get(p)
            if old != new:
                changed.add(p)
                self._digest ^= _entry_hash(old) ^ _entry_hash(new)
        return changed

    def _refresh(self, p: str, subtree: bool, start_ns: int) -> bool:
        """Bring ``p`` up to date; True when its subtree was walked again."""
        parent = p.rpartition("/")[0]
        if parent not in self._children or excluded(p, self._exclude or ()):
            self._drop(p)  # its directory is gone, or it is not state
            return False
        try:
            st = os.lstat(os.path.join(self._root, p))
        except (FileNotFoundError, NotADirectoryError):
            self._drop(p)
            return False
        except PermissionError as exc:
            raise _Unwatchable(f"{p}: {exc.strerror}") from exc
        old = self._nodes.get(p)
        if stat.S_ISDIR(st.st_mode):
            if (old is not None and not subtree and p in self._children
                    and (old.dev, old.ino) == (st.st_dev, st.st_ino)):
                if old.mode != st.st_mode and not os.access(
                        os.path.join(self._root, p), os.R_OK | os.X_OK):
                    raise _Unwatchable(f"{p}: {UNREADABLE}")
                self._put(p, st, start_ns, old.wd)  # its own entry: its children have theirs
                return False
            self._drop(p)
            self._add_tree(p, st, start_ns)
            return True
        if p in self._children:
            self._drop(p)  # a directory replaced by a file
        self._put_leaf(p, st, start_ns)
        return False

    # ------------------------------------------------------------------ the state

    def _add_tree(self, top: str, st: os.stat_result | None, start_ns: int) -> None:
        """Add the directory ``top`` (lstat ``st``; None for the root) and everything under
        it, each directory watched before it is listed."""
        if st is not None:
            self._put(top, st, start_ns, None)
            self._children[top] = set()
        unreachable: list[str] = []
        for rel, cst in self.scanner.walk(self._exclude, unreachable, top=top,
                                           entering=self._entering):
            if stat.S_ISDIR(cst.st_mode):
                self._put(rel, cst, start_ns, None)
                self._children[rel] = set()
            else:
                self._put_leaf(rel, cst, start_ns)
        if unreachable:
            raise _Unwatchable(unreachable[0])

    def _entering(self, rel: str) -> None:
        """Watch the directory ``rel`` before it is listed, then take its lstat again:
        whatever changes from here on makes an event."""
        full = os.path.join(self._root, rel) if rel else self._root
        wd = self._watch(full, _DIR_MASK)
        if wd is None:
            return  # gone meanwhile: its directory's event says so
        self._dir_wds[wd] = rel
        if not rel:
            return
        try:
            st = os.lstat(full)
        except (FileNotFoundError, NotADirectoryError):
            return
        self._put(rel, st, start_ns=time.time_ns(), wd=wd)

    def _put_leaf(self, p: str, st: os.stat_result, start_ns: int) -> None:
        """A file, FIFO, symlink or refused entry: all but the refused watched on their own
        inode first (a change through another name makes an event: a hardlink from
        outside, ``touch -h`` through a hardlinked symlink), then taken again."""
        wd = None
        if stat.S_ISREG(st.st_mode) or stat.S_ISFIFO(st.st_mode) or stat.S_ISLNK(st.st_mode):
            full = os.path.join(self._root, p)
            wd = self._watch(full, _INODE_MASK)
            again: os.stat_result | None = None
            if wd is not None:
                try:
                    again = os.lstat(full)
                except (FileNotFoundError, NotADirectoryError):
                    if wd not in self._inode_wds:
                        self._ino_rm(wd)  # gone meanwhile: its watch holds nothing
            if wd is None or again is None:
                self._drop(p)
                return
            st = again
            if stat.S_ISDIR(st.st_mode):  # replaced by a directory meanwhile
                self._drop(p)
                self._add_tree(p, st, start_ns)  # its watch gets the directory's mask again
                return
        self._put(p, st, start_ns, wd)

    def _put(self, p: str, st: os.stat_result, start_ns: int, wd: int | None) -> None:
        self._touch(p)
        old = self._nodes.get(p)
        if old is not None:
            self._unlink_node(p, old, keep_wd=wd)
        node = _Node(st.st_dev, st.st_ino, st.st_nlink, st.st_mode, wd)
        self._nodes[p] = node
        parent = p.rpartition("/")[0]
        self._children[parent].add(p)
        entry, why = self.scanner.entry_of(p, st, start_ns)
        if entry is None:
            self._entries.pop(p, None)
        else:
            self._entries[p] = entry
        if why is None:
            self._refused.pop(p, None)
        else:
            self._refused[p] = why
        if wd is not None:
            if stat.S_ISDIR(st.st_mode):
                self._dir_wds[wd] = p
            else:
                self._inode_wds.setdefault(wd, set()).add(p)
        if entry is not None and entry.kind == "file" and st.st_nlink > 1:
            key = (st.st_dev, st.st_ino)
            self._inodes.setdefault(key, set()).add(p)
            self._groups.add(key)

    def _drop(self, top: str) -> None:
        """``top`` and everything under it leave the state (iteratively: a tree may be
        deeper than Python's recursion)."""
        self._children.get(top.rpartition("/")[0], set()).discard(top)
        stack = [top]
        while stack:
            p = stack.pop()
            stack.extend(self._children.pop(p, ()))
            node = self._nodes.pop(p, None)
            if node is not None:
                self._touch(p)
                self._unlink_node(p, node, keep_wd=None)
                self._entries.pop(p, None)
                self._refused.pop(p, None)
                self.scanner.forget(p)

    def _unlink_node(self, p: str, node: _Node, keep_wd: int | None) -> None:
        """Take ``p``'s old node out of the watch maps and hardlink groups."""
        key = (node.dev, node.ino)
        group = self._inodes.get(key)
        if group is not None and p in group:
            group.discard(p)
            self._groups.add(key)
            if not group:
                del self._inodes[key]
        if node.wd is None or node.wd == keep_wd:
            return
        if self._dir_wds.get(node.wd) == p:
            del self._dir_wds[node.wd]
            self._orphans.add(node.wd)
        names = self._inode_wds.get(node.wd)
        if names is not None:
            names.discard(p)
            if not names:
                del self._inode_wds[node.wd]
                self._orphans.add(node.wd)

    def _touch(self, p: str) -> None:
        if p not in self._before:
            self._before[p] = self._entries.get(p)

    def _apply_groups(self) -> None:
        """Give every member of each hardlink group touched this scan its ``link``: the
        first member's path for all but the first, as ``Scanner.scan`` does."""
        for key in self._groups:
            members = sorted(self._inodes.get(key, ()))
            first = members[0] if len(members) > 1 else None
            for m in members:
                want = None if m == first else first
                entry = self._entries.get(m)
                if entry is not None and entry.link != want:
                    self._touch(m)
                    self._entries[m] = replace(entry, link=want)
            # A member that left the group was put again or dropped: its entry has no link.
        self._groups.clear()

    # ------------------------------------------------------------------ watches

    def _watch(self, full: str, mask: int) -> int | None:
        """The watch of ``full``'s inode; None when it is gone."""
        assert self._ino is not None
        if len(self._dir_wds) + len(self._inode_wds) >= self.budget:
            raise _Unwatchable(f"more than {self.budget} entries to watch, a quarter of "
                               "fs.inotify.max_user_watches (the rest is left to the "
                               "programs in the Space and on its host)")
        try:
            return self._ino.add_watch(full, mask)
        except OSError as exc:
            if exc.errno in (errno.ENOENT, errno.ENOTDIR, errno.ELOOP):
                return None
            raise _Unwatchable(f"{os.path.relpath(full, self._root)}: {exc.strerror}"
                               + (" (fs.inotify.max_user_watches reached)"
                                  if exc.errno == errno.ENOSPC else "")) from exc

    def _forget_wd(self, wd: int) -> None:
        """The kernel removed the watch ``wd`` (its inode is gone, or we removed it)."""
        self._dir_wds.pop(wd, None)
        self._inode_wds.pop(wd, None)
        self._orphans.discard(wd)

    def _drop_orphans(self) -> None:
        """Remove the watches no path of the state holds any more."""
        assert self._ino is not None
        for wd in self._orphans:
            if wd not in self._dir_wds and wd not in self._inode_wds:
                self._ino.rm_watch(wd)
        self._orphans.clear()

    def _ino_rm(self, wd: int) -> None:
        assert self._ino is not None
        self._ino.rm_watch(wd)

    def _read_marks(self) -> tuple[tuple[int, int], tuple[str, ...]]:
        """(the root's (device, inode), the mount points strictly inside it, sorted)."""
        st = os.stat(self._root)
        inside = sorted(m.point for m in self._mount_watch.mounts()
                        if m.point.startswith(self._root + "/"))
        return (st.st_dev, st.st_ino), tuple(inside)

    def _marks_changed(self) -> str:
        """Why the watched state cannot be trusted any more ("" when it can): the root is
        another directory now, or mounts inside it came or went (a mount makes no event)."""
        try:
            marks = self._read_marks()
        except OSError as exc:
            return f"cannot read the mounts: {exc}"
        if marks != self._marks:
            return "the workspace root or the mounts inside it changed"
        return ""
