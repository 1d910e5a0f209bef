"""``SandboxSnapshots``: whole-machine checkpoints of microVM Spaces (memory and disk).

A checkpoint is an internal snapshot of the Space's qcow2 overlay, taken with QEMU's
``savevm`` and brought back with ``loadvm``: processes come back as they were (same pids,
their memory), and every write after the checkpoint is gone. ``fork`` starts a new Space
from a copy of the disk (with its snapshots) at the checkpoint.

A restore takes the daemon's audit files (its exec ledger, fence journal) back in time with
everything else; what they said before is kept on the host first (``MicroVMSpaces.
keep_audit``), so an audit of the Space still sees every fence and every start.

Checkpoints live in the Space's overlay on the host, outside the guest (nothing in the
guest can touch them); the adapter's keeps the newest three of a Space (``keep``), so a
conversation forked at an older entry cannot start from its machine state. They go with the
Space when it is deleted: the provider is not
``durable`` (a lost Space in checkpoint mode ends its session, as without a
``CheckpointStore``). After a restore the daemon inside has the checkpoint's older epoch
floor; the adapter raises it again before it runs anything (``CheckpointKeeper``).
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Literal

from durable.adapter.snapshots import CheckpointRef
from durable.errors import PermanentFailure, SpaceUnavailable
from durable.spaces import SpaceClient

from .provider import MicroVMSpaces

_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
#: A row of ``info snapshots`` (ID ``--``: on every disk) or of ``qemu-img snapshot -l``.
_ROW = re.compile(r"^(?:\d+|--)\s+(\S+)\s", re.MULTILINE)


class SandboxSnapshots:
    kind: Literal["workspace", "machine"] = "machine"
    durable = False

    def __init__(self, spaces: MicroVMSpaces, *, keep: int = 3) -> None:
        if keep < 2:
            raise ValueError(f"keep at least 2 machine checkpoints (recovery may need the one "
                             f"before the newest), got {keep}")
        self.spaces = spaces
        self.keep = keep

    # ---------------------------------------------------------------- the adapter's side

    def take(self, client: SpaceClient, checkpoint_id: str) -> CheckpointRef:
        """A checkpoint after a call; only the newest ``keep`` of the Space are kept (each
        holds the machine's memory: about 125 MB for a 512 MiB guest). Recovery restores
        the newest recorded one, which is one of the last two taken."""
        self.checkpoint(client.name, checkpoint_id)
        for old in self.list(client.name)[:-self.keep]:
            self.delete(client.name, old)
        return CheckpointRef(client.name, checkpoint_id)

    def restore(self, client: SpaceClient, ref: CheckpointRef) -> None:
        if ref.space != client.name:
            raise PermanentFailure(f"checkpoint {ref.id} is a machine snapshot of Space "
                                   f"{ref.space}; it cannot be restored into {client.name} "
                                   "(fork the Space from it instead)")
        self.restore_space(client.name, ref.id)

    # ---------------------------------------------------------------- the provider's side

    def checkpoint(self, space: str, checkpoint_id: str) -> str:
        """``savevm``: the machine as it is now, under ``checkpoint_id``."""
        self._check(checkpoint_id)
        self.spaces.qmp(space).hmp(f"savevm {checkpoint_id}")
        return checkpoint_id

    def restore_space(self, space: str, checkpoint_id: str) -> None:
        """``loadvm``; a Space that is not running is booted from the checkpoint."""
        self._check(checkpoint_id)
        if checkpoint_id not in self.list(space):
            raise PermanentFailure(f"Space {space} has no checkpoint {checkpoint_id!r}")
        # The daemon's audit files go back in time with the machine: keep what they said.
        self.spaces.keep_audit(space)
        if self.spaces.running(space):
            self.spaces.qmp(space).hmp(f"loadvm {checkpoint_id}")
            self.spaces.set_clock(space)  # back at the checkpoint's time until told
        else:
            self.spaces.create(space, loadvm=checkpoint_id)

    def list(self, space: str) -> list[str]:
        """The checkpoints of ``space``, oldest first (from the overlay when it is off)."""
        if self.spaces.running(space):
            out = self.spaces.qmp(space).hmp("info snapshots")
        else:
            out = subprocess.run(["qemu-img", "snapshot", "-l", str(self._overlay(space))],
                                 check=True, capture_output=True, text=True).stdout
        return [m[1] for m in _ROW.finditer(out)]

    def delete(self, space: str, checkpoint_id: str) -> None:
        self._check(checkpoint_id)
        if self.spaces.running(space):
            self.spaces.qmp(space).hmp(f"delvm {checkpoint_id}")
        else:
            subprocess.run(["qemu-img", "snapshot", "-d", checkpoint_id,
                            str(self._overlay(space))], check=True, capture_output=True)

    def fork(self, space: str, checkpoint_id: str, new_name: str) -> None:
        """A new Space whose disk and memory start at ``checkpoint_id`` of ``space``."""
        if checkpoint_id not in self.list(space):
            raise PermanentFailure(f"Space {space} has no checkpoint {checkpoint_id!r}")
        if self.spaces.exists(new_name):
            raise SpaceUnavailable(f"Space {new_name} exists already; fork into a new name")
        src = self.spaces.space_dir(space)
        dest = self.spaces.space_dir(new_name)
        tmp = dest.with_name(f".{new_name}.new")
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
        if self.spaces.running(space):
            self.spaces.qmp(space).command("stop")  # a consistent copy of the overlay
        try:
            shutil.copyfile(src / "overlay.qcow2", tmp / "overlay.qcow2")
        finally:
            if self.spaces.running(space):
                self.spaces.qmp(space).command("cont")
        for name in ("machine.json", "token"):
            shutil.copy2(src / name, tmp / name)
        tmp.rename(dest)
        self.spaces.create(new_name, loadvm=checkpoint_id)

    def _overlay(self, space: str) -> Path:
        return self.spaces.space_dir(space) / "overlay.qcow2"

    @staticmethod
    def _check(checkpoint_id: str) -> None:
        if not _ID.fullmatch(checkpoint_id):
            raise ValueError(f"checkpoint id {checkpoint_id!r}: 1-128 letters, digits and "
                             "._- starting with a letter or digit")
