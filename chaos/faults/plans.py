"""Fault plans (the nemesis's schedule), drawn from a run's seed.

A plan is plain data: a list of faults, each with a trigger and an action.

Triggers:
- ``failpoint``: the ``occurrence``-th time any process of the run reaches ``point``
  (counted across attempts, so a plan can aim at recovery in a later driver). Points are
  the drivers' (``durable.failpoints.POINTS``) and the Space's own, inside spacesd and its
  command shims (``spacesd.failpoints.POINTS``), so a fault can land inside the daemon's
  critical sections (between the ledger record and the spawn, while an exit is written,
  mid-checkpoint, mid-restore, mid-advance);
- ``time``: ``delay`` seconds after the ``attempt``-th driver was launched, wherever it is.

Actions: ``kill_driver`` (SIGKILL of the driver's process group), ``kill_daemon`` (only the
Space's daemon; its commands survive), ``restart_space`` (daemon and every process gone,
disk kept), ``delete_space`` (the Space is lost), ``kill_process`` (SIGKILL of the one
process that reported the failpoint: a command's shim), ``power_loss`` (a microVM only: the
machine loses power, with its unsynced writes, and is booted again), ``pause_driver`` (SIGSTOP
of the driver's process group: it is frozen, its heartbeat silent, until its coordinator
replaces it; redrive only), ``pause_space`` (the whole Space frozen where it stands for
``hold`` seconds, often longer than the driver's request timeout, then thawed: SIGSTOP and
SIGCONT of every process of a local Space, ``docker pause``, QMP ``stop``; campaigns with
``--pause-spaces``), ``cut_link`` (the link between the drivers and the Space cut for
``hold`` seconds, then healed: a partition in ``chaos.faults.link_proxy``; campaigns with
``--cut-links``), ``jump_clock`` (the Space's clock stepped by ``jump`` seconds for
``hold`` seconds, then set to the host's again: a microVM's own clock; campaigns with
``--jump-clocks``), ``fill_state_disk`` (every free block of the disk that holds the
Space's daemon state taken for ``hold`` seconds, then freed: a local Space's state on a
tmpfs of its own; campaigns with ``--fill-state-disks``), ``fill_work_disk`` (the same for
the disk that holds the Space's workspace, a tmpfs of its own as a mounted volume would be:
writes, edits, commands and restores meet ``ENOSPC``; ``--fill-work-disks``),
``fill_log_disk`` (the same for the disk of the drivers' log, the run's state directory on
a tmpfs of its own as the host's disk: a commit meets ``ENOSPC``; ``--fill-log-disks``),
``cut_host_power`` (the drivers' host loses power at a driver's failpoint: every driver
killed, the log, on an ext4 image of its own, keeps what reached that disk; no hold;
``--cut-host-power``), ``slow_link`` (every burst of bytes crossing the link between the
drivers and the Space delayed for ``hold`` seconds: requests their clients gave up on
arrive late; ``--slow-links``),
``pause_commands`` (every process
of the daemon's commands frozen for ``hold`` seconds while the daemon answers, then thawed;
campaigns with ``--pause-commands``). A Space fault may also kill the
driver (``kill_driver=True``) or let it run into the fault itself.

Combined faults: a plan's later faults often aim at the recovery of an earlier one (a Space
fault during the next driver's recovery, or a kill in the middle of a restore).

Drawing is pure: ``random.Random`` seeded from (seed, mode), so a plan is reproduced from
its seed alone, and ``exhaustive_plans`` enumerates plans without any randomness.
"""

from __future__ import annotations

import bisect
import random
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Literal, get_args

from durable.failpoints import POINTS as DRIVER_POINTS
from durable.record_codec import OMIT_NONE, JsonRecord
from scenarios.plan import Scenario
from spacesd.failpoints import POINTS as SPACE_POINTS

if TYPE_CHECKING:
    from backends.descriptor import BackendDescriptor, DiskName

#: The faults that hold for a while (``HELD_KINDS`` describes each).
HeldAction = Literal["pause_space", "cut_link", "jump_clock", "pause_daemon", "fill_state_disk",
                     "pause_commands", "fill_work_disk", "fill_log_disk", "cut_host_power",
                     "slow_link"]
Action = Literal["kill_driver", "kill_daemon", "restart_space", "delete_space", "kill_process",
                 "power_loss", "pause_driver", HeldAction]


