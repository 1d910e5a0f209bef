"""Redrive mode: the coordinator (``durable.coordinator``, a real process) drives the run's
session while the nemesis attacks the drivers, the Space and the coordinator itself.

Seven kinds of runs, by seed (``KINDS``; ``--redrive-kind`` picks one):

- ``driver_kill``: one to three SIGKILLs of the driver at seeded failpoints;
- ``lost_after_kill``: the driver killed and its Space removed right after: the coordinator
  must notice before the next drive and place a new Space;
- ``lost_live``: the Space removed under a live driver, mid-call: the driver halts (exit 1,
  never a tool error) and the next drive resumes on a new Space;
- ``coordinator_kill``: a driver kill, then the coordinator SIGKILLed during the backoff that
  follows and started again (same id): it resumes from its store without a second driver
  for any epoch;
- ``frozen``: the driver frozen mid-call (SIGSTOP of its process group at a seeded
  failpoint): its heartbeat falls silent, the coordinator must notice the stall within
  ``--stall-secs``, kill the frozen driver and drive the session on at a newer epoch;
- ``frozen_host``: the driver frozen mid-call with its coordinator, as when their host is
  paused (every other frozen run by seed). The run's two coordinators are on hosts of their
  own names, so the other one, once the frozen claim lapses, may not end the frozen driver
  (it is not on its host): it drives the session on at a newer epoch. When that driver
  reaches its first failpoint, the frozen driver is woken, and must meet its fence (G4:
  nothing it does after the newer epoch lands); once it ended, its coordinator is woken and
  must find its claim lost and record how its drive ended (G6);
- ``race``: two sessions submitted at once for one Space: the second must wait ("held by
  session:<first>"), start promptly when the first ends, with the next lease token and
  epochs above the first's; the first's superseded token is then refused.

With ``--store postgresql://...`` each run keeps its coordinator store in a schema of its own
on that server, and ``--coordinators`` (default 2 there, 1 with SQLite) coordinators share
it. What the coordinator did (its sessions and events) and what the nemesis did to it go
into the observation (``Observation.coordinator``), for the coordinator check (G6); a race's
second session is observed and checked in full too (``Observation.second``).
"""

from __future__ import annotations

import os
import random
import signal
import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import psutil

from chaos.campaign import live
from chaos.faults.host_power import hosting, wait_dead
from chaos.faults.plans import Fault, FaultPlan
from chaos.faults.rendezvous import Answer, Hit, Rendezvous
from chaos.modes.second_session import second_scenario_params
from chaos.run.launch import OtherSession, driver_argv, driver_env
from chaos.run.observe import observe, save_ledger
from chaos.run.processes import Owned, python_argv
from durable.adapter.space_names import session_token
from durable.coordinator import (
    CoordinatorStore,
    LeaseSuperseded,
    PostgresStore,
    SessionRecord,
    SessionSpec,
    open_store,
)
from durable.errors import SpaceError
from durable.lifetime import DIE_WITH_ENV

if TYPE_CHECKING:
    from chaos.run.context import RunContext
    from chaos.run.state import RunState

KINDS = ("driver_kill", "lost_after_kill", "lost_live", "coordinator_kill", "race", "frozen",
         "frozen_host")
