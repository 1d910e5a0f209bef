"""The session driver: the process a coordinator (re)launches for each attempt of a session.

Environment (all required unless a default is given):

- ``CUA_SESSION_NAME``: the session's name (its Spaces and exec keys carry it, see
  ``adapter.space_names``).
- ``CUA_SESSION_EPOCH``: this attempt's epoch, an integer from 1 to 2**63 - 1 that grows with
  every launch. The log and the Spaces refuse any older epoch once a newer one has opened
  them. One epoch has one owner: when a Space's floor already is this epoch and another
  driver raised it (a second launch with the same epoch, a new log on an old Space), the
  driver runs above that floor instead, says so (``CUA-EPOCH <epoch> <reason>``) and records
  it where epochs are recorded (the log's floor, every entry, the Spaces' floors).
- ``CUA_STATE_DIR``: the directory holding the session's log (``log.sqlite``, or the
  directory ``log`` of a JSONL log).
- ``CUA_LOG_STORAGE`` (optional): ``sqlite`` (the default) or ``jsonl``: the log's storage,
  each with its fence (``durable.session_log``).
- ``CUA_SESSION_HEARTBEAT_SECS``: heartbeat interval, default 1.0.
- ``CUA_SPACE_NAME`` (optional): the durable Space the coordinator placed for the session
  and leased to it; the session's first conversation runs in it (without it, the Space is
  named from the session, ``adapter.space_names``).
- ``CUA_DIE_WITH_PID`` (optional): the coordinator's pid; the driver is SIGKILLed when it
  dies (``durable.lifetime``).
- ``CUA_SESSION_INPUT`` (optional): the session's input, as submitted to the coordinator
  (``SessionEnv.input``; what the app submits is its own choice).

Exit codes: ``0`` finished, ``78`` permanent failure (``PermanentFailure``, a bad
environment, a missing capability, an unanswered submission), ``75`` fenced (a newer epoch
exists; exits as soon as the log's fence refuses, even if the run never settles, and a run
that settled reports its verdict only after a fresh read of the floor), anything
else crashed (the coordinator retries with backoff).

While it runs it prints ``CUA-HEARTBEAT <epoch> <unix_ms>`` (the epoch it actually runs at)
every interval from a timer thread of its own, and checks the log's fence there too. Its
last line is ``CUA-EXIT <code> <reason>``.
"""

from __future__ import annotations

import os
import sys
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from .errors import EpochTaken, HaltError, PermanentFailure, SpaceFull, StaleEpochError
from .failpoints import failpoint
from .fence_contract import Fence
from .harness import Harness, Outcome, Submission
from .lifetime import DIE_WITH_ENV, die_with
from .log import Log
from .models import Model
from .session_log import DEFAULT_LOG_STORAGE, LOG_STORAGE_ENV, check_log_storage, open_fenced
from .storage.base import Storage
from .tools import Extension, ToolRegistry


class Workspaces(Protocol):
    """What a session's workspaces give the driver: the Space adapter (``DurableSpaces``)
    or a virtual workspace (``durable.virtual.Virtual``)."""

    @property
    def extension(self) -> Extension: ...

    @property
    def env(self) -> Any:
        """The harness's execution env (or factory), None when the tools need none."""

    def raise_epochs(self) -> None:
        """Fence the session's workspaces that exist at this epoch (before ``start``)."""

    def ensure_space(self, harness: Harness, conversation: int) -> Any:
        """Bring the conversation's workspace under this epoch and the log's state."""
        ...

EXIT_OK = 0
EXIT_CRASHED = 1
EXIT_FENCED = 75
EXIT_PERMANENT = 78
#: Epochs are stored as signed 64-bit integers (SQLite, spacesd's floor).
MAX_EPOCH = 2**63 - 1
#: How many times one attempt moves above a Space's floor taken by another owner before it
#: gives up (exit 75): two drivers that keep outbidding each other are a coordinator's bug.
MAX_EPOCH_MOVES = 5
#: Heartbeat intervals a driver accepts: faster floods its output, slower is no heartbeat.
MIN_HEARTBEAT_S = 0.01
MAX_HEARTBEAT_S = 86400.0


