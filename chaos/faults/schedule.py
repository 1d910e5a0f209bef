"""When each planned fault fires, and how every planned fault ends.

The plan (``chaos.faults.plans``) says when, the nemesis (``chaos.faults.nemesis``) says what; the
schedule brings them together:

- at a failpoint: the rendezvous hands every report to ``on_hit`` while its process waits.
  A held driver (stale mode) parks first; otherwise every fault due at that report fires,
  in plan order, before the answer;
- on a timer: ``arm`` starts one timer per time fault of an attempt, in that attempt's
  ``FaultTimers``; a timed fault kills its own attempt's driver, never a later one;
- a time fault whose delay outlasts its driver lands at the driver's ``session.end``
  instead of never: a launched attempt always gets its faults, so the same seed gives the
  same fault counts however fast the machine is;
- each fault fires at most once (``RunState.claim``); ``account`` ends every fault that
  never fired: skipped with its reason, or, when it was due, the nemesis's error.

A gated schedule (stale mode) fires nothing until ``open`` is called (once the older driver
is parked): its failpoint faults then count their occurrences from that instant, so they
land on the drivers that race and never keep the older one from its park.

A Space loss needs the seeded Space adopted first (``ARMING_POINTS``): before that its
initial files exist nowhere else. A timed loss waits for the adoption (within its attempt);
one at a failpoint reached earlier (the adoption's own checkpoint) leaves the Space alone,
deterministically.
"""

from __future__ import annotations

import threading
import time
from functools import partial

from chaos.faults.nemesis import Operation, ValidatingNemesis
from chaos.faults.plans import Action, Fault, FaultPlan
from chaos.faults.rendezvous import Answer, Hit
from chaos.modes.holds import Holds
from chaos.run.attempts import DRIVER_TIMEOUT_S, FaultTimers
from chaos.run.processes import Driver, Owned
from chaos.run.state import RunState

#: Failpoints reached only after the driver adopted the seeded Space (it adopts at start,
#: before any call or recovery).
ARMING_POINTS = ("call.", "recovery.", "session.")
#: Which processes a fault ends, by the process that reported the failpoint.
ENDS_REPORTER = {"spacesd": ("kill_daemon", "restart_space", "delete_space"),
                 "shim": ("kill_process", "restart_space", "delete_space"),
                 "driver": ("cut_host_power",)}


def _kills_reporter(hit: Hit, fault: Fault, killed_driver: bool, injured: bool) -> bool:
    """Whether firing ``fault`` ended the process that reported ``hit`` (then its channel is
    closed; a live reporter must get its answer, or it stops reporting failpoints)."""
    process = hit.info.get("process")
    if process is None and killed_driver:
        return True
    return injured and fault.action in ENDS_REPORTER.get(process or "driver", ())


