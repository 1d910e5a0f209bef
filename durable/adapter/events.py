"""Recording recovery events: each decision this driver takes becomes a hidden system entry
of the conversation (``state.RecoveryEvent``), committed at once or with the call's result,
and is kept in ``events`` for the process that decided it."""

from __future__ import annotations

from ..log import Transaction
from ..tools import CallContext
from .state import Cause, EventKind, ModeCause, RecoveryEvent


class EventRecorder:
    def __init__(self, epoch: int) -> None:
        self.epoch = epoch
        #: Every recovery event this process decided, in order (also committed to the log).
        self.events: list[RecoveryEvent] = []

    def event(self, kind: EventKind, mode: str | None, conversation: int, call_id: str | None,
              tool: str, cause: Cause | ModeCause, detail: str) -> RecoveryEvent:
        """A recovery event decided by this driver (it carries its epoch)."""
        return RecoveryEvent(kind, mode, call_id, detail, conversation, tool, cause, self.epoch)

    def record(self, tx: Transaction, conversation: int, event: RecoveryEvent) -> None:
        """Append ``event`` in ``tx``."""
        tx.append(conversation, "system", event.to_entry())
        self.events.append(event)

    def with_result(self, ctx: CallContext, tool: str, kind: EventKind, cause: Cause,
                    detail: str, mode: str | None) -> None:
        """Record a recovery event of this call with its result."""
        event = self.event(kind, mode, ctx.conversation, ctx.call_id, tool, cause, detail)
        ctx.on_result(lambda tx, _entry: self.record(tx, ctx.conversation, event))

    def now(self, ctx: CallContext, event: RecoveryEvent) -> None:
        """Commit a recovery event of this call at once (not with its result)."""
        def record(tx: Transaction) -> None:
            self.record(tx, ctx.conversation, event)

        ctx.commit_now(record)
