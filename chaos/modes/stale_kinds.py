"""Stale mode's kinds: another driver, or another session, meets the run's session.

Each kind drives the run's drivers itself and returns the exit code of the last one (the
runner then finishes the session with a clean driver, observes and checks as usual); what
went wrong with the *other* party goes to ``run.stale_error`` (checked by G4).

- ``race``: an older driver parked at a seeded point (``log.commit`` too: inside a commit,
  before it takes the log's lock, so two drivers are inside the log at once) is overtaken
  by a newer one and then released; it must be fenced (exit 75) and change nothing. Two
  races, by seed: the older resumes once the newer has *finished*, or just after the newer
  *opened* the log and before it wrote anything (parked at its first failpoint): only the
  fences inside each commit and each Space request can stop it there. The older driver's
  heartbeat (which also checks the fence) is slowed down so that those fences, not the
  heartbeat, are tested.
- ``paused``: the older driver is paused (SIGSTOP of its whole process group) a seeded
  instant (0-20 ms) after a seeded point, so it stops wherever it then is, which no
  failpoint names: between a Space request and its answer, inside a commit holding the
  log's write lock, in the middle of a restore. A newer driver then runs to its end, and
  only then is the older one woken (SIGCONT): once a newer driver finished, the older must
  be fenced (exit 75) and change nothing, wherever it woke (G4, G1). A paused driver that
  holds a lock the newer one needs (SQLite's write lock, a JSONL log's commit lock) stops
  it: the newer fails (SQLite's busy timeout) or waits, and the older is woken after
  ``PAUSE_MAX_S`` all the same; the two then race, and only the checks judge. Counted as
  ``pauses``.
- ``detached``: the finished race, with the older driver parked while a ``detached`` step's
  command runs: a command that left a writer in a session of its own (``setsid``, with or
  without its environment). The newer driver's fence must kill the writer too; the run
  waits until the writer would have written (``leak.txt``, which G1 sees).
- ``foreign``: a second session on the run's Spaces provider, with a log of its own. By
  seed, either *another session* (another name) runs beside the run's own, and must get a
  Space of its own (a shared one shows in G1, and its keys in G2); or *a new log of the same
  session* meets the Space an earlier log left with a command still running at the epoch
  the run's first driver also has (the seed document's bug): the run's driver must run
  above that epoch, which kills the command before it writes, and must never be answered
  with the earlier log's results. The earlier log's keys are known to the checker
  (``Observation.foreign_keys``), so G2 does not count them as this log's.

With held faults (``--pause-spaces``...), the plan's faults open once the older driver is
parked (``FaultSchedule.open``): they fall on the racing drivers, which then report their
failpoints and reach the Space through the run's link, never on the older driver before its
park. A held fault may stop the woken older driver before its fence does (a request that
timed out on a frozen Space): then any exit but a finished session (0) is its own, and the
checks judge what it changed.
"""

from __future__ import annotations

import random
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from chaos.faults.host_power import hosting, wait_dead
from chaos.faults.plans import HELD_KINDS, in_effect_at, park_points
from chaos.faults.rendezvous import Rendezvous
from chaos.modes.holds import Hold, Holds, wait_parked
from chaos.run.launch import OtherSession, driver_log
from chaos.run.observe import save_ledger
from chaos.run.spaces import seed_space
from durable.session_driver import EXIT_FENCED, EXIT_OK
from durable.session_log import open_for_audit
from scenarios import load, scenario_of
from scenarios.steps import DETACHED_GRACE_SECONDS

if TYPE_CHECKING:
    from chaos.run.attempts import AttemptScope
    from chaos.run.context import RunContext
    from chaos.run.processes import Owned

