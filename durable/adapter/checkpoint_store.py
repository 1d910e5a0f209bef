"""Checkpoint stores: copies of a Space's checkpoints kept outside any Space, so that a
checkpoint outlives the loss of its Space.

``DirectoryCheckpointStore`` keeps what the Space's daemon keeps: content-addressed objects
(``objects/ab/abcdef...``, one per distinct content, ever) and one manifest per checkpoint.
A checkpoint is copied in as the daemon's export tar, asked to leave out the objects the
store already holds (``known``: those of the newest manifest stored, a hint), so a store
grows by what changed, not by the workspace per checkpoint. A manifest is stored whole
(``<id>.manifest.json``, as the daemon exported it) or as its difference from the last whole
one this store object wrote (``<id>.delta.json``: the entries set and removed, and its
base's id): a manifest lists every file, about 100 bytes each, so a whole one per checkpoint
made a store grow by ~100 KiB per call at 1000 files whatever changed. A difference that
grew to ``1/DELTA_FRACTION`` of its base's size is written whole instead, and becomes the
next base: reading a checkpoint applies at most one difference, and a damaged base costs
the differences made from it. The manifest's file is written and synced while the objects
are (in a thread: the two syncs overlap) and renamed into place last, once every object it
names is on disk (fsynced): a copy cut short leaves objects no manifest names, never a
manifest without its objects. Which objects the store holds is read off a listing of each
object directory, kept while the directory's ctime stays as it was. ``open`` gives back a
whole export tar (manifest, then every object, each checked against its hash) for
``checkpoint_import``.
Stores written as one tar per checkpoint (``<id>.tar``, before objects) are still read.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import tarfile
import tempfile
import time
from collections import defaultdict
from collections.abc import Iterable, Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import IO, Any, Protocol, runtime_checkable

from ..atomic_file import StagedWrite, fsync_dir
from ..chunk_reader import ChunkReader
from ..errors import CorruptLog

MANIFEST_MEMBER = "manifest.json"
#: A manifest is stored as a difference while that is below 1/this of its base's size.
DELTA_FRACTION = 8
#: The entry tables of a manifest, each keyed by path (``files`` is a list of records;
#: manifests of daemons before the whole workspace state was kept lack the last two).
_TABLES = ("files", "symlinks", "dirs", "fifos", "times")
#: Bytes of a rebuilt tar kept in memory before it spills to a temporary file.
SPOOL_BYTES = 8 * 1024 * 1024
#: A listing of an object directory is reused while the directory's ctime stays the one it
#: had, and only if that ctime was older than this when the listing was read: a change in
#: the same tick of the filesystem's clock as an earlier one leaves the ctime as it was
#: (git's "racily clean" entries). The clock is this machine's: the store is a directory
#: of this machine (a network filesystem's server stamps with its own).
RACY_NS = 2_000_000_000
#: A manifest, a table of one, or a difference between two: JSON objects.
Json = dict[str, Any]


class DamagedStore(CorruptLog):
    """A checkpoint in a store is incomplete or does not match its hashes."""


class IncompleteCopy(Exception):
    """An export left out objects the store turned out not to have: copy it whole."""


@runtime_checkable
class CheckpointStore(Protocol):
    """Keeps copies of checkpoints outside any Space."""

    def put(self, checkpoint_id: str, chunks: Iterator[bytes]) -> None:
        """Store the export tar ``chunks``; ``IncompleteCopy`` when it left out an object
        (named in ``known``) the store does not hold after all."""
        ...

    def known(self) -> frozenset[str]:
        """Objects the store holds that an export may leave out (a hint, maybe empty)."""
        ...

    def open(self, checkpoint_id: str) -> IO[bytes] | None:
        """A whole export tar of the checkpoint, or ``None`` when this store lacks it."""
        ...

    def has(self, checkpoint_id: str) -> bool: ...


class DirectoryCheckpointStore:
    """A ``CheckpointStore`` in a directory of this machine (see the module docstring)."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self._objects = self.path / "objects"
        made = [d for d in (self.path, self._objects) if not d.is_dir()]
        self._objects.mkdir(parents=True, exist_ok=True)
        for d in made:  # their entries are durable before any manifest names what they hold
            fsync_dir(d.parent)
        self._known: frozenset[str] | None = None
        #: (id, entry tables (``_tables``), size) of the last whole manifest this object
        #: stored: the base of the differences it stores next.
        self._base: tuple[str, dict[str, Json], int] | None = None
        #: Object directories whose entry in ``objects`` this object has fsynced (once per
        #: process and each time one is made, not once per checkpoint).
        self._durable_dirs: set[Path] = set()
        #: Per object directory (its two hex digits): its inode and ctime, and the names it
        #: held then.
        self._listings: dict[str, tuple[tuple[int, int], frozenset[str]]] = {}

    def _name(self, checkpoint_id: str, suffix: str) -> Path:
        if "/" in checkpoint_id or checkpoint_id.startswith("."):
            raise ValueError(f"checkpoint id {checkpoint_id!r} is not a plain name")
        return self.path / f"{checkpoint_id}{suffix}"

    def _object(self, sha: str) -> Path:
        return self._objects / sha[:2] / sha

    def _stored(self, shas: Iterable[str]) -> set[str]:
        """Which of ``shas`` are in the store: asked of every object of every checkpoint, so
        read off a listing of each object directory, listed again only once its ctime moved
        (a stat per directory, not per object). A directory that cannot be looked at
        (EACCES, EIO) holds nothing: the checkpoint is then copied whole, and reading it
        back checks every object."""
        by_dir: defaultdict[str, list[str]] = defaultdict(list)
        for sha in shas:
            by_dir[sha[:2]].append(sha)
        stored: set[str] = set()
        for prefix, group in by_dir.items():
            names = self._listing(prefix)
            stored.update(sha for sha in group if sha in names)
        return stored

    def _listing(self, prefix: str) -> frozenset[str]:
        directory = f"{self._objects}/{prefix}"
        try:
            st = os.stat(directory)
            # ctime, not mtime: a change of names moves both, but anyone may set an mtime
            # back (cp -a, tar x, touch -d), and nobody a ctime
            stamp = (st.st_ino, st.st_ctime_ns)
            cached = self._listings.get(prefix)
            if cached is not None and cached[0] == stamp:
                return cached[1]
            now = time.time_ns()
            names = frozenset(os.listdir(directory))
        except OSError:
            return frozenset()
        if now - st.st_ctime_ns > RACY_NS:
            self._listings[prefix] = (stamp, names)
        else:  # it may change again within its ctime's tick: list it again next time
            self._listings.pop(prefix, None)
        return names

    # -- copying in ----------------------------------------------------------------

    def put(self, checkpoint_id: str, chunks: Iterator[bytes]) -> None:
        self._name(checkpoint_id, "")  # a plain name, before anything is copied
        with ExitStack() as stack:
            staged: tuple[StagedWrite, Json, frozenset[str]] | None = None
            dirs: set[Path] = set()
            received: set[str] = set()
            with tarfile.open(fileobj=ChunkReader(chunks), mode="r|") as tar:
                for member in tar:
                    src = tar.extractfile(member)
                    if src is None:
                        continue
                    if member.name == MANIFEST_MEMBER:
                        if staged is not None:
                            raise DamagedStore(f"the export of checkpoint {checkpoint_id} "
                                               "has two manifests")
                        # first in an export: its file is written and synced while the
                        # objects are, and renamed into place once they are durable
                        staged = self._stage_manifest(checkpoint_id, src.read(), stack)
                    elif member.name.startswith("objects/"):
                        sha = member.name[len("objects/"):]
                        dirs.add(self._put_object(sha, src))
                        received.add(sha)
            if staged is None:
                raise DamagedStore(f"the export of checkpoint {checkpoint_id} has no manifest")
            manifest_file, whole, shas = staged
            left_out = shas - received
            missing = sorted(left_out - self._stored(left_out))
            if missing:
                self._known = frozenset()
                raise IncompleteCopy(f"checkpoint {checkpoint_id}: {len(missing)} object(s) "
                                     f"left out of the export are not in {self.path} (e.g. "
                                     f"{missing[0]})")
            for d in dirs:
                fsync_dir(d)
            if not dirs <= self._durable_dirs:
                fsync_dir(self._objects)
                self._durable_dirs |= dirs
            manifest_file.commit()
        if manifest_file.path.name.endswith(".manifest.json"):
            self._base = (checkpoint_id, _tables(whole), manifest_file.size)
        self._known = shas

    def _stage_manifest(self, checkpoint_id: str, manifest: bytes, stack: ExitStack
                        ) -> tuple[StagedWrite, Json, frozenset[str]]:
        """The manifest's file, staged: as its difference from the base while that is
        small, else whole; with the manifest and the objects it names."""
        whole = _parse(manifest, checkpoint_id)
        shas = frozenset(f["sha256"] for f in whole["files"])
        name, data = self._name(checkpoint_id, ".manifest.json"), manifest
        if self._base is not None:
            base_id, base, size = self._base
            delta = json.dumps({"base": base_id, **_delta(base, whole)},
                               separators=(",", ":")).encode()
            if len(delta) * DELTA_FRACTION < size:
                name, data = self._name(checkpoint_id, ".delta.json"), delta
        return stack.enter_context(StagedWrite(name, data)), whole, shas

    def _put_object(self, sha: str, src: IO[bytes]) -> Path:
        """Write one object (checked against its name) unless it is there; its directory."""
        path = self._object(sha)
        if path.exists():
            return path.parent
        if not path.parent.is_dir():
            path.parent.mkdir(parents=True, exist_ok=True)
            self._durable_dirs.discard(path.parent)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{sha[:12]}.")
        digest = hashlib.sha256()
        try:
            with os.fdopen(fd, "wb") as f:
                while block := src.read(1024 * 1024):
                    digest.update(block)
                    f.write(block)
                f.flush()
                os.fsync(f.fileno())
            if digest.hexdigest() != sha:
                raise DamagedStore(f"object {sha} of the export has digest "
                                   f"{digest.hexdigest()}: the export is corrupt")
            os.replace(tmp, path)
        except BaseException:
            if os.path.exists(tmp):
                os.unlink(tmp)
            raise
        return path.parent

    def known(self) -> frozenset[str]:
        if self._known is None:  # a new process: the newest manifest's objects
            stored = sorted([*self.path.glob("*.manifest.json"), *self.path.glob("*.delta.json")],
                            key=lambda p: p.stat().st_mtime)
            self._known = frozenset()
            if stored:
                newest = stored[-1].name.rsplit(".", 2)[0]
                manifest = self._manifest(newest)
                self._known = frozenset(self._stored(f["sha256"] for f in manifest["files"]))
        return self._known

    def _manifest(self, checkpoint_id: str) -> Json:
        """The whole manifest of a stored checkpoint (a difference applied to its base);
        ``FileNotFoundError`` when it is not stored, ``DamagedStore`` when its base is
        missing or either is unreadable."""
        try:
            return _parse(self._name(checkpoint_id, ".manifest.json").read_bytes(),
                          checkpoint_id)
        except FileNotFoundError:
            pass
        raw = self._name(checkpoint_id, ".delta.json").read_bytes()
        try:
            delta = json.loads(raw)
            base = str(delta["base"])
        except (ValueError, KeyError, TypeError) as exc:
            raise DamagedStore(f"the manifest of checkpoint {checkpoint_id} in {self.path} "
                               f"is unreadable ({exc})") from None
        try:
            whole = _parse(self._name(base, ".manifest.json").read_bytes(), base)
        except FileNotFoundError:
            raise DamagedStore(f"checkpoint {checkpoint_id} in {self.path} is stored as a "
                               f"difference from {base}, which is missing") from None
        return _apply(whole, delta, checkpoint_id)

    # -- reading back ----------------------------------------------------------------

    def open(self, checkpoint_id: str) -> IO[bytes] | None:
        try:
            manifest = self._manifest(checkpoint_id)
        except FileNotFoundError:
            try:
                return open(self._name(checkpoint_id, ".tar"), "rb")  # a store of before
            except FileNotFoundError:
                return None
        out = tempfile.SpooledTemporaryFile(max_size=SPOOL_BYTES)  # noqa: SIM115 - returned open
        try:
            self._write_tar(checkpoint_id, manifest, out)
        except BaseException:
            out.close()
            raise
        out.seek(0)
        return out

    def _write_tar(self, checkpoint_id: str, manifest: Json, out: IO[bytes]) -> None:
        """The export tar of a stored checkpoint: its manifest, then each object, checked."""
        with tarfile.open(fileobj=out, mode="w|") as tar:
            data = json.dumps(manifest, separators=(",", ":")).encode()
            info = tarfile.TarInfo(MANIFEST_MEMBER)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
            for sha in sorted({f["sha256"] for f in manifest["files"]}):
                try:
                    data = self._object(sha).read_bytes()
                except FileNotFoundError:
                    raise DamagedStore(f"checkpoint {checkpoint_id} in {self.path} lacks its "
                                       f"object {sha}") from None
                if hashlib.sha256(data).hexdigest() != sha:
                    raise DamagedStore(f"object {sha} in {self.path} does not match its hash")
                info = tarfile.TarInfo(f"objects/{sha}")
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))

    def has(self, checkpoint_id: str) -> bool:
        return any(self._name(checkpoint_id, suffix).exists()
                   for suffix in (".manifest.json", ".delta.json", ".tar"))


