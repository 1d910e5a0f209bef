"""A checkpoint's manifest: the workspace state it records, its checks, its canonical
JSON (what its checksum is computed over), the parts of it kept between checkpoints so that
each costs what changed (``ManifestEncoder``), and the manifests kept parsed
(``ParsedManifests``). The store and its operations are ``checkpoints``."""

from __future__ import annotations

import hashlib
import json
import re
import stat
import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from operator import attrgetter
from typing import Any, cast

from . import paths
from .errors import BadRequest, OutsideRoot
from .protocol import CheckpointInfo, ScanEntry

SHA256_HEX = re.compile(r"[0-9a-f]{64}")
_TABLES = ("files", "symlinks", "dirs", "fifos")
_SIZE = attrgetter("size")


@dataclass(frozen=True)
class FileRec:
    path: str
    sha256: str
    size: int
    mode: int
    #: The first member of its hardlink group, when it is a later one.
    link: str | None = None
    #: Data extents of a sparse file (``[offset, length]``), None when dense.
    extents: tuple[tuple[int, int], ...] | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"path": self.path, "sha256": self.sha256, "size": self.size,
                               "mode": self.mode}
        if self.link is not None:
            out["link"] = self.link
        if self.extents is not None:
            out["extents"] = [list(x) for x in self.extents]
        return out


@dataclass(frozen=True)
class Manifest:
    id: str
    created_ms: int
    files: list[FileRec] = field(default_factory=list)
    symlinks: dict[str, str] = field(default_factory=dict)
    dirs: dict[str, int] = field(default_factory=dict)
    fifos: dict[str, int] = field(default_factory=dict)
    #: Every entry's mtime (ns); a manifest of an older daemon has none.
    times: dict[str, int] = field(default_factory=dict)

    def entries(self) -> list[ScanEntry]:
        """The state this manifest records, as scan entries (``protocol.workspace_hash``)."""
        t = self.times.get
        out = [ScanEntry(f.path, "file", bool(f.mode & stat.S_IXUSR), f.size, f.sha256,
                         mode=f.mode, mtime_ns=t(f.path), link=f.link, extents=f.extents)
               for f in self.files]
        out += [ScanEntry(p, "symlink", target=v, mtime_ns=t(p)) for p, v in self.symlinks.items()]
        out += [ScanEntry(p, "dir", mode=v, mtime_ns=t(p)) for p, v in self.dirs.items()]
        out += [ScanEntry(p, "fifo", mode=v, mtime_ns=t(p)) for p, v in self.fifos.items()]
        return sorted(out, key=lambda e: e.path)

    def info(self) -> CheckpointInfo:
        return CheckpointInfo(self.id, len(self.files), sum(map(_SIZE, self.files)),
                              self.created_ms)

    def to_json(self) -> dict[str, Any]:
        return {"id": self.id, "created_ms": self.created_ms,
                "files": [f.to_json() for f in self.files], "symlinks": self.symlinks,
                "dirs": self.dirs, "fifos": self.fifos, "times": self.times}

    @classmethod
    def from_json(cls, raw: Any, checkpoint_id: str) -> Manifest:
        """A manifest checked against the path rules; ``BadRequest`` says what is wrong."""
        try:
            m = cls(checkpoint_id, int(raw["created_ms"]),
                    [FileRec(f["path"], f["sha256"], int(f["size"]), int(f["mode"]),
                             None if f.get("link") is None else str(f["link"]),
                             None if f.get("extents") is None else
                             tuple((int(a), int(b)) for a, b in f["extents"]))
                     for f in raw["files"]],
                    {str(k): str(v) for k, v in raw["symlinks"].items()},
                    {str(k): int(v) for k, v in raw["dirs"].items()},
                    {str(k): int(v) for k, v in raw.get("fifos", {}).items()},
                    {str(k): int(v) for k, v in raw.get("times", {}).items()})
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise BadRequest(f"checkpoint {checkpoint_id!r}: malformed manifest ({exc})") from None
        m._validate()
        return m

    def _validate(self) -> None:
        for f in self.files:
            _check_file(self.id, f)
        for table in (self.symlinks, self.dirs, self.fifos):
            for path in table:
                _check_path(self.id, path)
        for mode in [*self.dirs.values(), *self.fifos.values()]:
            _check_mode(self.id, mode)
        self._check_structure()

    def _check_structure(self) -> None:
        """What ``_validate`` checks across entries: no path twice, every parent a
        directory of the checkpoint, hardlinks to their group's first file."""
        every = [f.path for f in self.files] + [*self.symlinks, *self.dirs, *self.fifos]
        if len(set(every)) != len(every):
            seen: set[str] = set()
            for path in every:
                if path in seen:
                    raise BadRequest(f"checkpoint {self.id!r}: bad or repeated path {path!r}")
                seen.add(path)
        dirs = self.dirs
        for path in every:
            parent = path.rpartition("/")[0]
            if parent and parent not in dirs:
                raise BadRequest(f"checkpoint {self.id!r}: {path!r} is not under a directory "
                                 "of the checkpoint")
        linked = [f for f in self.files if f.link is not None]
        if not linked:
            return
        firsts = {f.path: f for f in self.files if f.link is None}
        for f in linked:
            first = firsts.get(cast(str, f.link))
            if first is None or first.sha256 != f.sha256 or not cast(str, f.link) < f.path:
                raise BadRequest(f"checkpoint {self.id!r}: {f.path!r} is a hardlink of "
                                 f"{f.link!r}, which is not the first file of its group")


