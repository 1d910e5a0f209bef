"""``SandboxSnapshots``: whole-machine checkpoints of microVM Spaces (memory and disk), kept
on the host outside every Space, so that they outlive the Space they were taken in.

A checkpoint is the machine's saved state (``machine_state``: its memory and devices as
QEMU's migration stream, its disk overlay, both compressed), taken by a job that stops the
machine only for as long as the copy takes. Bringing one back starts the Space's QEMU anew
from it: processes come back as they were (same pids, their memory), every write after the
checkpoint is gone. The Space it is brought into may be the one it was taken in, that Space
made again after it was lost, or another (a fork: its conversation starts from its
parent's checkpoint, the same machine, with the same daemon and token).

The store (``<store>/``, by default ``.machine-checkpoints`` beside the provider's Spaces):
``<id>.json`` records a checkpoint (its Space, when, and which directory holds its state)
and is written last, atomically, so that a checkpoint is there whole or not at all; the
state is in ``<id>.<nonce>/``. Taking an id again replaces it the same way. Every checkpoint
is kept until deleted, as workspace checkpoints are: any entry of the log can be forked
from, and each holds about 45 MB for a 512 MiB guest.

A restore takes the daemon's audit files (its exec ledger, fence journal) back in time with
everything else; what they said before is kept on the host first (``MicroVMSpaces.
keep_audit``), so an audit of the Space still sees every fence and every start. After a
restore the daemon inside has the checkpoint's older epoch floor; the adapter raises it
again before it runs anything (``CheckpointKeeper``).
"""

from __future__ import annotations

import json
import re
import secrets
import shutil
import time
from pathlib import Path
from typing import Any, Literal

from durable.adapter.snapshots import CheckpointRef
from durable.atomic_file import write_atomic
from durable.errors import PermanentFailure, SpaceUnavailable
from durable.spaces import SpaceClient

from .machine_state import run_job
from .provider import MicroVMSpaces

_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")


class SandboxSnapshots:
    kind: Literal["workspace", "machine"] = "machine"
    durable = True

    def __init__(self, spaces: MicroVMSpaces, store: str | Path | None = None) -> None:
        self.spaces = spaces
        self.store = Path(store) if store is not None else \
            spaces.base_dir / ".machine-checkpoints"
        self.store.mkdir(parents=True, exist_ok=True)

    # ---------------------------------------------------------------- the adapter's side

    def take(self, client: SpaceClient, checkpoint_id: str) -> CheckpointRef:
        self.checkpoint(client.name, checkpoint_id)
        return CheckpointRef(client.name, checkpoint_id)

    def restore(self, client: SpaceClient, ref: CheckpointRef) -> None:
        """Make the Space behind ``client`` the machine of ``ref``, wherever it was taken."""
        self.restore_space(client.name, ref.id)

    # ---------------------------------------------------------------- the provider's side

    def checkpoint(self, space: str, checkpoint_id: str) -> str:
        """The machine of ``space`` as it is now, under ``checkpoint_id``."""
        self._check(checkpoint_id)
        data = f"{checkpoint_id}.{secrets.token_hex(4)}"
        run_job("save", self.spaces.base_dir, space, self.store / data)
        write_atomic(self._record(checkpoint_id), json.dumps(
            {"space": space, "data": data, "taken_ns": time.time_ns()}) + "\n")
        self._drop_data(checkpoint_id, keep=data)
        return checkpoint_id

    def restore_space(self, space: str, checkpoint_id: str) -> None:
        """Start ``space`` from the checkpoint (made first if it is not there)."""
        record = self._read(checkpoint_id)
        if record is None:
            raise PermanentFailure(f"no machine checkpoint {checkpoint_id!r} in {self.store}")
        if self.spaces.exists(space):
            # The daemon's audit files go back in time with the machine: keep what they said.
            self.spaces.keep_audit(space)
        run_job("load", self.spaces.base_dir, space, self.store / record["data"])

    def list(self, space: str) -> list[str]:
        """The checkpoints taken in ``space``, oldest first."""
        found = []
        for path in self.store.glob("*.json"):
            record = self._read(path.name.removesuffix(".json"))
            if record is not None and record["space"] == space:
                found.append((record["taken_ns"], path.name.removesuffix(".json")))
        return [cid for _, cid in sorted(found)]

    def delete(self, space: str, checkpoint_id: str) -> None:
        self._check(checkpoint_id)
        record = self._read(checkpoint_id)
        if record is None or record["space"] != space:
            return
        self._record(checkpoint_id).unlink()
        self._drop_data(checkpoint_id, keep=None)

    def fork(self, space: str, checkpoint_id: str, new_name: str) -> None:
        """A new Space whose disk and memory start at ``checkpoint_id`` of ``space``."""
        if checkpoint_id not in self.list(space):
            raise PermanentFailure(f"Space {space} has no checkpoint {checkpoint_id!r}")
        if self.spaces.exists(new_name):
            raise SpaceUnavailable(f"Space {new_name} exists already; fork into a new name")
        self.restore_space(new_name, checkpoint_id)

    # ---------------------------------------------------------------- the store

    def _record(self, checkpoint_id: str) -> Path:
        return self.store / f"{checkpoint_id}.json"

    def _read(self, checkpoint_id: str) -> dict[str, Any] | None:
        self._check(checkpoint_id)
        try:
            record: dict[str, Any] = json.loads(self._record(checkpoint_id).read_text())
        except FileNotFoundError:
            return None
        return record

    def _drop_data(self, checkpoint_id: str, *, keep: str | None) -> None:
        """Remove the state directories of ``checkpoint_id`` but ``keep``: replaced ones, and
        those of a take cut short before its record."""
        for path in self.store.glob(f"{checkpoint_id}.*"):
            if path.is_dir() and path.name != keep and \
                    re.fullmatch(rf"{re.escape(checkpoint_id)}\.[0-9a-f]{{8}}", path.name):
                shutil.rmtree(path, ignore_errors=True)

    @staticmethod
    def _check(checkpoint_id: str) -> None:
        if not _ID.fullmatch(checkpoint_id):
            raise ValueError(f"checkpoint id {checkpoint_id!r}: 1-128 letters, digits and "
                             "._- starting with a letter or digit")
