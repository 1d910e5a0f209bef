"""What each kind of fault does to a run: one small class per kind (the nemesis's).

``KillDriver`` (SIGKILL of the driver's process group), ``KillDaemon`` (the Space's daemon
only; its commands survive), ``RestartSpace`` (the daemon and every process, the disk
kept), ``LoseSpace`` (the Space is lost at one instant; its ledger is saved, for G2 and
G3), ``KillProcess`` (the one process of the Space that reported the failpoint: a
command's shim), ``PowerLoss`` (a microVM's power cut: unsynced writes lost, the machine
booted again), ``PauseDriver`` (SIGSTOP of the driver's process group), ``PauseSpace``
(the whole Space frozen for the fault's ``hold``, then thawed), ``CutLink`` (the link
between the drivers and the Space cut for its ``hold``, then healed) and ``JumpClock`` (the
Space's clock stepped for its ``hold``, then set right), ``FillStateDisk``,
``FillWorkDisk`` and ``FillLogDisk`` (the disk of the Space's daemon state, of its
workspace, of the drivers' log, full for its ``hold``, then freed), ``CutHostPower`` (the
drivers' host loses power, its log what did not reach its disk), ``SlowLink`` (every
burst crossing the link between the drivers and the Space late for its ``hold``).
``FaultNemesis`` holds them all, by action. Each ends an operation in one completion
(``chaos.faults.nemesis`` has the contract): ``info`` when it struck, ``fail`` with the
reason when it could not.
"""

from __future__ import annotations

import contextlib
import threading
import time
import zlib
from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, ClassVar, cast

from backends.local import own_disks
from chaos.faults.host_power import wait_dead
from chaos.faults.nemesis import Completion, Operation, Target
from chaos.faults.plans import DISK_BYTES, FROZEN, HELD_KINDS, RELEASE, THAWING, Action, Fault
from chaos.run.observe import kept_ledgers, read_ledger, unread_ledger
from chaos.run.processes import Owned
from chaos.space_providers import (
    Clocked,
    CommandPausable,
    DaemonPausable,
    DiskFillable,
    Pausable,
    PowerSwitched,
)
from durable.errors import SpaceError, SpaceNotFound
from durable.log import now_ms

if TYPE_CHECKING:
    from backends.descriptor import DiskName
    from chaos.faults.link_proxy import LinkProxy
    from chaos.space_providers import CampaignSpaces


class _Kind(ABC):
    action: ClassVar[Action]
    target: Target

    def setup(self, target: Target) -> None:
        self.target = target

    def teardown(self) -> None:  # noqa: B027 - optional: most kinds leave nothing to undo
        pass

    @abstractmethod
    def invoke(self, op: Operation) -> Completion: ...


class _SpaceKind(_Kind):
    """A fault of the Space: ``strike`` it; a Space that refuses (already gone, say) makes
    the operation ``fail`` with the provider's reason."""

    def invoke(self, op: Operation) -> Completion:
        try:
            self.strike(op)
        except SpaceError as exc:
            return Completion("fail", self.action, f"skipped: {exc}")
        return Completion("info", self.action, op.fault.describe())

    @abstractmethod
    def strike(self, op: Operation) -> None: ...

    @property
    def spaces(self) -> CampaignSpaces:
        """The run's Spaces provider (a virtual workspace has none: ``on_virtual`` gives it
        no fault of the Space)."""
        spaces = self.target.spaces
        if spaces is None:
            raise TypeError(f"{self.action}: a virtual workspace has no Space to fault")
        return spaces


class KillDriver(_Kind):
    action = "kill_driver"

    def invoke(self, op: Operation) -> Completion:
        if op.driver is None or op.driver.poll() is not None:
            return Completion("fail", self.action,
                              f"skipped {op.fault.describe()}: no driver was running")
        op.driver.kill_group()
        return Completion("info", self.action, op.fault.describe())


class PauseDriver(_Kind):
    """The driver frozen (SIGSTOP of its process group) where it stands: its heartbeat falls
    silent, and only its coordinator's stall detection can replace it."""

    action = "pause_driver"

    def invoke(self, op: Operation) -> Completion:
        if op.driver is None or not op.driver.pause_group():
            return Completion("fail", self.action,
                              f"skipped {op.fault.describe()}: no driver was running")
        return Completion("info", self.action, op.fault.describe())


class KillDaemon(_SpaceKind):
    action = "kill_daemon"

    def strike(self, op: Operation) -> None:
        self.spaces.kill_daemon(self.target.space_now())


