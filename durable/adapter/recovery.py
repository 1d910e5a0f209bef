"""Recovery of an interrupted wrapped call (its intent committed, no result): gather what the
log and the ledger say, ``decide``, carry the decision out.

The rules, in order (``decide.decide`` is their table):

1. outcome recorded (checkpoint mode): adopt it; take the checkpoint if the crash prevented it;
2. shell command running (same Space generation): reattach to it;
3. exited by itself: replay its recorded outcome; it does not run again;
4. never reached the Space (no start mark, or a key the ledger never saw): run it;
5. anything else is unknown (lost with the daemon or the Space, cut off by a newer epoch,
   a file tool cut off mid-write): in transactional mode the workspace is *reverted* to the
   image (the state before the call) and the call runs again, whatever the tool; in
   checkpoint mode the Space is *restored* to the newest checkpoint (or the image when none
   is recorded yet), write and edit (and tools declared ``replay="safe"``) run again and a
   shell command that started is never started a second time: the call ends interrupted,
   telling the model the sandbox was restored.

Before a revert or a restore, the driver fences its own earlier processes too (a command
it gave up on, a background job of an earlier call): recovery in the middle of a run keeps
its epoch, and nothing started before the workspace is put back may outlive that.

Every decision is recorded as ``RecoveryEvent``s with its cause and this driver's epoch.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from spacesd.protocol import ExecInfo

from ..failpoints import failpoint
from ..tools import CallContext, ToolResult, interrupted_result
from .checkpoint_keeper import CheckpointKeeper
from .decide import Action, Decision, Facts, decide, ledger_state, needs_ledger
from .events import EventRecorder
from .image_keeper import ImageKeeper
from .modes import ModeKeeper
from .runner import CallRunner
from .space_handle import SpaceHandle
from .space_keeper import SpaceKeeper
from .state import (
    CALL,
    SPACE,
    CallRecord,
    Cause,
    CheckpointMark,
    CommandMark,
    EventKind,
)


@dataclass(frozen=True)
class Interrupted:
    """An interrupted call as recovery found it: its facts, and what acting on them needs."""

    tool: str
    args: dict[str, Any]
    ctx: CallContext
    handle: SpaceHandle
    facts: Facts
    #: This call's ``cua.call`` record (None without its start mark).
    record: CallRecord | None
    #: The checkpoint ``cua.space`` records.
    checkpoint: CheckpointMark | None
    #: The ledger's answer for the last command key, when ``needs_ledger``.
    info: ExecInfo | None = None

    @property
    def last(self) -> CommandMark:
        """The last command started; only for a start mark with a key."""
        assert self.record is not None and self.record.commands
        return self.record.commands[-1]

    def rerun_n(self, epoch: int, cause: Cause) -> int:
        """The number of the rerun's command key: the last one's again when the ledger
        never saw it and this driver (``epoch``) sent it, since a slow network may still
        deliver that start after the rerun's and the ledger runs one key once (a new key
        would run the command twice); else after the last one; else the first."""
        if not self.facts.key:
            return 1
        if cause == "key_unknown" and self.last.epoch == epoch:
            return self.last.n
        return self.last.n + 1

    def found(self, cause: Cause) -> str:
        """What recovery found, for people."""
        match cause:
            case "outcome_recorded":
                return "the outcome was recorded before the crash"
            case "no_start_mark" | "no_key":
                return f"the {self.tool} call never reached the Space"
            case "key_unknown":
                return f"command {self.last.key} never reached the Space"
            case "running":
                return f"command {self.last.key} is still running"
            case "exited":
                assert self.info is not None
                return f"command {self.last.key} exited with {self.info.exit_code}"
            case "fenced":
                assert self.info is not None
                return f"command {self.last.key} was cut off by epoch {self.info.fenced_by}"
            case "daemon_lost":
                return f"command {self.last.key} was lost"
            case "space_lost":
                return f"the Space that ran the {self.tool} call was lost"
            case "file_cut":
                return f"the {self.tool} call was cut off; it may have partly changed the workspace"
        raise ValueError(f"no recovery of a call is caused by {cause!r}: it is a rebuilt "
                         "Space's cause; see rebuild.decide_rebuild")


#: What an unknown outcome's event adds to what recovery found.
_DONE: dict[EventKind, str] = {
    "reverted": "; the workspace was reverted to the image",
    "restored": "; the Space was restored to the state before the call",
}


class Recovery:
    def __init__(self, *, space: SpaceKeeper, modes: ModeKeeper, image: ImageKeeper,
                 checkpoints: CheckpointKeeper, runner: CallRunner,
                 recorder: EventRecorder) -> None:
        self.space = space
        self.modes = modes
        self.image = image
        self.checkpoints = checkpoints
        self.runner = runner
        self.recorder = recorder

    def recover(self, tool: str, args: dict[str, Any], ctx: CallContext, replay: str
                ) -> ToolResult:
        """Recover an interrupted call: gather its facts, ``decide``, carry the decision out."""
        failpoint("recovery.begin", call=ctx.call_id, tool=tool)
        call = self._interrupted(tool, args, ctx, replay)
        decision = decide(call.facts)
        return _EXECUTORS[decision.action](self, call, decision)

    def _interrupted(self, tool: str, args: dict[str, Any], ctx: CallContext,
                     replay: str) -> Interrupted:
        """What the log, and the ledger when ``decide`` needs it, say about the call."""
        log, conv = ctx.log, ctx.conversation
        handle = self.space.ensure(log, conv)
        space = SPACE.read(log, conv)
        mode = space.mode or self.modes.choice(log, conv, handle).mode
        rec = CALL.read(log, conv)
        mine = rec if rec is not None and rec.call_id == ctx.call_id else None
        mark = space.checkpoint
        facts = Facts(
            mode=mode, tool="bash" if tool == "bash" else "file",
            replay="safe" if replay == "safe" else "never",
            start_mark=mine is not None,
            outcome=mine is not None and mine.outcome is not None,
            same_generation=mine is not None and mine.generation == space.generation,
            key=mine is not None and bool(mine.commands),
            ledger=None,
            checkpoint=("none" if mark is None else
                        "this_call" if mark.call_id == ctx.call_id else "earlier"))
        call = Interrupted(tool, args, ctx, handle, facts, mine, mark)
        if not needs_ledger(facts):
            return call
        info = handle.client.exec_status(call.last.key)
        return replace(call, facts=replace(facts, ledger=ledger_state(info)), info=info)

    def _decided(self, call: Interrupted, decision: Decision) -> None:
        """Record the decision's events and reach ``recovery.decided``.

        A decision that runs the call again after a revert or a restore is committed at
        once, before the rerun: a command may then start a second time, and that must only
        ever follow a durable record of why (a rerun cut short by another crash would
        otherwise leave a second start with no revert in the log). Other decisions are
        recorded with the call's result."""
        rerun = decision.action in ("revert", "restore_rerun")
        for kind in decision.events:
            detail = call.found(decision.cause) + _DONE.get(kind, "")
            if rerun:
                self.recorder.now(call.ctx, self.recorder.event(
                    kind, call.facts.mode, call.ctx.conversation, call.ctx.call_id, call.tool,
                    decision.cause, detail))
            else:
                self.recorder.with_result(call.ctx, call.tool, kind, decision.cause, detail,
                                          call.facts.mode)
        failpoint("recovery.decided", call=call.ctx.call_id, decision=decision.events[-1])

    # One executor per action: its effects, in order.

    def _adopt(self, call: Interrupted, decision: Decision) -> ToolResult:
        assert call.record is not None and call.record.outcome is not None
        result = call.record.outcome
        self._decided(call, decision)
        if decision.take_checkpoint:
            self.checkpoints.after_call(call.ctx, call.handle.client)
        return result

    def _reattach(self, call: Interrupted, decision: Decision) -> ToolResult:
        assert call.info is not None
        self._decided(call, decision)
        result = self.runner.stream(call.ctx, call.handle, call.last.key, call.info,
                                    call.args.get("timeout"))
        return self.runner.settle(call.ctx, call.handle, call.facts.mode, call.tool, result)

    def _replay(self, call: Interrupted, decision: Decision) -> ToolResult:
        assert call.info is not None
        self._decided(call, decision)
        result = self.runner.stream(call.ctx, call.handle, call.last.key, call.info, None)
        return self.runner.settle(call.ctx, call.handle, call.facts.mode, call.tool, result)

    def _run(self, call: Interrupted, decision: Decision) -> ToolResult:
        self._decided(call, decision)
        return self.runner.run(call.tool, call.args, call.ctx,
                               n=call.rerun_n(self.runner.epoch, decision.cause))

    def _revert(self, call: Interrupted, decision: Decision) -> ToolResult:
        self.space.refence(call.handle.client, own=True)
        self.image.reimage(call.ctx.log, call.ctx.conversation, call.handle.client)
        return self._run(call, decision)

    def _restore(self, call: Interrupted, decision: Decision) -> ToolResult:
        self.space.refence(call.handle.client, own=True)
        if decision.restore_from == "checkpoint":
            assert call.checkpoint is not None
            failpoint("recovery.restore", call=call.ctx.call_id, checkpoint=call.checkpoint.id)
            self.checkpoints.restore(call.handle.client, call.checkpoint)
        else:
            self.image.reimage(call.ctx.log, call.ctx.conversation, call.handle.client)
        if decision.action == "restore_rerun":
            return self._run(call, decision)
        self._decided(call, decision)
        return interrupted_result(
            call.tool, call.ctx.slot.progress,
            "The sandbox was restored to its state before this call; run it again if needed.")


_EXECUTORS: dict[Action, Callable[[Recovery, Interrupted, Decision], ToolResult]] = {
    "adopt": Recovery._adopt, "reattach": Recovery._reattach, "replay": Recovery._replay,
    "run": Recovery._run, "revert": Recovery._revert, "restore_rerun": Recovery._restore,
    "restore_interrupt": Recovery._restore,
}
