"""The coordinator: (re)launches each session's driver, one drive per attempt, until the
session is done or has failed for good.

Each drive of a claimed session:

1. ends the previous driver if the session was taken over from a coordinator that died
   (by pid and start time, on this host);
2. asks the Space's provider whether the session's Space exists *before* launching: a Space
   removed under a host that is still up is noticed here, not by a failing driver. A Space
   that is gone after it was placed was lost: in checkpoint mode without a
   ``CheckpointStore`` nothing holds its state and the session fails for good ("use a
   CheckpointStore or mode transactional"); otherwise a new one is placed (created empty:
   the driver tells it by its id and rebuilds the log's state in it, a new generation);
3. chooses the epoch: ``max(previous + 1, lease token)``, and one above the Space's floor if
   that already is at or above it;
4. launches the driver with ``CUA_SESSION_NAME``, ``CUA_SESSION_EPOCH``, ``CUA_STATE_DIR``,
   ``CUA_SESSION_HEARTBEAT_SECS`` (``stall_secs / 4`` by default), ``CUA_SPACE_NAME``,
   ``CUA_SPACE_PROVIDER``, ``CUA_SESSION_INPUT``, ``CUA_SESSION_MODE`` and
   ``CUA_SESSION_CHECKPOINT_STORE``; it dies with the coordinator
   (``durable.lifetime``);
5. watches it (``drive``): silent for ``stall_secs`` -> ended and replaced;
6. by its exit: ``0`` done; ``78`` failed (permanent); ``75`` fenced (a newer epoch exists:
   this process is ignored, the next drive goes above it at once); anything else crashed:
   a retry after the backoff (``initial``, doubling, capped), up to ``max_attempts`` drives.

Every step is an event in the store, committed with the session's change it explains.
"""

from __future__ import annotations

import os
import socket
import sys
import threading
import time
import traceback
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

from ..errors import SpaceError
from ..lifetime import DIE_WITH_ENV
from ..session_driver import EXIT_FENCED, EXIT_OK, EXIT_PERMANENT
from ..spaces import Spaces
from .drive import DriveResult, DriverProcess, end_orphan
from .records import Claimed, ClaimLost, SessionRecord, StoreUnavailable, check_seconds
from .store import CoordinatorStore

#: The lease a session holds on its Space from its first drive until it ends.
DEFAULT_LEASE_SECS = 7 * 86400.0


@dataclass(frozen=True)
class Backoff:
    """Seconds before the n-th retry in a row: ``initial * factor**(n-1)``, at most ``cap``
    (``initial`` 0: at once, for tests)."""

    initial: float = 2.0
    factor: float = 2.0
    cap: float = 60.0

    def __post_init__(self) -> None:
        check_seconds("backoff", self.initial)
        check_seconds("backoff cap", self.cap)
        if not 1.0 <= self.factor <= 100.0:
            raise ValueError(f"the backoff factor is from 1 to 100, got {self.factor!r}")

    def delay(self, crashes: int) -> float:
        return min(self.cap, self.initial * self.factor ** max(0, crashes - 1))


@dataclass(frozen=True)
class CoordinatorConfig:
    max_attempts: int = 10
    backoff: Backoff = field(default_factory=Backoff)
    #: A driver whose output does not grow for this long is ended and replaced.
    stall_secs: float = 120.0
    #: The drivers' heartbeat interval (default ``stall_secs / 4``).
    heartbeat_secs: float | None = None
    #: How often the store is asked for due sessions (and claims renewed).
    poll_secs: float = 1.0
    #: How long a claim lasts without renewal: a coordinator that dies loses its sessions
    #: to another after this long.
    claim_secs: float = 15.0
    lease_secs: float = DEFAULT_LEASE_SECS
    #: Sessions this coordinator drives at once.
    max_drives: int = 4

    def __post_init__(self) -> None:
        if isinstance(self.max_attempts, bool) or not isinstance(self.max_attempts, int) or \
                self.max_attempts < 1:
            raise ValueError(f"max_attempts is a whole number >= 1, got {self.max_attempts!r}")
        if isinstance(self.max_drives, bool) or not isinstance(self.max_drives, int) or \
                self.max_drives < 1:
            raise ValueError(f"max_drives is a whole number >= 1, got {self.max_drives!r}")
        check_seconds("stall_secs", self.stall_secs, minimum=0.05)
        check_seconds("poll_secs", self.poll_secs, minimum=0.01)
        check_seconds("claim_secs", self.claim_secs, minimum=0.5)
        check_seconds("lease_secs", self.lease_secs, minimum=1.0)
        if self.heartbeat_secs is not None:
            check_seconds("heartbeat_secs", self.heartbeat_secs, minimum=0.01)
            if self.heartbeat_secs >= self.stall_secs:
                raise ValueError(f"heartbeat_secs ({self.heartbeat_secs}) must be below "
                                 f"stall_secs ({self.stall_secs}), or every driver stalls")

    @property
    def heartbeat(self) -> float:
        return self.heartbeat_secs if self.heartbeat_secs is not None else self.stall_secs / 4