@dataclass(frozen=True)
class HeldKind:
    """A fault drawn beside a plan's own faults (``with_held_faults``) when its campaign
    flag is on; most hold for a while (``Fault.hold``) and are then undone, one strikes
    once (``holds=False``: a host's power cut). The one place such a kind is named: the
    flag, the campaign's and a run's field, the counter and the SUMMARY key all come from
    here."""

    action: HeldAction
    #: ``chaos run``'s flag; without its dashes, the field of the campaign's settings and of
    #: its JSON files (``pause_spaces``).
    flag: str
    #: Its count, in a run's counters and the SUMMARY line (printed with the flag on).
    key: str
    #: What its drawing is seeded by, apart from the plan's own faults.
    seed: str
    #: The ability of a backend it needs (``backends.descriptor``; None: any backend with
    #: Spaces has it), and why.
    needs: Callable[[BackendDescriptor], bool] | None
    needs_why: str
    #: The faulted drivers' request timeout drops to ``HOLD_REQUEST_TIMEOUT_S``, so that the
    #: fault outlasts a request (a frozen Space, a cut link); not for a clock jump.
    outlasts_requests: bool
    #: ``chaos run --help``'s text.
    help: str
    #: Only root can set it up (a mount).
    root: bool = False
    #: Where it is drawn to begin, for a kind that needs something there (a command
    #: running): these points four times in five, else a seeded time. Empty: anywhere
    #: the driver uses the Space (``HOLD_POINTS``), a recovery's point, or a seeded time.
    points: tuple[str, ...] = ()
    #: The directory of the Space it needs on a disk of its own (the run's provider then
    #: gives every Space one of ``DISK_BYTES``).
    disk: DiskName | None = None
    #: It needs the drivers' log (the run's state directory) on a disk of its own (the
    #: runner then mounts one of ``DISK_BYTES`` there): ``"tmpfs"`` to fill, ``"image"``
    #: (``chaos.faults.host_power``) to lose power under.
    log_disk: Literal["tmpfs", "image"] | None = None
    #: What it leaves inside a microVM's own state while it holds (a frozen process, a full
    #: disk: "freezes the daemon inside a microVM"), which a whole-machine checkpoint taken
    #: meanwhile keeps and a restore brings back after its end, with nothing left to undo
    #: it; empty: nothing (a frozen machine, a cut link and a stepped clock are the host's
    #: to undo, or are set again at a restore).
    in_machine: str = ""
    #: It holds for a while, then is undone (else it strikes once, and only at a driver's
    #: failpoint, where no commit is in flight: what it did is then exact).
    holds: bool = True
    #: The campaign modes it is for (empty: every mode with held kinds).
    modes: tuple[str, ...] = ()
    #: It acts on the link between the faulted drivers and the Space: the runner routes
    #: that link through a proxy of its own (``chaos.faults.link_proxy``) in a run whose
    #: plan has it.
    link: bool = False
    #: In stale mode, the kinds (``chaos.modes.stale_kinds``) it is for (empty: every one), and why.
    stale_kinds: tuple[str, ...] = ()
    stale_why: str = ""

    @property
    def field(self) -> str:
        return self.flag.removeprefix("--").replace("-", "_")

    def stale_refusal(self, stale_kind: str) -> str | None:
        """Why this kind cannot strike a stale run of ``stale_kind`` (None: it can)."""
        if not self.stale_kinds or stale_kind in self.stale_kinds:
            return None
        return (f"{self.flag} is for --stale-kind {' or '.join(self.stale_kinds)}, not "
                f"{stale_kind}: {self.stale_why}")