KINDS = ("race", "detached", "foreign", "paused")
#: The preset of the earlier log in a foreign run: one command that sleeps, then appends.
FOREIGN_PRESET = "foreign"
#: Added to the run's seed for the other session's scenario (its content differs).
FOREIGN_SEED_OFFSET = 7919
#: An epoch above any a run reaches, for requests that only read.
CHECK_EPOCH = 2**62
#: Margin after a leftover writer's time before the run is observed.
SETTLE_S = 0.3
#: The heartbeat of a race's older driver: long, so the fences in its commits and Space
#: requests stop it, not its heartbeat's own fence check.
STALE_HEARTBEAT_S = 3600.0
#: Where an older driver is held (or paused just after): points of the driver's own that
#: its run reaches as often as ``park_points`` counts them.
RACE_POINTS = ("log.commit", "call.intent", "space.start_mark", "space.running",
               "space.exited", "call.returned", "space.file_op", "space.file_written")
#: A paused driver stops up to this long after the point it passed (seeded): past the
#: failpoint, into the code no failpoint names.
PAUSE_SPREAD_S = 0.02
#: The longest pause: past it the older driver is woken even though the newer one has not
#: ended (it waits on a lock the paused one holds).
PAUSE_MAX_S = 20.0


def run_kind(run: RunContext, rv: Rendezvous) -> int | None:
    """The run's kind, its drivers on one host with the log: a power cut of that host
    (``--cut-host-power``) ends them all, the parked older driver too."""
    if run.host_disk is not None and \
            (why := HELD_KINDS["cut_host_power"].stale_refusal(run.spec.stale_kind)):
        raise ValueError(why)
    with hosting(run.host_disk, StaleHost(run.scope, run.holds)):
        return _run_kind(run, rv)


@dataclass
class StaleHost:
    """The drivers' host of a stale run, for a power cut (``chaos.faults.host_power.
    HostProcesses``): every driver of the run dies at once, the older one parked at its
    failpoint and the newer one at the failpoint the cut struck at. All are stopped
    (SIGSTOP) before any is killed: a driver's death is what the run's thread waits on to
    release the other from its park, and a released driver could commit after the instant
    of the cut, which ``HostDisk.cut`` would read as a commit that had returned. Nothing
    starts again at boot: the runner launches the next driver once the host is up."""

    scope: AttemptScope
    holds: Holds
    #: The pids of the drivers a cut killed (each its own exit, never its fence's).
    killed: set[int] = field(default_factory=set)

    def unfit(self) -> str | None:
        # The driver at the cut's failpoint waits there; every other one must be parked.
        parked = self.holds.parked()
        loose = [d.pid for d in self.scope.running() if d.pid not in parked]
        if len(loose) > 1:
            return (f"drivers {loose} are not all held at a failpoint (a park gave up): one "
                    "may be inside a commit")
        return None

    def power_off(self) -> None:
        drivers = self.scope.running()
        for driver in drivers:
            driver.pause_group()
        self.killed.update(d.pid for d in drivers)  # before the deaths the run waits on
        for driver in drivers:
            driver.kill_group()
        wait_dead(drivers, "the run's drivers")

    def power_on(self, booted: bool) -> None:
        pass


def _run_kind(run: RunContext, rv: Rendezvous) -> int | None:
    kind = run.spec.stale_kind
    if kind == "foreign":
        return _foreign(run, rv)
    if kind == "detached":
        return _detached(run, rv)
    if kind == "paused":
        return _paused(run, rv, random.Random(f"paused:{run.spec.seed}"))
    return _race(run, rv, random.Random(f"stale:{run.spec.seed}"))