class RestartSpace(_SpaceKind):
    action = "restart_space"

    def strike(self, op: Operation) -> None:
        self.spaces.restart(self.target.space_now())


class LoseSpace(_SpaceKind):
    """A loss is two steps (save the ledger, delete the Space): two faults due at once
    would both save the same generation's ledger and count one loss twice (G2 would then
    see its commands started twice), so the second ends ``fail`` instead. Shared by the
    threads that fire faults (its lock guards ``_losing``; see ``chaos.run.state``)."""

    action = "delete_space"

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._losing = False

    def invoke(self, op: Operation) -> Completion:
        if not self.target.armed.is_set():
            return Completion("fail", self.action, f"skipped {op.fault.describe()}: the seeded "
                              "Space is not adopted yet")
        with self._lock:
            busy, self._losing = self._losing, True
        if busy:
            return Completion("fail", self.action, f"skipped {op.fault.describe()}: another "
                              "fault is deleting the Space at this moment")
        try:
            return super().invoke(op)
        finally:
            with self._lock:
                self._losing = False

    def strike(self, op: Operation) -> None:
        t = self.target
        space = t.space_now()
        generation = t.state.new_generation()
        dest = t.ledgers / f"gen-{generation:02d}"
        # The Space's ledger dies with it; the audits (G2, G3) need it as it was at the
        # instant of the loss: saved before a delete, the driver could still fence and
        # restore in the Space between the two, unrecorded (found by the docker campaign:
        # a G3 "reverted ... not preceded by advance_epoch" that the Space did precede).
        try:
            self.spaces.lose(space, dest)
        except SpaceNotFound:
            raise  # gone before this fault: nothing was lost by it
        except SpaceError:
            # Lost or not, what it recorded is unknown: the audits cannot decide this run.
            t.state.add_ledger(generation, space, unread_ledger("deleted"))
            raise
        t.state.add_ledger(generation, space, read_ledger(dest, "deleted"))
        for kept in kept_ledgers(dest):  # a machine restore took the audit files back
            t.state.add_ledger(t.state.new_generation(), space, kept)


class PowerLoss(_SpaceKind):
    """The machine loses power (its unsynced writes with it) and is booted again: a backend
    with a power switch only (``power_loss``: microVMs)."""

    action = "power_loss"

    def strike(self, op: Operation) -> None:
        if not isinstance(self.spaces, PowerSwitched):
            raise SpaceError(f"the {self.spaces.kind} backend has no power to cut; "
                             "power losses need --backend microvm")
        self.spaces.power_loss(self.target.space_now())


class KillProcess(_SpaceKind):
    action = "kill_process"

    def strike(self, op: Operation) -> None:
        if op.hit is None or op.hit.info.get("process") is None:
            raise ValueError(f"{op.fault.describe()}: kill_process needs a failpoint of the "
                             "Space (it kills the process that reported it)")
        # the pid as the Space sees it: only its provider can signal it
        self.spaces.kill_process(self.target.space_now(), op.hit.pid)