class _PatientStore:
    """The store as a coordinator uses it: an operation that finds the store unreachable
    (``StoreUnavailable``: a dropped connection, a restarting server) is tried again, with a
    growing pause, for as long as this coordinator's claims surely hold: two thirds of a claim
    after the store last answered (claims are renewed every third). Its drivers keep running
    meanwhile. After that another coordinator may take its sessions, so the error is raised
    and the coordinator ends its drivers and stops."""

    def __init__(self, store: CoordinatorStore, claim_secs: float) -> None:
        self._store, self._claim_secs = store, claim_secs
        #: Give up this long after the store last answered: claims are renewed every third
        #: of a claim, so the earliest of them lapses no sooner than this.
        self._patience = claim_secs * 2 / 3
        self._answered = time.monotonic()
        self._down = False
        self._lock = threading.Lock()

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._store, name)
        if not callable(attr):
            return attr

        def patient(*args: Any, **kwargs: Any) -> Any:
            pause = 0.05
            while True:
                try:
                    out = attr(*args, **kwargs)
                except StoreUnavailable as exc:
                    silent = self._silent(exc)
                    if silent >= self._patience:
                        raise StoreUnavailable(
                            f"{exc}; no answer for {silent:.1f} s, so this coordinator's "
                            f"claims ({self._claim_secs:g} s) lapse") from exc
                    time.sleep(min(pause, self._patience - silent))
                    pause = min(pause * 2, 1.0)
                    continue
                except Exception:
                    self._answered_now()  # a refusal (ClaimLost...) is an answer too
                    raise
                self._answered_now()
                return out

        return patient

    def _silent(self, exc: StoreUnavailable) -> float:
        """Seconds since the store last answered (noting the outage once)."""
        with self._lock:
            if not self._down:
                self._down = True
                print(f"durable.coordinator: {exc}; trying again while the claims hold, the "
                      "drivers keep running", file=sys.stderr, flush=True)
            return time.monotonic() - self._answered

    def _answered_now(self) -> None:
        with self._lock:
            if self._down:
                print(f"durable.coordinator: the store answers again after "
                      f"{time.monotonic() - self._answered:.1f} s", file=sys.stderr,
                      flush=True)
                self._down = False
            self._answered = time.monotonic()


@dataclass
class _Drive:
    record: SessionRecord
    thread: threading.Thread = field(init=False)
    #: Set (with a reason) when the drive must end its driver: cancelled, claim lost, the
    #: coordinator stopping.
    stop: str | None = None