def _race(run: RunContext, rv: Rendezvous, rng: random.Random,
          at: tuple[str, int] | None = None, race: str | None = None) -> int | None:
    """Every driver of the race is the run's scope's: whatever happens here (a timeout, a
    launch refused after Ctrl-C), none is left running or unreaped."""
    if at is None:
        at = _seeded_point(run, rng)
    race = race or rng.choice(("finished", "opened"))
    old, old_epoch, old_hold, parked = _park_older(run, rv, at, f"the older driver ({race} "
                                                   "race)")
    if not parked:
        return run.await_driver(old, 1)
    run.settle_at = max(run.settle_at, time.time())
    if race == "finished":
        code = run.await_driver(run.launch(2, _newer_failpoints(run, rv)), 2)
        released = _now(run)
        old_hold.release.set()
        old_code = run.await_driver(old, 1, epoch=old_epoch)
    else:
        new_hold = Hold("the newer driver, before its first write",
                        lambda hit: hit.pid != old.pid and hit.info.get("process") is None)
        run.holds.add(new_hold)
        new = run.launch(2, rv.address)
        wait_parked(new_hold, new)  # parked, or exited, or stuck: the older one goes on
        released = _now(run)
        old_hold.release.set()
        old_code = run.await_driver(old, 1, epoch=old_epoch)
        new_hold.release.set()
        code = run.await_driver(new, 2)
    if old_code == EXIT_FENCED:
        run.state.count("fenced")
    elif old_code == EXIT_OK and not _log_taken_over(run, old_epoch):
        # A planned fault ended the newer driver before it opened the log (a kill at a
        # failpoint its command's end reached): nothing overtook the older, which rightly
        # finished the session; the checks judge what each changed.
        run.state.op("nemesis", "info", "not_overtaken", f"the newer driver never opened "
                     f"the log (it exited {code}): the older one (epoch {old_epoch}) was not "
                     "overtaken, and finished")
    elif not _stopped_by_a_fault(run, old, old_code, released):
        run.stale_error = (f"the older driver (epoch {old_epoch}) exited {old_code} after a "
                           f"newer one took over ({race} race); it must be fenced "
                           f"({EXIT_FENCED})")
    return code


def _log_taken_over(run: RunContext, epoch: int) -> bool:
    """Whether an epoch above ``epoch`` opened the run's log (its epoch history: every raise
    of the floor), once the race's drivers have ended."""
    storage = open_for_audit(run.dir / "state")
    try:
        return any(raised > epoch for raised, _, _ in storage.epoch_history().raises)
    finally:
        storage.close()


def _newer_failpoints(run: RunContext, rv: Rendezvous) -> str | None:
    """The newer driver of a race reports its failpoints when the plan holds faults (they
    fall on it), else runs unhindered."""
    return rv.address if run.plan.faults else None


def _now(run: RunContext) -> float:
    """Seconds since the run began, as its history counts them."""
    return time.time() - run.state.t0


def _stopped_by_a_fault(run: RunContext, old: Owned, code: int, released: float) -> bool:
    """Whether the older driver's exit ``code`` (not fenced) is a planned fault's doing: the
    older did not finish the session (0), which a newer driver had taken over, and its
    host's power cut killed it (``StaleHost``), or when it went on (``released``, seconds
    into the run) a held fault still held, or a fault struck later. Any other fault over
    before it went on cannot have stopped it."""
    if code == EXIT_OK:
        return False
    holding, struck_later = in_effect_at(run.state.history(), released)
    host = run.host_disk.processes if run.host_disk is not None else None
    died_with_host = isinstance(host, StaleHost) and old.pid in host.killed and \
        code == -signal.SIGKILL
    if not (holding or struck_later or died_with_host):
        return False
    why = ("killed by its host's power cut" if died_with_host else
           f"while {', '.join(sorted(holding))} held" if holding else
           "after a planned fault struck")
    run.state.op("nemesis", "info", "stopped_older", f"the older driver exited {code}, not "
                 f"fenced ({EXIT_FENCED}), {why}: its own exit; the checks judge what it "
                 "changed")
    return True


def _park_older(run: RunContext, rv: Rendezvous, at: tuple[str, int],
                name: str) -> tuple[Owned, int, Hold, bool]:
    """The older driver (its heartbeat slowed, so that the fences in its commits and Space
    requests stop it, not its heartbeat's check) launched to park at ``at``: it, its epoch,
    the hold, and whether it parked (``stale_error`` says why not)."""
    hold = Hold(name, lambda hit: (hit.point, hit.occurrence) == at)
    run.holds.add(hold)
    old = run.launch(1, rv.address, heartbeat=STALE_HEARTBEAT_S)
    parked = wait_parked(hold, old)
    if parked:
        run.schedule.open(rv.counts())  # the plan's faults, from here on
    else:
        run.stale_error = f"the older driver never reached {at[0]}#{at[1]}"
    return old, run.epoch, hold, parked


