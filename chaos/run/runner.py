"""One campaign run: its phases, and the object that ties the run's roles together.

Each role has a module of its own (Jepsen's split): the nemesis (``chaos.faults.nemesis``, what a
fault does), the schedule (``chaos.faults.schedule``, when it fires and how every planned
fault ends), the attempts scope (``chaos.run.attempts``, the owner of every driver and timer),
the driver's command line (``chaos.run.launch``), the observation (``chaos.run.observe``, the log
and the Space as plain data and history), the checker (``chaos.checks.checker``) and the record
(``chaos.run.record``). What several threads write down, and the lock discipline, are
``chaos.run.state``'s.

A run's life:
1. create the Space of conversation 1 and seed the scenario's initial workspace;
2. launch drivers with growing epochs until one finishes (or fails for good) or the attempt
   cap is hit, each planned fault firing once when its trigger comes;
3. a clean driver (no failpoints) finishes the session, unless the last driver finished it
   with no fault since its launch;
4. observe (log, Space, effects) and check the invariant;
5. delete the run's Spaces; keep the run directory only when the run failed (or ``keep``).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import time
import traceback
from typing import Any

from backends.local import own_disks
from chaos.campaign import live
from chaos.checks.checker import check
from chaos.checks.golden import Golden, GoldenFailed, golden_for
from chaos.checks.model import Observation, Verdict
from chaos.driver import SPACE_PREFIX, initial_tree
from chaos.faults.host_power import HostDisk
from chaos.faults.kinds import FaultNemesis
from chaos.faults.link_proxy import LinkProxy, LinkTable
from chaos.faults.nemesis import NoopNemesis, Target, ValidatingNemesis
from chaos.faults.plans import (
    DISK_BYTES,
    HELD_KINDS,
    HOLD_REQUEST_TIMEOUT_S,
    FaultPlan,
    command_freezes,
    on_virtual,
    with_held_faults,
)
from chaos.faults.rendezvous import Rendezvous
from chaos.faults.schedule import FaultSchedule
from chaos.modes.holds import Holds
from chaos.modes.redrive import keys_of, observe_second
from chaos.modes.registry import MODES
from chaos.run.attempts import EXIT_TIMED_OUT, AttemptScope
from chaos.run.forked_run import forks_of
from chaos.run.launch import OtherSession, driver_argv, driver_env, driver_log
from chaos.run.observe import agent_history, observe, observe_virtual
from chaos.run.processes import Owned
from chaos.run.record import RunRecord
from chaos.run.spaces import delete_spaces, save_workspace, seed_space
from chaos.run.spec import RunSpec
from chaos.run.state import RunState
from chaos.space_providers import CampaignSpaces, backend, make_spaces
from durable.adapter.space_names import session_token, space_name
from durable.errors import CorruptLog
from durable.log import ROOT_CONVERSATION, Log
from durable.session_driver import EXIT_FENCED, EXIT_OK, EXIT_PERMANENT
from durable.session_log import open_for_audit
from scenarios import scenario_of
from scenarios.plan import Scenario

#: The attempt number of the clean driver that finishes a run (drawn plans have at most ten
#: attempts; reports tell the clean driver by it).
CLEAN_ATTEMPT = 99

def outcome_type(code: int) -> str:
    """A driver's exit as an operation's completion: ``ok`` finished, ``fail`` fenced or
    failed for good (it did not run on), ``info`` crashed, killed or timed out (unknown)."""
    return ("ok" if code == EXIT_OK else "fail" if code in (EXIT_FENCED, EXIT_PERMANENT)
            else "info")


class Run:
    """One run of ``spec``. ``note``: the campaign's note of what it owns (``live``), if it
    keeps one. ``execute`` runs it in the calling thread; ``abort`` (any thread) ends it."""

    def __init__(self, spec: RunSpec, note: live.Campaign | None = None) -> None:
        self.spec = spec
        self.dir = spec.work_dir / f"run-{spec.index:04d}"
        self.scenario: Scenario = scenario_of(spec.preset, spec.seed, steps=spec.steps,
                                              keep=spec.keep_steps, simple=spec.simple_steps)
        self.preset = self.scenario.preset
        #: The campaign mode: what the run's phases are where modes differ.
        self.mode = MODES[spec.campaign_mode]
        plan = spec.plan or self._draw_plan()
        self.plan = on_virtual(plan) if not backend(spec.backend).spaces else plan
        self.state = RunState()
        self.scope = AttemptScope(note)
        self.holds = Holds()
        self.nemesis = ValidatingNemesis(FaultNemesis() if self.plan.faults else NoopNemesis(),
                                         self.plan, self.state)
        self.schedule = FaultSchedule(self.plan, self.nemesis, self.state, self.holds,
                                      gated=self.mode.gated)
        #: The rendezvous's handler: the schedule's, or the mode's own (redrive's tells
        #: the coordinator's drivers apart first).
        self.on_hit = self.mode.on_hit(self) or self.schedule.on_hit
        #: Redrive mode: what the coordinator did (``chaos.modes.redrive.Redrive.facts``).
        self.redrive: dict[str, Any] | None = None
        self.note = note
        #: The newest epoch launched for the run's session.
        self.epoch = 0
        #: The session's name: the drivers' CUA_SESSION_NAME; its root Space follows from it.
        self.session = f"run-{spec.index}"
        self.space = self.space_of(self.session)
        self.spaces: CampaignSpaces | None = None
        #: What the runner saw go wrong with another driver or session (stale mode).
        self.stale_error: str | None = None
        #: Keys another log of this session started in the run's Space (stale mode).
        self.foreign_keys: list[str] = []
        #: Unix time before which the run is not observed (a leftover writer's time).
        self.settle_at = 0.0
        #: The link between the faulted drivers and the Space, when the plan cuts it.
        self.link: LinkProxy | None = None
        self.links = LinkTable(self.dir / "links")
        log_disks = {HELD_KINDS[f.action].log_disk for f in self.plan.faults
                     if f.action in HELD_KINDS}
        #: The drivers' log's directory, on a disk of its own when the plan fills it.
        self.log_disk = self.dir / "state" if "tmpfs" in log_disks else None
        #: The drivers' log's disk, when the plan cuts the host's power.
        self.host_disk = HostDisk(self.dir / "state", DISK_BYTES) \
            if "image" in log_disks else None
        self._fired_at_launch = 0

    def _draw_plan(self) -> FaultPlan:
        spec = self.spec
        plan = self.mode.plan(self)
        for kind in HELD_KINDS.values():  # in the registry's order, whatever the flags' order
            if kind.action in spec.held:
                plan = with_held_faults(plan, kind.action, self.scenario, spec.durable_mode,
                                        guest=backend(spec.backend).machines,
                                        long_seconds=self.preset.long_seconds,
                                        timed=self.mode.held_timed)
        return plan

    def note_launch(self) -> None:
        """A driver of the session was launched: faults fired from now on are its."""
        self._fired_at_launch = len(self.state.fired())

    def abort(self) -> None:
        """End the run now (the campaign was interrupted): no driver is launched any more,
        those running are SIGKILLed by their process group, parked ones are released; the
        run's own thread then deletes its Spaces and returns an ``unknown`` record."""
        self.scope.cancel()
        self.holds.release_all()

    @staticmethod
    def space_of(session: str, conversation: int = ROOT_CONVERSATION) -> str:
        """The name of the Space of ``conversation`` of ``session``."""
        return space_name(SPACE_PREFIX, session_token(session), conversation)

    # ------------------------------------------------------------------ drivers

    def request_timeout(self, *, faulted: bool) -> float | None:
        """A faulted driver's request timeout when the run holds a fault that outlasts
        requests (freezes its Space, cuts its link): one those outlast (None: the default;
        a clean driver runs after them)."""
        held = any(HELD_KINDS[a].outlasts_requests for a in self.spec.held) or \
            any(HELD_KINDS[f.action].outlasts_requests for f in self.plan.faults
                if f.action in HELD_KINDS)
        return HOLD_REQUEST_TIMEOUT_S if held and faulted else None

    def launch(self, attempt: int, failpoints: str | None, *, heartbeat: float = 0.5,
               other: OtherSession | None = None) -> Owned:
        """Start a driver of the run's session (at the next epoch), or of ``other``."""
        with contextlib.nullcontext() if self.host_disk is None else \
                self.host_disk.staying_up():  # no driver starts while the host is down
            return self._launch(attempt, failpoints, heartbeat=heartbeat, other=other)

    def _launch(self, attempt: int, failpoints: str | None, *, heartbeat: float,
                other: OtherSession | None) -> Owned:
        epoch = other.epoch if other else self.epoch + 1
        run_dir = other.run_dir if other else self.dir
        run_dir.mkdir(parents=True, exist_ok=True)
        env = driver_env(session=other.name if other else self.session, epoch=epoch,
                         state_dir=run_dir / "state", heartbeat=heartbeat,
                         failpoints=failpoints, log_storage=self.spec.log_storage)
        faulted = failpoints is not None
        argv = driver_argv(self.spec, self.dir, other,
                           request_timeout=self.request_timeout(faulted=faulted),
                           links=self.links.directory if self.link and faulted else None)
        with self.state.launching():  # its failpoints wait until it is the current one
            driver = self.scope.launch(argv, env, driver_log(run_dir, attempt, epoch))
            if other is None:
                self.epoch = epoch
                self.state.count("attempts")
                self.state.begin_attempt(attempt, driver)
        self.state.op("other" if other else "driver", "invoke", "attempt",
                      {"attempt": attempt, "epoch": epoch})
        return driver

    def await_driver(self, driver: Owned, attempt: int, *, epoch: int | None = None,
                     other: OtherSession | None = None) -> int:
        """Wait for a driver (reaped, and ended at the timeout) and record its exit."""
        code = self.scope.wait(driver)
        if code == EXIT_TIMED_OUT:
            self.state.count("timeouts")
        epoch = other.epoch if other else self.epoch if epoch is None else epoch
        self.state.op("other" if other else "driver", outcome_type(code), "attempt",
                      {"attempt": attempt, "epoch": epoch, "exit": code})
        return code

    def attempts(self, failpoints: str) -> int | None:
        """Drivers with growing epochs under the plan's faults, until one finishes or fails
        for good; the last one's exit code."""
        code: int | None = None
        for attempt in range(1, self.plan.max_attempts + 1):
            self.note_launch()
            with self.scope.attempt_timers() as timers:
                driver = self.launch(attempt, failpoints)
                self.schedule.arm(timers, attempt, driver)
                code = self.await_driver(driver, attempt)
            if code in (EXIT_OK, EXIT_PERMANENT):
                return code
            if self.plan.backoff:
                time.sleep(self.plan.backoff)
        return code

    # ------------------------------------------------------------------ the run

    def execute(self) -> RunRecord:
        spec, state = self.spec, self.state
        state.t0 = time.time()
        record = self.mode.whole_run(self)
        if record is not None:
            return record
        if self.dir.exists():
            shutil.rmtree(self.dir)
        (self.dir / "state").mkdir(parents=True)
        sock_dir = tempfile.mkdtemp(prefix="cua-fp-")
        if self.note is not None:
            self.note.temp(sock_dir)
            if backend(spec.backend).spaces_in_run_dir:
                self.note.spaces(self.dir / "spaces")
        final_exit: int | None = None
        verdict = Verdict("unknown", ["the run did not get to its check"])
        obs: Observation | None = None
        events: list[dict[str, Any]] = []
        hits: dict[str, int] = {}
        t_done: float | None = None
        try:
            if self.note is not None and (self.log_disk is not None or
                                          self.host_disk is not None):
                self.note.mount(self.dir / "state")  # before: a SIGKILL may come mid-mount
            if self.log_disk is not None:
                own_disks.mount_tmpfs(self.log_disk, DISK_BYTES, "leave --fill-log-disks off")
            if self.host_disk is not None:
                self.host_disk.mount()
            # Leaving the scope reaps every faulted driver before the channel closes.
            shared = backend(spec.backend).shared_failpoints
            with Rendezvous(os.path.join(sock_dir, "fp.sock"), self.on_hit,
                            shared=shared) as rv, self.holds, self.scope:
                final_exit = self._under_faults(rv)
            hits = rv.counts()
            for error in rv.errors:
                state.fault_error("the rendezvous", RuntimeError(error))
            self.schedule.account(hits)
            # A clean driver finishes the session unless the last driver finished it with
            # no fault fired since it started (a fault during its last steps, a Space lost
            # after its final check, need one; for a finished session the re-drive must
            # change nothing). Some modes always end with one (stale: the session's
            # re-drive after the other party must change nothing either).
            if final_exit != EXIT_OK or len(state.fired()) > self._fired_at_launch or \
                    self.mode.always_clean:
                with self.scope:
                    final_exit = self.await_driver(self.launch(CLEAN_ATTEMPT, None),
                                                   CLEAN_ATTEMPT)
            if self.link is not None:
                try:
                    self.link.drain()
                except TimeoutError as exc:
                    # What it still holds may reach the daemon while the Space is observed.
                    state.fault_error("the link", exc)
            t_done = time.time() - state.t0
            time.sleep(max(0.0, self.settle_at - time.time()))
            obs, events, verdict = self._observe(final_exit)
        except CorruptLog as exc:  # the log under test lost what it said it had committed
            verdict = Verdict(False, [f"run: the session's log is damaged, so no driver can "
                                      f"go on with it: {exc}"], ["run"])
        except Exception as exc:  # noqa: BLE001 - the run itself broke: unknown, with the reason
            verdict = Verdict("unknown", [f"run crashed: {type(exc).__name__}: {exc}",
                                          traceback.format_exc(limit=8)])
        finally:
            shutil.rmtree(sock_dir, ignore_errors=True)
            if self.link is not None:
                self.link.close()
            try:
                self._log_disk_back()
            except Exception as exc:  # noqa: BLE001 - said in the verdict; the Spaces still go
                verdict = Verdict(False if verdict.valid is False else "unknown",
                                  [f"run: the log could not be moved back to the host's disk "
                                   f"({type(exc).__name__}: {exc}); it is in {self.dir}",
                                   *verdict.errors], ["run", *verdict.checks])
            self._clean_up(failed=verdict.valid is not True)
        return RunRecord(
            index=spec.index, seed=spec.seed, campaign_mode=spec.campaign_mode,
            stale_kind=self.mode.kind(spec),
            durable_mode=spec.durable_mode, backend=spec.backend, preset=spec.preset,
            steps=len(self.scenario.steps), plan=self.plan, history=state.history(),
            recoveries=events, counts=state.counts(), latencies=state.latencies(t_done),
            points_hit=hits, final_exit=final_exit, fired=state.fired(), verdict=verdict,
            observation=obs, seconds=round(time.time() - state.t0, 3), started_at=state.t0,
            run_dir=str(self.dir) if (verdict.valid is not True or spec.keep) else None,
            interrupted=self.scope.cancelled)

    def _log_disk_back(self) -> None:
        """The log stays, on the host's disk (``chaos repro`` reads it): off the disk of its
        own a plan gave it."""
        if self.log_disk is not None:
            own_disks.unmount(self.log_disk, keep=True)
        if self.host_disk is not None:
            self.host_disk.close()

    def _under_faults(self, rv: Rendezvous) -> int | None:
        """Phase 1 and 2: the seeded Space, then the drivers under faults (or stale mode's
        other party); the last driver's exit code."""
        if not backend(self.spec.backend).spaces:  # no Space: the driver seeds the log's workspace
            self.nemesis.setup(Target(None, self.space, self.dir / "ledgers", self.state,
                                      self.schedule.armed, log_disk=self.log_disk,
                                      host_disk=self.host_disk))
            return self.attempts(rv.address)
        # The Space's daemons report their failpoints to the same rendezvous.
        held = [HELD_KINDS[f.action] for f in self.plan.faults if f.action in HELD_KINDS]
        disks = {k.disk: DISK_BYTES for k in held if k.disk is not None}
        self.spaces = make_spaces(self.spec.backend, self.dir, failpoints=rv.address,
                                  disks=disks, fork_daemons=True)
        if any(k.link for k in held):
            self.link = LinkProxy(self.spaces.endpoint(self.space))
            self.links.publish(self.space, self.link)
        self.nemesis.setup(Target(self.spaces, self.space, self.dir / "ledgers", self.state,
                                  self.schedule.armed, self.link,
                                  self.scenario.fork_after is not None, self.log_disk,
                                  self.host_disk))
        seed_space(self.spaces, self.space, self.scenario)
        return self.mode.drive(self, rv)

    def _observe(self, final_exit: int | None
                 ) -> tuple[Observation, list[dict[str, Any]], Verdict]:
        """Phase 4: the observation, the recovery events, and the verdict (``unknown`` at
        best when the nemesis failed: a planned fault may not have happened)."""
        if not backend(self.spec.backend).spaces:
            obs, events = observe_virtual(self.dir, initial_tree(self.scenario),
                                          session=session_token(self.session),
                                          epoch=self.epoch, final_exit=final_exit,
                                          final_done=final_exit == EXIT_OK)
        else:
            assert self.spaces is not None
            second = self.redrive.get("second") if self.redrive else None
            if second:  # the race's second session's keys in the Space are not this log's
                self.foreign_keys = keys_of(self, session_token(second))
            obs, events = observe(self.dir, self.spaces, self.space,
                                  session=session_token(self.session), epoch=self.epoch,
                                  final_exit=final_exit, final_done=final_exit == EXIT_OK,
                                  ledgers=self.state.ledgers(self.space),
                                  stale_error=self.stale_error,
                                  foreign_keys=self.foreign_keys)
        obs.coordinator = self.redrive
        obs.second = observe_second(self)
        obs.disk_filled = self._disk_filled()
        obs.power_cuts = list(self.host_disk.cuts) if self.host_disk is not None else []
        obs.command_freezes = command_freezes(self.state.history())
        obs.forks = self._observe_forks(final_exit)
        if self.spec.golden:  # the oracle itself: it must only have finished
            return obs, events, Verdict(True if final_exit == EXIT_OK else "unknown",
                                        [] if final_exit == EXIT_OK else
                                        [f"the golden run ended with exit {final_exit}"])
        try:
            golden = self._golden(obs)
        except GoldenFailed as exc:
            return obs, events, Verdict("unknown", [f"no oracle: {exc}"], ["golden"])
        verdict = check(self.scenario, obs, campaign_mode=self.spec.campaign_mode,
                        golden=golden)
        errors = self.state.errors()
        if errors:
            verdict = Verdict(False if verdict.valid is False else "unknown",
                              [f"nemesis: {e}" for e in errors] + verdict.errors,
                              ["nemesis", *verdict.checks])
        untested = self.state.untested()
        if untested:  # what the checks found follows from what was not set up: no verdict
            verdict = Verdict("unknown", [f"not tested: {e}" for e in untested] +
                              verdict.errors, ["untested", *verdict.checks])
        self.state.add_history(agent_history(obs.calls, self.state.t0))
        return obs, events, verdict

    def _observe_forks(self, final_exit: int | None) -> list[dict[str, Any]]:
        """The observation of each fork of the agent's conversation (``Scenario.fork_after``),
        each in its own Space, for the checks to run on too."""
        if self.scenario.fork_after is None:
            return []
        log = Log.open(open_for_audit(self.dir / "state"))
        try:
            forks = forks_of(log)
        finally:
            log.close()
        out = []
        for conversation in forks:
            common: dict[str, Any] = {
                "session": session_token(self.session), "epoch": self.epoch,
                "final_exit": final_exit, "final_done": final_exit == EXIT_OK,
                "conversation": conversation}
            if not backend(self.spec.backend).spaces:
                obs, _ = observe_virtual(self.dir, initial_tree(self.scenario), **common)
            else:
                assert self.spaces is not None
                name = self.space_of(self.session, conversation)
                obs, _ = observe(self.dir, self.spaces, name, ledgers=self.state.ledgers(name),
                                 **common)
            obs.command_freezes = command_freezes(self.state.history())
            out.append({"conversation": conversation, "after_step": self.scenario.fork_after,
                        "observation": obs.to_json()})
        return out

    def _disk_filled(self) -> bool:
        """Whether a held fault filled a workspace's disk (its calls may meet ENOSPC)."""
        counts = self.state.counts()
        return any(counts.get(k.key) for k in HELD_KINDS.values() if k.disk == "work")

    def _golden(self, obs: Observation) -> Golden | None:
        """A workload's oracle for this run: the golden run without the calls this run
        ended interrupted (None for a scripted agent, whose model is its oracle)."""
        if self.scenario.workload is None:
            return None
        took = {c.step for c in obs.calls if c.result in ("ok", "fail")}
        cut = frozenset(c.step for c in obs.calls if c.result == "info") - took
        return golden_for(self.spec, self.scenario.workload, cut, execute)

    def _clean_up(self, *, failed: bool) -> None:
        """Phase 5: keep a failed run's workspace, delete the run's Spaces, and its
        directory unless it failed or is kept."""
        if self.spaces is not None:
            if failed:
                save_workspace(self.spaces, self.space, self.epoch + 1, self.dir)
            delete_spaces(self.spaces)
        if not failed and not self.spec.keep:
            shutil.rmtree(self.dir, ignore_errors=True)


def execute(spec: RunSpec) -> RunRecord:
    """One run of ``spec``, start to record (no campaign note): what repro, shrink and the
    golden runs of a workload do with a spec."""
    return Run(spec).execute()