HELD_KINDS: dict[str, HeldKind] = {k.action: k for k in (
    HeldKind("pause_space", "--pause-spaces", "space_pauses", "pauses", None, "", True,
             "also freeze each run's Space once or twice (SIGSTOP of its processes, docker "
             "pause, QMP stop) at seeded points for seeded times, most past the faulted "
             "drivers' request timeout, which drops to 2 s (transactional, checkpoint, "
             "auto, stale and redrive modes)"),
    HeldKind("cut_link", "--cut-links", "link_cuts", "cuts", None, "", True,
             "also cut the link between each run's drivers and its Space once or twice (a "
             "partition: nothing crosses, what reached the daemon is carried out, its answers "
             "are lost) at seeded points for seeded times, then heal it; the faulted drivers' "
             "request timeout drops to 2 s (transactional, checkpoint, auto, stale and redrive "
             "modes)", link=True),
    HeldKind("jump_clock", "--jump-clocks", "clock_jumps", "jumps", lambda b: b.machines,
             "a microVM keeps a clock of its own; local and docker Spaces share the host's, "
             "which a campaign must not step", False,
             "also step each run's Space clock once or twice (seconds to a year, back or "
             "forward) at seeded points, and back to the host's after a seeded time, as NTP "
             "would (a microVM's own clock: --backend microvm; transactional, checkpoint, "
             "auto, stale and redrive modes)"),
    HeldKind("pause_daemon", "--pause-daemons", "daemon_pauses", "daemon_pauses", None, "",
             True,
             "also freeze each run's daemon alone once or twice (SIGSTOP of spacesd; its "
             "commands run on and end while it is frozen) at seeded points for seeded times, "
             "most past the faulted drivers' request timeout, which drops to 2 s "
             "(transactional, checkpoint, auto, stale and redrive modes; a microVM's "
             "checkpoints then workspace ones: --snapshots workspace)",
             in_machine="freezes the daemon inside a microVM"),
    HeldKind("fill_state_disk", "--fill-state-disks", "state_disk_fills", "state_fills",
             lambda b: "state" in b.own_disks, "a local Space's daemon state gets a disk of "
             "its own (a tmpfs, mounted as root); docker and microvm Spaces keep it on their "
             "one disk", False,
             "also fill each run's Space's state disk (the daemon's ledger, journals, command "
             "output and checkpoints, on a tmpfs of its own) once or twice at seeded points "
             "for seeded times, then free it (--backend local, as root; transactional, "
             "checkpoint, auto, stale and redrive modes)", root=True, disk="state"),
    HeldKind("pause_commands", "--pause-commands", "command_pauses", "command_pauses", None, "",
             False,
             "also freeze each run's running commands once or twice (SIGSTOP of every process "
             "of the daemon's commands, not the daemon: it answers on, their waits see them "
             "running) at seeded points for seeded times, then thaw them (transactional, "
             "checkpoint, auto, stale and redrive modes; a microVM's checkpoints then "
             "workspace ones: --snapshots workspace)",
             points=("spacesd.exec.spawned", "space.running", "spacesd.exec.exit_writing"),
             in_machine="freezes the commands inside a microVM"),
    HeldKind("fill_work_disk", "--fill-work-disks", "work_disk_fills", "work_fills",
             lambda b: "work" in b.own_disks, "a local or docker Space's workspace gets a disk "
             "of its own (a tmpfs on the host, mounted as root), as a volume would; a microVM's "
             "is the machine's one disk, filled by its guest agent", False,
             "also fill each run's Space's workspace disk (a tmpfs of its own, as a mounted "
             "volume; a microVM's one disk, its daemon's state with it) once or twice at "
             "seeded points for seeded times, then free it: writes, edits, commands and "
             "restores meet ENOSPC (as root; transactional, checkpoint, auto, stale and "
             "redrive modes; a microVM's checkpoints then workspace ones: --snapshots "
             "workspace)", root=True, disk="work", in_machine="fills a microVM's one disk"),
    HeldKind("fill_log_disk", "--fill-log-disks", "log_disk_fills", "log_fills", None, "",
             False,
             "also fill the disk of each run's log (the drivers' SQLite or JSONL log, on a "
             "tmpfs of its own as the host's disk) once or twice at seeded points for seeded "
             "times, then free it: a commit meets ENOSPC and must fail whole, the call with "
             "it (every backend, as root; transactional, checkpoint, auto, stale and redrive "
             "modes)", root=True, log_disk="tmpfs"),
    HeldKind("cut_host_power", "--cut-host-power", "host_power_cuts", "host_cuts", None, "",
             False,
             "also cut the power of each run's drivers' host once or twice at seeded driver "
             "failpoints (every driver killed, the log, SQLite or JSONL on an ext4 disk of "
             "its own, keeps only what reached that disk), then boot it again: every commit "
             "that had returned must still be in the log (check G7; every backend, as root; "
             "transactional, checkpoint, auto, stale and redrive modes: a stale run's parked "
             "older driver dies with the host, a redrive run's coordinators boot with it)",
             root=True,
             points=("call.intent", "call.returned", "call.result", "space.start_mark",
                     "space.running", "space.exited", "space.file_written", "space.outcome",
                     "checkpoint.after"),
             log_disk="image", holds=False,
             modes=("transactional", "checkpoint", "auto", "stale", "redrive"),
             stale_kinds=("race", "detached"),
             stale_why="it strikes only where no commit is in flight (every driver at a "
                       "failpoint); the paused kind stops a driver anywhere, inside a commit "
                       "too, and the foreign kind's drivers meet no planned fault"),
    HeldKind("slow_link", "--slow-links", "link_slowdowns", "slowdowns", None, "", True,
             "also slow the link between each run's drivers and its Space once or twice at "
             "seeded points for seeded times: every request and answer crossing it arrives "
             "a seeded 0.5 to 4 s late, most past the faulted drivers' request timeout, "
             "which drops to 2 s, so a request its client gave up on still reaches the "
             "daemon, maybe after the client's next one (transactional, checkpoint, auto, "
             "stale and redrive modes)", link=True),
)}
if set(HELD_KINDS) != set(get_args(HeldAction)):
    raise ImportError(f"chaos.faults.plans: HeldAction {get_args(HeldAction)} and HELD_KINDS "
                      f"{tuple(HELD_KINDS)} must name the same held kinds")