class Coordinator:
    """Drives the sessions of ``store`` on the Spaces of ``spaces``. ``id`` names it in the
    store (default: unique per process); a coordinator restarted with the same id takes its
    own sessions back at once, another waits for their claims to expire. ``provider`` is the
    description drivers get in ``CUA_SPACE_PROVIDER``."""

    def __init__(self, store: CoordinatorStore, spaces: Spaces, *,
                 config: CoordinatorConfig | None = None,
                 id: str | None = None,  # noqa: A002 - as the CLI's --id names it
                 host: str | None = None,
                 provider: str = "", clock: Callable[[], float] = time.time) -> None:
        self.config = config or CoordinatorConfig()
        self.store = cast(CoordinatorStore, _PatientStore(store, self.config.claim_secs))
        self.spaces = spaces
        #: The host its drivers run on, as recorded with them: an orphaned driver (its
        #: coordinator died or its claim lapsed) is ended by a coordinator of its host only.
        self.host = host or socket.gethostname()
        self.id = id or f"{self.host}-{os.getpid()}-{uuid.uuid4().hex[:6]}"
        self.provider = provider
        self.clock = clock
        self.wake = threading.Event()
        self._drives: dict[str, _Drive] = {}
        self._lock = threading.Lock()
        self._stopping: str | None = None
        self._renewed = 0.0

    # ------------------------------------------------------------------ the loop

    def serve(self, stop: threading.Event, *, until_idle: bool = False) -> None:
        """Drive due sessions until ``stop`` is set (or, ``until_idle``, until every session
        in the store has ended). Leaving ends this coordinator's drivers and releases their
        sessions, so another coordinator (or this one, restarted) resumes them at once."""
        self.store.release_claims(self.id, self.clock())
        why = "the coordinator stopped"
        try:
            while not stop.is_set():
                self._renew()
                self._reap()
                self._claim()
                if until_idle and not self._drives and \
                        all(r.ended for r in self.store.sessions()):
                    return
                self.wake.wait(self.config.poll_secs)
                self.wake.clear()
        except StoreUnavailable:
            why = "the store was unreachable for longer than a claim"
            raise
        finally:
            self._stop_all(why)

    def _claim(self) -> None:
        while len(self._drives) < self.config.max_drives and self._stopping is None:
            claimed = self.store.claim(self.id, self.clock(), self.config.claim_secs,
                                       self.config.lease_secs)
            if claimed is None:
                return
            name = claimed.record.name
            with self._lock:
                # A session this coordinator still drives, claimed again: its claim lapsed
                # (this process stalled longer than a claim), so the earlier drive is over;
                # the new one starts once it has ended its driver.
                earlier = self._drives.get(name)
                if earlier is not None:
                    earlier.stop = earlier.stop or "the claim was lost"
                drive = _Drive(claimed.record)
                drive.thread = threading.Thread(target=self._drive_safely,
                                                args=(claimed, drive, earlier),
                                                name=f"drive-{name}", daemon=True)
                self._drives[name] = drive
            drive.thread.start()

    def _renew(self) -> None:
        now = self.clock()
        with self._lock:
            names = list(self._drives)
        if not names or now - self._renewed < self.config.claim_secs / 3:
            return
        self._renewed = now
        held = self.store.renew(self.id, names, now, self.config.claim_secs,
                                self.config.lease_secs)
        with self._lock:
            for name, drive in self._drives.items():
                rec = held.get(name)
                if rec is None:
                    drive.stop = drive.stop or "the claim was lost"
                elif rec.cancel_requested:
                    drive.stop = drive.stop or "cancelled"

    def _reap(self) -> None:
        with self._lock:
            for name in [n for n, d in self._drives.items() if not d.thread.is_alive()]:
                del self._drives[name]

    def _stop_all(self, reason: str) -> None:
        self._stopping = reason
        with self._lock:
            drives = list(self._drives.values())
            for drive in drives:
                drive.stop = drive.stop or reason
        for drive in drives:
            drive.thread.join()
        self._reap()
        try:
            self.store.release_claims(self.id, self.clock())
        except StoreUnavailable:
            pass  # the claims lapse on their own; another coordinator takes the sessions

    def _stop_reason(self, drive: _Drive) -> str | None:
        with self._lock:
            return drive.stop

    # ------------------------------------------------------------------ one drive

    def _drive_safely(self, claimed: Claimed, drive: _Drive, earlier: _Drive | None) -> None:
        rec = claimed.record
        try:
            if earlier is not None:
                earlier.thread.join()
            self._drive(claimed, drive)
        except ClaimLost as exc:
            try:
                self.store.note(rec.name, "claim_lost", {"coordinator": self.id,
                                                         "error": str(exc)}, self.clock())
            except StoreUnavailable:
                pass
        except StoreUnavailable as exc:
            # The claim lapsed while the store was away: the session is another's to take.
            print(f"durable.coordinator: left session {rec.name}: {exc}", file=sys.stderr,
                  flush=True)
        except Exception as exc:  # noqa: BLE001 - a drive's own error: the session retries
            traceback.print_exc()
            try:
                self._crashed(self.store.get(rec.name), None,
                              f"the drive failed: {type(exc).__name__}: {exc}")
            except (ClaimLost, StoreUnavailable):
                pass  # another coordinator drives it, or the claim lapses and one will
        finally:
            self.wake.set()

    def _drive(self, claimed: Claimed, drive: _Drive) -> None:
        rec = claimed.record
        if claimed.orphan is not None:
            pid, started, host = claimed.orphan
            # Recorded whether this ended it or found it gone: the end of its drive (a
            # drive whose coordinator died has no ``exited``), which the next one follows.
            ended = end_orphan(pid, started) if host == self.host else None
            if ended is not None:
                self.store.note(rec.name, "orphan_ended", {"pid": pid, "killed": ended},
                                self.clock())
        rec = self._place(rec)
        if rec.ended:
            return
        if self._stop_reason(drive) == "cancelled":
            self.store.save(rec.evolve(state="failed", reason="cancelled"), self.id,
                            self.clock(), [("cancelled", {})])
            return
        if self._stop_reason(drive) is not None:
            return
        epoch, facts = self._epoch(rec)
        now = self.clock()
        # The epoch is recorded before the driver exists: it is never handed out twice.
        rec = self.store.save(rec.evolve(attempts=rec.attempts + 1, epoch=epoch,
                                         reason=f"driving at epoch {epoch}"),
                              self.id, now,
                              [("drive", {"attempt": rec.attempts + 1, "epoch": epoch,
                                          **facts})])
        driver = DriverProcess(list(rec.spec.command), self._env(rec, epoch),
                               self._log_path(rec, epoch), stall_secs=self.config.stall_secs)
        driver.start()
        try:
            rec = self.store.save(rec.evolve(driver_pid=driver.pid,
                                             driver_started=driver.create_time(),
                                             driver_host=self.host),
                                  self.id, self.clock(),
                                  [("launched", {"epoch": epoch, "pid": driver.pid,
                                                 "coordinator": self.id})])
        except BaseException:
            driver.kill_group()
            driver.watch(lambda: "the claim was lost")
            raise
        result = driver.watch(lambda: self._stop_reason(drive))
        self._after(rec, epoch, result)

    def _place(self, rec: SessionRecord) -> SessionRecord:
        """The Space checked before the drive: placed when missing, or the session failed
        when its lost Space cannot be rebuilt."""
        space, now = rec.spec.space, self.clock()
        if self.spaces.exists(space):
            if rec.placed:
                return rec
            return self.store.save(rec.evolve(placed=True), self.id, now,
                                   [("space_found", {"space": space})])
        events: list[tuple[str, dict[str, Any]]] = []
        if rec.placed:
            events.append(("space_gone", {"space": space, "attempts": rec.attempts}))
            if rec.spec.mode == "checkpoint" and not rec.spec.checkpoint_store:
                return self.store.save(rec.evolve(
                    state="failed", reason=f"the Space {space} is gone and its checkpoints "
                    "were inside it: nothing holds the session's state; use a "
                    "CheckpointStore or mode transactional"), self.id, now, events)
        self.spaces.create(space)
        events.append(("space_placed", {"space": space, "lost": rec.placed}))
        return self.store.save(rec.evolve(placed=True), self.id, self.clock(), events)

    def _epoch(self, rec: SessionRecord) -> tuple[int, dict[str, Any]]:
        """``max(previous + 1, lease token)``, one above the Space's floor if that is at or
        above it already."""
        epoch = max(rec.epoch + 1, rec.lease_token or 1)
        floor: int | None = None
        try:
            floor = int(self.spaces.connect(rec.spec.space, epoch=0).describe()["floor"])
        except (SpaceError, KeyError, TypeError, ValueError):
            pass  # unreadable: the driver runs above a floor it meets (CUA-EPOCH)
        chosen = floor + 1 if floor is not None and floor >= epoch else epoch
        return chosen, {"previous": rec.epoch, "token": rec.lease_token, "floor": floor}

    def _env(self, rec: SessionRecord, epoch: int) -> dict[str, str]:
        spec = rec.spec
        return {**os.environ, **spec.env,
                "CUA_SESSION_NAME": spec.name, "CUA_SESSION_EPOCH": str(epoch),
                "CUA_STATE_DIR": spec.state_dir,
                "CUA_SESSION_HEARTBEAT_SECS": repr(self.config.heartbeat),
                "CUA_SPACE_NAME": spec.space, "CUA_SPACE_PROVIDER": self.provider,
                "CUA_SESSION_INPUT": spec.input, "CUA_SESSION_MODE": spec.mode,
                "CUA_SESSION_CHECKPOINT_STORE": "1" if spec.checkpoint_store else "0",
                DIE_WITH_ENV: str(os.getpid())}

    @staticmethod
    def _log_path(rec: SessionRecord, epoch: int) -> Path:
        return Path(rec.spec.state_dir) / "drives" / f"drive-{rec.attempts:03d}-e{epoch}.log"

    def _after(self, rec: SessionRecord, epoch: int, result: DriveResult) -> None:
        now = self.clock()
        exited = {"epoch": epoch, "exit": result.exit_code, "reason": result.reason,
                  "stalled": result.stalled, "stopped": result.stopped,
                  "heartbeats": result.heartbeats, "first_output": result.first_output,
                  "seconds": result.seconds}
        if result.stopped == "cancelled":
            self.store.save(rec.evolve(state="failed", reason="cancelled",
                                       last_exit=result.exit_code), self.id, now,
                            [("exited", exited), ("cancelled", {})])
            return
        if result.stopped is not None:
            # The coordinator stops or lost the claim: the session is released, not failed.
            self.store.note(rec.name, "exited", exited, now)
            return
        try:
            self._ended(rec, epoch, result, exited)
        except ClaimLost:
            # The claim lapsed while the driver ran (this process was frozen, or stalled,
            # longer than a claim): the session and its record are another coordinator's
            # now; how this drive ended is still the session's history.
            self.store.note(rec.name, "exited", exited, now)
            raise

    def _ended(self, rec: SessionRecord, epoch: int, result: DriveResult,
               exited: dict[str, Any]) -> None:
        """The session's record after a drive that ended on its own (or stalled)."""
        now = self.clock()
        events: list[tuple[str, dict[str, Any]]] = [("exited", exited)]
        code = result.exit_code
        if result.stalled:
            events.insert(0, ("stalled", {"epoch": epoch, "silent_secs":
                                          self.config.stall_secs}))
        elif code == EXIT_OK:
            self.store.save(rec.evolve(state="done", reason="finished", last_exit=code,
                                       crashes=0), self.id, now, events)
            return
        elif code == EXIT_PERMANENT:
            self.store.save(rec.evolve(state="failed", last_exit=code,
                                       reason=f"permanent failure: {result.reason}"),
                            self.id, now, events)
            return
        elif code == EXIT_FENCED:
            # A newer epoch exists (another driver raised the Space or the log): ignore this
            # process; the next drive runs above it, at once.
            self._retry(rec, code, f"fenced at epoch {epoch}: {result.reason}", 0.0,
                        rec.crashes, events)
            return
        why = ("stalled: no output for "
               f"{self.config.stall_secs:g} s" if result.stalled else
               f"crashed (exit {code}): {result.reason or 'no CUA-EXIT line'}")
        self._crashed(rec, code, why, events)

    def _crashed(self, rec: SessionRecord, code: int | None, why: str,
                 events: list[tuple[str, dict[str, Any]]] | None = None) -> None:
        crashes = rec.crashes + 1
        self._retry(rec, code, why, self.config.backoff.delay(crashes), crashes, events or [])

    def _retry(self, rec: SessionRecord, code: int | None, why: str, delay: float,
               crashes: int, events: list[tuple[str, dict[str, Any]]]) -> None:
        now = self.clock()
        if rec.attempts >= self.config.max_attempts:
            self.store.save(rec.evolve(state="failed", last_exit=code, crashes=crashes,
                                       reason=f"gave up after {rec.attempts} drives; the "
                                       f"last: {why}"), self.id, now, events)
            return
        events.append(("backoff", {"delay": delay, "crashes": crashes}))
        self.store.save(rec.evolve(state="backoff", last_exit=code, crashes=crashes,
                                   next_retry=now + delay, owner=None, claim_until=None,
                                   driver_pid=None, driver_started=None, driver_host=None,
                                   reason=f"{why}; next drive in {delay:g} s"),
                        self.id, now, events)
