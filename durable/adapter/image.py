"""The workspace image kept in the log (transactional mode).

The image is the workspace as of the last committed call: a path table (path → kind,
permission bits, content sha256 or link target) and the bytes of each distinct file
content. It lives in the log as hidden system entries, one per change, each holding the
paths set and deleted and only the blobs the log does not hold yet. Folding a
conversation's history (a fork inherits its parent's entries up to the fork point, so it
inherits the image as of the fork for free) gives the table and where each blob is stored.
Log growth is therefore the changed bytes, never calls times workspace size.

This module is pure: it computes diffs and plans, and reads blobs back from entries.
``image_keeper`` does the I/O against the Space and the log.
"""

from __future__ import annotations

import base64
import bisect
import hashlib
from dataclasses import dataclass, field
from typing import Any

from spacesd.protocol import ScanEntry, ScanResult, workspace_hash

from ..storage.records import EntryRecord

#: Key of the image payload in a hidden system entry.
IMAGE_KEY = "space_image"

# path -> (kind, permission bits, sha256 or link target)
Row = tuple[str, int, str]


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
        for path, (kind, mode, ident) in payload.get("set", {}).items():
            self.table[path] = (kind, _mode(mode) if kind == "file" else 0, ident)
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

    def hash(self) -> str:
        return workspace_hash([(p, k, mode, ident) for p, (k, mode, ident) in self.table.items()])


def row_of(entry: ScanEntry) -> Row:
    if entry.kind == "symlink":
        return ("symlink", 0, entry.target or "")
    return ("file", entry.mode, entry.sha256 or "")


def tracked_rows(scan: ScanResult) -> dict[str, Row]:
    return {e.path: row_of(e) for e in scan.entries if e.kind in ("file", "symlink")}


@dataclass(frozen=True)
class Diff:
    set: dict[str, Row]
    deleted: list[str]

    def __bool__(self) -> bool:
        return bool(self.set or self.deleted)

    def new_blobs(self, image: Image) -> list[str]:
        """Content hashes this diff needs that the log does not hold yet."""
        return sorted({ident for kind, _mode, ident in self.set.values()
                       if kind == "file" and not image.holds(ident)})


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
        "set": {p: list(r) for p, r in d.set.items()},
        "del": d.deleted,
        "blobs": {sha: base64.b64encode(data).decode("ascii") for sha, data in blobs.items()},
    }
    if external:
        out["ext"] = sorted(external)
    return {"hidden": True, IMAGE_KEY: out}


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
        return (f"{len(scan.refused)} path(s) with a backslash or newline in the name "
                f"(e.g. {scan.refused[0]!r}) cannot be tracked")
    files = [e for e in scan.entries if e.kind in ("file", "symlink")]
    if len(files) > limits.max_files:
        return f"{len(files)} files exceed max_files={limits.max_files}"
    size = sum(e.size for e in files if e.kind == "file")
    if size > limits.max_bytes:
        return f"{size} bytes exceed max_bytes={limits.max_bytes}"
    return None