class FaultSchedule:
    """Fires the plan's faults through ``nemesis``. Its ``on_hit`` runs in the rendezvous'
    handler threads, its timers in their own; it keeps no state of its own besides
    ``armed`` (an ``Event``): the rest is ``RunState``'s."""

    def __init__(self, plan: FaultPlan, nemesis: ValidatingNemesis, state: RunState,
                 holds: Holds, *, gated: bool = False) -> None:
        self.plan, self.nemesis, self.state, self.holds = plan, nemesis, state, holds
        self.armed = threading.Event()
        #: How often each point was reached when the gate opened (None: still closed);
        #: ungated, every count is the rendezvous's own.
        self._base: dict[str, int] | None = None if gated else {}

    def open(self, counts: dict[str, int]) -> None:
        """Open a gated schedule: from now on its failpoint faults fire, their
        occurrences counted past ``counts`` (the rendezvous's counts at this instant)."""
        self._base = dict(counts)

    def on_hit(self, hit: Hit) -> Answer:
        """The rendezvous handler: park a held driver, else fire every fault due at ``hit``."""
        if hit.point.startswith(ARMING_POINTS):
            self.armed.set()
        if hit.info.get("process") is None:
            self.state.step_seen(hit.t)
        if self.holds.park(hit, self.state):
            return "continue"
        base = self._base
        if base is None:
            return "continue"  # gated, not open yet: nothing fires
        occurrence = hit.occurrence - base.get(hit.point, 0)
        attempt, driver = self.state.driver_for(hit.pid)
        reporter_gone = False
        for index, fault in enumerate(self.plan.faults):
            due = (fault.trigger == "failpoint" and fault.point == hit.point
                   and fault.occurrence == occurrence)
            due = due or (hit.point == "session.end" and fault.trigger == "time"
                          and fault.attempt == attempt)
            if due and fault.after_output and not self._printed(hit):
                self.nemesis.skip(index, f"the command at {hit.point}#{hit.occurrence} ended "
                                  "without printing anything")
                continue
            if due:  # every fault due here fires, in plan order
                fired = self._fire(index, fault, hit, driver)
                if fired is not None:
                    reporter_gone = reporter_gone or _kills_reporter(hit, fault, *fired)
        return "killed" if reporter_gone else "continue"

    def arm(self, timers: FaultTimers, attempt: int, driver: Owned) -> None:
        """Start the timers of ``attempt``'s time faults (its driver was just launched)."""
        for index, fault in enumerate(self.plan.faults):
            if fault.trigger == "time" and fault.attempt == attempt:
                timers.start(fault.delay or 0.0,
                             partial(self._fire_timed, timers, index, fault, driver))

    def account(self, hits: dict[str, int]) -> None:
        """After the faulted drivers: end every planned fault that never fired (``hits``:
        how often each failpoint was reached), then check that every fault ended."""
        attempt, _ = self.state.current()
        fired = set(self.state.fired())
        base = self._base
        for index, fault in enumerate(self.plan.faults):
            if index in fired:
                continue
            if base is None:
                self.nemesis.skip(index, "the run never opened its faults (stale mode opens "
                                  "them once its older driver is parked; this kind parks none)")
                continue
            if fault.trigger == "time":
                self.nemesis.skip(index, f"attempt {fault.attempt} ended before its delay"
                                  if fault.attempt is not None and fault.attempt <= attempt
                                  else f"attempt {fault.attempt} was never launched")
                continue
            assert fault.point is not None and fault.occurrence is not None
            reached = hits.get(fault.point, 0) - base.get(fault.point, 0)
            if reached >= fault.occurrence:
                self.nemesis.missed(index, f"{fault.point} reached {reached} times")
            else:
                self.nemesis.skip(index, f"{fault.point} was reached {reached} time(s)")
        self.nemesis.teardown()

    def _printed(self, hit: Hit) -> bool:
        """Wait (the reporting driver waits at its failpoint meanwhile) until the command
        the hit names (``key``) printed something, through the Space's daemon; False when
        it ended first. Its key ends in the epoch of the driver that started it, the epoch
        the question is asked at."""
        target = self.nemesis.target
        key = hit.info.get("key")
        if target is None or target.spaces is None or not isinstance(key, str):
            raise ValueError(f"a fault after a command's output needs a Space and a failpoint "
                             f"that names the command's key; {hit.point} names none")
        client = target.spaces.connect(target.space, epoch=int(key.rpartition("@")[2]))
        deadline = time.monotonic() + DRIVER_TIMEOUT_S  # only a hang gets there
        while time.monotonic() < deadline:
            info = client.exec_status(key)
            if info.output_size > 0 or info.output:
                return True
            if info.state != "running":
                return False
            time.sleep(0.02)
        raise TimeoutError(f"the command {key} printed nothing within {DRIVER_TIMEOUT_S} s")

    def _fire_timed(self, timers: FaultTimers, index: int, fault: Fault,
                    driver: Owned) -> None:
        """A timer's fault: an error here is the run's, never lost with the timer thread."""
        try:
            if fault.action == "delete_space":
                timers.wait(self.armed, DRIVER_TIMEOUT_S)
            self._fire(index, fault, None, driver)
        except Exception as exc:  # noqa: BLE001 - the run's error, not the thread's
            self.state.fault_error(f"the nemesis failed to fire {fault.describe()}", exc)

    def _fire(self, index: int, fault: Fault, hit: Hit | None,
              driver: Driver | None) -> tuple[bool, bool] | None:
        """Fire ``fault`` once: (it killed the driver, it injured the Space), or None when it
        had fired already.

        The nemesis acts outside every lock: bringing a daemon back waits for it, and the
        new daemon's (or the driver's) failpoints must be answered meanwhile."""
        if not self.state.claim(index):
            return None
        injured = killed = False
        if fault.action != "kill_driver":
            injured = self._invoke(index, fault, fault.action, hit, driver)
        if fault.kill_driver:
            killed = self._invoke(index, fault, "kill_driver", hit, driver)
        self.state.fault_latency(fault, killed)
        return killed, injured

    def _invoke(self, index: int, fault: Fault, action: Action, hit: Hit | None,
                driver: Driver | None) -> bool:
        """Whether the operation happened (``info``)."""
        return self.nemesis.invoke(Operation(index, fault, action, hit, driver)).type == "info"
