"""The refusals the daemon answers with: one exception per protocol error code.

Handlers raise these; the server turns them into ``{"error": {"code", "message", ...}}``
with the HTTP status of ``protocol.ERROR_STATUS``. Messages say what was wrong and what to
do, because the host side shows them to the model or the operator as they are.
"""

from __future__ import annotations

from typing import Any

from . import protocol


class OpError(Exception):
    """A request the daemon refused; ``extra`` fields travel in the error object."""

    code = protocol.ERR_INTERNAL

    def __init__(self, message: str, **extra: Any) -> None:
        super().__init__(message)
        self.message = message
        self.extra = extra

    @property
    def status(self) -> int:
        return protocol.ERROR_STATUS[self.code]

    def to_json(self) -> dict[str, Any]:
        return {"error": {"code": self.code, "message": self.message, **self.extra}}


class BadRequest(OpError):
    """Malformed JSON, a missing field, a field of the wrong type or an unusable value."""

    code = protocol.ERR_BAD_REQUEST


class Unauthorized(OpError):
    code = protocol.ERR_UNAUTHORIZED


class NotFound(OpError):
    """An unknown operation, file, directory or checkpoint."""

    code = protocol.ERR_NOT_FOUND


class OutsideRoot(OpError):
    """A path that is absolute, climbs with ``..``, has a NUL, newline or backslash in it,
    or goes through a symlink that leads out of the workspace."""

    code = protocol.ERR_OUTSIDE_ROOT


class Conflict(OpError):
    """The request is well formed but the workspace does not allow it (edit text not found
    or not unique, a directory where a file is expected, a non-empty directory)."""

    code = protocol.ERR_CONFLICT


class StaleEpoch(OpError):
    """The request's epoch is below the Space's floor: a newer owner fenced this one off. Or
    its round is: its own driver fenced it off (``epoch_fence``: a request sent before the
    driver's own fence, delivered after it)."""

    code = protocol.ERR_STALE_EPOCH

    def __init__(self, epoch: int, floor: int, *, sent_round: int | None = None,
                 floor_round: int = 0) -> None:
        if sent_round is None:
            super().__init__(
                f"epoch {epoch} is below this Space's floor {floor}: a newer owner fenced "
                "this client off; stop, a newer driver owns the session",
                epoch=epoch,
                floor=floor,
            )
            return
        super().__init__(
            f"epoch {epoch} round {sent_round} was sent before its own driver fenced its earlier "
            f"requests (this Space is at round {floor_round}): it has no effect; a client of "
            "that driver sends the round its last advance_epoch answered",
            epoch=epoch,
            floor=floor,
            round=sent_round,
            floor_round=floor_round,
        )


class EpochTaken(OpError):
    """``advance_epoch`` to the floor itself by another owner: one epoch has one owner, so the
    sender must run above the floor (a second driver of the same epoch, or a new log on a
    Space an earlier driver raised to exactly this epoch)."""

    code = protocol.ERR_EPOCH_TAKEN

    def __init__(self, epoch: int, floor: int) -> None:
        super().__init__(
            f"epoch {epoch} is this Space's floor and belongs to another owner: one epoch has "
            f"one owner; advance to {floor + 1} or above instead",
            epoch=epoch,
            floor=floor,
        )


class Damaged(OpError):
    """State the daemon stored is damaged (see ``protocol.ERR_DAMAGED``)."""

    code = protocol.ERR_DAMAGED


class TooLarge(OpError):
    code = protocol.ERR_TOO_LARGE
