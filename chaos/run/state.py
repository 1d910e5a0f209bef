"""What several threads of one run write down, and the lock discipline of the whole campaign.

A run has these threads: its own (it launches and awaits drivers, then observes and
checks), the rendezvous' handler threads (one per process that reports failpoints: they
park held drivers and fire failpoint faults), the fault timers of the current attempt (they
fire time faults) and the campaign's main thread (``Run.abort`` on Ctrl-C).

The lock discipline, followed by every module of ``chaos``:

1. An object that more than one thread touches owns one private lock and guards every
   mutable field with it. It exposes methods that are atomic on their own (``claim`` tests
   and sets, ``op`` appends, reads return copies), never the fields themselves.
2. A lock is held only to read or update the fields it guards, and for system calls that
   return at once (a signal, an append to a file, an ``Event``'s ``set`` or ``clear``):
   never while waiting for anything (a thread, a process, a Space, an ``Event``) and never
   while calling another object that locks. So no thread ever holds two of these locks,
   and no order of taking them can deadlock.
3. Threads signal each other with ``threading.Event`` (armed, parked, released, closing).
4. Fields written before the threads that read them start (a run's configuration), and
   fields only one thread ever touches, need no lock.

The shared objects are ``RunState`` (here), ``AttemptScope`` (``chaos.run.attempts``),
``Holds`` (``chaos.modes.holds``), ``ValidatingNemesis`` (``chaos.faults.nemesis``), ``LoseSpace``
(``chaos.faults.kinds``), and inside them ``OwnedProcess``, ``Rendezvous`` and
``live.Campaign``.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from chaos.faults.plans import KIND_COUNTS, Fault
from chaos.run.processes import Driver

#: The counts of a run record: those records have always had, in their order, then each
#: fault kind's that is not among them (``plans.KIND_COUNTS``).
COUNTS = tuple(dict.fromkeys((
    "kills", "daemon_kills", "space_restarts", "lost_spaces", "process_kills", "fenced",
    "timeouts", "attempts", "foreign", "drives", "refused_tokens", "coordinator_kills",
    "power_losses", "machine_checks", "pauses", *KIND_COUNTS.values())))
#: How long a failpoint report waits for the driver being launched to be registered: the
#: launch itself gives up far sooner (``driver_forks.LAUNCH_TIMEOUT_S``); only a hang
#: gets here.
LAUNCH_WAIT_S = 600.0


class RunState:
    """The run's history, fault bookkeeping, counts and errors, and its current attempt.

    ``t0`` (the run's start) is set by the run's thread before any other thread starts."""

    def __init__(self) -> None:
        self.t0 = time.time()
        self._lock = threading.Lock()
        self._history: list[dict[str, Any]] = []
        self._fired: set[int] = set()
        self._counts = dict.fromkeys(COUNTS, 0)
        #: What went wrong in the nemesis itself: the run is then ``unknown``, since a
        #: planned fault may not have happened.
        self._errors: list[str] = []
        #: Why the run tested nothing (the machine was too slow for what it sets up): the
        #: run is then ``unknown`` whatever the checks found, since they checked nothing.
        self._untested: list[str] = []
        self._latencies: list[dict[str, Any]] = []
        #: The ledgers of the Space's generations the nemesis destroyed, by generation.
        self._ledgers: dict[int, tuple[str, dict[str, Any]]] = {}
        self._generations = 0
        self._attempt = 0
        self._driver: Driver | None = None
        self._launches = 0  # drivers being launched, not yet registered
        self._settled = threading.Event()  # set while no driver is being launched
        self._settled.set()

    # ------------------------------------------------------------------ history

    def op(self, process: str, type_: str, f: str, value: Any = None) -> None:
        """Append one operation (Jepsen's ``{process, type, f, value, time}``)."""
        with self._lock:
            self._history.append({"process": process, "type": type_, "f": f, "value": value,
                                  "time": round(time.time() - self.t0, 4)})

    def add_history(self, ops: list[dict[str, Any]]) -> None:
        with self._lock:
            self._history.extend(ops)

    def history(self) -> list[dict[str, Any]]:
        """The operations so far, by time."""
        with self._lock:
            return sorted(self._history, key=lambda op: op["time"])

    def count(self, key: str, n: int = 1) -> None:
        with self._lock:
            self._counts[key] = self._counts.get(key, 0) + n

    def counts(self) -> dict[str, int]:
        with self._lock:
            return dict(self._counts)

    def fault_error(self, what: str, exc: BaseException) -> None:
        """The nemesis failed (``what``, because of ``exc``): recorded as an error of the run
        and as a ``fail error`` operation."""
        text = f"{what}: {type(exc).__name__}: {exc}"
        with self._lock:
            self._errors.append(text)
        self.op("nemesis", "fail", "error", text)

    def errors(self) -> list[str]:
        with self._lock:
            return list(self._errors)

    def not_tested(self, why: str) -> None:
        """The run tested nothing (``why``): recorded, and as an ``info untested`` operation."""
        with self._lock:
            self._untested.append(why)
        self.op("nemesis", "info", "untested", why)

    def untested(self) -> list[str]:
        with self._lock:
            return list(self._untested)

    # ------------------------------------------------------------------ faults

    def claim(self, index: int) -> bool:
        """Mark the plan's fault ``index`` fired; False when it already was (it fires once)."""
        with self._lock:
            if index in self._fired:
                return False
            self._fired.add(index)
            return True

    def fired(self) -> list[int]:
        with self._lock:
            return sorted(self._fired)

    def fault_latency(self, fault: Fault, killed: bool) -> None:
        """Note when ``fault`` fired, for the latency report."""
        entry = {"action": fault.action, "trigger": fault.trigger, "point": fault.point,
                 "t_fault": time.time() - self.t0, "t_next_step": None, "t_done": None,
                 "killed": killed}
        with self._lock:
            self._latencies.append(entry)

    def step_seen(self, t: float) -> None:
        """A driver reached a failpoint at ``t``: the next step after every kill before it."""
        with self._lock:
            for lat in self._latencies:
                if lat["t_next_step"] is None and lat["killed"]:
                    lat["t_next_step"] = t - self.t0

    def latencies(self, t_done: float | None) -> list[dict[str, Any]]:
        """The faults' latencies, the run done at ``t_done`` (seconds after the start; None
        when it never got there)."""
        with self._lock:
            return [{**lat, "t_done": t_done} for lat in self._latencies]

    def new_generation(self) -> int:
        """The number of the next Space generation whose ledger is saved."""
        with self._lock:
            self._generations += 1
            return self._generations - 1

    def add_ledger(self, generation: int, space: str, ledger: dict[str, Any]) -> None:
        """The ledger record of a generation of ``space`` (the run's, or its fork's)."""
        with self._lock:
            self._ledgers[generation] = (space, ledger)

    def ledgers(self, space: str) -> list[dict[str, Any]]:
        """The ledger records of ``space``'s earlier generations, oldest first."""
        with self._lock:
            return [self._ledgers[g][1] for g in sorted(self._ledgers)
                    if self._ledgers[g][0] == space]

    # ------------------------------------------------------------------ the attempt

    def begin_attempt(self, attempt: int, driver: Driver) -> None:
        """The run's session is now at ``attempt``, run by ``driver``: failpoint faults kill
        that driver."""
        with self._lock:
            self._attempt, self._driver = attempt, driver

    def current(self) -> tuple[int, Driver | None]:
        with self._lock:
            return self._attempt, self._driver

    @contextmanager
    def launching(self) -> Iterator[None]:
        """A driver is being launched (and registered with ``begin_attempt``) inside the
        block: ``driver_for`` waits for the block's end."""
        with self._lock:
            self._launches += 1
            self._settled.clear()
        try:
            yield
        finally:
            with self._lock:
                self._launches -= 1
                if not self._launches:
                    self._settled.set()

    def driver_for(self, pid: int) -> tuple[int, Driver | None]:
        """``current()``, for a failpoint ``pid`` reported (a driver, or a daemon or shim of
        its Space). A forked driver can reach its first failpoints, and make its Space's
        daemon reach some (``spacesd.advance.persisted``), before its launcher heard its pid
        and registered it: a fault due there was then aimed at the driver before (dead:
        skipped), so whether a recovery's fault fired depended on the machine's load (found
        by a stress run: an exhaustive campaign's kill at ``recovery.decided`` fired in one
        run of the same plan and not in the other). A report from any process but the
        driver being launched waits until the launch ended (the launch needs no failpoint
        answered)."""
        deadline = time.monotonic() + LAUNCH_WAIT_S
        while True:
            with self._lock:
                if not self._launches or (self._driver is not None and
                                          self._driver.pid == pid):
                    return self._attempt, self._driver
            if not self._settled.wait(max(0.0, deadline - time.monotonic())):
                return self.current()