@dataclass(frozen=True)
class SessionEnv:
    name: str
    epoch: int
    state_dir: Path
    heartbeat_secs: float = 1.0
    #: The durable Space of the session's first conversation (``CUA_SPACE_NAME``), if the
    #: coordinator named one.
    space: str | None = None
    #: The log's storage (``CUA_LOG_STORAGE``): ``sqlite`` or ``jsonl``.
    log_storage: str = DEFAULT_LOG_STORAGE
    #: The session's input (``CUA_SESSION_INPUT``), "" when none was given.
    input: str = ""

    @classmethod
    def from_environ(cls, environ: dict[str, str] | None = None) -> SessionEnv:
        env = os.environ if environ is None else environ
        missing = [k for k in ("CUA_SESSION_NAME", "CUA_SESSION_EPOCH", "CUA_STATE_DIR")
                   if not env.get(k)]
        if missing:
            raise PermanentFailure(
                f"the driver needs {', '.join(missing)} in its environment (see "
                "durable.session_driver)")
        raw_epoch = env["CUA_SESSION_EPOCH"]
        if not (raw_epoch.isascii() and raw_epoch.isdigit()) \
                or not 1 <= int(raw_epoch) <= MAX_EPOCH:
            raise PermanentFailure(f"CUA_SESSION_EPOCH must be an integer from 1 to {MAX_EPOCH} "
                                   f"(it grows with every launch), got {raw_epoch!r}")
        state_dir = Path(env["CUA_STATE_DIR"])
        if state_dir.exists() and not state_dir.is_dir():
            raise PermanentFailure(f"CUA_STATE_DIR {str(state_dir)!r} exists and is not a "
                                   "directory; point it at the directory of the session's log")
        raw_hb = env.get("CUA_SESSION_HEARTBEAT_SECS", "1.0")
        try:
            hb = float(raw_hb)
        except ValueError:
            raise PermanentFailure(
                f"Expected a number of seconds in CUA_SESSION_HEARTBEAT_SECS but got {raw_hb!r}"
            ) from None
        if not MIN_HEARTBEAT_S <= hb <= MAX_HEARTBEAT_S:  # also refuses nan
            raise PermanentFailure(
                f"CUA_SESSION_HEARTBEAT_SECS must be from {MIN_HEARTBEAT_S} to "
                f"{MAX_HEARTBEAT_S:.0f} seconds, got {raw_hb!r}")
        try:
            storage = check_log_storage(env.get(LOG_STORAGE_ENV) or DEFAULT_LOG_STORAGE)
        except ValueError as exc:
            raise PermanentFailure(str(exc)) from None
        return cls(env["CUA_SESSION_NAME"], int(raw_epoch), state_dir, hb,
                   env.get("CUA_SPACE_NAME") or None, storage, env.get("CUA_SESSION_INPUT", ""))


@dataclass
class Session:
    """What ``start`` gets: the session (``env``: its name, epoch and input), the opened log
    (``storage``), its fence, the adapter, and ``on_stale``."""

    env: SessionEnv
    storage: Storage
    fence: Fence
    durable: Workspaces
    harness: Harness | None = None
    conversations: list[int] = field(default_factory=list)
    #: The refusal ``on_stale`` was told of, if any.
    stale: StaleEpochError | None = None

    def on_stale(self, exc: StaleEpochError) -> None:
        """Tell the driver that a newer epoch refused this one somewhere the app caught it
        (its own thread, a host tool's store): the log's fence halts at once, so nothing
        more is committed, and the attempt ends fenced (75) as soon as ``start`` or the
        run returns."""
        self.fence.halt(f"fenced: {exc}")
        self.stale = self.stale or exc

    def open_harness(self, *, models: dict[str, Model] | Model, registry: ToolRegistry) -> Harness:
        """A harness over this session's log with the adapter plugged in, after resuming
        every interrupted call."""
        registry.extend(self.durable.extension)
        self.harness = Harness.open(Log.open(self.storage), models=models, registry=registry,
                                    env=self.durable.env)
        self.harness.resume()
        return self.harness


    def started(self, submission: Submission) -> SessionRun:
        """The ``Started`` of ``submission`` for ``start`` to return (the driver wraps a
        bare ``Submission`` in one too)."""
        return SessionRun(self, submission)