#: The kinds a seed picks from; half the frozen ones freeze the driver's host (``kind_of``).
SEEDED_KINDS = KINDS[:-1]
#: The coordinator of a redrive run: quick to notice, quick to retry; its backoff is long
#: enough in the coordinator_kill kind for the kill to land inside it.
POLL_S = 0.05
BACKOFF_S = {"coordinator_kill": 1.5}
DEFAULT_BACKOFF_S = 0.2
CLAIM_S = 3.0
HEARTBEAT_S = 0.5
STALL_S = 60.0
#: ... but short where a frozen driver must be noticed (its heartbeat is every 0.5 s: ten
#: silent beats, which a live driver on a loaded machine does not miss).
STALL_S_BY_KIND = {"frozen": 5.0}
#: How long a run waits for its sessions to end.
SESSIONS_TIMEOUT_S = 180.0
#: ``frozen_host``: how long a frozen host waits for another coordinator's driver to begin
#: (the frozen claim lapses after ``CLAIM_S``) before the nemesis wakes it anyway (G6 then
#: says the session was not taken over) ...
TAKEOVER_WAIT_S = 30.0
#: ... and how long the woken driver is given to end before its coordinator is woken too.
WOKEN_END_WAIT_S = 20.0
#: How often a freeze waits for its coordinator to be outside the store's transactions.
QUIET_TRIES = 200
#: Failpoints a driver reaches inside a call (a kill or a Space loss lands mid-call there).
CALL_POINTS = ("call.intent", "space.start_mark", "space.before_spawn", "space.running",
               "space.exited", "space.file_op", "space.file_written", "space.outcome",
               "checkpoint.before", "checkpoint.after", "call.returned", "call.result")
#: Where a Space removed under a live driver meets it in a call: its next request fails.
LIVE_LOSS_POINTS = ("space.before_spawn", "space.running", "space.file_op",
                    "checkpoint.before")


def kind_of(seed: int, chosen: str | None) -> str:
    """``chosen``, or the seed's: ``SEEDED_KINDS`` in turn, a frozen run's host frozen with
    its driver every other time."""
    if chosen:
        return chosen
    kind = SEEDED_KINDS[seed % len(SEEDED_KINDS)]
    return "frozen_host" if kind == "frozen" and seed // len(SEEDED_KINDS) % 2 else kind


def draw_redrive_plan(seed: int, kind: str, points: dict[str, int]) -> FaultPlan:
    """The nemesis's plan for a run of ``kind`` (pure: from the seed alone). The
    coordinator's own kill (``coordinator_kill``) is not in the plan: it is aimed at the
    backoff the plan's kill starts."""
    rng = random.Random(f"redrive:{kind}:{seed}")
    calls = {p: n for p, n in points.items() if p in CALL_POINTS}

    def at(choices: dict[str, int]) -> tuple[str, int]:
        point = rng.choice(sorted(choices))
        return point, rng.randint(1, choices[point])

    faults: list[Fault] = []
    if kind == "driver_kill":
        for _ in range(rng.randint(1, 3)):
            faults.append(Fault("kill_driver", "failpoint", *at(calls)))
    elif kind == "lost_after_kill":
        faults.append(Fault("delete_space", "failpoint", *at(calls), kill_driver=True))
    elif kind == "lost_live":
        live_points = {p: n for p, n in calls.items() if p in LIVE_LOSS_POINTS} or calls
        faults.append(Fault("delete_space", "failpoint", *at(live_points), kill_driver=False))
    elif kind in ("frozen", "frozen_host"):
        faults.append(Fault("pause_driver", "failpoint", *at(calls), kill_driver=False))
    elif kind in ("coordinator_kill", "race"):
        faults.append(Fault("kill_driver", "failpoint", *at(calls)))
    else:
        raise ValueError(f"unknown redrive kind {kind!r}; one of {KINDS}")
    return FaultPlan(seed, tuple(sorted(faults, key=lambda f: (f.point or "", f.occurrence))),
                     max_attempts=10)


@dataclass(frozen=True)
class FrozenHost:
    """The coordinator a ``frozen_host`` run freezes with its driver: by pid and start time
    (a signal sent late names nobody else), with the run's store and session (frozen outside
    every store transaction; its claim's expiry read once it is frozen)."""

    pid: int
    started: float
    store_url: str
    session: str

    @classmethod
    def of(cls, driver_pid: int, store_url: str, session: str) -> FrozenHost:
        coordinator = psutil.Process(psutil.Process(driver_pid).ppid())
        return cls(coordinator.pid, coordinator.create_time(), store_url, session)

    def signal(self, signum: int) -> bool:
        """Signal its process group (it leads one), if it is still that process."""
        try:
            if abs(psutil.Process(self.pid).create_time() - self.started) > 0.01:
                return False
        except psutil.Error:
            return False
        return _signal_group(self.pid, signum)


