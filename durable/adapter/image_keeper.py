"""The workspace image's I/O (transactional mode): keeping each conversation's image as the
log holds it, recording a scan's diff with a call, and making a workspace equal to it.

The image (``image.Image``) of a conversation is folded from its history once per process
and then kept up to date incrementally: the diffs this process records are folded as they
are staged, and a later catch-up (after a Space was reconnected or rebuilt) folds only the
entries after the last one folded. Before, every new connection to a Space refolded the
whole history into an empty image.
"""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
import tempfile
import time
import weakref
from collections.abc import Iterable
from typing import IO, Any

from spacesd.protocol import ScanResult, workspace_hash

from ..errors import PermanentFailure
from ..failpoints import failpoint
from ..log import Log, Transaction
from ..spaces import SpaceClient
from . import image as img
from .state import IMAGE_STATE, ImageState


class ImageKeeper:
    def __init__(self, limits: img.TransactionalLimits) -> None:
        self.limits = limits
        self._images: dict[int, img.Image] = {}
        #: Per Space client: the rows of its last scan, kept for its next (they can match
        #: only that client's entries); gone with the client.
        self._rows: weakref.WeakKeyDictionary[SpaceClient, img.RowMemo] = (
            weakref.WeakKeyDictionary())

    def image(self, conversation: int) -> img.Image:
        return self._images.setdefault(conversation, img.Image())

    def catch_up(self, log: Log, conversation: int) -> None:
        """Fold the conversation's image entries after the last one folded."""
        self.image(conversation).fold_history(log.entries(conversation))

    def scan(self, client: SpaceClient) -> ScanResult:
        return client.scan(exclude=list(self.limits.exclude))

    def over_limits(self, scan: ScanResult) -> str | None:
        return img.over_limits(scan, self.limits)

    def reimage(self, log: Log, conversation: int, client: SpaceClient) -> None:
        """Make the workspace equal to the image, its whole state: the image is imported
        into the Space as a checkpoint (with only the contents the workspace lacks) and
        restored, as a checkpoint is; paths the scans exclude are left alone."""
        failpoint("recovery.reimage", space=client.name)
        stale = IMAGE_STATE.read(log, conversation).stale
        if stale:
            raise PermanentFailure(
                f"the workspace image of conversation {conversation} is stale ({stale}), so "
                "the Space cannot be rebuilt from the log; use checkpoint mode with a "
                "CheckpointStore for workspaces this large")
        image = self.image(conversation)
        scan = self.scan(client)
        if workspace_hash(scan.entries) == image.hash():
            return
        held = {e.sha256: e.size for e in scan.entries if e.kind == "file" and e.sha256}
        blobs: dict[str, bytes] = {}
        for row in image.table.values():
            if row.kind == "file" and row.ident not in held and row.ident not in blobs:
                blobs[row.ident] = img.blob_from(log.entry(image.blobs[row.ident]).data,
                                                 row.ident)
        checkpoint_id = f"image-c{conversation}"
        sizes = {**held, **{sha: len(data) for sha, data in blobs.items()}}
        with tempfile.TemporaryFile() as tar:
            _export_tar(img.manifest(image, checkpoint_id, int(time.time() * 1000), sizes),
                        blobs, tar)
            tar.seek(0)
            client.checkpoint_import(checkpoint_id, tar)
        client.checkpoint_restore(checkpoint_id, exclude=list(self.limits.exclude) or None)
        client.checkpoint_delete(checkpoint_id)

    def stage(self, tx: Transaction, conversation: int, client: SpaceClient, scan: ScanResult,
              call_id: str | None, *, known: Iterable[bytes] = ()) -> None:
        """Record in ``tx`` the diff from the image to ``scan`` (with the bytes of contents
        the log does not hold yet: those of ``known`` whose digest the scan found, the rest
        read from the Space) and fold it in."""
        image = self.image(conversation)
        rows = self._rows.setdefault(client, img.RowMemo()).rows(scan)
        d = img.diff(image, rows)
        if not d:
            return
        have = {hashlib.sha256(data).hexdigest(): data for data in known}
        blobs: dict[str, bytes] = {}
        for sha in d.new_blobs(image):
            if sha in have:
                blobs[sha] = have[sha]
                continue
            path = next(p for p, row in d.set.items() if row.kind == "file" and row.ident == sha)
            blobs[sha] = client.read_file(path)
        data = img.payload(d, blobs, call_id=call_id)
        entry = tx.append(conversation, "system", data)
        files = [e for e in scan.entries if e.kind in ("file", "symlink")]
        IMAGE_STATE.write(tx, conversation, ImageState(
            None, len(files), sum(e.size for e in files if e.kind == "file")))
        image.fold(entry, data[img.IMAGE_KEY])

    @staticmethod
    def mark_stale(tx: Transaction, conversation: int, problem: str) -> None:
        """Record in ``tx`` that the image no longer follows the workspace, and why."""
        state = IMAGE_STATE.read_in(tx, conversation)
        IMAGE_STATE.write(tx, conversation, ImageState(problem, state.files, state.bytes))


def _export_tar(manifest: dict[str, Any], blobs: dict[str, bytes], out: IO[bytes]) -> None:
    """A checkpoint export tar (the daemon's format): the manifest, then the objects."""
    with tarfile.open(fileobj=out, mode="w|") as tar:
        for name, data in [("manifest.json", json.dumps(manifest, separators=(",", ":"))
                            .encode()),
                           *((f"objects/{sha}", b) for sha, b in sorted(blobs.items()))]:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
