"""The nemesis role (Jepsen's): its protocol, a no-op one, and the validating wrapper.

A nemesis is ``setup`` with its ``Target``, gets ``invoke``d once per operation and is
``teardown`` at the end. ``chaos.faults.kinds`` has one small class per kind of fault and
``FaultNemesis``, which holds them all by action; ``NoopNemesis`` injures nothing (the
nemesis of a run whose plan has no faults). ``ValidatingNemesis`` wraps either: it is the
only writer of nemesis entries into the history, and it checks the contract.

When a fault fires is the schedule's business (``chaos.faults.schedule``), not the
nemesis's. The schedule turns a fault into one operation, or two when a Space fault also
kills the driver (its history has always shown both), and invokes each. The contract:

- every operation ends in exactly one completion: ``info`` (the fault happened; what it did
  to the system is the checker's to find out) or ``fail`` (it did not happen, with the
  reason: the Space was already gone, the driver had already exited, the seeded Space was
  not adopted yet);
- every planned fault ends fired (its operations ended) or skipped with its reason;
- an operation that raises, a second completion, or a planned fault that ended neither
  fired nor skipped is the nemesis's error (``fail error``): the run is then ``unknown``.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, Protocol

from chaos.errors import NemesisContractError
from chaos.faults.host_power import HostDisk
from chaos.faults.link_proxy import LinkProxy
from chaos.faults.plans import KIND_COUNTS, Action, Fault, FaultPlan
from chaos.faults.rendezvous import Hit
from chaos.run.processes import Driver
from chaos.run.state import RunState
from chaos.space_providers import CampaignSpaces
from durable.adapter.space_names import session_spaces


@dataclass(frozen=True)
class Target:
    """What the nemesis injures: the run's Spaces provider and Space. ``ledgers``: where a
    lost Space's ledger is saved; ``armed``: set once a driver adopted the seeded Space
    (before that its initial files exist nowhere else, so losing them would be a fault of
    the test, not of the system)."""

    #: None on a virtual workspace: there only the driver can be faulted (``on_virtual``).
    spaces: CampaignSpaces | None
    space: str
    ledgers: Path
    state: RunState
    armed: threading.Event
    #: The link between the drivers and the Space, when the plan has a kind that acts on it
    #: (``HeldKind.link``: a cut, a slowdown).
    link: LinkProxy | None = None
    #: Whether the agent forks its conversation (``Scenario.fork_after``).
    forks: bool = False
    #: The drivers' log's directory, when the plan fills its disk (``fill_log_disk``).
    log_disk: Path | None = None
    #: The drivers' log's disk, when the plan cuts the host's power (``cut_host_power``).
    host_disk: HostDisk | None = None

    def space_now(self) -> str:
        """The Space a fault of the Space strikes: the fork's once it exists (the drivers
        work there from then on: the only other Space of the run's session), else the
        run's. A cut link is the run's Space's only."""
        if self.forks and self.spaces is not None:
            prefix = session_spaces(self.space)
            others = [n for n in self.spaces.names() if n.startswith(prefix) and n != self.space]
            if others:
                return others[0]
        return self.space


@dataclass(frozen=True)
class Operation:
    """One thing to do to the run: ``action`` for the plan's fault ``index`` (its own
    action, or ``kill_driver`` for a Space fault that also kills the driver)."""

    index: int
    fault: Fault
    action: Action
    #: The failpoint report that made the fault due (None: its timer).
    hit: Hit | None
    #: The driver of the fault's attempt.
    driver: Driver | None


@dataclass(frozen=True)
class Completion:
    type: Literal["info", "fail"]
    f: str
    value: str


class Nemesis(Protocol):
    def setup(self, target: Target) -> None: ...

    def invoke(self, op: Operation) -> Completion: ...

    def teardown(self) -> None: ...


class NoopNemesis:
    """Injures nothing: any operation it gets ends ``fail``."""

    def setup(self, target: Target) -> None:
        pass

    def invoke(self, op: Operation) -> Completion:
        return Completion("fail", op.action,
                          f"skipped {op.fault.describe()}: the no-op nemesis injures nothing")

    def teardown(self) -> None:
        pass


# ---------------------------------------------------------------------- the contract


class ValidatingNemesis:
    """Wraps a nemesis: records each completion (and the count it adds to) and checks the
    contract above. Shared by the rendezvous handlers and the fault timers (its lock guards
    what ended; see ``chaos.run.state``)."""

    def __init__(self, inner: Nemesis, plan: FaultPlan, state: RunState) -> None:
        self.inner, self.plan, self.state = inner, plan, state
        self._lock = threading.Lock()
        #: (fault index, action) of every operation invoked, and every fault skipped.
        self._invoked: set[tuple[int, str]] = set()
        self._skipped: set[int] = set()
        #: What it injures, once ``setup``.
        self.target: Target | None = None

    def setup(self, target: Target) -> None:
        self.target = target
        self.inner.setup(target)

    def invoke(self, op: Operation) -> Completion:
        """Invoke ``op`` on the inner nemesis and record its one completion."""
        with self._lock:
            again = (op.index, op.action) in self._invoked or op.index in self._skipped
            self._invoked.add((op.index, op.action))
        if again:
            return self._broken(f"{op.action} of {op.fault.describe()} was invoked after that "
                                "fault had ended")
        try:
            done = self.inner.invoke(op)
        except Exception as exc:  # noqa: BLE001 - never lost: the run becomes unknown
            self.state.fault_error(f"the nemesis failed to fire {op.fault.describe()}", exc)
            return Completion("fail", "error", str(exc))
        if done.type not in ("info", "fail") or done.f != op.action:
            return self._broken(f"{op.action} of {op.fault.describe()} ended in {done}")
        self.state.op("nemesis", done.type, done.f, done.value)
        if done.type == "info":
            self.state.count(KIND_COUNTS[done.f])
        return done

    def skip(self, index: int, why: str) -> None:
        """The plan's fault ``index`` never came due: skipped, with the reason."""
        if self._end_unfired(index):
            self.state.op("nemesis", "info", "skipped", f"{self.plan.faults[index].describe()}: "
                          f"{why}")

    def missed(self, index: int, why: str) -> None:
        """The plan's fault ``index`` came due (``why``) and never fired."""
        if self._end_unfired(index):
            self.state.fault_error(f"{self.plan.faults[index].describe()} was due ({why})",
                                   RuntimeError("it never fired"))

    def teardown(self) -> None:
        """Every planned fault must have ended, fired or skipped."""
        self.inner.teardown()
        with self._lock:
            ended = {index for index, _ in self._invoked} | self._skipped
        for index, fault in enumerate(self.plan.faults):
            if index not in ended:
                self._broken(f"{fault.describe()} ended neither fired nor skipped")

    def _end_unfired(self, index: int) -> bool:
        with self._lock:
            fresh = index not in self._skipped and all(i != index for i, _ in self._invoked)
            self._skipped.add(index)
        if not fresh:
            self._broken(f"{self.plan.faults[index].describe()} was skipped after it had ended")
        return fresh

    def _broken(self, what: str) -> Completion:
        self.state.fault_error("the nemesis broke its contract", NemesisContractError(what))
        return Completion("fail", "error", what)
