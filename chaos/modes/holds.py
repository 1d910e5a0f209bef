"""Parking drivers at a failpoint (stale mode's races).

A hold names the report it waits for (``matches``). The first driver whose report matches
is parked: the rendezvous handler does not answer it until the hold is released, so the
driver waits inside its failpoint while the runner launches a newer one. Every hold is
released when the run ends (``Holds`` as a context manager), so no handler thread waits
past its run.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Self

from chaos.faults.rendezvous import Hit
from chaos.run.attempts import DRIVER_TIMEOUT_S
from chaos.run.processes import Owned
from chaos.run.state import RunState


@dataclass
class Hold:
    """Park the driver whose failpoint hit ``matches`` until ``release`` is set."""

    who: str
    matches: Callable[[Hit], bool]
    parked: threading.Event = field(default_factory=threading.Event)
    release: threading.Event = field(default_factory=threading.Event)


class Holds:
    """The run's holds. Shared by the run's thread (``add``, ``release_all``), the rendezvous
    handlers (``park``) and the campaign's thread (``release_all`` on abort)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._waiting: list[Hold] = []
        self._all: list[Hold] = []
        self._parked: set[int] = set()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release_all()

    def add(self, hold: Hold) -> None:
        with self._lock:
            self._waiting.append(hold)
            self._all.append(hold)

    def park(self, hit: Hit, state: RunState) -> bool:
        """Park the reporter of ``hit`` if a waiting hold matches it (then return True once it
        is released); False when no hold wants it."""
        with self._lock:
            hold = next((h for h in self._waiting if h.matches(hit)), None)
            if hold is not None:
                self._waiting.remove(hold)  # taken: it parks one driver
        if hold is None:
            return False
        with self._lock:
            self._parked.add(hit.pid)
        hold.parked.set()  # tell the runner: a driver is parked here
        state.op("nemesis", "info", "hold_driver", f"{hold.who} at {hit.point}#{hit.occurrence}")
        try:
            hold.release.wait(DRIVER_TIMEOUT_S)
        finally:
            with self._lock:
                self._parked.discard(hit.pid)
        return True

    def parked(self) -> set[int]:
        """The pids of the drivers parked now (each waits at its failpoint)."""
        with self._lock:
            return set(self._parked)

    def release_all(self) -> None:
        with self._lock:
            holds = list(self._all)
        for hold in holds:
            hold.release.set()


def wait_parked(hold: Hold, driver: Owned, timeout: float = DRIVER_TIMEOUT_S) -> bool:
    """Wait until ``hold`` parks ``driver``: whether it did and the driver still runs (False
    when the driver exited first, or after ``timeout``)."""
    deadline = time.monotonic() + timeout
    while not hold.parked.wait(0.05):
        if driver.poll() is not None or time.monotonic() > deadline:
            return False
    return driver.poll() is None
