"""What the coordinator keeps of a session, a lease and what happened: plain dataclasses
that every store writes as JSON (one encoding for SQLite and PostgreSQL alike).

A session's life: ``pending`` (submitted, or waiting for its Space's lease: "held by
session:<first>") -> ``running`` (a coordinator claimed it and drives it) -> ``done``
(a driver exited 0) or ``failed`` (78, the attempt cap, a lost Space that cannot be rebuilt,
a cancel), with ``backoff`` between drives after a crash. A running session carries the
claim of one coordinator (``owner`` until ``claim_until``): no other drives it meanwhile.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import asdict, dataclass, field, replace
from typing import Any, ClassVar, Literal

from ..record_codec import JsonRecord

SessionState = Literal["pending", "running", "backoff", "done", "failed"]
STATES: tuple[SessionState, ...] = ("pending", "running", "backoff", "done", "failed")
TERMINAL: tuple[SessionState, ...] = ("done", "failed")
MODES = ("auto", "transactional", "checkpoint")
#: What the coordinator sets in every driver's environment: never a session's own.
DRIVER_ENV = ("CUA_SESSION_NAME", "CUA_SESSION_EPOCH", "CUA_STATE_DIR",
              "CUA_SESSION_HEARTBEAT_SECS", "CUA_SPACE_NAME", "CUA_SPACE_PROVIDER",
              "CUA_SESSION_INPUT", "CUA_SESSION_MODE", "CUA_SESSION_CHECKPOINT_STORE",
              "CUA_DIE_WITH_PID")
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:@/-]{0,199}")
#: A Space's name is a directory and a container name on every backend.
_SPACE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,62}")


class CoordinatorError(Exception):
    """Root of the coordinator's errors; each says what was wrong and what to do."""


class StoreUnavailable(CoordinatorError):
    """The store did not answer (a PostgreSQL connection dropped, the server down). The
    next operation connects again; a coordinator retries for as long as its claims hold."""


class UnknownSession(CoordinatorError):
    """No session of that name in the store: ``sessions`` lists them."""


class SessionConflict(CoordinatorError):
    """A session of that name exists with another spec: submitting is idempotent only for
    the same spec. Pick another name, or cancel the first."""


class ClaimLost(CoordinatorError):
    """This coordinator no longer holds the session's claim (it expired and another took
    it, or it was cancelled): stop driving it."""


class LeaseHeld(CoordinatorError):
    """The Space is leased to another session until it ends (``holder``)."""

    def __init__(self, message: str, *, holder: str) -> None:
        super().__init__(message)
        self.holder = holder


class LeaseSuperseded(CoordinatorError):
    """The lease token is not the Space's current one: a newer lease (a later session, or
    one granted after this lease expired) superseded it. Its holder must stop."""


@dataclass(frozen=True)
class SessionSpec:
    """What a session is: given at submission, never changed.

    ``command`` is the driver's argv (for campaigns ``python -m chaos.driver ...``), run once
    per attempt with ``CUA_SESSION_NAME``, ``CUA_SESSION_EPOCH``, ``CUA_STATE_DIR``,
    ``CUA_SESSION_HEARTBEAT_SECS``, ``CUA_SPACE_NAME``, ``CUA_SESSION_INPUT``,
    ``CUA_SESSION_MODE`` and ``CUA_SESSION_CHECKPOINT_STORE`` (``1`` or ``0``) set.
    ``mode`` and ``checkpoint_store`` say whether a lost Space can be rebuilt: in checkpoint
    mode without a ``CheckpointStore`` its checkpoints were inside it.
    """

    name: str
    space: str
    command: tuple[str, ...]
    state_dir: str
    input: str = ""
    mode: str = "auto"
    checkpoint_store: bool = True
    env: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not _NAME.fullmatch(self.name):
            raise ValueError(f"a session's name is 1-200 letters, digits and ._:@/- starting "
                             f"with a letter or digit; got {self.name!r}")
        if not isinstance(self.space, str) or not _SPACE.fullmatch(self.space):
            raise ValueError(f"a Space's name is 1-63 letters, digits and ._- starting with a "
                             f"letter or digit (a directory and a container name); got "
                             f"{self.space!r}")
        if not self.command or not all(isinstance(a, str) and a for a in self.command):
            raise ValueError(f"a session needs its driver's command (non-empty strings), got "
                             f"{list(self.command)!r}")
        if not self.state_dir:
            raise ValueError("a session needs a state directory (its log lives there)")
        if self.mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {self.mode!r}")
        bad = [k for k in self.env if not k or "=" in k or k in DRIVER_ENV]
        if bad:
            raise ValueError(f"env names {bad} are not allowed: names are non-empty without "
                             f"'=', and {', '.join(DRIVER_ENV)} are the coordinator's to set")
        object.__setattr__(self, "command", tuple(self.command))

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "command": list(self.command)}

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> SessionSpec:
        # A session stored before a name became the coordinator's own (``DRIVER_ENV``)
        # loads with that value left out: the coordinator sets it for every driver now.
        env = {k: v for k, v in (raw.get("env") or {}).items() if k not in DRIVER_ENV}
        return cls(**{**raw, "command": tuple(raw["command"]), "env": env})


