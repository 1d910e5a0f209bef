"""Content-addressed blobs beside a log: a virtual workspace's larger files.

A blob is stored once under its sha256 (``<log>.blobs/ab/abcdef...``), written to a
temporary file, fsynced, renamed into place and its directory fsynced, all before the call
whose change names it commits; so a committed change never names a blob that is not on
disk. A blob written by a call that crashed before its commit is named by nothing: it is
harmless and a rerun of the call finds it already there. Every read checks the content
against its name: a damaged or missing blob is ``DamagedBlob``, never wrong bytes.

``image_content`` reads a content of a workspace image wherever the log keeps it (inline
in an image entry, or in this store); the tools and ``durable.review`` both read through it.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from ..adapter.image import Image, blob_from
from ..errors import CorruptLog
from ..log import Log
from ..storage.base import Storage


class DamagedBlob(CorruptLog):
    """A blob the log names is missing or does not match its hash."""


def blob_dir(storage: Storage) -> Path | None:
    """Where the blobs of the log on ``storage`` live, or None for a storage without a file
    (in memory), whose workspaces keep every content in the log: beside a SQLite log's file
    (``log.sqlite.blobs``), beside a JSONL log's directory (``log.blobs``: the directory
    holds only the log's own files; blobs inside it made every later open refuse the log)."""
    directory = getattr(storage, "directory", None)
    path = directory if directory is not None else getattr(storage, "path", None)
    return None if path is None else Path(f"{path}.blobs")


class BlobStore:
    def __init__(self, directory: Path) -> None:
        self.directory = directory

    def path(self, sha: str) -> Path:
        """Where blob ``sha`` lives; a name that is not a sha256 (the log is input: a
        damaged or hostile one could name ``/dev/zero``) is ``DamagedBlob``."""
        if len(sha) != 64 or not all(c in "0123456789abcdef" for c in sha):
            raise DamagedBlob(f"the log names a blob {sha[:80]!r}, which is not a sha256: the "
                              "log is damaged")
        return self.directory / sha[:2] / sha

    def put(self, data: bytes) -> str:
        """Store ``data`` durably; its sha256."""
        sha = hashlib.sha256(data).hexdigest()
        target = self.path(sha)
        if target.exists() and self._matches(target, sha):
            return sha
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(f".{sha}.{os.getpid()}.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, target)
        for directory in (target.parent, self.directory):
            dfd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
            try:
                os.fsync(dfd)
            finally:
                os.close(dfd)
        return sha

    def get(self, sha: str) -> bytes:
        target = self.path(sha)
        try:
            data = target.read_bytes()
        except FileNotFoundError:
            raise DamagedBlob(f"blob {sha} is missing from {self.directory}; the log names it "
                              "as a file of the virtual workspace (was the log copied without "
                              "its .blobs directory?)") from None
        if hashlib.sha256(data).hexdigest() != sha:
            raise DamagedBlob(f"blob {target} does not match its hash: it is damaged; restore "
                              "it from a backup of the log and its .blobs directory")
        return data

    @staticmethod
    def _matches(target: Path, sha: str) -> bool:
        return hashlib.sha256(target.read_bytes()).hexdigest() == sha


def image_content(log: Log, image: Image, sha: str, store: BlobStore | None) -> bytes:
    """The bytes of content ``sha`` of ``image``, from its entry or the blob store, checked
    against the hash."""
    if sha in image.blobs:
        try:
            return blob_from(log.entry(image.blobs[sha]).data, sha)
        except ValueError as exc:
            raise DamagedBlob(str(exc)) from None
    if sha in image.external:
        if store is None:
            raise DamagedBlob(f"content {sha} is kept in a blob store beside the log, and "
                              "this log has none (it is not in a file)")
        return store.get(sha)
    raise DamagedBlob(f"content {sha} is named by the workspace image but held nowhere in "
                      "the log")