@dataclass
class LaunchedDriver:
    """A driver the coordinator launched, as the nemesis sees it: by the pid it reported a
    failpoint from (it waits for the answer meanwhile, so the pid is its own). It leads a
    process group of its own (the coordinator starts it so)."""

    pid: int
    #: ``frozen_host``: its coordinator, frozen and woken with it: their host.
    host: FrozenHost | None = None
    frozen_at: float | None = None
    #: When the frozen coordinator's claim on the session lapses (the store's record).
    claim_until: float | None = None
    woken_at: float | None = None
    _waking: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def poll(self) -> int | None:
        try:
            proc = psutil.Process(self.pid)
            return None if proc.status() != psutil.STATUS_ZOMBIE else 0
        except psutil.Error:
            return 0

    def kill_group(self) -> None:
        try:
            os.killpg(self.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass

    def pause_group(self) -> bool:
        """SIGSTOP its process group (with its host's: ``_freeze_with_host``); False when
        it had exited."""
        if self.host is not None:
            return self._freeze_with_host(self.host)
        return _signal_group(self.pid, signal.SIGSTOP)

    def _freeze_with_host(self, host: FrozenHost) -> bool:
        """The coordinator stopped first (it then never sees its driver fall silent), and
        only while it is inside no store transaction nor queued for one: frozen there, it
        would hold the other coordinator up as long as it stays frozen."""
        def stop() -> bool:
            if not host.signal(signal.SIGSTOP):
                return False
            if not _signal_group(self.pid, signal.SIGSTOP):
                host.signal(signal.SIGCONT)
                return False
            return True

        def undo(stopped: bool) -> None:
            if stopped:
                _signal_group(self.pid, signal.SIGCONT)
                host.signal(signal.SIGCONT)

        store = open_store(host.store_url)
        try:
            for _ in range(QUIET_TRIES):
                stopped = store.while_quiet(stop, undo)
                if stopped is not None:
                    break
                time.sleep(0.01)
            if not stopped:
                return False
            self.frozen_at = time.time()
            self.claim_until = store.get(host.session).claim_until
        finally:
            store.close()
        return True

    def wake(self, state: RunState) -> None:
        """A driver frozen with its host: it is woken first and given ``WOKEN_END_WAIT_S``
        to end (a newer driver took over: it must meet its fence), then its coordinator.
        Once: a second caller returns when the first is done. Nothing for a driver frozen
        alone (its coordinator ends it) or not frozen."""
        with self._waking:
            if self.host is None or self.frozen_at is None or self.woken_at is not None:
                return
            self.woken_at = time.time()
            _signal_group(self.pid, signal.SIGCONT)
            state.op("nemesis", "info", "wake_driver",
                     {"pid": self.pid, "claim_until": self.claim_until})
            deadline = time.monotonic() + WOKEN_END_WAIT_S
            while self.poll() is None and time.monotonic() < deadline:
                time.sleep(0.05)
            ended = self.poll() is not None
            self.host.signal(signal.SIGCONT)
            state.op("nemesis", "info", "wake_host",
                     {"pid": self.host.pid, "driver_ended": ended})


def _signal_group(pgid: int, signum: int) -> bool:
    try:
        os.killpg(pgid, signum)
    except ProcessLookupError:
        return False
    return True


class DriverTracker:
    """The rendezvous's handler in a redrive run: the first failpoint of a driver it has not
    seen makes that driver the run's current attempt (the coordinator launched it), then
    the fault schedule answers."""

    def __init__(self, run: RunContext) -> None:
        self.run = run
        self.pids: dict[int, int] = {}
        self.frozen_hosts = kind_of(run.spec.seed, run.spec.redrive_kind) == "frozen_host"

    def on_hit(self, hit: Hit) -> Answer:
        if hit.info.get("process") is None and hit.pid not in self.pids:
            attempt = len(self.pids) + 1
            self.pids[hit.pid] = attempt
            self.run.note_launch()
            _, previous = self.run.state.current()
            host = FrozenHost.of(hit.pid, store_url(self.run), self.run.session) \
                if self.frozen_hosts else None
            self.run.state.begin_attempt(attempt, LaunchedDriver(hit.pid, host))
            self.run.state.op("driver", "invoke", "attempt",
                              {"attempt": attempt, "pid": hit.pid})
            if isinstance(previous, LaunchedDriver):
                # A newer driver runs the session (it waits here, at its first point): the
                # driver frozen with its host is woken now, its coordinator once it ended.
                previous.wake(self.run.state)
        return self.run.schedule.on_hit(hit)


@dataclass
class Redrive:
    run: RunContext
    rv: Rendezvous
    kind: str
    store: CoordinatorStore
    url: str
    coordinators: dict[str, Owned] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)
    probes: list[dict[str, Any]] = field(default_factory=list)
    coordinator_kills: list[float] = field(default_factory=list)
    #: Held by the run's loop while it looks at the coordinators, and by a host power cut
    #: from the coordinators' death until they run again (``RedriveHost``).
    host_lock: threading.Lock = field(default_factory=threading.Lock)
    #: How many times each coordinator was started (its log's number).
    starts: dict[str, int] = field(default_factory=dict)
    #: Set (under ``host_lock``) once the sessions ended: a power cut starts nothing more.
    stopped: bool = False

    # ------------------------------------------------------------------ sessions

    @property
    def second_name(self) -> str:
        return f"{self.run.session}-b"

    def specs(self) -> list[SessionSpec]:
        run, spec = self.run, self.run.spec
        # Every driver the coordinator launches is a faulted one: with a held fault in the
        # plan, its requests time out before a frozen Space thaws, and it reaches the Space
        # through the link the plan cuts.
        timeout = run.request_timeout(faulted=True)
        links = run.links.directory if run.link else None
        first = SessionSpec(run.session, run.space,
                            tuple(driver_argv(spec, run.dir, None, request_timeout=timeout,
                                              links=links)),
                            str(run.dir / "state"), f"play scenario {spec.seed}",
                            spec.durable_mode, True)
        if self.kind != "race":
            return [first]
        agent = second_scenario_params(spec.seed)
        other = OtherSession(self.second_name, agent["seed"], agent["preset"], run.dir / "b")
        argv = driver_argv(spec, run.dir, other, request_timeout=timeout, links=links) + [
            "--steps", str(agent["steps"]), "--keep-steps", ",".join(map(str, agent["keep"]))]
        return [first, SessionSpec(other.name, run.space, tuple(argv),
                                   str(other.run_dir / "state"), "play the second scenario",
                                   spec.durable_mode, True)]

    # ------------------------------------------------------------------ coordinators

    def coordinator_env(self) -> dict[str, str]:
        """The run's driver environment without a session: the coordinator sets those."""
        env = driver_env(session="-", epoch=1, state_dir=self.run.dir, heartbeat=HEARTBEAT_S,
                         failpoints=self.rv.address, log_storage=self.run.spec.log_storage)
        for key in ("CUA_SESSION_NAME", "CUA_SESSION_EPOCH", "CUA_STATE_DIR",
                    "CUA_SESSION_HEARTBEAT_SECS", live.RUNNER_PID_ENV):
            env.pop(key, None)
        env[DIE_WITH_ENV] = str(os.getpid())
        return env

    @property
    def coordinator_count(self) -> int:
        """The run's coordinators: a frozen host needs another to take its session."""
        return max(2, self.run.spec.coordinators) if self.kind == "frozen_host" \
            else self.run.spec.coordinators

    def start_coordinator(self, ident: str) -> None:
        run = self.run
        # Frozen hosts: each coordinator on a host of its own name, so that none ends (by
        # pid) a driver another left behind, as on separate machines.
        host = ["--host", f"chaos-host-{ident}"] if self.kind == "frozen_host" else []
        argv = python_argv(
            "durable.coordinator", "--store", self.url, "serve",
            "--spaces", "chaos.space_providers:coordinator_spaces",
            "--spaces-arg", f"backend={run.spec.backend}",
            "--spaces-arg", f"run_dir={run.dir}", "--spaces-arg", f"failpoints={self.rv.address}",
            "--id", ident, "--backoff", str(BACKOFF_S.get(self.kind, DEFAULT_BACKOFF_S)),
            "--backoff-cap", "2", "--poll-secs", str(POLL_S), "--claim-secs", str(CLAIM_S),
            "--stall-secs", str(STALL_S_BY_KIND.get(self.kind, STALL_S)),
            "--heartbeat-secs", str(HEARTBEAT_S),
            "--max-attempts", str(run.plan.max_attempts), "--until-idle", *host)
        log = run.dir / f"coordinator-{ident}-{self.starts.get(ident, 0)}.log"
        self.starts[ident] = self.starts.get(ident, 0) + 1
        self.coordinators[ident] = run.scope.launch(argv, self.coordinator_env(), log)
        run.state.op("coordinator", "invoke", "serve", {"id": ident})

    def kill_coordinator(self, ident: str) -> None:
        proc = self.coordinators[ident]
        proc.kill_group()
        proc.wait()
        self.coordinator_kills.append(time.time())
        self.run.state.count("coordinator_kills")
        self.run.state.op("nemesis", "info", "kill_coordinator", {"id": ident})
        self.start_coordinator(ident)

    # ------------------------------------------------------------------ the run

    def execute(self) -> int | None:
        run = self.run
        for s in self.specs():
            self.store.submit(s, time.time())
        with hosting(run.host_disk, RedriveHost(self)):
            try:
                self._drive_sessions()
            finally:
                with self.host_lock:  # no power cut starts a coordinator again from here on
                    self.stopped = True
                _, driver = run.state.current()
                if isinstance(driver, LaunchedDriver):  # a host still frozen: cut short or
                    driver.wake(run.state)              # broken, nothing stays stopped
        return self._wind_up()

    def _drive_sessions(self) -> None:
        """Until every session ended (or the deadline, or the campaign's Ctrl-C)."""
        run = self.run
        with self.host_lock:
            for i in range(self.coordinator_count):
                self.start_coordinator(f"c{i + 1}")
        deadline = time.monotonic() + SESSIONS_TIMEOUT_S
        while True:
            with self.host_lock:
                recs = {r.name: r for r in self.store.sessions()}
                if all(r.ended for r in recs.values()):
                    break
                if time.monotonic() > deadline:
                    self.errors.append(f"the sessions did not end within "
                                       f"{SESSIONS_TIMEOUT_S:.0f} s: "
                                       f"{[(r.name, r.state, r.reason) for r in recs.values()]}")
                    break
                if run.scope.cancelled:
                    break
                self._attack(recs)
                for ident, proc in self.coordinators.items():
                    if proc.poll() is not None:
                        self.errors.append(f"coordinator {ident} exited {proc.poll()} before "
                                           "its sessions ended (its log: "
                                           f"{run.dir}/coordinator-{ident}-*.log)")
                        deadline = 0.0
            self._wake_overdue_host()
            time.sleep(POLL_S)

    def _wake_overdue_host(self) -> None:
        """A host frozen ``TAKEOVER_WAIT_S`` with no newer driver: woken (outside the
        host lock: waking waits for the driver to end)."""
        _, driver = self.run.state.current()
        if isinstance(driver, LaunchedDriver) and driver.frozen_at is not None \
                and time.time() - driver.frozen_at > TAKEOVER_WAIT_S:
            driver.wake(self.run.state)

    def _wind_up(self) -> int | None:
        """The coordinators seen to their end, the facts of the run, the first session's
        last exit."""
        run = self.run
        for proc in self.coordinators.values():
            try:
                proc.wait(timeout=15)
            except Exception:  # noqa: BLE001 - it did not see the end: ended here
                proc.kill_group()
                proc.wait()
        recs = {r.name: r for r in self.store.sessions()}
        # A driver runs above a floor it meets (CUA-EPOCH), above what the coordinator
        # recorded: the run observes (and a clean driver runs) above the Space's floor.
        run.epoch = max([run.epoch, self._floor(), *(r.epoch for r in recs.values())])
        run.state.count("drives", sum(r.attempts for r in recs.values()))
        run.redrive = self.facts(recs)
        first = recs[run.session]
        return first.last_exit if first.state in ("done", "failed") else None

    def _floor(self) -> int:
        assert self.run.spaces is not None
        try:
            return int(self.run.spaces.connect(self.run.space, epoch=0).describe()["floor"])
        except SpaceError:
            return 0  # gone: nothing to be above

    def _attack(self, recs: dict[str, SessionRecord]) -> None:
        """The nemesis's moves that the plan cannot schedule: the coordinator's kill inside
        a backoff, and the probes of a superseded lease token."""
        if self.kind == "coordinator_kill" and not self.coordinator_kills and \
                self.run.state.fired():
            rec = recs[self.run.session]
            if rec.state == "backoff" and (rec.next_retry or 0) - time.time() > 0.3:
                launched = [e.data["coordinator"] for e in self.store.events(rec.name)
                            if e.kind == "launched"]
                self.kill_coordinator(launched[-1] if launched else "c1")
        if self.kind == "race" and not self.probes:
            first, second = recs[self.run.session], recs.get(self.second_name)
            if first.ended and second is not None and second.lease_token is not None \
                    and first.lease_token is not None:
                self._probe(first.spec.space, first.lease_token)

    def _probe(self, space: str, token: int) -> None:
        """The first session's token, after the second took the Space: renew and release
        must both be refused."""
        for op, call in (("renew", lambda: self.store.renew_lease(space, token, time.time(),
                                                                   60.0)),
                         ("release", lambda: self.store.release_lease(space, token,
                                                                      time.time()))):
            try:
                call()
                self.probes.append({"op": op, "token": token, "refused": False})
            except LeaseSuperseded as exc:
                self.probes.append({"op": op, "token": token, "refused": True,
                                    "error": str(exc)})
                self.run.state.count("refused_tokens")

    def facts(self, recs: dict[str, SessionRecord]) -> dict[str, Any]:
        """What the coordinator check (G6) reads."""
        run = self.run
        def struck(action: str) -> list[float]:
            return [run.state.t0 + op["time"] for op in run.state.history()
                    if op["process"] == "nemesis" and op["f"] == action
                    and op["type"] == "info"]
        losses = struck("delete_space")
        pauses = struck("pause_driver")
        wakes = [(run.state.t0 + op["time"], op["value"]["claim_until"])
                 for op in run.state.history() if op["process"] == "nemesis"
                 and op["f"] == "wake_driver"]
        frozen_hosts = self.kind == "frozen_host"
        return {"kind": self.kind, "session": run.session,
                "second": self.second_name if self.kind == "race" else None,
                "records": [r.to_json() for r in recs.values()],
                "events": [e.to_json() for e in self.store.events()],
                "losses": losses, "pauses": [] if frozen_hosts else pauses,
                "host_freezes": [{"at": t, **dict(zip(("woken", "claim_until"),
                                                       next((w for w in wakes if w[0] >= t),
                                                            (None, None)), strict=True))}
                                 for t in pauses] if frozen_hosts else [],
                "host_cuts": struck("cut_host_power"),
                "coordinator_kills": self.coordinator_kills,
                "probes": self.probes, "errors": self.errors,
                "coordinators": sorted(self.coordinators)}


