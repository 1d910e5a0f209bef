"""The epoch rule both fences apply: one writer's epoch and halt state, judged against a floor.

The SQLite fence reads its floor from a table inside the commit transaction, the file fence
from epoch marker files under the commit lock; where the floor comes from differs, what to do
with it does not. ``EpochGuard`` holds that shared decision so the two fences cannot drift
apart (same refusal, same message, same halt behaviour).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import StaleEpochError


@dataclass(frozen=True)
class EpochHistory:
    """Who wrote what, for auditing a fenced log: both fenced storages record it
    (``SqliteStorage.epoch_history``, ``JsonlStorage.epoch_history``)."""

    #: (epoch, first entry id it governs, unix ms), one per raise of the floor, by epoch.
    raises: list[tuple[int, int, int]]
    #: entry id → the epoch of the writer that committed it (None: unfenced or older log).
    entry_epochs: dict[int, int | None]


@dataclass
class EpochGuard:
    """The epoch a writer opened a log with, and why it was halted (``None``: not halted)."""

    epoch: int
    halt_reason: str | None = None

    def __post_init__(self) -> None:
        if isinstance(self.epoch, bool) or not isinstance(self.epoch, int) or self.epoch < 1:
            raise ValueError(
                f"Expected an epoch that is an int >= 1 (epochs start at 1), got "
                f"epoch={self.epoch!r} (type={type(self.epoch).__name__})"
            )

    @property
    def halted(self) -> bool:
        return self.halt_reason is not None

    def halt(self, reason: str) -> None:
        """Refuse everything from now on. The first reason is kept: it is the cause."""
        if self.halt_reason is None:
            self.halt_reason = reason

    def admit(self, floor: int) -> bool:
        """Judge a freshly read ``floor``: raise ``StaleEpochError`` if this writer is halted or
        a newer epoch raised the floor; otherwise tell whether the caller must raise the floor
        to this epoch (True when the epoch is newer than the floor)."""
        if self.halt_reason is not None:
            raise StaleEpochError(
                f"the writer of epoch {self.epoch} was halted ({self.halt_reason}); it must "
                "not record anything more: stop this process",
                epoch=self.epoch,
                floor=floor,
            )
        if floor > self.epoch:
            raise StaleEpochError(
                f"epoch {self.epoch} is below the log's floor {floor}: a newer process "
                "opened this log and owns it now; stop this one",
                epoch=self.epoch,
                floor=floor,
            )
        return self.epoch > floor