#: Every action and the run's count its fault adds one to when it strikes: the one place a
#: kind's count is named (the nemesis counts by it, records keep it, progress and the
#: SUMMARY sum it; a kind with a key of its own is printed when it struck).
KIND_COUNTS: dict[str, str] = {
    "kill_driver": "kills", "kill_daemon": "daemon_kills", "restart_space": "space_restarts",
    "delete_space": "lost_spaces", "kill_process": "process_kills", "power_loss": "power_losses",
    "pause_driver": "pauses", **{a: k.key for a, k in HELD_KINDS.items()}}
if set(KIND_COUNTS) != set(get_args(Action)):
    raise ImportError(f"chaos.faults.plans: Action {get_args(Action)} and KIND_COUNTS "
                      f"{tuple(KIND_COUNTS)} must name the same kinds")
#: The history's operation that ends a held fault (its value names the action).
RELEASE = "release"
#: The history's operations that bound a command pause: its commands frozen (the keys whose
#: shims were, and when all were), and the first moment of their thaw.
FROZEN, THAWING = "commands_frozen", "commands_thawing"


def in_effect_at(history: list[dict[str, Any]], t: float) -> tuple[set[str], bool]:
    """From a run's history (``t``: seconds since its start): the held kinds holding at
    ``t`` (struck before it, not yet released), and whether any fault struck after it."""
    holding: set[str] = set()
    for op in history:
        if op["process"] != "nemesis" or op["type"] != "info":
            continue
        if op["time"] > t:
            if op["f"] in KIND_COUNTS:
                return holding, True
        elif op["f"] in HELD_KINDS and HELD_KINDS[op["f"]].holds:
            holding.add(op["f"])
        elif op["f"] == RELEASE:
            holding.discard(op["value"]["action"])
    return holding, False