@dataclass
class RedriveHost:
    """The drivers' host of a redrive run, for a power cut (``chaos.faults.host_power.
    HostProcesses``): its coordinators and the drivers they launched die at once; the
    coordinators start again (the same ids) and each takes its sessions back from its store
    (off the cut disk: a file beside the run's, or PostgreSQL), finding their drivers gone.
    Runs in the thread that fires the cut, one cut at a time (``HostDisk.cut``'s lock);
    holds the run's ``host_lock`` from the death to the start again."""

    redrive: Redrive
    #: The coordinators ``power_off`` killed, to start again.
    _killed: list[str] = field(default_factory=list)
    #: Whether ``power_off`` holds the run's ``host_lock`` (for ``power_on`` to release).
    _holding: bool = False

    def unfit(self) -> str | None:
        if self.redrive.stopped:
            return "the run's sessions had ended: its coordinators are being wound up"
        return None

    def power_off(self) -> None:
        redrive = self.redrive
        redrive.host_lock.acquire()
        if redrive.stopped:
            redrive.host_lock.release()
            return
        self._holding = True
        self._killed = [i for i, p in redrive.coordinators.items() if p.poll() is None]
        coordinators = [redrive.coordinators[i] for i in self._killed]
        for proc in coordinators:  # stopped first: none launches a driver after the count
            proc.pause_group()
        drivers: list[LaunchedDriver] = []
        for proc in coordinators:  # each driver leads a process group of its own
            try:
                drivers += [LaunchedDriver(c.pid) for c in psutil.Process(proc.pid).children()]
            except psutil.Error:
                continue
        for proc in coordinators:
            proc.kill_group()
        for driver in drivers:
            driver.kill_group()
        wait_dead(coordinators, "the coordinators")
        # Their parent is dead: they are reaped by init, or end as zombies (files closed).
        wait_dead(drivers, "the coordinators' drivers")

    def power_on(self, booted: bool) -> None:
        redrive = self.redrive
        if not self._holding:
            return  # the cut failed before power_off, or the sessions had ended
        try:
            if booted:
                for ident in self._killed:
                    redrive.start_coordinator(ident)
        finally:
            self._killed, self._holding = [], False
            redrive.host_lock.release()


