"""Snapshot providers (checkpoint mode) and checkpoint stores.

A ``SnapshotProvider`` takes a checkpoint of a Space and restores one. Two kinds:

- ``workspace`` (``WorkspaceSnapshots``): a copy of the workspace directory made by the
  Space's daemon, optionally copied out to a ``CheckpointStore`` so it survives the loss of
  the Space itself. Processes are not part of it.
- ``machine``: a whole-machine snapshot (memory and disk), which a microVM backend provides
  by implementing the same protocol.

A checkpoint is named by a ``CheckpointRef``: the Space it was taken in and its id. A fork's
Space is restored from its parent's checkpoint, so restoring into another Space (through the
store, or by export/import between the two Spaces) is part of the contract.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Literal, Protocol, runtime_checkable

from ..atomic_file import write_atomic
from ..errors import PermanentFailure, SpaceError
from ..failpoints import failpoint
from ..spaces import SpaceClient, Spaces


@dataclass(frozen=True)
class CheckpointRef:
    """A checkpoint: the Space it was taken in and its id (``state.CheckpointMark`` records
    one in the log)."""

    space: str
    id: str


@runtime_checkable
class CheckpointStore(Protocol):
    """Keeps copies of checkpoints outside any Space."""

    def put(self, checkpoint_id: str, chunks: Iterator[bytes]) -> None: ...

    def open(self, checkpoint_id: str) -> IO[bytes] | None:
        """The stored tar stream, or ``None`` when this store does not have it."""
        ...

    def has(self, checkpoint_id: str) -> bool: ...


class DirectoryCheckpointStore:
    """A ``CheckpointStore`` in a directory of this machine: one tar file per checkpoint,
    written to a temporary name, fsynced, then renamed (a crash leaves no partial copy)."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self.path.mkdir(parents=True, exist_ok=True)

    def _file(self, checkpoint_id: str) -> Path:
        if "/" in checkpoint_id or checkpoint_id.startswith("."):
            raise ValueError(f"checkpoint id {checkpoint_id!r} is not a plain name")
        return self.path / f"{checkpoint_id}.tar"

    def put(self, checkpoint_id: str, chunks: Iterator[bytes]) -> None:
        write_atomic(self._file(checkpoint_id), chunks)

    def open(self, checkpoint_id: str) -> IO[bytes] | None:
        try:
            return open(self._file(checkpoint_id), "rb")
        except FileNotFoundError:
            return None

    def has(self, checkpoint_id: str) -> bool:
        return self._file(checkpoint_id).exists()


@runtime_checkable
class SnapshotProvider(Protocol):
    kind: Literal["workspace", "machine"]
    #: True when a checkpoint outlives the loss of its Space.
    durable: bool

    def take(self, client: SpaceClient, checkpoint_id: str) -> CheckpointRef: ...

    def restore(self, client: SpaceClient, ref: CheckpointRef) -> None:
        """Make the Space behind ``client`` equal to ``ref`` (which may have been taken in
        another Space). Raises ``PermanentFailure`` when the checkpoint is gone."""
        ...


class WorkspaceSnapshots:
    """Directory checkpoints through the Space's daemon, optionally copied to a store."""

    kind: Literal["workspace", "machine"] = "workspace"

    def __init__(self, spaces: Spaces, root: str = "", store: CheckpointStore | None = None):
        self.spaces = spaces
        self.root = root
        self.store = store
        self.durable = store is not None

    def take(self, client: SpaceClient, checkpoint_id: str) -> CheckpointRef:
        client.checkpoint_create(checkpoint_id)
        failpoint("checkpoint.during", checkpoint=checkpoint_id)
        if self.store is not None:
            self.store.put(checkpoint_id, client.checkpoint_export(checkpoint_id))
        return CheckpointRef(client.name, checkpoint_id)

    def restore(self, client: SpaceClient, ref: CheckpointRef) -> None:
        if not self._in_space(client, ref.id):
            self._bring(client, ref)
        client.checkpoint_restore(ref.id)

    @staticmethod
    def _in_space(client: SpaceClient, checkpoint_id: str) -> bool:
        return any(c.id == checkpoint_id for c in client.checkpoint_list())

    def _bring(self, client: SpaceClient, ref: CheckpointRef) -> None:
        """Import ``ref`` into the Space: from the store, else from the Space it was taken in."""
        if self.store is not None:
            stream = self.store.open(ref.id)
            if stream is not None:
                with stream:
                    client.checkpoint_import(ref.id, stream)
                return
        if ref.space != client.name and self.spaces.exists(ref.space):
            source = self.spaces.connect(ref.space, epoch=client.epoch)
            try:
                with tempfile.TemporaryFile() as buf:
                    for chunk in source.checkpoint_export(ref.id):
                        buf.write(chunk)
                    buf.seek(0)
                    client.checkpoint_import(ref.id, buf)
                return
            except SpaceError:
                pass
        hint = ("" if self.store is not None else
                " Keep checkpoints outside the Space with WorkspaceSnapshots(store="
                "DirectoryCheckpointStore(path)), or use transactional mode.")
        raise PermanentFailure(
            f"checkpoint {ref.id} (taken in Space {ref.space}) is gone: the Space holding it "
            f"was lost and no store has a copy.{hint}"
        )