def command_freezes(history: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each command pause of a run's ``history``: ``{"keys", "from_ms", "to_ms"}``, the keys
    whose commands were alive and frozen all that while (a pause whose thaw the history
    lacks is left out: how long it held is not known)."""
    freezes: list[dict[str, Any]] = []
    frozen: dict[str, Any] | None = None
    for op in history:
        if op["f"] == FROZEN:
            frozen = op["value"]
        elif op["f"] == THAWING and frozen is not None:
            freezes.append({"keys": frozen["keys"], "from_ms": frozen["ms"],
                            "to_ms": op["value"]["ms"]})
            frozen = None
    return freezes


#: The size of a disk of its own a run's Spaces get for a held kind that fills it.
DISK_BYTES = 32 * 1024 * 1024


def held_of(raw: dict[str, Any]) -> tuple[HeldAction, ...]:
    """The held kinds a campaign's settings (``campaign.json``, a ``shrunk.json``, a
    summary) turn on, by their fields (``pause_spaces: true``)."""
    return tuple(k.action for k in HELD_KINDS.values() if raw.get(k.field))


def held_flags(held: tuple[str, ...]) -> dict[str, bool]:
    """Each held kind's field, on or off: how the settings' JSON holds ``held``."""
    return {k.field: a in held for a, k in HELD_KINDS.items()}


SPACE_ACTIONS: tuple[Action, ...] = ("kill_daemon", "restart_space", "delete_space")
#: Every failpoint a plan may name: the drivers' and the Space's.
ALL_POINTS: dict[str, str] = {**DRIVER_POINTS, **SPACE_POINTS}
#: Points reported by a command's shim (not a daemon, not a driver).
SHIM_POINTS = ("spacesd.exec.exit_writing",)
#: Points a stale race parks an older driver at, never a kill's (random and exhaustive plans
#: leave them out): nothing happens between the point before and a commit taking the log's
#: lock, so a kill there is a kill at the point before; a park there is a driver inside its
#: commit while a newer one opens the log.
PARK_ONLY_POINTS = ("log.commit",)
#: The longest a held fault (``HELD_KINDS``) may hold.
MAX_HOLD_S = 600.0
#: How long a drawn ``slow_link`` that queues a request past its driver's recovery delays
#: each burst (seconds): past the two 2 s sends and the health checks after them.
QUEUED_S = 8.0
#: The farthest a ``jump_clock`` steps a clock, either way (seconds: ten years).
MAX_JUMP_S = 10 * 365 * 86400.0
#: How far a drawn ``jump_clock`` steps the clock: a leap second's worth, an hour (a time
#: zone or daylight-saving mistake), a day, a year; back or forward.
JUMPS = (1.0, 3600.0, 86400.0, 365 * 86400.0)
#: Points reached only while an earlier fault is being recovered from.
RECOVERY_POINTS = ("recovery.begin", "recovery.decided", "recovery.reimage", "recovery.restore",
                   "spacesd.restore.partial")
#: The recovery points each adapter mode reaches (a revert reimages, a restore restores).
MODE_RECOVERY_POINTS = {
    "transactional": ("recovery.begin", "recovery.decided", "recovery.reimage"),
    "checkpoint": ("recovery.begin", "recovery.decided", "recovery.restore",
                   "spacesd.restore.partial"),
    "auto": RECOVERY_POINTS,
}


@dataclass(frozen=True)
class Fault(JsonRecord):
    action: Action
    trigger: Literal["failpoint", "time"]
    point: str | None = None
    occurrence: int | None = None
    attempt: int | None = None
    delay: float | None = None
    #: For a Space fault: also SIGKILL the driver (else it meets the fault itself).
    kill_driver: bool = True
    #: At a failpoint that names a running command (``space.running``): fire only once
    #: that command has printed something (an event in the Space, read through its daemon,
    #: so that a fault meant for a command's later moment waits for it however slow the
    #: machine is, instead of guessing a delay).
    after_output: bool = False
    #: A held fault only (``HELD_KINDS``): how long it holds, in seconds (in a plan file
    #: only where there is one, as for ``jump``: older plans read the same).
    hold: float | None = field(default=None, metadata=OMIT_NONE)
    #: A ``jump_clock`` only: the seconds the Space's clock is stepped by (back if
    #: negative) for the hold.
    jump: float | None = field(default=None, metadata=OMIT_NONE)
    #: A ``slow_link`` only: the seconds each burst waits (drawn from the fault's
    #: description when None, ``SlowLink.DELAYS``), for a plan that needs a request
    #: delivered after its driver's recovery, however long that took.
    slow: float | None = field(default=None, metadata=OMIT_NONE)

    def __post_init__(self) -> None:
        """A plan read back (a results directory, a shrunk.json) is input: refuse what no
        nemesis can do."""
        if self.action not in get_args(Action):
            raise ValueError(f"unknown fault action {self.action!r}; known: "
                             f"{', '.join(get_args(Action))}")
        if self.trigger == "failpoint":
            if self.point not in ALL_POINTS:
                raise ValueError(f"unknown failpoint {self.point!r}")
            if isinstance(self.occurrence, bool) or not isinstance(self.occurrence, int) or \
                    self.occurrence < 1:
                raise ValueError(f"occurrence {self.occurrence!r} is not a positive count")
        elif self.trigger == "time":
            if isinstance(self.delay, bool) or not isinstance(self.delay, int | float) or \
                    not 0 <= self.delay < 86400:
                raise ValueError(f"delay {self.delay!r} is not seconds from 0 to a day")
        else:
            raise ValueError(f"trigger {self.trigger!r} is neither 'failpoint' nor 'time'")
        if self.action == "pause_driver" and self.kill_driver:
            raise ValueError("a pause_driver fault freezes the driver and must not also kill "
                             "it: give it kill_driver=False")
        holds = [a for a, k in HELD_KINDS.items() if k.holds]
        if (self.action in holds) != (self.hold is not None):
            raise ValueError(f"{self.action}: a {' or '.join(holds)} fault needs hold "
                             "(the seconds it holds), and only they have one")
        if self.hold is not None and (isinstance(self.hold, bool) or
                                      not isinstance(self.hold, int | float) or
                                      not 0 < self.hold <= MAX_HOLD_S):
            raise ValueError(f"hold {self.hold!r} is not seconds above 0, at most {MAX_HOLD_S}")
        if (self.action == "jump_clock") != (self.jump is not None):
            raise ValueError(f"{self.action}: a jump_clock fault needs jump (the seconds the "
                             "Space's clock is stepped by), and only it has one")
        if self.jump is not None and (isinstance(self.jump, bool) or
                                      not isinstance(self.jump, int | float) or
                                      not 0 < abs(self.jump) <= MAX_JUMP_S):
            raise ValueError(f"jump {self.jump!r} is not seconds, not 0, at most {MAX_JUMP_S} "
                             "either way")
        if self.slow is not None and (self.action != "slow_link" or
                                      isinstance(self.slow, bool) or
                                      not isinstance(self.slow, int | float) or
                                      not 0 < self.slow <= MAX_HOLD_S):
            raise ValueError(f"slow {self.slow!r}: only a slow_link fault has one, seconds "
                             f"above 0, at most {MAX_HOLD_S}")

    def describe(self) -> str:
        where = (f"{self.point}#{self.occurrence}" if self.trigger == "failpoint"
                 else f"attempt {self.attempt} +{self.delay:.2f}s")
        if self.after_output:
            where += " once its command printed"
        extra = " +kill driver" if self.action != "kill_driver" and self.kill_driver else ""
        held = f" for {self.hold:g}s" if self.hold is not None else ""
        if self.jump is not None:
            held = f" by {self.jump:+g}s{held}"
        if self.slow is not None:
            held = f" by {self.slow:g}s{held}"
        return f"{self.action}{held}{extra} at {where}"


@dataclass(frozen=True)
class FaultPlan(JsonRecord):
    seed: int
    faults: tuple[Fault, ...]
    backoff: float = 0.0
    max_attempts: int = 8


def reachable_points(scenario: Scenario, durable_mode: str) -> dict[str, int]:
    """Each failpoint a run of ``scenario`` reaches without faults, with how often (an
    estimate for drawing; ``exhaustive`` measures instead of estimating)."""
    steps = len(scenario.steps)
    space = [s for s in scenario.steps if s.touches_workspace()]
    bash = [s for s in space if s.tool == "bash"]
    files = [s for s in space if s.tool != "bash"]
    out = {"call.begin": steps, "call.intent": steps, "call.returned": steps,
           "call.result": steps, "space.start_mark": len(space),
           "space.before_spawn": len(bash), "space.running": len(bash),
           "space.exited": len(bash), "space.file_op": len(files),
           "space.file_written": len(files),
           "spacesd.exec.recorded": len(bash), "spacesd.exec.spawned": len(bash),
           "spacesd.exec.exit_writing": len(bash), "spacesd.advance.persisted": 1}
    if durable_mode != "transactional":
        for p in ("space.outcome", "checkpoint.before", "checkpoint.during",
                  "checkpoint.after", "spacesd.checkpoint.objects"):
            out[p] = len(space)
    return {p: n for p, n in out.items() if n > 0 and p in ALL_POINTS}


def park_points(scenario: Scenario, durable_mode: str) -> dict[str, int]:
    """``reachable_points`` and the points only a park aims at (``PARK_ONLY_POINTS``): where a
    stale race may hold an older driver. Every call commits at least its intent and its
    result, so a run reaches ``log.commit`` twice per step at least."""
    return {**reachable_points(scenario, durable_mode), "log.commit": 2 * len(scenario.steps)}


def _action_at(point: str, rng: random.Random, allow_delete: bool) -> Action:
    """A fault's action, given where it lands: the Space's own points mostly get Space
    faults (that is what they are for), a shim's point may kill just that shim."""
    space_point = point.startswith("spacesd.")
    roll = rng.random()
    if roll < (0.25 if space_point else 0.7):
        return "kill_driver"
    if point in SHIM_POINTS and roll < 0.6:
        return "kill_process"
    choices: list[Action] = ["kill_daemon", "restart_space", "restart_space"]
    if allow_delete:
        choices.append("delete_space")
    return rng.choice(choices)