def store_url(run: RunContext) -> str:
    """The run's coordinator store: a SQLite file in the run's directory, or a schema of
    its own on the campaign's PostgreSQL server."""
    base = run.spec.redrive_store
    if not base:
        return str(run.dir / "coordinator.sqlite")
    digest = session_token(str(run.spec.work_dir.resolve())).replace("-", "_").lower()
    schema = f"redrive_{digest[-8:]}_{run.spec.index}"
    return f"{base}{'&' if '?' in base else '?'}schema={schema}"


def run_redrive(run: RunContext, rv: Rendezvous) -> int | None:
    kind = kind_of(run.spec.seed, run.spec.redrive_kind)
    run.state.count(f"kind_{kind}")
    url = store_url(run)
    store = open_store(url)
    try:
        return Redrive(run, rv, kind, store, url).execute()
    finally:
        if isinstance(store, PostgresStore):
            store.drop()  # the run's schema: its record holds what the coordinator did
        else:
            store.close()


def observe_second(run: RunContext) -> dict[str, Any] | None:
    """The race's second session, observed like the run's own (its keys in the Space are
    its own; the first session's are foreign to it)."""
    facts = run.redrive
    if not facts or not facts.get("second"):
        return None
    assert run.spaces is not None
    name = facts["second"]
    rec = next(r for r in facts["records"] if r["spec"]["name"] == name)
    first_keys = keys_of(run, session_token(run.session))
    obs, _ = observe(run.dir / "b", run.spaces, run.space, session=session_token(name),
                     epoch=run.epoch, final_exit=rec["last_exit"],
                     final_done=rec["state"] == "done", ledgers=run.state.ledgers(run.space),
                     foreign_keys=first_keys)
    return {"scenario": second_scenario_params(run.spec.seed), "observation": obs.to_json()}


def keys_of(run: RunContext, token: str) -> list[str]:
    """Every exec key of session ``token`` in the run's Space, its lost generations too."""
    assert run.spaces is not None
    ledgers = list(run.state.ledgers(run.space))
    try:
        ledgers.append(save_ledger(run.spaces, run.space, run.dir / "ledgers" / "keys", "keys"))
    except Exception:  # noqa: BLE001 - gone: the saved generations are all there is
        pass
    return sorted({k["key"] for ledger in ledgers for k in ledger["audit"]["keys"]
                   if k["key"].startswith(f"{token}:")})