class _Held(_SpaceKind):
    """A fault that holds for a while (``Fault.hold``) and is then undone: ``begin`` until
    the latest deadline of the faults holding (overlapping ones each get their whole hold),
    then ``end`` by the one timer that is current; also ``release``d at once by
    ``teardown``, before the run's clean driver and checks. A ``begin`` that raised may have
    taken effect and an ``end`` that raised may not have: it counts as holding until an
    ``end`` succeeded (a failed timer's end is tried again each second; teardown's last try
    records its error). Shared by the threads that fire faults (its lock guards the
    deadline, the timer and the flag)."""

    #: Seconds between tries of an end that failed.
    RETRY_S = 1.0

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._holding = False
        self._deadline = 0.0
        self._timer: threading.Timer | None = None

    @abstractmethod
    def able(self) -> None:
        """Raise ``SpaceError`` (the fault is then skipped) when this run cannot have it."""

    @abstractmethod
    def begin(self, fault: Fault) -> None: ...

    @abstractmethod
    def end(self) -> None: ...

    def strike(self, op: Operation) -> None:
        assert op.fault.hold is not None  # a held fault has one (Fault checks)
        self.able()
        with self._lock:
            self._holding = True  # before the call: one that raises may have taken effect
            self._deadline = max(self._deadline, time.monotonic() + op.fault.hold)
            self._schedule(self._deadline - time.monotonic())
            self.begin(op.fault)

    def _schedule(self, delay: float) -> None:
        """(Under the lock.) The one timer, due in ``delay`` seconds; any earlier one is
        cancelled, and one already firing finds it is no longer current."""
        if self._timer is not None:
            self._timer.cancel()
        timer = threading.Timer(max(0.0, delay), self._expire)
        timer.daemon = True
        self._timer = timer
        timer.start()

    def _expire(self) -> None:
        with self._lock:
            if threading.current_thread() is not self._timer:
                return  # rescheduled meanwhile: the current timer ends it
            self._timer = None
            if time.monotonic() < self._deadline:
                self._schedule(self._deadline - time.monotonic())
                return
            try:
                self._end()
            except Exception:  # noqa: BLE001 - still holding: tried again, and at teardown
                self._schedule(self.RETRY_S)

    def release(self) -> None:
        """End the fault now if it may hold. Raises what the end raised."""
        with self._lock:
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None
            self._end()

    def _end(self) -> None:
        """(Under the lock.) End a fault that may hold; a Space gone meanwhile has nothing
        to end."""
        if not self._holding:
            return
        try:
            self.end()
        except SpaceNotFound:
            pass
        self._holding = False
        self._deadline = 0.0
        # Its end in the history (Jepsen's stop of a nemesis interval), for the timeline
        # and a failure's story.
        self.target.state.op("nemesis", "info", RELEASE, {"action": self.action})

    def teardown(self) -> None:
        try:
            self.release()
        except Exception as exc:  # noqa: BLE001 - never lost: the run becomes unknown
            self.target.state.fault_error(f"ending {self.action}", exc)


class _SpaceHeld(_Held):
    """A held fault on one Space, through a protocol its provider implements (``needs``):
    the Space it struck (a fork's, once one exists) is the one its end undoes."""

    needs: ClassVar[type]
    #: What a backend without ``needs`` cannot do, and what it takes.
    lacks: ClassVar[str]

    def __init__(self) -> None:
        super().__init__()
        self._struck = ""

    def able(self) -> None:
        if not isinstance(self.spaces, self.needs):
            raise SpaceError(f"the {self.spaces.kind} backend {self.lacks}")

    def begin(self, fault: Fault) -> None:
        self._struck = self.target.space_now()
        self.hold_on(self._struck, fault)

    def end(self) -> None:
        self.release_on(self._struck)

    @abstractmethod
    def hold_on(self, space: str, fault: Fault) -> None: ...

    @abstractmethod
    def release_on(self, space: str) -> None: ...


class PauseSpace(_SpaceHeld):
    """The Space frozen where it stands (``Pausable.pause``), thawed at the end of its
    hold; any other Space fault thaws it first (a killed, restarted or lost machine is not
    frozen any more)."""

    action = "pause_space"
    needs = Pausable
    lacks = "cannot freeze a Space; pauses need local, docker or microvm"

    def hold_on(self, space: str, fault: Fault) -> None:
        cast(Pausable, self.spaces).pause(space)

    def release_on(self, space: str) -> None:
        cast(Pausable, self.spaces).resume(space)


class PauseDaemon(_SpaceHeld):
    """The Space's daemon alone frozen (``DaemonPausable.pause_daemon``) while its commands
    run on and end, thawed at the end of its hold; a fault that ends processes thaws it
    first, as it does a frozen Space."""

    action = "pause_daemon"
    needs = DaemonPausable
    lacks = "cannot freeze a daemon alone"

    def hold_on(self, space: str, fault: Fault) -> None:
        cast(DaemonPausable, self.spaces).pause_daemon(space)

    def release_on(self, space: str) -> None:
        cast(DaemonPausable, self.spaces).resume_daemon(space)


class PauseCommands(_SpaceHeld):
    """Every process of the Space's commands frozen (``CommandPausable.pause_commands``)
    while its daemon answers (a wait sees them running), thawed at the end of its hold; a
    fault that ends processes thaws them first, as it does a frozen Space. The history
    says which commands were held alive and from when to when (``FROZEN``, ``THAWING``):
    no driver may be told one of them was lost meanwhile (G5)."""

    action = "pause_commands"
    needs = CommandPausable
    lacks = "cannot freeze a Space's commands alone"

    def hold_on(self, space: str, fault: Fault) -> None:
        keys = cast(CommandPausable, self.spaces).pause_commands(space)
        self.target.state.op("nemesis", "info", FROZEN,
                             {"keys": keys, "ms": now_ms()})

    def release_on(self, space: str) -> None:
        self.target.state.op("nemesis", "info", THAWING, {"ms": now_ms()})
        cast(CommandPausable, self.spaces).resume_commands(space)


