"""The conversation's mode, carried out: ``policy`` decides, this records the mode, its
reason and ``auto``'s switch in ``cua.space``, and prepares a call (or the adoption of a
Space) as the mode needs: the image brought up to date with changes made outside the calls
(transactional), or a base checkpoint when none is recorded yet (checkpoint)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from spacesd.protocol import CAP_SCAN, ScanResult

from ..errors import ToolError
from ..log import Log, Transaction
from . import policy
from .checkpoint_keeper import CheckpointKeeper
from .events import EventRecorder
from .image_keeper import ImageKeeper
from .space_handle import SpaceHandle
from .state import IMAGE_STATE, SPACE, CheckpointMark, Mode, ModeCause

#: Commits what a call must find recorded before it starts (with its start mark).
Stage = Callable[[Transaction], None]


class ModeKeeper:
    def __init__(self, requested: policy.RequestedMode, snapshot_kind: str,
                 image: ImageKeeper, checkpoints: CheckpointKeeper,
                 recorder: EventRecorder) -> None:
        self.requested = requested
        self.snapshot_kind = snapshot_kind
        self.image = image
        self.checkpoints = checkpoints
        self.recorder = recorder

    def choice(self, log: Log, conversation: int, handle: SpaceHandle) -> policy.ModeChoice:
        """The conversation's mode, with the reason when it is decided now."""
        return policy.conversation_mode(SPACE.read(log, conversation).mode, self.requested,
                                        self.snapshot_kind, CAP_SCAN in handle.caps)

    def prepare(self, log: Log, conversation: int, handle: SpaceHandle, call_id: str | None,
                tool: str) -> tuple[Mode, Stage]:
        """Decide the mode before a call (or at adoption: ``tool="space"``) and what must be
        committed first: the mode and its reason, a base checkpoint, changes made outside
        the calls. Raises ``ToolError`` when transactional mode was requested and the
        workspace cannot be kept."""
        choice = self.choice(log, conversation, handle)
        mode = choice.mode
        switch: policy.Verdict | None = None
        scan: ScanResult | None = None
        if mode == "transactional":
            scan = self.image.scan(handle.client)
            verdict = policy.before_call(self.requested, self.image.over_limits(scan),
                                         IMAGE_STATE.read(log, conversation).stale)
            if verdict.action == "refuse":
                raise ToolError(
                    f"the workspace cannot be kept transactionally: {verdict.problem}. Use "
                    "mode='checkpoint' (or 'auto') for this workspace")
            if verdict.action == "switch":
                switch, mode, scan = verdict, "checkpoint", None
        base: CheckpointMark | None = None
        if mode == "checkpoint" and SPACE.read(log, conversation).checkpoint is None:
            # The state before this call must be restorable: checkpoint it first.
            base = self.checkpoints.base(handle.client, call_id)

        def stage(tx: Transaction) -> None:
            if switch is not None:
                assert switch.cause is not None and switch.problem is not None
                self.switch(tx, conversation, call_id, tool, switch.cause, switch.problem)
            elif choice.reason is not None:
                self._record(tx, conversation, mode, choice.reason)
            if base is not None:
                SPACE.write(tx, conversation, replace(SPACE.read_in(tx, conversation),
                                                      checkpoint=base))
            if scan is not None:
                self.image.stage(tx, conversation, handle.client, scan, None)
        return mode, stage

    def switch(self, tx: Transaction, conversation: int, call_id: str | None, tool: str,
               cause: ModeCause, reason: str) -> None:
        """auto: switch to checkpoint mode, for good, and record why."""
        self._record(tx, conversation, "checkpoint", reason)
        self.recorder.record(tx, conversation, self.recorder.event(
            "mode", "checkpoint", conversation, call_id, tool, cause, reason))

    @staticmethod
    def _record(tx: Transaction, conversation: int, mode: Mode, reason: str) -> None:
        SPACE.write(tx, conversation, replace(SPACE.read_in(tx, conversation), mode=mode,
                                              mode_reason=reason))