def _budget(scenario: Scenario, long_seconds: float) -> float:
    """The seconds after a driver's launch a timed fault is drawn within: about as long as
    the scenario's calls take."""
    return max(1.0, len(scenario.steps) * 0.15 + long_seconds)


def draw_plan(seed: int, scenario: Scenario, durable_mode: str, *,
              allow_delete: bool = True, long_seconds: float = 1.0) -> FaultPlan:
    """The seeded fault plan of one run: one to six faults, most at failpoints, later ones
    often aimed at the recovery of earlier ones."""
    rng = random.Random(f"faults:{durable_mode}:{seed}")
    points = reachable_points(scenario, durable_mode)
    names = sorted(points)
    recovery = MODE_RECOVERY_POINTS.get(durable_mode, RECOVERY_POINTS)
    faults: list[Fault] = []
    for _ in range(rng.choice((1, 2, 3, 3, 4, 4, 5, 5, 6))):
        trigger = rng.random()
        if trigger < 0.55 or (not faults and trigger < 0.8):
            point = rng.choice(names)
            action = _action_at(point, rng, allow_delete)
            faults.append(Fault(action, "failpoint", point, rng.randint(1, points[point]),
                                kill_driver=action == "kill_driver" or rng.random() < 0.6))
        elif trigger < 0.8:
            # combined: a fault during the recovery of an earlier one
            point = rng.choice(recovery)
            action = _action_at(point, rng, allow_delete)
            faults.append(Fault(action, "failpoint", point, rng.choice((1, 1, 2)),
                                kill_driver=action == "kill_driver" or rng.random() < 0.5))
        else:
            action = rng.choice(("kill_driver", "kill_driver", *SPACE_ACTIONS))
            if action == "delete_space" and not allow_delete:
                action = "restart_space"
            faults.append(Fault(action, "time", attempt=rng.choice((1, 1, 2)),
                                delay=round(rng.uniform(0.05, _budget(scenario, long_seconds)),
                                            3),
                                kill_driver=action == "kill_driver" or rng.random() < 0.5))
    backoff = rng.choice((0.0, 0.0, 0.05))
    return FaultPlan(seed, tuple(faults), backoff, max_attempts=len(faults) + 4)