@runtime_checkable
class Started(Protocol):
    """What ``start`` returns (the design's ``{wait, close, ensure_space}``): the driver
    calls ``ensure_space`` before ``wait`` and after it, and ``close`` last, whatever
    happened. ``Session.started`` makes the usual one; an app with more to do around its
    run (another conversation to wait for, its own resources to close) returns its own."""

    def wait(self) -> Outcome:
        """Run until the session's work settles: ``done``, or unanswered with a reason."""
        ...

    def ensure_space(self) -> None:
        """Bring the workspace of what runs under this epoch and the log's state."""
        ...

    def close(self) -> None:
        """Close what the run opened (the log with it)."""
        ...


@dataclass
class SessionRun:
    """The ``Started`` of one submission: waits for it, ensures its conversation's
    workspace, and closes the session's harness (and so its log)."""

    session: Session
    submission: Submission

    def wait(self) -> Outcome:
        return self.submission.wait()

    def ensure_space(self) -> None:
        self.session.durable.ensure_space(self.submission.harness,
                                          self.submission.conversation)

    def close(self) -> None:
        self.submission.harness.close()


def _started(session: Session, returned: object) -> Started:
    """What ``start`` returned, as a ``Started``; ``PermanentFailure`` for anything else."""
    if isinstance(returned, Submission):
        return session.started(returned)
    if isinstance(returned, Started):
        return returned
    raise PermanentFailure(
        f"start returned {type(returned).__name__}, not something to run: return the "
        "Submission of the session's input (conversation.submit(...)), or an object with "
        "wait(), ensure_space() and close() (session.started(submission) makes one)")


class _Heartbeat(threading.Thread):
    def __init__(self, epoch: int, interval: float, fence: Fence) -> None:
        super().__init__(name="cua-heartbeat", daemon=True)
        self.epoch, self.interval, self.fence = epoch, interval, fence
        self.stopped = threading.Event()

    def run(self) -> None:
        while not self.stopped.wait(self.interval):
            print(f"CUA-HEARTBEAT {self.epoch} {int(time.time() * 1000)}", flush=True)
            try:
                self.fence.check()
            except StaleEpochError as exc:
                print(f"CUA-EXIT {EXIT_FENCED} fenced: {exc}", flush=True)
                os._exit(EXIT_FENCED)
            except Exception:  # noqa: BLE001 - a storage hiccup is the main thread's to report
                continue


def run_durable_session(
    *,
    durable: Callable[[Fence, SessionEnv], Workspaces],
    start: Callable[[Session], Submission | Started],
    open_log: Callable[[Path, int], tuple[Storage, Fence]] | None = None,
    environ: dict[str, str] | None = None,
) -> int:
    """Run one attempt of a session and return its exit code (see the module docstring).

    ``durable(fence, senv)`` builds the adapter for the session ``senv`` (its name, the
    epoch it runs at); ``start(session)`` opens the harness (``session.open_harness``),
    submits the input with a fixed request id, and returns the ``Started`` of the run (a
    bare ``Submission`` is taken as ``session.started(submission)``).
    """
    die_with((os.environ if environ is None else environ).get(DIE_WITH_ENV))
    try:
        senv = SessionEnv.from_environ(environ)
    except PermanentFailure as exc:
        return exit_line(EXIT_PERMANENT, f"bad environment: {exc}")
    if open_log is None:
        kind = senv.log_storage

        def open_log(state: Path, epoch: int) -> tuple[Storage, Fence]:
            return open_fenced(state, epoch, kind)
    for _move in range(MAX_EPOCH_MOVES + 1):
        try:
            return _attempt(senv, durable, start, open_log)
        except EpochTaken as exc:
            if exc.floor >= MAX_EPOCH:
                return exit_line(EXIT_PERMANENT, f"no epoch above the floor {exc.floor}: {exc}")
            # Nothing ran at the taken epoch in that Space: start over, one above its floor.
            senv = replace(senv, epoch=exc.floor + 1)
            print(f"CUA-EPOCH {senv.epoch} {exc}", flush=True)
    return exit_line(EXIT_FENCED, f"another owner took the Space's epoch {MAX_EPOCH_MOVES + 1} "
                              "times in a row: two drivers of this session are running")