def _seeded_point(run: RunContext, rng: random.Random) -> tuple[str, int]:
    """A (point, occurrence) of ``RACE_POINTS`` the run's first driver reaches."""
    points = park_points(run.scenario, run.spec.durable_mode)
    point = rng.choice([p for p in RACE_POINTS if p in points])
    return point, rng.randint(1, points[point])


def _paused(run: RunContext, rv: Rendezvous, rng: random.Random) -> int | None:
    """The older driver paused past a seeded point, a newer one run to its end, the older
    woken. Its drivers are the run's scope's, as in ``_race``."""
    at = _seeded_point(run, rng)
    after_s = rng.uniform(0.0, PAUSE_SPREAD_S)
    old, old_epoch, hold, parked = _park_older(
        run, rv, at, f"the older driver, to be paused just after {at[0]}#{at[1]}")
    if not parked:
        return run.await_driver(old, 1)
    hold.release.set()
    time.sleep(after_s)  # the fault's seeded instant, not a wait for an event
    if not old.pause_group():  # it finished within those milliseconds: nothing to race
        run.state.op("nemesis", "info", "pause", f"the older driver ended within "
                     f"{after_s * 1000:.1f} ms of {at[0]}#{at[1]}, before its pause")
        return run.await_driver(old, 1)
    run.state.count("pauses")
    run.state.op("nemesis", "info", "pause", f"older driver (epoch {old_epoch}) paused "
                 f"{after_s * 1000:.1f} ms after {at[0]}#{at[1]}")
    decided = _exit_line(driver_log(run.dir, 1, old_epoch))
    if decided is not None:  # paused on its way out: it ended while its epoch was the newest
        run.state.op("nemesis", "info", "pause", f"the older driver had printed {decided!r} "
                     "before its pause: its verdict came before any newer driver")
    run.settle_at = max(run.settle_at, time.time())
    try:
        new = run.launch(2, _newer_failpoints(run, rv))
        try:
            new.wait(PAUSE_MAX_S)
            woken_early = False
        except subprocess.TimeoutExpired:  # it waits on a lock the paused one holds
            woken_early = True
            run.state.op("nemesis", "info", "resume", f"the older driver woken after "
                         f"{PAUSE_MAX_S:g} s: the newer one had not ended")
    finally:
        released = _now(run)
        old.resume_group()
    code = run.await_driver(new, 2)
    old_code = run.await_driver(old, 1, epoch=old_epoch)
    if old_code == EXIT_FENCED:
        run.state.count("fenced")
    elif code == EXIT_OK and not woken_early and decided is None and \
            not _stopped_by_a_fault(run, old, old_code, released):
        run.stale_error = (f"the older driver (epoch {old_epoch}), paused after {at[0]}#"
                           f"{at[1]}, exited {old_code} when woken after a newer one had "
                           f"finished the session; it must be fenced ({EXIT_FENCED})")
    return code


def _exit_line(log: Path) -> str | None:
    """The ``CUA-EXIT`` line a driver printed to ``log``, or None (it has not printed it:
    a driver prints it once its verdict is decided, then closes its log and Spaces)."""
    try:
        text = log.read_text(errors="replace")
    except FileNotFoundError:
        return None
    return next((line for line in text.splitlines() if line.startswith("CUA-EXIT ")), None)


def _detached(run: RunContext, rv: Rendezvous) -> int | None:
    steps = run.scenario.steps
    detached = next((s for s in steps if s.kind == "detached"), None)
    if detached is None:
        raise ValueError(f"stale kind 'detached' needs an agent with a 'detached' step; "
                         f"preset {run.preset.name!r} has none (use --preset detached)")
    occurrence = sum(1 for s in steps[:detached.index + 1] if s.tool == "bash")
    window = run.preset.long_seconds + DETACHED_GRACE_SECONDS
    # The finished race: the newer driver advances the Space as soon as it starts, inside
    # the command's window (the opened race parks it before it touches the Space).
    code = _race(run, rv, random.Random(f"stale:{run.spec.seed}"),
                 at=("space.running", occurrence), race="finished")
    # The writer of the parked command writes ``window`` seconds after it started: look
    # only after that, so a writer that escaped the fence has left its mark.
    run.settle_at += window + SETTLE_S
    return code