@dataclass(frozen=True)
class SessionRecord(JsonRecord):
    """A session's state in the store (``spec`` plus what the drives made of it)."""

    # Records stored by an older coordinator may hold fields this one dropped.
    json_extra: ClassVar[Literal["refuse", "ignore"]] = "ignore"

    spec: SessionSpec
    state: SessionState = "pending"
    reason: str = "submitted"
    #: Drives launched so far (the attempt cap counts them).
    attempts: int = 0
    #: Crashes in a row (the backoff doubles with them; a clean exit resets it).
    crashes: int = 0
    #: The epoch of the newest drive (0 before the first).
    epoch: int = 0
    last_exit: int | None = None
    #: Unix time the next drive is due (backoff).
    next_retry: float | None = None
    #: The session's lease on its Space, from its first drive until it ends.
    lease_token: int | None = None
    #: The coordinator whose claim the session is under, and until when.
    owner: str | None = None
    claim_until: float | None = None
    #: Claims taken so far: a drive saves under the claim it was started by, and no other
    #: (its own coordinator may have claimed the session again after the claim lapsed).
    claim: int = 0
    #: The running driver: pid, its start time (psutil's create_time) and host, so that a
    #: coordinator taking the session over can end it by pid (never by name).
    driver_pid: int | None = None
    driver_started: float | None = None
    driver_host: str | None = None
    #: Whether the Space was placed for the session at least once (a Space gone after that
    #: was lost, not never made).
    placed: bool = False
    cancel_requested: bool = False
    created_at: float = 0.0
    updated_at: float = 0.0

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def ended(self) -> bool:
        return self.state in TERMINAL

    def encode(self) -> str:
        return json.dumps(self.to_json(), sort_keys=True)

    @classmethod
    def decode(cls, text: str) -> SessionRecord:
        return cls.from_json(json.loads(text))

    def evolve(self, **changes: Any) -> SessionRecord:
        return replace(self, **changes)


@dataclass(frozen=True)
class Lease:
    """A Space's lease: the newest token, and the session holding it (None once released).
    Tokens only grow, per Space; each acquisition takes the next."""

    space: str
    token: int
    session: str | None
    expires_at: float

    def live(self, now: float) -> bool:
        return self.session is not None and self.expires_at > now


@dataclass(frozen=True)
class Event(JsonRecord):
    """Something the coordinator did or saw, in the order the store committed it: what
    ``status`` shows and what the redrive campaign checks."""

    seq: int
    session: str
    at: float
    kind: str
    data: dict[str, Any]


@dataclass(frozen=True)
class Claimed:
    """What ``claim`` hands a coordinator: the session (now running under its claim) and
    the events that claiming it committed."""

    record: SessionRecord
    #: The session's previous driver, if it was running under a claim that expired (its
    #: coordinator died): end it if it is still alive here.
    orphan: tuple[int, float, str] | None = None


def check_seconds(name: str, value: float, *, minimum: float = 0.0) -> float:
    """``value`` as seconds, refused with a clear message when it is not a finite number at
    least ``minimum``."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or \
            not math.isfinite(value) or value < minimum:
        raise ValueError(f"{name} must be a finite number of seconds >= {minimum}, got "
                         f"{value!r}")
    return float(value)
