"""One campaign run: launch drivers, inject the planned faults, finish cleanly, observe, check.

The runner is the only part that owns processes and threads (Jepsen's interpreter): drivers
are ``OwnedProcess``es killed as a group and always reaped; failpoint faults fire from the
rendezvous handler while the driver waits at the point, time faults from timers. Everything
that happened is written down as plain operations (``history``): driver attempts, faults,
and, after the run, every tool call read back from the log.

A run's life:
1. create the Space of conversation 1 and seed the scenario's initial workspace;
2. launch drivers with growing epochs until one exits 0 or 78 or the attempt cap is hit,
   firing each planned fault once when its trigger comes;
3. a clean driver (no failpoints) finishes the session, unless the last driver finished it
   with no fault since its launch;
4. observe (log, Space, effects) and check the invariant;
5. delete the run's Spaces; keep the run directory only when the run failed (or ``keep``).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from durable.adapter.space_names import session_token, space_name
from durable.errors import SpaceError
from scenarios import generate, load
from scenarios.plan import Scenario

from . import live
from .backends import CampaignSpaces, make_spaces
from .checker import Verdict, check
from .driver import SPACE_FAILPOINTS_ENV, SPACE_PREFIX
from .faults import Fault, FaultPlan, draw_plan
from .observe import observe, save_ledger
from .processes import OwnedProcess, python_argv
from .rendezvous import Action, Hit, Rendezvous
from .stale import OtherSession, run_kind

DRIVER_TIMEOUT_S = 180.0
#: Failpoints reached only after the driver adopted the seeded Space (it adopts at start,
#: before any call or recovery).
ARMING_POINTS = ("call.", "recovery.", "session.")
#: The heartbeat of a stale race's older driver: long, so the fences in its commits and
#: Space requests stop it, not its heartbeat's own fence check.
STALE_HEARTBEAT_S = 3600.0


@dataclass(frozen=True)
class RunSpec:
    index: int
    seed: int
    campaign_mode: str
    durable_mode: str
    backend: str
    preset: str
    steps: int | None
    work_dir: Path
    plan: FaultPlan | None = None
    keep: bool = False
    #: The driver program: a module run with ``-m``, or a path to a ``.py`` file.
    driver: str = "chaos.driver"
    #: Stale mode's kind (``stale.KINDS``).
    stale_kind: str = "race"


class RunAborted(Exception):
    """The campaign was interrupted while this run was going: it ends ``unknown``."""


@dataclass
class Hold:
    """Park the driver whose failpoint hit ``matches`` until ``release`` (stale mode)."""

    who: str
    matches: Callable[[Hit], bool]
    parked: threading.Event = field(default_factory=threading.Event)
    release: threading.Event = field(default_factory=threading.Event)


@dataclass
class RunState:
    """Mutable bookkeeping of one run, shared by the runner thread, the rendezvous handler
    and the fault timers (all under ``lock``)."""

    t0: float
    lock: threading.RLock = field(default_factory=threading.RLock)
    history: list[dict[str, Any]] = field(default_factory=list)
    fired: set[int] = field(default_factory=set)
    counts: dict[str, int] = field(default_factory=lambda: {
        "kills": 0, "daemon_kills": 0, "space_restarts": 0, "lost_spaces": 0,
        "process_kills": 0, "fenced": 0, "timeouts": 0, "attempts": 0, "foreign": 0})
    #: What went wrong in the nemesis itself (a handler or timer that raised): the run is
    #: then ``unknown``, since a planned fault may not have happened.
    errors: list[str] = field(default_factory=list)
    latencies: list[dict[str, Any]] = field(default_factory=list)
    driver: OwnedProcess | None = None

    def op(self, process: str, type_: str, f: str, value: Any = None) -> None:
        with self.lock:
            self.history.append({"process": process, "type": type_, "f": f, "value": value,
                                 "time": round(time.time() - self.t0, 4)})

    def count(self, key: str) -> None:
        with self.lock:
            self.counts[key] += 1

    def fault_error(self, what: str, exc: BaseException) -> None:
        text = f"{what}: {type(exc).__name__}: {exc}"
        with self.lock:
            self.errors.append(text)
        self.op("nemesis", "fail", "error", text)


def _kills_reporter(hit: Hit, fault: Fault, killed_driver: bool, injured: bool) -> bool:
    """Whether firing ``fault`` ended the process that reported ``hit`` (then its channel is
    closed; a live reporter must get its answer, or it stops reporting failpoints)."""
    process = hit.info.get("process")
    if process is None:
        return killed_driver
    ends = {"spacesd": ("kill_daemon", "restart_space", "delete_space"),
            "shim": ("kill_process", "restart_space", "delete_space")}.get(process, ())
    return injured and fault.action in ends


class Run:
    """``note``: the campaign's note of what it owns (``live``), if it keeps one."""

    def __init__(self, spec: RunSpec, note: live.Campaign | None = None) -> None:
        self.spec = spec
        self.note = note
        self.dir = spec.work_dir / f"run-{spec.index:04d}"
        self.preset = load(spec.preset)
        self.scenario: Scenario = generate(spec.seed, self.preset, steps=spec.steps)
        self.plan = spec.plan or (FaultPlan(spec.seed, ()) if spec.campaign_mode == "stale"
                                  else draw_plan(spec.seed, self.scenario, spec.durable_mode,
                                                 long_seconds=self.preset.long_seconds))
        self.state = RunState(time.time())
        self.epoch = 0
        #: The session's name: the drivers' CUA_SESSION_NAME; its root Space follows from it.
        self.session = f"run-{spec.index}"
        self.space = space_name(SPACE_PREFIX, session_token(self.session), 1)
        self.spaces: CampaignSpaces | None = None
        #: Drivers to park at a failpoint (stale mode's race).
        self._holds: list[Hold] = []
        self._attempt = 0
        self._fired_at_launch = 0
        self._armed = threading.Event()
        #: The ledgers of the Space's generations the nemesis destroyed (see G2).
        self.ledgers: list[dict[str, Any]] = []
        #: What the runner saw go wrong with another driver or session (stale mode).
        self.stale_error: str | None = None
        #: Keys another log of this session started in the run's Space (stale mode).
        self.foreign_keys: list[str] = []
        #: Unix time before which the run is not observed (a leftover writer's time).
        self.settle_at = 0.0
        #: Every driver this run launched (``abort`` ends those still running).
        self._procs: list[OwnedProcess] = []
        self._aborted = threading.Event()

    def abort(self) -> None:
        """End the run now (the campaign was interrupted): no driver is launched any more,
        those running are SIGKILLed by their process group, parked ones are released; the
        run's own thread then deletes its Spaces and returns an ``unknown`` record."""
        self._aborted.set()
        with self.state.lock:
            procs, holds = list(self._procs), list(self._holds)
        for proc in procs:
            proc.kill_group()
        for hold in holds:
            hold.release.set()

    # ------------------------------------------------------------------ faults

    def _space_fault(self, fault: Fault, hit: Hit | None) -> bool:
        """Injure the Space as ``fault`` says; False when it could not (the history says
        why)."""
        assert self.spaces is not None
        s = self.state
        try:
            if fault.action == "kill_daemon":
                self.spaces.kill_daemon(self.space)
                s.count("daemon_kills")
            elif fault.action == "restart_space":
                self.spaces.restart(self.space)
                s.count("space_restarts")
            elif fault.action == "delete_space":
                # The Space's ledger dies with it; the never-twice check needs it.
                with s.lock:
                    dest = self.dir / "ledgers" / f"gen-{len(self.ledgers):02d}"
                ledger = save_ledger(self.spaces, self.space, dest, "deleted")
                with s.lock:
                    self.ledgers.append(ledger)
                self.spaces.delete(self.space)
                s.count("lost_spaces")
            elif fault.action == "kill_process":
                if hit is None or hit.info.get("process") is None:
                    raise ValueError(f"{fault.describe()}: kill_process needs a failpoint "
                                     "of the Space (it kills the process that reported it)")
                # the pid as the Space sees it: only its provider can signal it
                self.spaces.kill_process(self.space, hit.pid)
                s.count("process_kills")
        except SpaceError as exc:  # e.g. the Space is already gone
            s.op("nemesis", "fail", fault.action, f"skipped: {exc}")
            return False
        s.op("nemesis", "info", fault.action, fault.describe())
        return True

    def _fire(self, index: int, fault: Fault, hit: Hit | None) -> tuple[bool, bool]:
        """Fire ``fault`` once; returns (it killed the driver, it injured the Space).

        A Space fault acts outside the run's lock: bringing a daemon back waits for it, and
        the new daemon's (or the driver's) failpoints must be answered meanwhile.

        A deletion needs the seeded Space adopted first (``ARMING_POINTS``): before that its
        initial files exist nowhere else, so losing them would be a fault of the test, not
        of the system. A timed one waits for that; one at a failpoint reached earlier (the
        adoption's own checkpoint) leaves the Space alone, deterministically."""
        s = self.state
        if fault.action == "delete_space" and fault.trigger == "time":
            self._armed.wait(DRIVER_TIMEOUT_S)
        with s.lock:
            if index in s.fired:
                return False, False
            s.fired.add(index)
            driver = s.driver
        injured = False
        if fault.action == "delete_space" and not self._armed.is_set():
            s.op("nemesis", "fail", fault.action, f"skipped {fault.describe()}: the seeded "
                 "Space is not adopted yet")
        elif fault.action != "kill_driver":
            injured = self._space_fault(fault, hit)
        killed = False
        if fault.kill_driver and driver is not None and driver.poll() is None:
            driver.kill_group()
            s.count("kills")
            s.op("nemesis", "info", "kill_driver", fault.describe())
            killed = True
        with s.lock:
            s.latencies.append({"action": fault.action, "trigger": fault.trigger,
                                "point": fault.point, "t_fault": time.time() - s.t0,
                                "t_next_step": None, "t_done": None, "killed": killed})
        return killed, injured

    def _fire_timed(self, index: int, fault: Fault) -> None:
        """A timer's fault: an error here is the run's, never lost with the timer thread."""
        try:
            self._fire(index, fault, None)
        except Exception as exc:
            self.state.fault_error(f"the nemesis failed to fire {fault.describe()}", exc)

    def _on_hit(self, hit: Hit) -> Action:
        s = self.state
        if hit.point.startswith(ARMING_POINTS):
            self._armed.set()
        from_driver = hit.info.get("process") is None
        with s.lock:
            for lat in s.latencies:
                if from_driver and lat["t_next_step"] is None and lat["killed"]:
                    lat["t_next_step"] = hit.t - s.t0
        with s.lock:
            hold = next((h for h in self._holds if not h.parked.is_set() and h.matches(hit)),
                        None)
            if hold is not None:
                hold.parked.set()  # tell the runner: a driver is parked here
        if hold is not None:
            s.op("nemesis", "info", "hold_driver", f"{hold.who} at {hit.point}#{hit.occurrence}")
            hold.release.wait(DRIVER_TIMEOUT_S)
            return "continue"
        reporter_gone = False
        for i, fault in enumerate(self.plan.faults):
            due = (fault.trigger == "failpoint" and fault.point == hit.point
                   and fault.occurrence == hit.occurrence)
            # A time fault whose delay outlasts its driver lands at the driver's very end
            # instead of never: a launched attempt always gets its faults, so the same seed
            # gives the same fault counts however fast the machine is.
            due = due or (hit.point == "session.end" and fault.trigger == "time"
                          and fault.attempt == self._attempt)
            if due and i not in s.fired:  # every fault due here fires, in plan order
                killed_driver, injured = self._fire(i, fault, hit)
                reporter_gone = reporter_gone or _kills_reporter(hit, fault, killed_driver,
                                                                 injured)
        return "killed" if reporter_gone else "continue"

    # ------------------------------------------------------------------ drivers

    def _driver_argv(self, other: OtherSession | None) -> list[str]:
        spec = self.spec
        program = ([sys.executable, spec.driver] if spec.driver.endswith(".py")
                   else python_argv(spec.driver))
        argv = program + ["--run-dir", str(other.run_dir if other else self.dir),
                          "--preset", other.preset if other else spec.preset,
                          "--seed", str(other.seed if other else spec.seed),
                          "--mode", spec.durable_mode, "--backend", spec.backend]
        if other is not None:
            argv += ["--spaces-dir", str(self.dir)]
        if spec.steps is not None and (other is None or other.preset == spec.preset):
            argv += ["--steps", str(spec.steps)]
        return argv

    def launch(self, attempt: int, failpoints: str | None, *, heartbeat: float = 0.5,
               other: OtherSession | None = None) -> OwnedProcess:
        """Start a driver of the run's session (the next epoch), or of ``other``."""
        if self._aborted.is_set():
            raise RunAborted("the campaign was interrupted")
        if other is None:
            self.epoch += 1
        epoch = other.epoch if other else self.epoch
        run_dir = other.run_dir if other else self.dir
        run_dir.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, live.RUNNER_PID_ENV: str(os.getpid()),
               "CUA_SESSION_NAME": other.name if other else self.session,
               "CUA_SESSION_EPOCH": str(epoch), "CUA_STATE_DIR": str(run_dir / "state"),
               "CUA_SESSION_HEARTBEAT_SECS": str(heartbeat),
               "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
        env.pop("CUA_FAILPOINTS", None)
        env.pop(SPACE_FAILPOINTS_ENV, None)
        if failpoints:
            # the driver's own points, and those of the daemons it brings up
            env["CUA_FAILPOINTS"] = env[SPACE_FAILPOINTS_ENV] = failpoints
        out = open(run_dir / f"driver-{attempt:02d}-e{epoch}.log", "wb")
        try:
            proc = OwnedProcess(self._driver_argv(other), env=env, stdout=out,
                                stderr=subprocess.STDOUT)
        finally:
            out.close()
        with self.state.lock:
            self._procs.append(proc)
        if self.note is not None:
            self.note.driver(proc.pid)
        if self._aborted.is_set():  # aborted while this one started: it must not live on
            proc.kill_group()
        if other is None:
            self.state.counts["attempts"] += 1
        self.state.op("other" if other else "driver", "invoke", "attempt",
                      {"attempt": attempt, "epoch": epoch})
        return proc

    def hold(self, hold: Hold) -> None:
        """Park the next driver whose failpoint hit ``hold.matches`` (stale mode)."""
        with self.state.lock:
            self._holds.append(hold)

    def space_of(self, session: str) -> str:
        """The name of the Space of conversation 1 of ``session``."""
        return space_name(SPACE_PREFIX, session_token(session), 1)

    def await_driver(self, proc: OwnedProcess, attempt: int, *, epoch: int | None = None,
                     other: OtherSession | None = None) -> int:
        """Wait for a driver (reaped, and killed at the timeout) and record its exit."""
        try:
            code = proc.wait(DRIVER_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self.state.counts["timeouts"] += 1
            proc.close()
            code = -1000
        finally:
            proc.close()
        kind = "ok" if code == 0 else "fail" if code in (75, 78) else "info"
        epoch = other.epoch if other else self.epoch if epoch is None else epoch
        self.state.op("other" if other else "driver", kind, "attempt",
                      {"attempt": attempt, "epoch": epoch, "exit": code})
        return code

    def _timers(self, attempt: int, proc: OwnedProcess) -> list[threading.Timer]:
        timers = []
        for i, fault in enumerate(self.plan.faults):
            if fault.trigger == "time" and fault.attempt == attempt:
                t = threading.Timer(fault.delay or 0.0, self._fire_timed, (i, fault))
                t.daemon = True
                t.start()
                timers.append(t)
        return timers

    # ------------------------------------------------------------------ the run

    def seed_space(self, name: str, scenario: Scenario) -> None:
        """Create the Space ``name`` with ``scenario``'s initial workspace."""
        assert self.spaces is not None
        self.spaces.create(name)
        client = self.spaces.connect(name, epoch=0)
        for path, (data, mode) in sorted(scenario.initial.files.items()):
            client.write_file(path, data, mode=mode)
        for path, target in sorted(scenario.initial.links.items()):
            client.symlink(path, target)

    def execute(self) -> dict[str, Any]:
        spec, s = self.spec, self.state
        s.t0 = time.time()
        if self.dir.exists():
            shutil.rmtree(self.dir)
        (self.dir / "state").mkdir(parents=True)
        sock_dir = tempfile.mkdtemp(prefix="cua-fp-")
        if self.note is not None:
            self.note.temp(sock_dir)
            if spec.backend == "local":
                self.note.spaces(self.dir / "spaces")
        final_exit: int | None = None
        verdict = Verdict("unknown", ["the run did not get to its check"])
        obs_json: dict[str, Any] | None = None
        events: list[dict[str, Any]] = []
        hits: dict[str, int] = {}
        try:
            with Rendezvous(os.path.join(sock_dir, "fp.sock"), self._on_hit,
                            shared=spec.backend == "docker") as rv:
                # The Space's daemons report their failpoints to the same rendezvous.
                self.spaces = make_spaces(spec.backend, self.dir, failpoints=rv.address)
                self.seed_space(self.space, self.scenario)
                if spec.campaign_mode == "stale":
                    final_exit = run_kind(self, rv)
                else:
                    final_exit = self._attempts(rv.address)
                hits = rv.counts()
                for error in rv.errors:
                    s.fault_error("the rendezvous", RuntimeError(error))
            self._account_faults(hits)
            # A clean driver finishes the session unless the last driver finished it with
            # no fault fired since it started (a fault during its last steps, a Space lost
            # after its final check, need one; for a finished session the re-drive must
            # change nothing).
            # (Stale mode always ends with one: the session's re-drive after the other
            # party must change nothing either.)
            if final_exit != 0 or len(s.fired) > self._fired_at_launch or \
                    spec.campaign_mode == "stale":
                clean = self.launch(99, None)
                final_exit = self.await_driver(clean, 99)
            t_done = time.time() - s.t0
            time.sleep(max(0.0, self.settle_at - time.time()))
            for lat in s.latencies:
                lat["t_done"] = t_done
            obs, events = observe(self.dir, self.spaces, self.space,
                                  session=session_token(self.session), epoch=self.epoch,
                                  final_exit=final_exit, final_done=final_exit == 0,
                                  ledgers=self.ledgers, stale_error=self.stale_error,
                                  foreign_keys=self.foreign_keys)
            verdict = check(self.scenario, obs, campaign_mode=spec.campaign_mode)
            if s.errors:  # a planned fault may not have happened: nothing is proven
                verdict = Verdict(False if verdict.valid is False else "unknown",
                                  [f"nemesis: {e}" for e in s.errors] + verdict.errors,
                                  ["nemesis", *verdict.checks])
            obs_json = obs.to_json()
            for c in obs.calls:
                s.history.append({"process": "agent", "type": "invoke", "f": c.tool,
                                  "value": {"step": c.step, "call": c.call_id},
                                  "time": round(c.invoked_ms / 1000 - s.t0, 4)})
                if c.result is not None and c.completed_ms is not None:
                    s.history.append({"process": "agent", "type": c.result, "f": c.tool,
                                      "value": {"step": c.step, "call": c.call_id},
                                      "time": round(c.completed_ms / 1000 - s.t0, 4)})
            s.history.sort(key=lambda op: op["time"])
        except Exception as exc:  # the run itself broke: unknown, with the reason
            import traceback

            verdict = Verdict("unknown", [f"run crashed: {type(exc).__name__}: {exc}",
                                          traceback.format_exc(limit=8)])
        finally:
            for hold in self._holds:
                hold.release.set()
            shutil.rmtree(sock_dir, ignore_errors=True)
            failed = verdict.valid is not True
            if self.spaces is not None:
                if failed:
                    self._save_workspace()
                self._cleanup_spaces()
            if not failed and not spec.keep:
                shutil.rmtree(self.dir, ignore_errors=True)
        return {
            "index": spec.index, "seed": spec.seed, "campaign_mode": spec.campaign_mode,
            "stale_kind": spec.stale_kind if spec.campaign_mode == "stale" else None,
            "durable_mode": spec.durable_mode, "backend": spec.backend, "preset": spec.preset,
            "steps": len(self.scenario.steps), "plan": self.plan.to_json(),
            "history": s.history, "recoveries": events, "counts": s.counts,
            "latencies": s.latencies, "points_hit": hits, "final_exit": final_exit,
            #: Indexes of the plan's faults that fired (the others were skipped: history).
            "fired": sorted(s.fired),
            "verdict": verdict.to_json(), "observation": obs_json,
            "seconds": round(time.time() - s.t0, 3),
            #: Unix time of the run's start: history times are seconds after it.
            "started_at": s.t0,
            "run_dir": str(self.dir) if (verdict.valid is not True or spec.keep) else None,
            #: Ended by the campaign's interruption, not by its own course.
            "interrupted": self._aborted.is_set(),
        }

    def _account_faults(self, hits: dict[str, int]) -> None:
        """Every planned fault ends as fired, or skipped with its reason in the history; one
        that was due and did not fire is the nemesis's error (the run becomes unknown)."""
        s = self.state
        for i, fault in enumerate(self.plan.faults):
            if i in s.fired:
                continue
            if fault.trigger == "time":
                why = (f"attempt {fault.attempt} ended before its delay"
                       if fault.attempt is not None and fault.attempt <= self._attempt
                       else f"attempt {fault.attempt} was never launched")
                s.op("nemesis", "info", "skipped", f"{fault.describe()}: {why}")
                continue
            assert fault.point is not None and fault.occurrence is not None
            reached = hits.get(fault.point, 0)
            if reached >= fault.occurrence:
                s.fault_error(f"{fault.describe()} was due ({fault.point} reached {reached} "
                              "times)", RuntimeError("it never fired"))
            else:
                s.op("nemesis", "info", "skipped",
                     f"{fault.describe()}: {fault.point} was reached {reached} time(s)")

    def _attempts(self, failpoints: str | None) -> int | None:
        code: int | None = None
        for attempt in range(1, self.plan.max_attempts + 1):
            self._attempt = attempt
            with self.state.lock:
                self._fired_at_launch = len(self.state.fired)
            proc = self.launch(attempt, failpoints)
            self.state.driver = proc
            timers = self._timers(attempt, proc)
            code = self.await_driver(proc, attempt)
            for t in timers:
                t.cancel()
            if code in (0, 78):
                return code
            if self.plan.backoff:
                time.sleep(self.plan.backoff)
        return code

    def _save_workspace(self) -> None:
        assert self.spaces is not None
        try:
            client = self.spaces.connect(self.space, epoch=self.epoch + 1)
            client.checkpoint_create("final-workspace")
            with open(self.dir / "workspace.tar", "wb") as f:
                for chunk in client.checkpoint_export("final-workspace"):
                    f.write(chunk)
        except Exception as exc:  # keep whatever else we have
            (self.dir / "workspace.error").write_text(f"{type(exc).__name__}: {exc}\n")

    def _cleanup_spaces(self) -> None:
        assert self.spaces is not None
        for name in self.spaces.names():
            try:
                self.spaces.delete(name)
            except Exception as exc:
                print(f"warning: could not delete Space {name}: {exc}", file=sys.stderr)