def _foreign(run: RunContext, rv: Rendezvous) -> int | None:
    rng = random.Random(f"foreign:{run.spec.seed}")
    if rng.random() < 0.5:
        return _another_session(run)
    return _new_log_of_this_session(run, rv)


def _another_session(run: RunContext) -> int | None:
    """Another session beside the run's own, on the same provider."""
    assert run.spaces is not None
    other = OtherSession(f"{run.session}-other", run.spec.seed + FOREIGN_SEED_OFFSET,
                         run.spec.preset, run.dir / "other")
    scenario = scenario_of(other.preset, other.seed, steps=run.spec.steps)
    seed_space(run.spaces, run.space_of(other.name), scenario)
    proc = run.launch(1, None, other=other)
    run.state.count("foreign")
    code = _unharmed_driver(run, f"beside session {other.name!r}")
    other_code = run.await_driver(proc, 1, other=other)
    if other_code != EXIT_OK:
        run.stale_error = (f"session {other.name!r}, beside the run's on the same provider, "
                           f"exited {other_code}; two sessions must not disturb each other")
    return code


def _new_log_of_this_session(run: RunContext, rv: Rendezvous) -> int | None:
    """An earlier log of this session left a command running on the Space at epoch 1."""
    earlier = OtherSession(run.session, run.spec.seed, FOREIGN_PRESET, run.dir / "earlier")
    hold = Hold("the earlier log's driver, its command running",
                lambda hit: hit.point == "space.running")
    run.holds.add(hold)
    proc = run.launch(1, rv.address, other=earlier)
    parked = wait_parked(hold, proc)
    started = time.time()
    proc.kill_group()  # its command runs on in the Space, under the daemon
    hold.release.set()
    run.state.count("kills")
    run.state.count("foreign")
    run.await_driver(proc, 1, other=earlier)
    if not parked:
        run.stale_error = "the earlier log's driver never started its command"
        return None
    assert run.spaces is not None
    run.foreign_keys = [k["key"] for k in save_ledger(
        run.spaces, run.space, run.dir / "ledgers" / "earlier-log", "earlier log"
    )["audit"]["keys"]]
    code = _unharmed_driver(run, "after an earlier log of the session left a command "
                                 "running on its Space")
    floor = save_ledger(run.spaces, run.space, run.dir / "ledgers" / "after-first-driver",
                        "after the session's first driver")["audit"]["floor"]
    sleep_s = load(FOREIGN_PRESET).long_seconds
    # A check needs no epoch of its own: any one at or above the floor reads.
    client = run.spaces.connect(run.space, epoch=CHECK_EPOCH)
    for key in run.foreign_keys:
        info = client.exec_status(key)
        lived_ms = (info.ended_ms or 0) - (info.started_ms or 0)
        if info.state == "exited" and floor > earlier.epoch and lived_ms >= 1000 * sleep_s:
            # The session's first driver did fence the Space, but only after the command's
            # sleep was over (a slow machine): its write is then part of the Space the new
            # log adopted, which the checker's model does not know. Nothing was tested:
            # unknown, never a failure. (Not fenced at all, the floor still at the earlier
            # epoch, is the bug this kind looks for: the checks judge it.)
            run.state.not_tested(f"the earlier log's command {key} lived {lived_ms} ms, "
                                 f"past its {sleep_s:g} s sleep, before the session's first "
                                 "driver fenced it: too slow a machine to test the fence")
    # The command writes once its sleep is over: look after that.
    run.settle_at = max(run.settle_at, started + sleep_s + SETTLE_S)
    return code


def _unharmed_driver(run: RunContext, where: str) -> int:
    """One driver of the run's session, with no fault planned: it must finish; any
    other exit (a crash on a key another log recorded, a fence it should have been above)
    is the run's error."""
    code = run.await_driver(run.launch(1, None), 1)
    if code != EXIT_OK:
        run.stale_error = (f"the session's driver exited {code} {where}, with no fault "
                           "planned; it must finish (0)")
    return code
