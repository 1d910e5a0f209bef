"""Snapshot providers (checkpoint mode) and checkpoint stores.

A ``SnapshotProvider`` takes a checkpoint of a Space and restores one. Two kinds:

- ``workspace`` (``WorkspaceSnapshots``): a copy of the workspace directory made by the
  Space's daemon, optionally copied out to a ``CheckpointStore`` (``checkpoint_store``) so
  it survives the loss of the Space itself. Processes are not part of it.
- ``machine``: a whole-machine snapshot (memory and disk), which a microVM backend provides
  by implementing the same protocol.

A checkpoint is named by a ``CheckpointRef``: the Space it was taken in and its id. A fork's
Space is restored from its parent's checkpoint, so restoring into another Space (through the
store, or by export/import between the two Spaces) is part of the contract.
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass
from typing import Literal, Protocol, runtime_checkable

from ..errors import PermanentFailure, SpaceError
from ..failpoints import failpoint
from ..spaces import SpaceClient, Spaces
from .checkpoint_store import CheckpointStore, IncompleteCopy


@dataclass(frozen=True)
class CheckpointRef:
    """A checkpoint: the Space it was taken in and its id (``state.CheckpointMark`` records
    one in the log)."""

    space: str
    id: str


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
            try:  # only what the store lacks: it grows by what changed
                self.store.put(checkpoint_id, client.checkpoint_export(
                    checkpoint_id, have=self.store.known()))
            except IncompleteCopy:
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

