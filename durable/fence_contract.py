"""The fence contract: epochs that only grow, checked inside every commit.

A fenced storage carries the epoch of the process that opened it. Opening raises the floor
to that epoch (refusing with ``StaleEpochError`` if the floor is already higher); every
commit re-reads the floor in the same transaction and refuses atomically when a newer epoch
raised it. ``halt()`` makes every later commit through this fence fail, so that a driver that
must stop can never record anything more.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable


@runtime_checkable
class Fence(Protocol):
    @property
    def epoch(self) -> int:
        """The epoch of the process that opened the log through this fence."""
        ...

    def floor(self) -> int:
        """The highest epoch that has opened this log (read from storage, not cached)."""
        ...

    def check(self) -> None:
        """Raise ``StaleEpochError`` if a newer epoch than ``epoch`` has opened the log."""
        ...

    def halt(self, reason: str) -> None:
        """Refuse every later commit through this fence (``StaleEpochError`` with reason)."""
        ...

    @property
    def halted(self) -> bool: ...