def _check_path(checkpoint_id: str, path: str) -> None:
    """``OutsideRoot`` (a name no workspace may hold) or ``BadRequest`` unless ``path`` is
    a protocol path in its one spelling."""
    if not path or "/".join(paths.split_rel(path)) != path:
        raise BadRequest(f"checkpoint {checkpoint_id!r}: bad or repeated path {path!r}")


def _check_mode(checkpoint_id: str, mode: int) -> None:
    if not 0 <= mode <= 0o7777:
        raise BadRequest(f"checkpoint {checkpoint_id!r}: a mode out of range ({mode:o})")


def _check_file(checkpoint_id: str, f: FileRec) -> None:
    """What one file record must be, on its own."""
    _check_path(checkpoint_id, f.path)
    if not SHA256_HEX.fullmatch(f.sha256) or not 0 <= f.mode <= 0o7777:
        raise BadRequest(f"checkpoint {checkpoint_id!r}: bad digest or mode for {f.path!r}")
    if f.extents is not None and any(a < 0 or b <= 0 or a + b > f.size for a, b in f.extents):
        raise BadRequest(f"checkpoint {checkpoint_id!r}: bad extents for {f.path!r}")


class ParsedManifests:
    """Manifests already parsed and checked (``Manifest._validate``), by id, each with the
    SHA-256 of the bytes it was read from or written as: ``load`` hands one back only
    while its file holds those very bytes, so a manifest damaged or replaced on disk is
    read (and judged) again. A checkpoint is exported, listed and counted by every
    delete's garbage collection right after it is made, and parsing and checking a
    manifest costs ~10 ms per 1000 files against ~0.3 ms to read and hash it. Kept while
    their entries sum to at most ``budget`` (the oldest used go first). A ``Manifest``
    handed out is shared: its readers never change it (nothing in spacesd does)."""

    def __init__(self, budget: int) -> None:
        self._budget = budget
        self._kept: OrderedDict[str, tuple[bytes, Manifest, int]] = OrderedDict()
        self._entries = 0
        self._lock = threading.Lock()  # ``list`` loads outside the checkpoints' lock

    def get(self, checkpoint_id: str, data: bytes) -> Manifest | None:
        digest = hashlib.sha256(data).digest()
        with self._lock:
            kept = self._kept.get(checkpoint_id)
            if kept is None or kept[0] != digest:
                return None
            self._kept.move_to_end(checkpoint_id)
            return kept[1]

    def put(self, checkpoint_id: str, data: bytes, m: Manifest) -> None:
        size = len(m.files) + len(m.symlinks) + len(m.dirs) + len(m.fifos) + 1
        digest = hashlib.sha256(data).digest()
        with self._lock:
            self._drop(checkpoint_id)
            if size > self._budget:
                return
            self._kept[checkpoint_id] = (digest, m, size)
            self._entries += size
            while self._entries > self._budget:
                self._drop(next(iter(self._kept)))

    def drop(self, checkpoint_id: str) -> None:
        with self._lock:
            self._drop(checkpoint_id)

    def _drop(self, checkpoint_id: str) -> None:
        kept = self._kept.pop(checkpoint_id, None)
        if kept is not None:
            self._entries -= kept[2]