#: Where a fault aimed inside the daemon lands on a microVM, whose daemon reports no
#: failpoints to the host: the driver's point of the same moment.
GUEST_POINT = {"spacesd.exec.recorded": "space.before_spawn",
               "spacesd.exec.spawned": "space.running",
               "spacesd.exec.exit_writing": "space.exited",
               "spacesd.checkpoint.objects": "checkpoint.during",
               "spacesd.restore.partial": "recovery.restore",
               "spacesd.advance.persisted": "call.begin"}


def on_machine(plan: FaultPlan) -> FaultPlan:
    """``plan`` for a microVM Space (pure: from the plan's seed): faults at the daemon's
    points land at the driver's point of the same moment, a shim's kill becomes the
    daemon's (the host cannot see the guest's shims), and half the machine restarts become
    power losses. Space losses stay: every checkpoint a microVM Space can be rebuilt from
    (a workspace store's, a whole-machine one) lives outside it. A plan with no power loss
    gets one, at a seeded call point, so every run loses power at least once."""
    rng = random.Random(f"machine:{plan.seed}")
    faults: list[Fault] = []
    for f in plan.faults:
        action: Action = f.action
        if action == "kill_process":
            action = "kill_daemon"
        if action == "restart_space" and rng.random() < 0.5:
            action = "power_loss"
        point = GUEST_POINT.get(f.point or "", f.point)
        faults.append(replace(f, action=action, point=point))
    if not any(f.action == "power_loss" for f in faults):
        point = rng.choice(("space.running", "space.exited", "call.returned", "space.file_op"))
        faults.append(Fault("power_loss", "failpoint", point, 1,
                            kill_driver=rng.random() < 0.5))
    return replace(plan, faults=tuple(faults), max_attempts=len(faults) + 4)


#: The request timeout of a campaign's faulted drivers when it pauses Spaces or cuts links:
#: short, so that those outlast it.
HOLD_REQUEST_TIMEOUT_S = 2.0
#: How long a held fault holds (seconds), by band: answered late but in time (40%);
#: past one timeout, so an idempotent request is sent again and the second is answered
#: (20%: both are carried out); past both sends, so the request is left with no answer and
#: an unknown outcome (40%).
HOLDS = ((0.2, 1.5), (HOLD_REQUEST_TIMEOUT_S + 0.2, 2 * HOLD_REQUEST_TIMEOUT_S - 0.2),
               (2 * HOLD_REQUEST_TIMEOUT_S + 0.5, 2 * HOLD_REQUEST_TIMEOUT_S + 2.5))
HOLD_BANDS = (0.4, 0.6)
#: Where a held fault begins: wherever the driver is about to need the Space, or is using
#: it (with another fault in the plan, during a recovery too).
HOLD_POINTS = ("call.intent", "space.start_mark", "space.before_spawn", "space.running",
                "space.exited", "space.file_op", "space.file_written", "space.outcome",
                "checkpoint.before", "checkpoint.during", "spacesd.exec.recorded",
                "spacesd.exec.spawned", "spacesd.exec.exit_writing",
                "spacesd.checkpoint.objects", "spacesd.advance.persisted")


def with_held_faults(plan: FaultPlan, action: HeldAction, scenario: Scenario,
                     durable_mode: str, *, guest: bool = False,
                     long_seconds: float = 1.0, timed: bool = True) -> FaultPlan:
    """``plan`` with one or two faults more of a held ``action`` (``HELD_KINDS``; pure:
    from the plan's seed, and drawn apart from it, so the plan's own faults are
    unchanged). Each holds for a time of ``HOLDS``, from a point of ``HOLD_POINTS`` (or
    the kind's own ``points``), a recovery's point, or a seeded time. ``guest``: a
    microVM, whose daemon's points land at the driver's (``GUEST_POINT``). Not
    ``timed``: at points alone (a coordinator launches redrive's drivers, so no timer
    starts with them); where a time was drawn, a point is. A kind that strikes once
    (``HeldKind.holds`` off) has no hold, and lands at its points alone."""
    kind = HELD_KINDS[action]
    timed = timed and kind.holds
    rng = random.Random(f"{kind.seed}:{durable_mode}:{plan.seed}")
    points = reachable_points(scenario, durable_mode)
    names = [p for p in kind.points or HOLD_POINTS if p in points]
    if not kind.holds and not names:
        return plan  # it lands at its points alone, and none is reached
    recovery = MODE_RECOVERY_POINTS.get(durable_mode, RECOVERY_POINTS) \
        if plan.faults and not kind.points else ()
    held: list[Fault] = []
    for _ in range(rng.choice((1, 1, 1, 2))):
        hold: float | None = round(rng.uniform(*HOLDS[bisect.bisect(HOLD_BANDS,
                                                                     rng.random())]), 3)
        if not kind.holds:
            hold = None
        kill = rng.random() < 0.2 and kind.holds  # a cut kills every driver itself
        roll = rng.random()
        jump = rng.choice((-1, 1)) * rng.choice(JUMPS) if action == "jump_clock" else None
        # A fifth of the slowdowns queue past the two sends and the recovery after them
        # (written into the plan: a drawn one is the fault's own, from its description).
        slow = QUEUED_S if action == "slow_link" and rng.random() < 0.2 else None
        if (roll < (0.8 if kind.points else 0.6) or not timed) and names:
            point = rng.choice(names)
            fault = Fault(action, "failpoint", point, rng.randint(1, points[point]),
                          kill_driver=kill, hold=hold, jump=jump, slow=slow)
        elif roll < 0.8 and recovery:
            fault = Fault(action, "failpoint", rng.choice(recovery), 1, kill_driver=kill,
                          hold=hold, jump=jump, slow=slow)
        else:
            fault = Fault(action, "time", attempt=rng.choice((1, 1, 2)),
                          delay=round(rng.uniform(0.05, _budget(scenario, long_seconds)), 3),
                          kill_driver=kill, hold=hold, jump=jump, slow=slow)
        if guest:
            fault = replace(fault, point=GUEST_POINT.get(fault.point or "", fault.point))
        held.append(fault)
    return replace(plan, faults=plan.faults + tuple(held),
                   max_attempts=plan.max_attempts + len(held))