class JumpClock(_SpaceHeld):
    """The Space's clock stepped by the fault's ``jump`` (``Clocked.set_clock``), and set
    to the host's again at the end of its hold, as NTP would step it back. An overlapping
    jump steps it again, from the host's time. Nothing that decides recovery, or a check,
    may depend on a Space's clock agreeing with the driver's."""

    action = "jump_clock"
    needs = Clocked
    lacks = "shares the host's clock; clock jumps need --backend microvm"

    def hold_on(self, space: str, fault: Fault) -> None:
        assert fault.jump is not None  # a jump_clock fault has one (Fault checks)
        cast(Clocked, self.spaces).set_clock(space, offset=fault.jump)

    def release_on(self, space: str) -> None:
        cast(Clocked, self.spaces).set_clock(space)


class _FillDisk(_SpaceHeld):
    """Every free block of a disk of the Space's own taken (``DiskFillable.fill_disk``),
    freed at the end of its hold."""

    needs = DiskFillable
    #: Which of the Space's disks (``HeldKind.disk``).
    disk: ClassVar[DiskName]

    #: The most a fill leaves free (pages of 4 KiB): what the next writes take before one
    #: of them is cut short.
    LEAVE_PAGES = 4

    @classmethod
    def leave(cls, fault: Fault) -> int:
        """The room a fill leaves: the fault's own (from its description: the same plan
        leaves the same room), so the write the disk cuts short falls at a seeded place."""
        return zlib.crc32(fault.describe().encode()) % (cls.LEAVE_PAGES + 1) * 4096

    def hold_on(self, space: str, fault: Fault) -> None:
        cast(DiskFillable, self.spaces).fill_disk(space, self.disk, leave=self.leave(fault))

    def release_on(self, space: str) -> None:
        cast(DiskFillable, self.spaces).free_disk(space, self.disk)


class FillStateDisk(_FillDisk):
    """The disk that holds the Space's daemon state full: the daemon runs on, its ledger,
    journals, command output and checkpoints meet ``ENOSPC``; the workspace has room."""

    action = "fill_state_disk"
    disk = "state"
    lacks = "keeps a Space's daemon state on the Space's one disk; state disk fills need " \
            "--backend local"


class FillWorkDisk(_FillDisk):
    """The disk that holds the Space's workspace full, as a mounted volume fills: writes,
    edits, commands and restores meet ``ENOSPC``; the daemon's state has room, but on a
    microVM, whose one disk holds both."""

    action = "fill_work_disk"
    disk = "work"
    lacks = "cannot fill a Space's workspace disk; workspace disk fills need --backend " \
            "local, docker or microvm"


class FillLogDisk(_Held):
    """The disk of the drivers' log (the run's state directory, a tmpfs of its own) full,
    freed at the end of its hold: a commit meets ``ENOSPC`` (SQLite's ``SQLITE_FULL``, a
    JSONL append cut short) and must fail whole, never half-record a call."""

    action = "fill_log_disk"

    def able(self) -> None:
        if self.target.log_disk is None:
            raise SpaceError("this run's log is on the host's disk: no disk of its own to "
                             "fill (the runner gives it one only when the plan fills it)")

    def begin(self, fault: Fault) -> None:
        assert self.target.log_disk is not None
        own_disks.fill(self.target.log_disk, leave=_FillDisk.leave(fault))

    def end(self) -> None:
        assert self.target.log_disk is not None
        own_disks.free(self.target.log_disk, DISK_BYTES)


class CutHostPower(_Kind):
    """The drivers' host loses power (``chaos.faults.host_power``): every driver on it dies at
    once, and its log keeps only what reached its disk; the host then boots again. Struck
    at a driver's failpoint, where no commit is in flight, so every commit that had
    returned must still be there (G7)."""

    action = "cut_host_power"

    def invoke(self, op: Operation) -> Completion:
        disk = self.target.host_disk
        if disk is None:
            return Completion("fail", self.action, f"skipped {op.fault.describe()}: this "
                              "run's log is on the host's own disk (the runner gives it one "
                              "that can lose power only when the plan cuts it)")
        if op.hit is None or op.hit.info.get("process") is not None:
            return Completion("fail", self.action, f"skipped {op.fault.describe()}: a host "
                              "power cut lands at a driver's failpoint, where no commit is "
                              "in flight")
        host = disk.processes
        if host is not None:  # the host runs more than the runner's drivers: all go down
            why = disk.cut(op.fault.describe(), host.power_off, host.power_on,
                           unfit=host.unfit)
        elif not isinstance(op.driver, Owned):
            why = "no driver of the runner's was running"
        else:
            driver = op.driver

            def drivers_dead() -> None:
                driver.kill_group()
                wait_dead([driver], "the driver")

            why = disk.cut(op.fault.describe(), drivers_dead, unfit=lambda: (
                None if driver.poll() is None else "no driver of the runner's was running"))
        if why is not None:
            return Completion("fail", self.action, f"skipped {op.fault.describe()}: {why}")
        return Completion("info", self.action, op.fault.describe())


