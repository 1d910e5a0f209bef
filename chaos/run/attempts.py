"""Who owns a run's drivers and fault timers: the attempts scope (Trio's rule).

The owner of a child process always ends it and waits for it; the owner of a thread always
joins it. ``AttemptScope`` is the one owner of every driver a run launches (its session's
attempts, a stale race's older and newer drivers, another session's) and of every fault
timer of its attempts:

- ``wait`` gives a driver's exit code and reaps it, whatever happens; at the timeout the
  driver is ended (SIGTERM, a grace period, SIGKILL) and its code is ``EXIT_TIMED_OUT``.
- Leaving the scope (``with scope:``) SIGKILLs every driver still running by its process
  group, reaps it and ends every timer, so a stale race that raised or timed out leaves no
  older driver behind. The scope can be entered again: the run's clean driver comes after
  its faulted ones.
- ``cancel`` (Ctrl-C, from the campaign's thread) kills every driver and refuses new
  launches for good (``RunAborted``).
- ``attempt_timers`` gives one attempt's ``FaultTimers``. When the attempt leaves it, every
  timer is cancelled *and joined*: a timer past its wait does not start its fault once the
  attempt is closing, and one already firing is waited for, so no fault of an attempt
  lands in a later one.

Shared by the run's thread and the campaign's (``cancel``): see ``chaos.run.state`` for the
lock discipline.
"""

from __future__ import annotations

import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Self

from chaos.campaign import live
from chaos.errors import RunAborted
from chaos.run.driver_forks import forkable, server
from chaos.run.processes import Owned, OwnedProcess

#: How long a driver may run, a hold may park one, or a fault timer may take to end.
DRIVER_TIMEOUT_S = 180.0
#: The exit code recorded for a driver ended at ``DRIVER_TIMEOUT_S``: no process exits with
#: it (signals give -1 to -64).
EXIT_TIMED_OUT = -1000


class FaultTimers:
    """The fault timers of one attempt. ``start`` and ``close`` are called by the run's
    thread only; the timer threads only read ``closing``."""

    def __init__(self) -> None:
        self.closing = threading.Event()
        self._timers: list[threading.Timer] = []

    def start(self, delay: float, fire: Callable[[], None]) -> None:
        """Call ``fire`` after ``delay`` seconds, unless the attempt is closing by then."""
        if self.closing.is_set():
            raise RuntimeError("a fault timer started for an attempt that already ended")
        timer = threading.Timer(delay, self._call, (fire,))
        timer.daemon = True
        self._timers.append(timer)
        timer.start()

    def _call(self, fire: Callable[[], None]) -> None:
        if not self.closing.is_set():
            fire()

    def wait(self, event: threading.Event, timeout: float) -> bool:
        """In a timer: wait for ``event``, but not beyond the attempt's close or ``timeout``;
        whether it is set."""
        deadline = time.monotonic() + timeout
        while not event.wait(0.05):
            if self.closing.is_set() or time.monotonic() > deadline:
                return False
        return True

    def close(self) -> None:
        """Cancel every timer and join it (a fault already firing ends first)."""
        self.closing.set()
        for timer in self._timers:
            timer.cancel()
        stuck = []
        for timer in self._timers:
            timer.join(DRIVER_TIMEOUT_S)
            if timer.is_alive():
                stuck.append(timer.name)
        if stuck:
            raise RuntimeError(f"fault timer(s) {stuck} still firing {DRIVER_TIMEOUT_S:.0f} s "
                               "after their attempt ended")


class AttemptScope:
    """Owns a run's drivers and fault timers; ``note``: the campaign's note of what it owns
    (``live``), if it keeps one."""

    def __init__(self, note: live.Campaign | None = None) -> None:
        self.note = note
        self._lock = threading.Lock()
        self._drivers: list[Owned] = []
        self._timers: list[FaultTimers] = []
        self._cancelled = threading.Event()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.end_all()

    @property
    def cancelled(self) -> bool:
        return self._cancelled.is_set()

    def launch(self, argv: list[str], env: dict[str, str], log: Path) -> Owned:
        """Start a driver (its output to ``log``), owned by the scope from here on: forked
        by the driver server when it runs the campaign's driver (``driver_forks``)."""
        if self.cancelled:
            raise RunAborted("the campaign was interrupted")
        driver: Owned
        if forkable(argv):
            driver = server().launch(argv, env, log)
        else:
            with open(log, "wb") as out:
                driver = OwnedProcess(argv, env=env, stdout=out, stderr=subprocess.STDOUT)
        with self._lock:
            self._drivers.append(driver)
        if self.note is not None:
            self.note.driver(driver.pid)
        if self.cancelled:  # cancelled while it started: it must not live on
            driver.kill_group()  # type: ignore[unreachable]  # set by another thread
        return driver

    def wait(self, driver: Owned, timeout: float = DRIVER_TIMEOUT_S) -> int:
        """``driver``'s exit code, or ``EXIT_TIMED_OUT`` after ending it at ``timeout``;
        reaped either way."""
        try:
            return driver.wait(timeout)
        except subprocess.TimeoutExpired:
            return EXIT_TIMED_OUT
        finally:
            self._reap(driver)

    @contextmanager
    def attempt_timers(self) -> Iterator[FaultTimers]:
        """The fault timers of one attempt, cancelled and joined when it ends."""
        timers = FaultTimers()
        with self._lock:
            self._timers.append(timers)
        try:
            yield timers
        finally:
            with self._lock:
                self._timers.remove(timers)
            timers.close()

    def running(self) -> list[Owned]:
        """Every driver of the scope that has not exited, oldest first."""
        with self._lock:
            drivers = list(self._drivers)
        return [d for d in drivers if d.poll() is None]

    def cancel(self) -> None:
        """From any thread: kill every driver; no driver is launched any more."""
        self._cancelled.set()
        with self._lock:
            drivers = list(self._drivers)
        for driver in drivers:
            driver.kill_group()

    def end_all(self) -> None:
        """End every timer and SIGKILL and reap every driver still owned."""
        with self._lock:
            drivers, timers = list(self._drivers), list(self._timers)
        for timers_of_attempt in timers:
            timers_of_attempt.close()
        failed: OSError | None = None
        for driver in drivers:  # every one, even past one that could not be reaped
            driver.kill_group()
            try:
                self._reap(driver)
            except OSError as exc:
                failed = failed or exc
        if failed is not None:
            raise failed

    def _reap(self, driver: Owned) -> None:
        driver.close()
        with self._lock:
            if driver in self._drivers:
                self._drivers.remove(driver)