#: Where a fault aimed at a Space (which a virtual workspace has none of) lands: the
#: driver's point of the same moment in a virtual workspace's call.
VIRTUAL_POINT = {"space.start_mark": "call.intent",
                 "space.before_spawn": "virtual.ran", "space.running": "virtual.ran",
                 "space.exited": "virtual.ran", "space.file_op": "virtual.ran",
                 "space.file_written": "virtual.ran",
                 "spacesd.exec.recorded": "virtual.ran", "spacesd.exec.spawned": "virtual.ran",
                 "spacesd.exec.exit_writing": "virtual.ran",
                 "space.outcome": "call.returned", "checkpoint.before": "call.returned",
                 "checkpoint.during": "call.returned", "checkpoint.after": "call.returned",
                 "spacesd.checkpoint.objects": "virtual.blobs_written",
                 "spacesd.advance.persisted": "call.begin",
                 **{p: "call.returned" for p in RECOVERY_POINTS}}


def on_virtual(plan: FaultPlan) -> FaultPlan:
    """``plan`` for a virtual workspace (pure, and a no-op on a plan already made for one):
    every fault kills the driver (there is no Space to fault), at the point of the same
    moment (``VIRTUAL_POINT``)."""
    faults = tuple(replace(f, action="kill_driver", kill_driver=True, hold=None, jump=None,
                           point=VIRTUAL_POINT.get(f.point or "", f.point))
                   for f in plan.faults)
    return replace(plan, faults=faults)


#: What follows the first kill of an exhaustive plan: one kind of fault during the next
#: driver's recovery, taken in turn (``pairs=True`` takes every one for every point).
FOLLOW_UPS: tuple[Fault, ...] = (
    Fault("kill_driver", "failpoint", "recovery.decided", 1),
    Fault("restart_space", "failpoint", "recovery.begin", 1, kill_driver=False),
    Fault("kill_daemon", "failpoint", "recovery.decided", 1, kill_driver=False),
    Fault("delete_space", "failpoint", "recovery.begin", 1, kill_driver=True),
    Fault("kill_daemon", "failpoint", "spacesd.restore.partial", 1, kill_driver=False),
)


def leads_exhaustive(point: str) -> bool:
    """Whether an exhaustive campaign puts a first fault at ``point``: not at a recovery
    point (reached only after a fault) nor a park-only one."""
    return point not in RECOVERY_POINTS and point not in PARK_ONLY_POINTS


def exhaustive_plans(seed: int, counts: dict[str, int], *, pairs: bool = False
                     ) -> list[FaultPlan]:
    """One plan per (point, occurrence) measured in a fault-free run: a fault exactly there
    (a kill of the driver at its points; at the Space's points a kill of the daemon, or of
    the shim at a shim's point), followed by a fault during the next driver's recovery
    (``FOLLOW_UPS`` in turn, or with ``pairs`` one plan per follow-up)."""
    plans: list[FaultPlan] = []
    turn = 0
    for point in sorted(counts):
        if not leads_exhaustive(point):
            continue
        first: Action = ("kill_process" if point in SHIM_POINTS else
                         "kill_daemon" if point.startswith("spacesd.") else "kill_driver")
        for occ in range(1, counts[point] + 1):
            lead = Fault(first, "failpoint", point, occ, kill_driver=first == "kill_driver")
            follow = FOLLOW_UPS if pairs else (FOLLOW_UPS[turn % len(FOLLOW_UPS)],)
            turn += 1
            for f in follow:
                plans.append(FaultPlan(seed, (lead, f), 0.0, max_attempts=5))
    return plans
