"""The workspace image kept in the log (transactional mode).

The image is the workspace as of the last committed call: a path table (path → ``Row``: the
entry's whole state as ``spacesd.protocol.ScanEntry`` holds it, directories, FIFOs, mtimes,
hardlink groups and sparse extents included) and the bytes of each distinct file content.
It lives in the log as hidden system entries, one per change, each holding the paths set
and deleted and only the blobs the log does not hold yet. Folding a conversation's history
(a fork inherits its parent's entries up to the fork point, so it inherits the image as of
the fork for free) gives the table and where each blob is stored. Log growth is therefore
the changed bytes, never calls times workspace size.

This module is pure: it computes diffs and plans, and reads blobs back from entries.
``image_keeper`` does the I/O against the Space and the log.
"""

from __future__ import annotations

import base64
import bisect
import hashlib
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from spacesd.protocol import EntryKind, ScanEntry, ScanResult, workspace_hash

from ..storage.records import EntryRecord

#: Key of the image payload in a hidden system entry.
IMAGE_KEY = "space_image"

class Row(NamedTuple):
    """One path of the image: its kind, mode, content (a file's sha256, a link's target,
    '' for the rest) and the rest of its state (None where a log written before it was
    kept lacks it: an mtime, a size)."""

    kind: EntryKind
    mode: int
    ident: str
    mtime_ns: int | None = None
    link: str | None = None
    extents: tuple[tuple[int, int], ...] | None = None
    size: int | None = None

    def entry(self, path: str) -> ScanEntry:
        return ScanEntry(path, self.kind,
                         self.kind == "file" and bool(self.mode & 0o100), self.size or 0,
                         self.ident if self.kind == "file" else None,
                         self.ident if self.kind == "symlink" else None, self.mode,
                         self.mtime_ns, self.link, self.extents)

    def to_json(self) -> list[Any]:
        out: list[Any] = [self.kind, self.mode, self.ident, self.mtime_ns, self.link,
                          None if self.extents is None else [list(x) for x in self.extents],
                          self.size]
        while len(out) > 3 and out[-1] is None:
            out.pop()
        return out

    @classmethod
    def from_json(cls, raw: list[Any]) -> Row:
        kind, mode, ident, *rest = raw
        mtime, link, extents, size = [*rest, None, None, None, None][:4]
        return cls(kind, _mode(mode) if kind == "file" else int(mode), ident, mtime, link,
                   None if extents is None else tuple((int(a), int(b)) for a, b in extents),
                   size)


def _mode(raw: int | bool) -> int:
    """A row's mode as stored; logs written before modes were kept hold the exec bit."""
    if isinstance(raw, bool):
        return 0o755 if raw else 0o644
    return int(raw)


@dataclass
class Image:
    table: dict[str, Row] = field(default_factory=dict)
    #: sha256 → id of the entry holding its bytes.
    blobs: dict[str, int] = field(default_factory=dict)
    #: Contents kept outside the log, in a blob store beside it (a virtual workspace's
    #: larger files, ``durable.virtual.blob_store``).
    external: set[str] = field(default_factory=set)
    #: The last entry folded in (incremental folding).
    upto: int = 0

    def fold(self, entry_id: int, payload: dict[str, Any]) -> None:
        for path in payload.get("del", []):
            self.table.pop(path, None)
        for path, raw in payload.get("set", {}).items():
            self.table[path] = Row.from_json(raw)
        for sha in payload.get("blobs", {}):
            self.blobs.setdefault(sha, entry_id)
        self.external.update(payload.get("ext", ()))
        self.upto = entry_id

    def fold_history(self, history: list[EntryRecord], *, upto: int | None = None) -> None:
        """Fold the image entries of ``history`` (a conversation's, in order) after the last
        one folded, up to entry ``upto`` (all when None): incremental, so a caller that keeps
        its image folds only what was committed since."""
        start = bisect.bisect_right(history, self.upto, key=lambda e: e.id)
        for e in history[start:]:
            if upto is not None and e.id > upto:
                break
            if e.kind == "system" and IMAGE_KEY in e.data:
                self.fold(e.id, e.data[IMAGE_KEY])

    def holds(self, sha: str) -> bool:
        """Whether the log (or its blob store) already holds this content."""
        return sha in self.blobs or sha in self.external

    def files(self) -> int:
        return len(self.table)

    def entries(self) -> list[ScanEntry]:
        """The workspace state the image holds."""
        return [row.entry(path) for path, row in sorted(self.table.items())]

    def hash(self) -> str:
        return workspace_hash(self.entries())


def row_of(entry: ScanEntry) -> Row:
    return Row(entry.kind, 0 if entry.kind == "symlink" else entry.mode, entry.ident(),
               entry.mtime_ns, entry.link, entry.extents,
               entry.size if entry.kind == "file" else None)