class _OnLink(_Held):
    """A held fault on the link between the drivers and the Space: the runner's proxy of
    it (``chaos.faults.link_proxy``), which it has when the plan has such a kind
    (``HeldKind.link``)."""

    #: What it does to the link, for the refusal when the run has none.
    verb: ClassVar[str]

    @property
    def link(self) -> LinkProxy:
        if self.target.link is None:
            raise SpaceError(f"this run's drivers reach the Space directly: no link to "
                             f"{self.verb} (the runner proxies the link only when the plan "
                             f"has a fault on it)")
        return self.target.link

    def able(self) -> None:
        _ = self.link  # its refusal is the check


class SlowLink(_OnLink):
    """What crosses the link between the drivers and the Space delayed by the fault's own
    delay, until the end of its hold; what was sent before the end still waits out its
    delay (a real network's queue). A request its client gave up on reaches the daemon
    late and is carried out there, maybe after the client's next ones, after its driver's
    recovery even: the ledger's keys and the epoch fence (its rounds) must make that
    harmless, and the log must record only what the client was answered."""

    action = "slow_link"
    verb = "slow"
    #: The delays a slowdown is drawn from (seconds): most past ``HOLD_REQUEST_TIMEOUT_S``.
    #: (A plan's ``slow`` sets a longer one: ``plans.QUEUED_S``.)
    DELAYS = (0.5, 1.0, 2.5, 3.0, 4.0)

    @classmethod
    def delay(cls, fault: Fault) -> float:
        """The fault's own delay: its ``slow``, else drawn from its description (the same
        plan, the same delay)."""
        if fault.slow is not None:
            return fault.slow
        return cls.DELAYS[zlib.crc32(fault.describe().encode()) % len(cls.DELAYS)]

    def begin(self, fault: Fault) -> None:
        self.link.slow(self.delay(fault))

    def end(self) -> None:
        self.link.slow(0)


class CutLink(_OnLink):
    """The link between the drivers and the Space cut, healed at the end of its hold: the
    daemon runs on and carries out what reached it, its answers are lost."""

    action = "cut_link"
    verb = "cut"

    def begin(self, fault: Fault) -> None:
        self.link.cut()

    def end(self) -> None:
        self.link.heal()


KINDS: tuple[type[_Kind], ...] = (KillDriver, KillDaemon, RestartSpace, LoseSpace, KillProcess,
                                  PowerLoss, PauseDriver, PauseSpace, CutLink, JumpClock,
                                  PauseDaemon, FillStateDisk, PauseCommands, FillWorkDisk,
                                  FillLogDisk, CutHostPower, SlowLink)


class FaultNemesis:
    """Every kind of fault, by action."""

    #: The held kinds that freeze processes, which a fault that ends processes thaws first.
    FREEZES = ("pause_space", "pause_daemon", "pause_commands")

    def __init__(self) -> None:
        self.kinds = {kind.action: kind() for kind in KINDS}
        self._freezes = [k for a, k in self.kinds.items() if a in self.FREEZES]

    def setup(self, target: Target) -> None:
        for kind in self.kinds.values():
            kind.setup(target)

    def invoke(self, op: Operation) -> Completion:
        # A fault that ends processes (a kill, a restart, a loss) thaws a paused Space or
        # daemon first; a held fault leaves it frozen.
        if isinstance(self.kinds[op.action], _SpaceKind) and op.action not in HELD_KINDS:
            for freeze in self._freezes:
                assert isinstance(freeze, _Held)
                with contextlib.suppress(SpaceError):  # a kill gets through a freeze;
                    freeze.release()                   # teardown tries the thaw again
        return self.kinds[op.action].invoke(op)

    def teardown(self) -> None:
        for kind in self.kinds.values():
            kind.teardown()
