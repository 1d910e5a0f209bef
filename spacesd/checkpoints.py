"""Directory checkpoints: copies of the workspace in a content-addressed store.

Layout under ``<state>/checkpoints``: ``objects/<sha[:2]>/<sha>`` holds each distinct file
content once, ``manifests/<id>.json`` lists the workspace state of one checkpoint, every path
of it (``protocol.ScanEntry``): files (digest, size, every mode bit, hardlink group, sparse
extents), symlinks (target, any: a link is data), directories (empty ones too) and FIFOs
(mode), and every entry's mtime.

A checkpoint costs what changed since the last one: ``create`` takes the state from the
daemon's watched scan (``watched_scan``: only paths with events since its last look are
looked at again), reuses each unchanged entry's record, JSON and checks from the manifest
before (``manifest.ManifestEncoder``), and does not look for objects this process stored or saw in
the store (the store is this daemon's alone, and the garbage collector forgets what it
deletes; an object removed behind its back is found by the restore that needs it, as a
damaged one is, and looked for again from then on). It also inherits the watched scan's
one blind spot: a write through a shared memory map after its file's every descriptor was
closed makes no event (see ``watched_scan``).

Damage: a manifest carries a SHA-256 of its own content (``checksum``; manifests of older
daemons have none and are read as they are), and restore checks each object it copies back
against its digest before the copy replaces anything. A manifest that does not parse or
match, or an object that is missing or does not match, is ``Damaged``: never restored, never
listed as if it were fine, and while any manifest is damaged the garbage collector keeps
every object.
Objects are copies, never hard links, because a hard link would change when a command
appends to the workspace file in place.

Restore makes the workspace equal to a manifest in steps that are each idempotent: remove
what the manifest lacks (or has with another kind), create directories, write back each file
whose content (or hardlink group) differs (atomically; a sparse file's holes stay holes),
link the other members of each hardlink group, make FIFOs, fix symlinks, set the mode of
what differs, then every mtime (directories last, deepest first, since each entry made in
a directory changed its mtime) and the directories' modes. A crash midway leaves a mix of
old and new whole files; running restore again converges. Nothing is rewritten that already
equals the manifest, so a restore never changes an untouched file's mode or time.

Export and import move a checkpoint as a tar stream (``manifest.json`` then
``objects/<sha>``); import checks every object against its name and the manifest against
the path rules. An import may leave out objects of files the workspace holds right now:
they are taken from there (each checked against its digest), so the adapter's revert to its
image sends only the contents the workspace lost.

Confinement: restore and create reach every entry through ``paths.Walk`` (directory fds,
no following a link out of the root), like the file ops. A symlink is created as it was
recorded, whatever its target; no restore step ever follows one. The store is private: its
directories are 0700 and objects 0400 (content of a 0600 file is not readable by others in
the store), whatever the mode of the files they copy.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import io
import json
import os
import re
import shutil
import stat
import tarfile
import threading
import time
from collections.abc import Iterator
from dataclasses import replace
from operator import attrgetter
from typing import IO, Protocol, cast

from . import paths
from .errors import BadRequest, Conflict, Damaged, NotFound, OutsideRoot
from .failpoints import Channel
from .file_ops import Workspace
from .manifest import SHA256_HEX, FileRec, Manifest, ManifestEncoder, ParsedManifests, checksum_of
from .protocol import CheckpointInfo, ScanEntry, applied_scan
from .watched_scan import WatchedScan
from .workspace_scan import CANNOT_READ

_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:@-]{0,199}")
_MANIFEST_MEMBER = "manifest.json"
_MAX_MANIFEST = 256 * 1024 * 1024
_CHUNK = 1024 * 1024
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
#: Entries (files, links, directories, FIFOs) of the parsed manifests a daemon keeps in
#: memory (``manifest.ParsedManifests``): some tens of MB at most.
PARSED_MANIFEST_ENTRIES = 100_000


class Readable(Protocol):
    """What import reads a tar stream from (a file, or the body of a request)."""

    def read(self, n: int = -1, /) -> bytes: ...


_PATH = attrgetter("path")


class Vanished(OSError):
    """A workspace file went away, or is something else now, between a scan and its copy."""


#: What opening a workspace file that vanished (or was replaced: by a symlink, a socket)
#: fails with.
_GONE = (errno.ENOENT, errno.ENOTDIR, errno.ELOOP, errno.ENXIO)


def check_id(checkpoint_id: str) -> str:
    if not _ID.fullmatch(checkpoint_id):
        raise BadRequest(f"checkpoint id {checkpoint_id!r} is not valid: use 1-200 of "
                         "A-Z a-z 0-9 . _ : @ -, starting with a letter or digit")
    return checkpoint_id


class Checkpoints:
    def __init__(self, state_dir: str, workspace: Workspace, watched: WatchedScan, *,
                 failpoints: Channel) -> None:
        base = os.path.join(state_dir, "checkpoints")
        self._objects = os.path.join(base, "objects")
        self._manifests = os.path.join(base, "manifests")
        for d in (base, self._objects, self._manifests):
            os.makedirs(d, mode=0o700, exist_ok=True)
            os.chmod(d, 0o700)  # a store made by an older daemon was world-readable
        self._ws = workspace
        self._watched = watched
        self._scanner = watched.scanner
        #: The workspace state as of this object's last scan, and the token naming it.
        self._state: dict[str, ScanEntry] = {}
        self._token: str | None = None
        self._encoder = ManifestEncoder()
        #: Objects this process stored or saw in the store and did not delete since.
        self._have: set[str] = set()
        self._failpoints = failpoints
        self._lock = threading.Lock()  # one checkpoint operation at a time (and the GC)
        self._prefixes: set[str] = set()  # object directories known to exist
        self._parsed = ParsedManifests(PARSED_MANIFEST_ENTRIES)

    # ---------------------------------------------------------------- store

    def _object(self, sha: str) -> str:
        return os.path.join(self._objects, sha[:2], sha)

    def _store(self, chunks: Iterator[bytes], expect: str | None = None) -> tuple[str, int]:
        """Copy ``chunks`` into the store; returns (digest, size). ``expect``: refuse
        content whose digest differs (an imported object must match its name)."""
        tmp = self._ws.writer.temp_path(os.path.join(self._objects, "x"))
        h = hashlib.sha256()
        size = 0
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
                         | os.O_CLOEXEC, 0o600)
            with open(fd, "wb") as f:
                for chunk in chunks:
                    h.update(chunk)
                    size += len(chunk)
                    f.write(chunk)
                f.flush()
                os.fchmod(fd, 0o400)
                os.fsync(fd)
            sha = h.hexdigest()
            if expect is not None and sha != expect:
                raise BadRequest(f"object {expect} has digest {sha}: the tar is corrupt")
            prefix = os.path.dirname(self._object(sha))
            if prefix not in self._prefixes:
                os.makedirs(prefix, mode=0o700, exist_ok=True)
                self._prefixes.add(prefix)
            os.replace(tmp, self._object(sha))
            self._have.add(sha)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
        return sha, size

    def _read_entry(self, rel: str) -> Iterator[bytes]:
        """The content of the regular file ``rel`` of the workspace, reached by its fd;
        ``Vanished`` when it is gone or something else now."""
        try:
            with self._ws.walk(rel, follow=False) as w:
                fd = os.open(w.name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK
                             | os.O_CLOEXEC, dir_fd=w.fd)
        except OutsideRoot as exc:  # a directory on its way is a link now
            raise Vanished(errno.ENOENT, f"{rel}: {exc}") from None
        except OSError as exc:
            if exc.errno in _GONE:
                raise Vanished(exc.errno, f"{rel}: {exc.strerror}") from None
            raise
        with open(fd, "rb") as f:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise Vanished(errno.ENOENT, f"{rel}: not a regular file any more")
            os.set_blocking(fd, True)
            yield from _chunks_of(f)

    def _manifest_path(self, checkpoint_id: str) -> str:
        return os.path.join(self._manifests, check_id(checkpoint_id) + ".json")

    def load(self, checkpoint_id: str) -> Manifest:
        """A stored manifest; ``NotFound``, or ``Damaged`` when it fails its checks."""
        return self.load_with_json(checkpoint_id)[0]

    def load_with_json(self, checkpoint_id: str) -> tuple[Manifest, bytes]:
        """A stored manifest and its file's JSON, checksum and all (what ``export`` sends);
        ``NotFound``, or ``Damaged`` when it fails its checks."""
        path = self._manifest_path(checkpoint_id)
        try:
            with open(path, "rb") as f:
                data = f.read()
        except FileNotFoundError:
            raise NotFound(f"no checkpoint {checkpoint_id!r}; checkpoint_list shows the "
                           "existing ones") from None
        known = self._parsed.get(checkpoint_id, data)
        if known is not None:
            return known, data
        try:
            raw = json.loads(data)
            claimed = raw.pop("checksum", None) if isinstance(raw, dict) else None
            if claimed is not None and claimed != checksum_of(raw):
                raise ValueError("its content does not match its checksum")
            m = Manifest.from_json(raw, checkpoint_id)
        except (ValueError, BadRequest) as exc:
            raise Damaged(f"checkpoint {checkpoint_id!r}: its manifest {path} is damaged "
                          f"({exc}); it cannot be restored. Delete the checkpoint "
                          "(checkpoint_delete) and make a new one") from None
        self._parsed.put(checkpoint_id, data, m)
        return m, data

    def _save(self, m: Manifest, body: bytes, valid: bool) -> None:
        """Write ``m``, whose canonical JSON is ``body`` (``_checksum``'s spelling), with
        its checksum; ``valid``: whether ``load`` would take it (only then is it kept
        parsed: a manifest it would refuse is judged by it)."""
        data = b'%s,"checksum":"%s"}' % (body[:-1], hashlib.sha256(body).hexdigest().encode())
        self._ws.writer.write(self._manifest_path(m.id), [data], mode=0o600)
        if valid:
            self._parsed.put(m.id, data, m)

    def _has_object(self, sha: str) -> bool:
        """Whether the store holds ``sha``: known without a look once this process stored
        or saw it and did not delete it (the store is this daemon's alone)."""
        if sha in self._have:
            return True
        if os.path.exists(self._object(sha)):
            self._have.add(sha)
            return True
        return False

    def _workspace(self) -> tuple[list[ScanEntry], list[str]]:
        """What ``Scanner.scan`` answers, from the watched state (``WatchedScan``): the
        entries that changed since this object last asked, applied to what it kept."""
        answer = self._watched.scan(None, since=self._token, passing=True)
        self._state = applied_scan(self._state, answer.full, answer.entries, answer.removed)
        self._token = answer.token
        return sorted(self._state.values(), key=_PATH), answer.refused

    # ---------------------------------------------------------------- operations

    def create(self, checkpoint_id: str) -> CheckpointInfo:
        check_id(checkpoint_id)
        with self._lock:
            entries, refused = self._workspace()
            unreadable = [r for r in refused if r.endswith(CANNOT_READ)]
            if unreadable:  # a socket is no state; a file it cannot read is, and is lost
                raise Conflict(f"checkpoint {checkpoint_id!r} cannot keep {unreadable[0]}")
            kept: list[ScanEntry] = []
            named = {e.link for e in entries if e.link is not None}  # groups' first files
            stored: dict[str, ScanEntry] = {}  # first file of a group, as kept
            first: dict[str, str] = {}  # a group's first file gone meanwhile -> the new one
            have = self._have
            for e in entries:
                if e.kind == "file":
                    promoted = False
                    if e.link is not None and e.link not in stored:
                        # Its group's first file went away between the scan and the copy:
                        # the next member (in path order) becomes the first, the later ones
                        # link to it.
                        gone = e.link
                        e = replace(e, link=first.get(gone))
                        first.setdefault(gone, e.path)
                        promoted = e.link is None
                    if e.link is None:
                        if e.sha256 is not None and e.sha256 not in have and \
                                not self._has_object(e.sha256):
                            try:
                                sha, size = self._store(self._read_entry(e.path))
                            except Vanished:
                                continue  # removed or replaced meanwhile
                            # Any other error (the store's disk full, a read error) fails
                            # the checkpoint: one that left the file out would delete it
                            # at its restore.
                            if (sha, size) != (e.sha256, e.size):  # changed since the scan
                                e = replace(e, sha256=sha, size=size, extents=None)
                        if promoted or e.path in named:
                            stored[e.path] = e
                    elif e.link in stored:  # a group's members hold what its first holds
                        held = stored[e.link]
                        e = replace(e, sha256=held.sha256, size=held.size,
                                    extents=held.extents)
                    else:
                        continue  # the group's new first went away too
                kept.append(e)
            m, body, valid = self._encoder.encode(checkpoint_id, int(time.time() * 1000), kept)
            self._failpoints.report("spacesd.checkpoint.objects", {"id": checkpoint_id})
            self._save(m, body, valid)
            return m.info()

    def restore(self, checkpoint_id: str, *, exclude: list[str] | None = None
                ) -> CheckpointInfo:
        """Make the workspace equal to the checkpoint; ``exclude``: paths (scan globs) it
        leaves as they are (a manifest made without them does not name them)."""
        with self._lock:
            m = self.load(checkpoint_id)
            self._restore(m, exclude or [])
            return m.info()

    def _restore(self, m: Manifest, exclude: list[str]) -> None:
        ws = self._ws
        self._check_objects(m)
        want = {e.path: e for e in m.entries()}
        # 0. Every directory writable and searchable by its owner while the restore works
        # in it (a daemon that is not root could neither remove from a read-only one nor
        # enter one of mode 000); the modes the manifest wants are set last.
        opened = self._open_up(exclude)
        have = {e.path: e for e in self._scanner.scan(exclude)[0]}
        touched = {""}  # directories (relative) whose entries changed
        # 1. Remove what the checkpoint lacks or has as another kind (children first).
        for rel, st in reversed(list(self._scanner.walk(exclude))):
            wanted = want.get(rel)
            if wanted is None or wanted.kind != paths.kind_of(st.st_mode):
                with contextlib.suppress(FileNotFoundError, NotADirectoryError), \
                        ws.walk(rel, follow=False) as w:
                    if stat.S_ISDIR(st.st_mode):
                        shutil.rmtree(w.name, dir_fd=w.fd, ignore_errors=True)
                    else:
                        os.unlink(w.name, dir_fd=w.fd)
                have.pop(rel, None)
                touched.add(_parent(rel))
        self._failpoints.report("spacesd.restore.partial", {"id": m.id})
        # 2. Directories, writable while entries go in; their modes are set last.
        for rel in sorted(m.dirs):
            now = have.get(rel)
            if now is not None and now.mode & stat.S_IRWXU == stat.S_IRWXU:
                continue
            with ws.walk(rel, follow=False, make_dirs=True) as w:
                if now is None:
                    with contextlib.suppress(FileExistsError):
                        os.mkdir(w.name, 0o700, dir_fd=w.fd)
                    touched.add(_parent(rel))
                with _opened(w.name, _DIR_FLAGS, w.fd) as fd:
                    os.fchmod(fd, m.dirs[rel] | stat.S_IRWXU)
            opened.add(rel)
        # 3. Files: the first of each hardlink group whose content (or group) differs is
        # written again; then the group's other members are linked to it.
        rewritten: set[str] = set()
        for f in m.files:
            if f.link is not None:
                continue
            now = have.get(f.path)
            if now is not None and now.kind == "file" and now.link is None and \
                    now.sha256 == f.sha256 and now.extents == f.extents:
                continue
            with ws.walk(f.path, follow=False) as w:
                ws.writer.write(w.name, self._verified(m.id, f), mode=f.mode, sync_dir=False,
                                dir_fd=w.fd, extents=f.extents)
            rewritten.add(f.path)
            touched.add(_parent(f.path))
        for f in m.files:
            if f.link is not None and self._relink(f.link, f.path):
                touched.add(_parent(f.path))
        # 4. FIFOs and symlinks (any target: a restore never follows a link).
        for rel in m.fifos:
            if have.get(rel) is None:
                with ws.walk(rel, follow=False) as w:
                    os.mkfifo(w.name, 0o600, dir_fd=w.fd)
                touched.add(_parent(rel))
        for rel, target in m.symlinks.items():
            now = have.get(rel)
            if now is None or now.target != target:
                with ws.walk(rel, follow=False) as w:
                    ws.symlink_at(rel, w.fd, w.name, target)
                touched.add(_parent(rel))
                rewritten.add(rel)  # a new link: its mtime is now
        # 5. Modes and times of what differs (directories last, deepest first: every entry
        # made in one changed its mtime), then make the renames durable.
        for e in sorted(want.values(), key=lambda e: (e.kind == "dir", -e.path.count("/"))):
            now = have.get(e.path)
            fresh = now is None or e.path in rewritten
            if e.kind == "dir":
                fresh = fresh or e.path in touched or e.path in opened
            elif e.kind != "symlink" and e.path not in rewritten and (now is None
                                                                      or now.mode != e.mode):
                with ws.walk(e.path, follow=False) as w:
                    os.chmod(w.name, e.mode, dir_fd=w.fd)
            if e.mtime_ns is not None and (fresh or now is None or now.mtime_ns != e.mtime_ns):
                with ws.walk(e.path, follow=False) as w:
                    os.utime(w.name, ns=(e.mtime_ns, e.mtime_ns), dir_fd=w.fd,
                             follow_symlinks=False)
        for rel, mode in m.dirs.items():
            now = have.get(rel)
            if now is None or rel in opened or now.mode != mode:
                with ws.walk(rel, follow=False) as w, _opened(w.name, _DIR_FLAGS, w.fd) as fd:
                    os.fchmod(fd, mode)
        for rel in touched:
            with contextlib.suppress(OSError, OutsideRoot), ws.walk(rel, follow=True) as w, \
                    _opened(w.name, _DIR_FLAGS, w.fd) as fd:
                os.fsync(fd)

    def _open_up(self, exclude: list[str]) -> set[str]:
        """Give every directory of the workspace its owner's rwx, entering each as it is
        opened (so a mode-000 one's children are reached too); the ones changed."""
        changed: set[str] = set()
        for rel, st in self._scanner.walk(exclude):
            if stat.S_ISDIR(st.st_mode) and st.st_mode & stat.S_IRWXU != stat.S_IRWXU:
                with contextlib.suppress(FileNotFoundError, NotADirectoryError), \
                        self._ws.walk(rel, follow=False) as w:
                    fd = os.open(w.name, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW,
                                 dir_fd=w.fd)
                    try:  # an O_PATH fd cannot fchmod; its /proc link can, without search
                        os.chmod(f"/proc/self/fd/{fd}",
                                 stat.S_IMODE(st.st_mode) | stat.S_IRWXU)
                    finally:
                        os.close(fd)
                    changed.add(rel)
        return changed

    def _relink(self, first: str, member: str) -> bool:
        """Make ``member`` a hardlink of ``first``; whether it had to change."""
        with self._ws.walk(first, follow=False) as a, self._ws.walk(member, follow=False) as b:
            target = os.stat(a.name, dir_fd=a.fd, follow_symlinks=False)
            try:
                now = os.stat(b.name, dir_fd=b.fd, follow_symlinks=False)
                if (now.st_dev, now.st_ino) == (target.st_dev, target.st_ino):
                    return False
                os.unlink(b.name, dir_fd=b.fd)
            except FileNotFoundError:
                pass
            os.link(a.name, b.name, src_dir_fd=a.fd, dst_dir_fd=b.fd, follow_symlinks=False)
            return True

    def _check_objects(self, m: Manifest) -> None:
        """``Damaged`` before the restore changes anything when an object ``m`` names is
        missing or of another size than it says: found only when its file's turn came, the
        restore had already removed and rewritten other entries (found by review). One
        of the right size but other content is still found as it is copied back
        (``_verified``), before its file is replaced; reading every object twice to find
        it first would double what a restore reads."""
        seen: set[str] = set()
        for f in m.files:
            if f.link is not None or f.sha256 in seen:
                continue
            seen.add(f.sha256)
            try:
                size = os.stat(self._object(f.sha256)).st_size
            except FileNotFoundError:
                problem = "is missing"
            else:
                if size == f.size:
                    continue
                problem = f"holds {size} bytes"
            raise self._damaged(m.id, f, problem, "the restore changed nothing")

    def _damaged(self, checkpoint_id: str, f: FileRec, problem: str, done: str) -> Damaged:
        """The error of an object found missing or damaged. A damaged one is removed and
        forgotten, so that the next checkpoint of its content stores it again (kept, it was
        taken as stored, and the new checkpoint the error advises was as damaged; found by
        review)."""
        self._have.discard(f.sha256)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self._object(f.sha256))
        return Damaged(f"checkpoint {checkpoint_id!r}: the object of {f.path!r} "
                       f"({self._object(f.sha256)}, {f.size} bytes) {problem}; {done}. "
                       "Delete the checkpoint (checkpoint_delete) and make a new one "
                       "(its object is stored again)")

    def _verified(self, checkpoint_id: str, f: FileRec) -> Iterator[bytes]:
        """The chunks of ``f``'s object; ``Damaged`` after the last one (so before the
        writer replaces anything) when the object is missing or not what ``f`` says."""
        h = hashlib.sha256()
        size = 0
        try:
            for chunk in _read_chunks(self._object(f.sha256)):
                h.update(chunk)
                size += len(chunk)
                yield chunk
        except FileNotFoundError:
            problem = "is missing"
        else:
            if h.hexdigest() == f.sha256 and size == f.size:
                return
            problem = f"holds {size} bytes of digest {h.hexdigest()}"
        raise self._damaged(checkpoint_id, f, problem,
                            "the restore stopped before copying it back")

    def _ids(self) -> list[str]:
        """The ids of the stored manifests (names that are not ids are not ours)."""
        return [name[:-5] for name in sorted(os.listdir(self._manifests))
                if name.endswith(".json") and _ID.fullmatch(name[:-5])]

    def list(self) -> list[CheckpointInfo]:
        """Every checkpoint; ``Damaged`` if one of them is."""
        out = []
        for checkpoint_id in self._ids():
            try:
                out.append(self.load(checkpoint_id).info())
            except NotFound:
                continue  # deleted meanwhile
        return out

    def delete(self, checkpoint_id: str) -> bool:
        """Remove a checkpoint and the objects no other checkpoint uses."""
        with self._lock:
            try:
                os.unlink(self._manifest_path(checkpoint_id))
            except FileNotFoundError:
                return False
            self._parsed.drop(checkpoint_id)
            self._collect_garbage()
            return True

    def _collect_garbage(self) -> None:
        used: set[str] = set()
        for checkpoint_id in self._ids():
            try:
                used.update(f.sha256 for f in self.load(checkpoint_id).files)
            except NotFound:
                continue
            except Damaged:
                return  # its objects are unknown: keep them all
        kept: set[str] = set()
        for prefix in os.listdir(self._objects):
            for sha in os.listdir(os.path.join(self._objects, prefix)):
                if sha in used:
                    kept.add(sha)
                else:
                    _unlink(os.path.join(self._objects, prefix, sha))
        self._have &= kept  # and forget any object removed behind this daemon's back

    def _take_from_workspace(self, shas: set[str]) -> None:
        """Store, from the workspace's files, the contents of ``shas`` it holds now (each
        copy checked against its digest: a file changed meanwhile is no copy)."""
        for e in self._workspace()[0]:
            if e.kind == "file" and e.sha256 in shas:
                with contextlib.suppress(Vanished, BadRequest):  # gone, or changed
                    self._store(self._read_entry(e.path), expect=e.sha256)
                    shas.discard(e.sha256)

    # ---------------------------------------------------------------- export / import

    def export(self, m: Manifest, data: bytes, out: IO[bytes],
               skip: frozenset[str] = frozenset()) -> None:
        """Write checkpoint ``m`` to ``out`` as a tar stream: its manifest (``data``, the JSON
        of its file, as ``load_with_json`` gave it: encoding it again cost about 1 ms per
        1000 files), then its objects but those in ``skip`` (the receiver has them: a store
        copies only what changed)."""
        with tarfile.open(fileobj=out, mode="w|") as tar:
            info = tarfile.TarInfo(_MANIFEST_MEMBER)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
            for sha in sorted({f.sha256 for f in m.files} - skip):
                path = self._object(sha)
                info = tarfile.TarInfo(f"objects/{sha}")
                info.size = os.path.getsize(path)
                with open(path, "rb") as f:
                    tar.addfile(info, f)

    def import_(self, checkpoint_id: str, stream: Readable) -> CheckpointInfo:
        """Read a tar stream made by ``export`` into checkpoint ``checkpoint_id``."""
        check_id(checkpoint_id)
        with self._lock:
            raw_manifest = None
            try:
                # Stream mode ("r|") only ever calls read() on fileobj.
                with tarfile.open(fileobj=cast(IO[bytes], stream), mode="r|") as tar:
                    for member in tar:
                        src = tar.extractfile(member) if member.isfile() else None
                        if src is None:
                            raise BadRequest(f"unexpected tar member {member.name!r}")
                        if member.name == _MANIFEST_MEMBER and member.size <= _MAX_MANIFEST:
                            raw_manifest = json.loads(src.read())
                        elif member.name.startswith("objects/") and SHA256_HEX.fullmatch(
                                member.name[8:]):
                            self._store(_chunks_of(src), expect=member.name[8:])
                        else:
                            raise BadRequest(f"unexpected tar member {member.name!r}")
            except (tarfile.TarError, ValueError, EOFError) as exc:
                raise BadRequest(f"checkpoint_import: not a checkpoint tar ({exc})") from None
            if raw_manifest is None:
                raise BadRequest("checkpoint_import: the tar has no manifest.json")
            m = Manifest.from_json(raw_manifest, checkpoint_id)
            lacking = {f.sha256 for f in m.files if not self._has_object(f.sha256)}
            if lacking:
                self._take_from_workspace(lacking)
            missing = [f.path for f in m.files if not self._has_object(f.sha256)]
            if missing:
                raise BadRequest(f"checkpoint_import: the tar lacks the content of "
                                 f"{len(missing)} file(s), e.g. {missing[0]!r}")
            self._save(m, json.dumps(m.to_json(), sort_keys=True, separators=(",", ":"))
                       .encode(), True)
            return m.info()


def _chunks_of(f: IO[bytes]) -> Iterator[bytes]:
    while chunk := f.read(_CHUNK):
        yield chunk


def _read_chunks(path: str) -> Iterator[bytes]:
    with open(path, "rb") as f:
        yield from _chunks_of(f)


def _parent(rel: str) -> str:
    return rel.rpartition("/")[0]


@contextlib.contextmanager
def _opened(name: str, flags: int, dir_fd: int) -> Iterator[int]:
    fd = os.open(name, flags, dir_fd=dir_fd)
    try:
        yield fd
    finally:
        os.close(fd)


def _unlink(path: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