class RowMemo:
    """The rows of one Space client's successive scans (every entry a row: the whole state is the
    image's), each entry's row made once. The client hands back the very ``ScanEntry``
    object of a path its daemon reported unchanged (``SpaceClient.scan`` applies the
    daemon's difference), so a scan's rows cost what changed, not the workspace (two scans
    per transactional call, about 0.8 ms per 1000 files each when every row was made anew).
    An entry that is another object, equal or not, gets its row made again: the answer is
    ``row_of`` of every entry, always."""

    def __init__(self) -> None:
        self._made: dict[str, tuple[ScanEntry, Row]] = {}

    def rows(self, scan: ScanResult) -> dict[str, Row]:
        made = self._made
        out: dict[str, Row] = {}
        for e in scan.entries:
            hit = made.get(e.path)
            if hit is None or hit[0] is not e:
                hit = made[e.path] = (e, row_of(e))
            out[e.path] = hit[1]
        if len(made) > len(out):
            for gone in made.keys() - out.keys():
                del made[gone]
        return out


@dataclass(frozen=True)
class Diff:
    set: dict[str, Row]
    deleted: list[str]

    def __bool__(self) -> bool:
        return bool(self.set or self.deleted)

    def new_blobs(self, image: Image) -> list[str]:
        """Content hashes this diff needs that the log does not hold yet."""
        return sorted({row.ident for row in self.set.values()
                       if row.kind == "file" and not image.holds(row.ident)})


def diff(image: Image, rows: dict[str, Row]) -> Diff:
    """What turns ``image`` into ``rows``."""
    changed = {p: r for p, r in rows.items() if image.table.get(p) != r}
    deleted = sorted(p for p in image.table if p not in rows)
    return Diff(changed, deleted)


def payload(d: Diff, blobs: dict[str, bytes], *, call_id: str | None,
            external: tuple[str, ...] = ()) -> dict[str, Any]:
    """The hidden entry data recording ``d`` (with the given new blobs; ``external``: new
    contents written to the blob store beside the log instead)."""
    out: dict[str, Any] = {
        "call_id": call_id,
        "set": {p: r.to_json() for p, r in d.set.items()},
        "del": d.deleted,
        "blobs": {sha: base64.b64encode(data).decode("ascii") for sha, data in blobs.items()},
    }
    if external:
        out["ext"] = sorted(external)
    return {"hidden": True, IMAGE_KEY: out}


def manifest(image: Image, checkpoint_id: str, created_ms: int,
             sizes: dict[str, int]) -> dict[str, Any]:
    """The image as a checkpoint manifest of the Space's daemon (``spacesd.checkpoints``),
    to import and restore: one way to make a workspace equal to a recorded state, whether
    the record is a checkpoint or the image. ``sizes``: the size of each content (rows of
    logs written before sizes were kept lack it). The directories an old log's rows only
    imply are made 0755."""
    files: list[dict[str, Any]] = []
    out: dict[str, Any] = {"id": checkpoint_id, "created_ms": created_ms, "files": files,
                           "symlinks": {}, "dirs": {}, "fifos": {}, "times": {}}
    for path, row in sorted(image.table.items()):
        if row.kind == "file":
            rec: dict[str, Any] = {"path": path, "sha256": row.ident,
                                   "size": sizes[row.ident] if row.size is None else row.size,
                                   "mode": row.mode}
            if row.link is not None:
                rec["link"] = row.link
            if row.extents is not None:
                rec["extents"] = [list(x) for x in row.extents]
            files.append(rec)
        elif row.kind == "symlink":
            out["symlinks"][path] = row.ident
        else:
            out["dirs" if row.kind == "dir" else "fifos"][path] = row.mode
        if row.mtime_ns is not None:
            out["times"][path] = row.mtime_ns
        parent = path.rpartition("/")[0]
        while parent and parent not in image.table:
            out["dirs"].setdefault(parent, 0o755)
            parent = parent.rpartition("/")[0]
    return out


def blob_from(entry_data: dict[str, Any], sha: str) -> bytes:
    data = base64.b64decode(entry_data[IMAGE_KEY]["blobs"][sha])
    if hashlib.sha256(data).hexdigest() != sha:
        raise ValueError(f"blob {sha} in the log does not match its hash; the log is corrupt")
    return data


@dataclass(frozen=True)
class TransactionalLimits:
    """Bounds under which the workspace is kept as an image in the log (transactional mode);
    ``exclude`` names paths the scans leave out."""

    max_files: int = 1000
    max_bytes: int = 16 * 1024 * 1024
    exclude: tuple[str, ...] = ()


def over_limits(scan: ScanResult, limits: TransactionalLimits) -> str | None:
    """Why the scanned workspace cannot be kept as an image, or ``None`` when it can."""
    if scan.refused:
        return (f"{len(scan.refused)} entr{'y' if len(scan.refused) == 1 else 'ies'} no "
                f"workspace state can keep: {scan.refused[0]}")
    files = [e for e in scan.entries if e.kind in ("file", "symlink")]
    if len(files) > limits.max_files:
        return f"{len(files)} files exceed max_files={limits.max_files}"
    size = sum(e.size for e in files if e.kind == "file")
    if size > limits.max_bytes:
        return f"{size} bytes exceed max_bytes={limits.max_bytes}"
    return None