def _attempt(senv: SessionEnv, durable: Callable[[Fence, SessionEnv], Workspaces],
             start: Callable[[Session], Submission | Started],
             open_log: Callable[[Path, int], tuple[Storage, Fence]]) -> int:
    """The session at ``senv.epoch``: an exit code, or ``EpochTaken`` to run above it."""
    try:
        storage, fence = open_log(senv.state_dir, senv.epoch)
    except StaleEpochError as exc:
        return exit_line(EXIT_FENCED, f"fenced at open: {exc}")
    heartbeat = _Heartbeat(senv.epoch, senv.heartbeat_secs, fence)
    heartbeat.start()
    session: Session | None = None
    run: Started | None = None
    try:
        adapter = durable(fence, senv)
        # The order the design gives: the log is open at this epoch; now the Space, before
        # ``start`` resumes anything; only then the app.
        adapter.raise_epochs()
        session = Session(senv, storage, fence, adapter)
        run = _started(session, start(session))
        if session.stale is not None:
            raise session.stale
        # Bring the Space under this epoch and the log's state before the run goes on.
        run.ensure_space()
        outcome = run.wait()
        if session.stale is not None:
            raise session.stale
        run.ensure_space()
        if outcome.done:
            failpoint("session.end", epoch=senv.epoch)
        # A driver overtaken after its last commit (paused past it) has nothing left that a
        # fence refuses, yet a newer epoch owns the session now: its verdict is not this
        # driver's to report. The floor, read fresh, says (StaleEpochError: fenced, 75).
        fence.check()
        if outcome.done:
            return exit_line(EXIT_OK, "finished")
        return exit_line(EXIT_PERMANENT, f"unanswered: {outcome.reason}")
    except EpochTaken as exc:
        fence.halt(f"moving above epoch {senv.epoch}: {exc}")
        raise
    except StaleEpochError as exc:
        fence.halt(f"fenced: {exc}")
        return exit_line(EXIT_FENCED, f"fenced: {exc}")
    except HaltError as exc:
        fence.halt(f"halted: {exc}")
        code = EXIT_PERMANENT if exc.permanent else EXIT_CRASHED
        return exit_line(code, f"halted: {exc}")
    except PermanentFailure as exc:
        fence.halt(f"permanent failure: {exc}")
        return exit_line(EXIT_PERMANENT, f"permanent failure: {exc}")
    except SpaceFull as exc:  # no room to record a call or a checkpoint: retry with room
        fence.halt(f"halted: {exc}")
        return exit_line(EXIT_CRASHED, f"halted: {exc}")
    except Exception as exc:  # noqa: BLE001 - any other error: the driver crashed, said so
        traceback.print_exc()
        return exit_line(EXIT_CRASHED, f"crashed: {type(exc).__name__}: {exc}")
    finally:
        heartbeat.stopped.set()
        if run is not None:
            try:
                run.close()
            except Exception:  # noqa: BLE001 - the attempt's exit stands; the error is shown
                traceback.print_exc()
        # The log closed whatever the app's close did (closing twice is harmless).
        if session is not None and session.harness is not None:
            session.harness.close()
        else:
            storage.close()


def exit_line(code: int, reason: str) -> int:
    """Print the driver's last line (``CUA-EXIT <code> <reason>``); ``code``."""
    print(f"CUA-EXIT {code} {reason}", file=sys.stderr, flush=True)
    return code
