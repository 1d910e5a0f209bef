"""The model of a workspace that scripted steps change: the workspace state contract
(``spacesd.protocol.ScanEntry``), as far as a step's effect decides it.

The checker replays the effects of the committed calls over this model to get the state the
workspace must be in, and hashes it with the one workspace hash the Space uses too
(``spacesd.protocol.workspace_hash``). Directories are entries of their own: every parent a
write or a command makes (``mkdir -p``, the write tool's parents: 0755 under the daemon's
umask 022) stays until a step removes it. An mtime is known only where a step sets it
(``touch -d``): a command's writes happen at a time no model can predict, so those entries
carry none and the checker compares their mtimes with nothing (``protocol.times_as``).

A command that a full disk cut short changed what it got to, and no model can say how far
that was (bash's ``>`` truncates, then its write fails; an ``&&`` chain stops): the paths
it changed are *unsure* from then on, as an indeterminate operation is in Jepsen's
histories. The checker takes the Space's word for them, and a later step whose effect
reads one gives a result (and changes) no model can predict, so they become unsure too.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

from spacesd.protocol import ScanEntry, workspace_hash

#: The mode of a file a command or the write tool creates (spacesd runs with umask 022).
NEW_FILE_MODE = 0o644
#: The mode of a directory ``mkdir -p`` or the write tool's parents get.
NEW_DIR_MODE = 0o755


@dataclass
class WorkspaceModel:
    #: path → (content, permission bits)
    files: dict[str, tuple[bytes, int]] = field(default_factory=dict)
    #: path → link target (as given to ``ln -s``; may dangle, may be absolute)
    links: dict[str, str] = field(default_factory=dict)
    #: path → permission bits
    dirs: dict[str, int] = field(default_factory=dict)
    #: path → permission bits
    fifos: dict[str, int] = field(default_factory=dict)
    #: hardlink groups: a later member's path → the group's first path
    hardlinks: dict[str, str] = field(default_factory=dict)
    #: sparse files: path → data extents ((offset, length), ...)
    extents: dict[str, tuple[tuple[int, int], ...]] = field(default_factory=dict)
    #: the mtimes a step set (``touch -d``), by path
    times: dict[str, int] = field(default_factory=dict)
    #: paths whose state no model knows (a command a full disk cut short changed them)
    unsure: set[str] = field(default_factory=set)
    #: whether an effect read an unsure path (``content``, ``has_file``) since the copy
    read_unsure: bool = False
    #: the paths an effect changed at some point since the copy, even where it left them as
    #: they were: a file written with what it held (``>`` truncates first: cut short, it
    #: leaves less), a directory whose mtime an entry made in it changed and a later
    #: ``touch -d`` set back (cut short in between, it keeps the new one)
    touched: set[str] = field(default_factory=set)

    def copy(self) -> WorkspaceModel:
        return WorkspaceModel(dict(self.files), dict(self.links), dict(self.dirs),
                              dict(self.fifos), dict(self.hardlinks), dict(self.extents),
                              dict(self.times), set(self.unsure))

    def exists(self, path: str) -> bool:
        return any(path in t for t in (self.files, self.links, self.dirs, self.fifos))

    def content(self, path: str) -> bytes | None:
        self.read_unsure |= path in self.unsure
        entry = self.files.get(path)
        return None if entry is None else entry[0]

    def has_file(self, path: str) -> bool:
        self.read_unsure |= path in self.unsure
        return path in self.files

    def cut_short(self, after: WorkspaceModel) -> WorkspaceModel:
        """``after`` (a copy of this state with a step's whole effect applied) with every
        path the step changed or wrote made unsure: the state a full disk may have cut it
        short anywhere in."""
        was = {e.path: e.state() for e in self.entries()}
        now = {e.path: e.state() for e in after.entries()}
        after.unsure |= {p for p in was.keys() | now.keys() if was.get(p) != now.get(p)}
        after.unsure |= after.touched
        return after

    def parents(self, path: str) -> None:
        """Make ``path``'s missing parent directories (``mkdir -p``): its parent's mtime
        is then the moment of the step, unknown."""
        parts = path.split("/")[:-1]
        for i in range(1, len(parts) + 1):
            self.dirs.setdefault("/".join(parts[:i]), NEW_DIR_MODE)
        self.touched_dir_of(path)

    def touched_dir_of(self, path: str) -> None:
        """An entry was made or removed in ``path``'s directory: its mtime is now."""
        parent = path.rpartition("/")[0]
        self.times.pop(parent, None)
        if parent:
            self.touched.add(parent)

    def write(self, path: str, data: bytes, mode: int | None = None, *,
              renamed: bool = False) -> None:
        """Replace ``path``'s content; a new file gets ``NEW_FILE_MODE``, an existing one
        keeps its mode unless ``mode`` is given (as the write tool and ``>`` do). ``>``
        writes the inode in place, so every hardlink of it sees the content; the write
        and edit tools (``renamed``) put a new inode in place, which leaves the group."""
        self.links.pop(path, None)
        self.parents(path)
        old = self.files.get(path)
        keep = old[1] if old is not None else NEW_FILE_MODE
        if renamed and old is not None and len(self.group(path)) > 1:
            self.remove(path)
        for member in self.group(path):
            self.files[member] = (data, keep if mode is None else mode)
            self.times.pop(member, None)
            self.extents.pop(member, None)
            self.unsure.discard(member)
            self.touched.add(member)

    def append(self, path: str, data: bytes) -> None:
        """``>>``: an unsure file stays unsure (what it held is still unknown)."""
        entry = self.files.get(path)
        unsure = path in self.unsure
        self.write(path, (b"" if entry is None else entry[0]) + data)
        if unsure:
            self.unsure.update(self.group(path))

    def group(self, path: str) -> list[str]:
        """``path`` and every path hardlinked with it."""
        first = self.hardlinks.get(path, path)
        return [first, *(p for p, f in self.hardlinks.items() if f == first)] \
            if first in self.files else [path]

    def remove(self, path: str) -> None:
        """Remove one name (a file, link or FIFO; ``rm -f``): a hardlink group keeps its
        other members, the next one in path order becoming its first."""
        self.links.pop(path, None)
        self.fifos.pop(path, None)
        if path in self.files:
            self.touched_dir_of(path)
        members = [p for p in self.group(path) if p != path] if path in self.files else []
        self.unsure.discard(path)
        self.files.pop(path, None)
        self.extents.pop(path, None)
        self.times.pop(path, None)
        self.hardlinks.pop(path, None)
        if members:
            first = min(members)
            for m in members:
                self.hardlinks.pop(m, None)
                if m != first:
                    self.hardlinks[m] = first

    def entries(self) -> list[ScanEntry]:
        """The state as the Space's scan reports it (mtimes only where a step set one)."""
        t = self.times.get
        out = [ScanEntry(p, "file", bool(mode & 0o100), len(data),
                         hashlib.sha256(data).hexdigest(), mode=mode, mtime_ns=t(p),
                         link=self.hardlinks.get(p), extents=self.extents.get(p))
               for p, (data, mode) in self.files.items()]
        out += [ScanEntry(p, "symlink", target=target, mtime_ns=t(p))
                for p, target in self.links.items()]
        out += [ScanEntry(p, "dir", mode=mode, mtime_ns=t(p)) for p, mode in self.dirs.items()]
        out += [ScanEntry(p, "fifo", mode=mode, mtime_ns=t(p)) for p, mode in self.fifos.items()]
        return sorted(out, key=lambda e: e.path)

    def hash(self) -> str:
        return workspace_hash(self.entries())
