"""Checkpoints of a conversation's Space (checkpoint mode): taking one after a call and
recording it with the call's result, taking the base one before a first call, restoring.

The snapshot provider (``snapshots``) does the work; this keeper names the checkpoints,
reaches the failpoints of taking one and records them in ``cua.space``
(``state.CheckpointMark``). A restore's ``recovery.restore`` is reached by its callers
(recovery of a call, a rebuilt Space), whose reasons it reports.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from ..failpoints import failpoint
from ..log import Transaction
from ..spaces import SpaceClient
from ..tools import CallContext
from .snapshots import SnapshotProvider
from .state import SPACE, CheckpointMark


class CheckpointKeeper:
    def __init__(self, snapshots: SnapshotProvider, epoch: int) -> None:
        self.snapshots = snapshots
        self.epoch = epoch
        #: Fences a Space at this driver's epoch again (``SpaceKeeper.refence``): a machine
        #: restore brings back the daemon's floor of the checkpoint's time, and the
        #: processes of older epochs alive then.
        self.refence: Callable[[SpaceClient], object] | None = None

    def after_call(self, ctx: CallContext, client: SpaceClient) -> None:
        """Checkpoint the Space and record it with the call's result (and that entry)."""
        cid = f"{client.name}.{ctx.call_id}.e{self.epoch}".replace("/", "_")
        failpoint("checkpoint.before", call=ctx.call_id, checkpoint=cid)
        ref = self.snapshots.take(client, cid)
        failpoint("checkpoint.after", call=ctx.call_id, checkpoint=cid)
        SPACE.stage(ctx, replace(SPACE.staged(ctx), checkpoint=CheckpointMark(
            ref.space, ref.id, ctx.call_id)))

        def record_entry(_tx: Transaction, result_entry: int) -> None:
            state = SPACE.staged(ctx)
            assert state.checkpoint is not None
            SPACE.stage(ctx, replace(state, checkpoint=replace(state.checkpoint,
                                                               entry=result_entry)))

        ctx.on_result(record_entry)

    def base(self, client: SpaceClient, call_id: str | None) -> CheckpointMark:
        """Checkpoint the state before a first call (``call_id``), or at adoption (None)."""
        ref = self.snapshots.take(client, f"{client.name}.base-{call_id or 'adopt'}"
                                          f".e{self.epoch}")
        return CheckpointMark(ref.space, ref.id)

    def restore(self, client: SpaceClient, mark: CheckpointMark) -> None:
        """Make the Space equal to ``mark`` (its callers reach ``recovery.restore`` first);
        after a whole-machine restore, fence it at this epoch again before anything runs."""
        self.snapshots.restore(client, mark.ref)
        if self.snapshots.kind == "machine" and self.refence is not None:
            self.refence(client)

    def only_inside(self, mark: CheckpointMark, space: str) -> bool:
        """Whether ``mark`` lives only inside ``space`` (lost with it: no durable store)."""
        return not self.snapshots.durable and mark.space == space