@dataclass(frozen=True)
class _Part:
    """One entry's share of a manifest (``ManifestEncoder``)."""

    entry: ScanEntry
    path: str
    #: The table it is a member of: ``files``, ``symlinks``, ``dirs`` or ``fifos``.
    table: str
    #: Its value there: a ``FileRec``, a symlink's target, a mode.
    value: FileRec | str | int
    #: Its member of its table, and of ``times`` (None without an mtime), spelled as the
    #: manifest's checksum spells them (``checksum_of``: keys sorted, no spaces).
    json: bytes
    time: bytes | None
    mtime_ns: int | None
    #: Whether it passes ``Manifest._validate``'s checks of one entry.
    ok: bool


def _part(e: ScanEntry) -> _Part:
    path = json.dumps(e.path).encode()
    value: FileRec | str | int
    try:
        if e.kind == "file":
            value = FileRec(e.path, e.sha256 or "", e.size, e.mode, e.link, e.extents)
            member = json.dumps(value.to_json(), sort_keys=True, separators=(",", ":")).encode()
            _check_file("", value)
        elif e.kind == "symlink":
            value = e.target or ""
            member = path + b":" + json.dumps(value).encode()
            _check_path("", e.path)
        else:
            value, member = e.mode, path + b":%d" % e.mode
            _check_path("", e.path)
            _check_mode("", e.mode)
        ok = True
    except (BadRequest, OutsideRoot):
        ok = False
    time_member = None if e.mtime_ns is None else path + b":%d" % e.mtime_ns
    return _Part(e, e.path, f"{e.kind}s", value, member, time_member, e.mtime_ns, ok)


class ManifestEncoder:
    """Manifests of successive workspace states, each entry made into its record, its JSON
    and its checks once while it stays the same: a checkpoint then costs what changed
    since the last one, but for joins (that was ~15 us per entry, more than all else
    ``create`` does for an unchanged file)."""

    def __init__(self) -> None:
        self._parts: dict[str, _Part] = {}

    def encode(self, checkpoint_id: str, created_ms: int, entries: list[ScanEntry]
               ) -> tuple[Manifest, bytes, bool]:
        """(the manifest of ``entries``, sorted by path; its canonical JSON, without the
        checksum; whether ``load`` would take it)."""
        get = self._parts.get
        parts: list[_Part] = []
        for e in entries:
            p = get(e.path)
            if p is None or (p.entry is not e and p.entry != e):
                p = _part(e)
            parts.append(p)
        self._parts = {p.path: p for p in parts}
        tables: dict[str, list[_Part]] = {t: [] for t in _TABLES}
        for p in parts:
            tables[p.table].append(p)
        # Each table's values are of its kind (``_part``: FileRecs, targets, modes, modes).
        m = Manifest(checkpoint_id, created_ms,
                     [p.value for p in tables["files"]],  # type: ignore[misc]  # FileRecs
                     {p.path: p.value for p in tables["symlinks"]},  # type: ignore[misc]  # str
                     {p.path: p.value for p in tables["dirs"]},  # type: ignore[misc]  # int
                     {p.path: p.value for p in tables["fifos"]},  # type: ignore[misc]  # int
                     {p.path: p.mtime_ns for p in parts if p.mtime_ns is not None})
        members = {t: b",".join([p.json for p in tables[t]]) for t in _TABLES}
        body = b'{"created_ms":%d,"dirs":{%s},"fifos":{%s},"files":[%s],"id":%s,' \
               b'"symlinks":{%s},"times":{%s}}' % (
                   created_ms, members["dirs"], members["fifos"], members["files"],
                   json.dumps(checkpoint_id).encode(), members["symlinks"],
                   b",".join([p.time for p in parts if p.time is not None]))
        ok = all([p.ok for p in parts])
        if ok:
            try:
                m._check_structure()
            except BadRequest:
                ok = False
        return m, body, ok


def checksum_of(body: dict[str, Any]) -> str:
    """The SHA-256 of a manifest's JSON, keys sorted, without its ``checksum``."""
    return hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":"))
                          .encode()).hexdigest()
