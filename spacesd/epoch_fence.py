"""The epoch fence: a persisted floor that only grows, and requests checked against it.

A request below the floor must have *no* effect. Checking the epoch and then acting is a
race: ``advance_epoch`` could raise the floor and kill the old processes in between, and an
old write (or an old command) would then land after the fence. So operations with effects
run inside ``admit(epoch)``, a shared hold of a readers-writer lock, and ``advancing``
takes it exclusively: an advance waits for the effects already admitted and none admitted
afterwards can carry an older epoch. Waiting advances block new admissions (writer
preference), so a stream of requests cannot starve them.

A higher epoch than the floor is admitted without raising it: only ``advance`` raises the
floor (written to a temp file, fsynced, renamed, directory fsynced).

One epoch has one owner. The floor is persisted with the owner that raised it (an opaque
token of the driver, ``<epoch> <owner>``); an advance to the floor itself by anyone else is
refused with ``EpochTaken``, so a second driver of the same epoch (or a new log on a Space an
earlier driver raised to exactly its epoch) must run above it and fence the first, instead
of sharing its epoch, its processes and its recorded results. An anonymous advance (no owner)
never matches one: it can raise the floor, never share it.

An owner also fences its own earlier requests (``own``: before it restores or reverts the
workspace in the middle of its run). Each own fence starts a new *round* of the epoch,
persisted with the floor (``<epoch> <owner> <round>``), and a request that carries the
round it was sent in is refused once a later round began: a write its driver gave up on
(timed out, its outcome unknown) that a slow network delivers after the driver's recovery
put the workspace back must change nothing. A request that carries no round is judged by
its epoch alone (clients that never advanced: a campaign's checks, a copy's source).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from .errors import BadRequest, EpochTaken, StaleEpoch
from .fsio import fsync_dir

#: Longest owner token ``advance_epoch`` accepts.
MAX_OWNER = 128


class DamagedFloor(Exception):
    """The persisted floor cannot be read: taking it as 0 would admit every stale epoch."""


@dataclass(frozen=True)
class Floor:
    """What the fence file holds: the floor, the owner that raised it (None for a floor
    written before owners were recorded, or by an anonymous advance) and its round."""

    epoch: int = 0
    owner: str | None = None
    round: int = 0

    def line(self) -> str:
        fields = [str(self.epoch), *([self.owner] if self.owner else []),
                  *([str(self.round)] if self.round and self.owner else [])]
        return " ".join(fields) + "\n"


@dataclass(frozen=True)
class Advanced:
    """What one ``advancing`` did: the floor before, whether it fences its owner's own
    processes (a new round), and the floor and round after."""

    floor_before: int
    own: bool
    floor: int
    round: int


def read_fence(path: str) -> Floor:
    """The floor persisted at ``path``: ``Floor()`` when there is none yet. An existing file
    that does not hold a floor (empty, garbage) raises ``DamagedFloor``: it is written
    atomically, so that is damage, never "no floor yet"."""
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except FileNotFoundError:
        return Floor()
    try:
        fields = raw.decode("ascii").split()
        floor = int(fields[0])
    except (UnicodeDecodeError, ValueError, IndexError):
        raise DamagedFloor(
            f"{path} does not hold an epoch floor ({len(raw)} bytes: {raw[:40]!r}); it is "
            "written atomically, so the disk damaged it. Refusing to guess a floor (0 would "
            "admit every stale epoch): write the highest epoch any driver of this Space used "
            "into it, or remove the Space") from None
    if floor < 0 or len(fields) > 3 or (len(fields) == 3 and not _is_round(fields[2])):
        raise DamagedFloor(f"{path} holds {raw[:40]!r}, not '<epoch> [<owner> [<round>]]'; "
                           "write the highest epoch any driver of this Space used into it")
    return Floor(floor, fields[1] if len(fields) > 1 else None,
                 int(fields[2]) if len(fields) > 2 else 0)


def _is_round(field: str) -> bool:
    return field.isascii() and field.isdigit()


def read_floor(path: str) -> int:
    """The floor persisted at ``path`` (0 when there is none yet)."""
    return read_fence(path).epoch


def check_owner(owner: str) -> str:
    """``owner`` if it can be stored as a token (no whitespace, at most ``MAX_OWNER``)."""
    if len(owner) > MAX_OWNER or any(c.isspace() for c in owner):
        raise BadRequest(f"advance_epoch: field 'owner' must be at most {MAX_OWNER} "
                         "characters without whitespace (an opaque token of the driver)")
    return owner


class EpochFence:
    def __init__(self, path: str) -> None:
        self._path = path
        self._cond = threading.Condition()
        self._admitted = 0
        self._advancing = False
        self._waiting_advances = 0
        self._at = read_fence(path)

    @property
    def floor(self) -> int:
        return self._at.epoch

    @property
    def round(self) -> int:
        """The floor's round: how many own fences its owner took at it."""
        return self._at.round

    def check(self, epoch: int, sent_round: int | None = None) -> None:
        """Refuse ``epoch`` if it is below the floor, or ``sent_round`` (when the request
        carries one) if it is the floor's epoch and an own fence began a later round."""
        if epoch < self._at.epoch:
            raise StaleEpoch(epoch, self._at.epoch)
        if sent_round is not None and epoch == self._at.epoch and sent_round < self._at.round:
            raise StaleEpoch(epoch, self._at.epoch, sent_round=sent_round,
                             floor_round=self._at.round)

    @contextmanager
    def admit(self, epoch: int, sent_round: int | None = None) -> Iterator[None]:
        """Hold the fence open for one request's effects, refusing a stale ``epoch`` (or
        ``sent_round``)."""
        with self._cond:
            while self._advancing or self._waiting_advances:
                self._cond.wait()
            self.check(epoch, sent_round)
            self._admitted += 1
        try:
            yield
        finally:
            with self._cond:
                self._admitted -= 1
                self._cond.notify_all()

    @contextmanager
    def advancing(self, epoch: int, owner: str = "", *, own: bool = False,
                  sent_round: int | None = None) -> Iterator[Advanced]:
        """Exclusively, with no admitted request in flight: refuse a stale ``epoch`` (and
        the floor's own epoch from another ``owner``: ``EpochTaken``), raise and persist the
        floor to it, and yield what it did. The caller kills the older processes inside (a
        crash in between is healed by the sweep at start-up).

        ``own`` (with an owner) begins a new round, unless the advance itself is of an
        earlier round than the floor's (``sent_round``): a copy of an own fence already
        taken (its client sent it again after a timeout, and the copies crossed) changes
        nothing, or the owner's current requests would be refused. The round never goes
        below the round its owner's client sent: a restored machine brings back an older
        floor file, and its late requests must stay refused."""
        with self._cond:
            self._waiting_advances += 1
            try:
                while self._advancing or self._admitted:
                    self._cond.wait()
            finally:
                self._waiting_advances -= 1
            self._advancing = True
        try:
            self.check(epoch)
            before = self._at
            if epoch == before.epoch and not (owner and owner == before.owner) and \
                    (before.epoch > 0 or before.owner is not None):
                raise EpochTaken(epoch, before.epoch)
            same = epoch == before.epoch and before.owner is not None
            known = max(before.round, sent_round or 0) if same else 0
            fences_own = bool(own and owner) and \
                not (same and sent_round is not None and sent_round < before.round)
            after = Floor(epoch, owner or None, known + fences_own)
            if after != before:
                self._persist(after)
            yield Advanced(before.epoch, fences_own, after.epoch, after.round)
        finally:
            with self._cond:
                self._advancing = False
                self._cond.notify_all()

    def _persist(self, at: Floor) -> None:
        tmp = self._path + ".tmp"
        with open(tmp, "w") as f:
            f.write(at.line())
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self._path)
        fsync_dir(os.path.dirname(self._path) or ".")
        self._at = at