def _parse(manifest: bytes, checkpoint_id: str) -> Json:
    """A whole manifest, checked for what the store reads of it."""
    try:
        whole: Json = json.loads(manifest)
        if not all(isinstance(f["path"], str) and isinstance(f["sha256"], str)
                   for f in whole["files"]) or not all(
                isinstance(whole.get(t, {}), dict) for t in _TABLES[1:]):
            raise TypeError("an entry table is not what an export holds")
        return whole
    except (ValueError, KeyError, TypeError) as exc:
        raise DamagedStore(f"the manifest of checkpoint {checkpoint_id} is unreadable "
                           f"({exc})") from None


def _tables(manifest: Json) -> dict[str, Json]:
    """Each entry table keyed by path (a file's value: its record)."""
    return {"files": {f["path"]: f for f in manifest["files"]},
            **{t: manifest.get(t, {}) for t in _TABLES[1:]}}


def _delta(old_t: dict[str, Json], new: Json) -> Json:
    """What turns the manifest of entry tables ``old_t`` into ``new``: its other fields, and
    per table what is set (added or changed) and what is removed."""
    new_t = _tables(new)
    out: Json = {"fields": {k: v for k, v in new.items() if k not in _TABLES}}
    for table in _TABLES:
        old, cur = old_t[table], new_t[table]
        out[table] = {"set": {p: v for p, v in cur.items() if old.get(p) != v},
                      "del": sorted(p for p in old if p not in cur)}
    return out


def _apply(base: Json, delta: Json, checkpoint_id: str) -> Json:
    """``base`` with ``delta`` applied (``_delta``'s inverse)."""
    try:
        tables = _tables(base)
        for table in _TABLES:
            entries = dict(tables[table])
            change = delta.get(table, {"set": {}, "del": []})  # a store of before: no such table
            for path in change["del"]:
                entries.pop(path, None)
            entries.update(change["set"])
            tables[table] = entries
        return {**delta["fields"], "files": [tables["files"][p] for p in sorted(tables["files"])],
                **{t: tables[t] for t in _TABLES[1:]}}
    except (KeyError, TypeError, AttributeError) as exc:
        raise DamagedStore(f"the difference stored for checkpoint {checkpoint_id} is "
                           f"unreadable ({exc})") from None
