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
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager

from .errors import StaleEpoch
from .fsio import fsync_dir


def read_floor(path: str) -> int:
    """The floor persisted at ``path`` (0 when there is none yet)."""
    try:
        with open(path) as f:
            return int(f.read().strip() or 0)
    except FileNotFoundError:
        return 0


class EpochFence:
    def __init__(self, path: str) -> None:
        self._path = path
        self._cond = threading.Condition()
        self._admitted = 0
        self._advancing = False
        self._waiting_advances = 0
        self._floor = read_floor(path)

    @property
    def floor(self) -> int:
        return self._floor

    def check(self, epoch: int) -> None:
        """Refuse ``epoch`` if it is below the floor (for requests without effects)."""
        if epoch < self._floor:
            raise StaleEpoch(epoch, self._floor)

    @contextmanager
    def admit(self, epoch: int) -> Iterator[None]:
        """Hold the fence open for one request's effects, refusing a stale ``epoch``."""
        with self._cond:
            while self._advancing or self._waiting_advances:
                self._cond.wait()
            self.check(epoch)
            self._admitted += 1
        try:
            yield
        finally:
            with self._cond:
                self._admitted -= 1
                self._cond.notify_all()

    @contextmanager
    def advancing(self, epoch: int) -> Iterator[int]:
        """Exclusively, with no admitted request in flight: refuse a stale ``epoch``, raise
        and persist the floor to it, and yield the floor it had before (raised if below
        ``epoch``). The caller kills the older processes inside (a crash in between is
        healed by the sweep at start-up)."""
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
            before = self._floor
            if epoch > before:
                self._persist(epoch)
            yield before
        finally:
            with self._cond:
                self._advancing = False
                self._cond.notify_all()

    def _persist(self, epoch: int) -> None:
        tmp = self._path + ".tmp"
        with open(tmp, "w") as f:
            f.write(f"{epoch}\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self._path)
        fsync_dir(os.path.dirname(self._path) or ".")
        self._floor = epoch
