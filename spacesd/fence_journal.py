"""The fence audit journal (``fences.jsonl``): what each fence killed and found alive after.

The invariant says "before a restore, no process of an older epoch is alive". Only the
daemon sees the processes at that moment, so it writes down what it saw, and a checker
outside reads the journal later (``audit.read_state``), even from a copy of a Space's state
taken after the Space died. One fsynced record per event:

- ``advance``: every ``advance_epoch`` that passed the fence: the floor before, whether it
  was raised, the keys it killed and those of an older epoch still alive afterwards (with
  ``own``, those of its own epoch too);
- ``restore``: every ``checkpoint_restore``, written before it touches the workspace (so a
  restore cut short is recorded too): the request's epoch, the floor, and the keys started
  at or below the request's epoch still alive: the restorer's own earlier commands count,
  since a driver that restores in the middle of its run fences its own first (``own``);
- ``sweep``: every daemon start, which kills what an advance cut short by a crash left
  alive.

"Alive" is checked afresh in ``/proc`` (``ExecLedger.alive_below``), never taken from what
the daemon remembers: the record must hold even when the daemon's memory is wrong.
Recording never changes what the operations do or answer.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from typing import Any, ClassVar

from .journal import Journal


def _now_ms() -> int:
    return int(time.time() * 1000)


@dataclass(frozen=True)
class Advance:
    t: ClassVar[str] = "advance"
    epoch: int
    floor_before: int
    raised: bool
    killed: list[str]
    alive_after: list[str]
    #: Its owner's own fence: the keys of ``epoch`` itself were killed too.
    own: bool = False
    ms: int = field(default_factory=_now_ms)


@dataclass(frozen=True)
class Restore:
    t: ClassVar[str] = "restore"
    id: str
    #: The epoch of the restore request.
    epoch: int
    floor: int
    #: Keys started at or below ``epoch`` whose tree had a live member (journals of older
    #: daemons hold ``alive_older``: keys below ``floor``).
    alive_after: list[str]
    ms: int = field(default_factory=_now_ms)


@dataclass(frozen=True)
class Sweep:
    t: ClassVar[str] = "sweep"
    floor: int
    killed: list[str]
    alive_after: list[str]
    ms: int = field(default_factory=_now_ms)


FenceRecord = Advance | Restore | Sweep


def to_json(record: FenceRecord) -> dict[str, Any]:
    """The stored form: ``{"t": kind, **fields}``."""
    return {"t": record.t, **asdict(record)}


class FenceJournal:
    def __init__(self, path: str) -> None:
        self._journal = Journal(path)

    def append(self, record: FenceRecord) -> None:
        """Write ``record``, fsynced."""
        self._journal.append(to_json(record))

    def close(self) -> None:
        self._journal.close()
