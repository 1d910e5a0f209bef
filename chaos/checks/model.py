"""The checker's data: what a run's observation holds (``Observation``, ``ObservedCall``),
what the log implies of it (``Implied``), what each check is given (``CheckInput``) and
what it decides (``Verdict``). Plain data, read and written by the runner, the checks,
``chaos analyze`` and the reports; it imports none of them."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from typing import Any, Literal

from scenarios import Expected, Scenario, Step, WorkspaceModel
from spacesd.protocol import EntryKind, ScanEntry

Valid = bool | Literal["unknown"]
#: A verdict's name: in SUMMARY lines (``verdict=``) and for the exit code (``campaign.EXIT``).
VERDICT_NAMES: dict[Valid, str] = {True: "valid", False: "invalid", "unknown": "unknown"}


@dataclass
class ObservedCall:
    step: int
    attempt: int
    call_id: str
    tool: str
    args: dict[str, Any]
    invoked_ms: int
    #: "ok" | "fail" | "info" (interrupted) | None (no result committed)
    result: str | None
    result_entry: int | None = None
    #: The result's content, cut to its first 2000 characters (for people).
    content: str = ""
    completed_ms: int | None = None
    #: sha256 of the whole content (for the checks).
    content_sha256: str = ""


@dataclass
class Observation:
    calls: list[ObservedCall]
    #: The final workspace's state (its scan), every entry
    workspace: list[ScanEntry]
    #: file contents of the marker file, for exactly-once counts
    log_txt: str
    #: (tool, marker, call id) of every real run of a host tool
    effects: list[tuple[str, str, str]]
    final_exit: int | None
    final_outcome_done: bool
    end_mode: str | None
    image_hash: str | None
    image_stale: str | None
    mode_switch_entry: int | None = None
    #: The adapter's recovery events, with their log entry and commit time.
    events: list[dict[str, Any]] = field(default_factory=list)
    #: (entry id, request id) of every input entry.
    inputs: list[tuple[int, str | None]] = field(default_factory=list)
    #: The log's epoch history: (epoch, first entry it governs, ms) per floor raise, and
    #: (entry id, epoch of its writer) per entry.
    epoch_raises: list[tuple[int, int, int]] = field(default_factory=list)
    entry_epochs: list[tuple[int, int | None]] = field(default_factory=list)
    #: The exec ledgers and fence records of each Space generation the run had:
    #: ``{"why": ..., "audit": spacesd.audit.StateAudit JSON}``; None when not read.
    ledgers: list[dict[str, Any]] | None = None
    #: What the runner saw go wrong with an older driver in the stale race.
    stale_error: str | None = None
    #: The token of the run's session: the first field of every exec key of its Spaces.
    session: str | None = None
    #: Keys an earlier log of the same session started in the Space before this log's
    #: first driver (stale mode's foreign kind): not this log's calls.
    foreign_keys: list[str] = field(default_factory=list)
    #: Redrive mode: what the coordinator did and what was done to it (``chaos.modes.redrive``'s
    #: facts: its sessions and events, the Space losses, the coordinator's kills, the lease
    #: probes), for G6; None in every other mode.
    coordinator: dict[str, Any] | None = None
    #: A redrive race's second session on the same Space: ``{"scenario": how its agent is
    #: drawn, "observation": its Observation as JSON}``; checked in full after the first.
    second: dict[str, Any] | None = None
    #: A virtual workspace's: its directories are only those its files imply (an empty one
    #: is not kept), so the implied state's are compared the same way.
    dirs_implied: bool = False
    #: The forks of the agent's conversation (``Scenario.fork_after``): ``{"conversation",
    #: "after_step", "observation": its Observation as JSON}`` each, checked in full from
    #: their own history.
    forks: list[dict[str, Any]] = field(default_factory=list)
    #: The conversation observed: the agent's (1), or a fork's, whose history (``calls``,
    #: ``events``) holds its parent's up to the fork, and whose Space is its own.
    conversation: int = 1
    #: The workspace's disk was full for a while (a ``fill_work_disk`` struck): a call may
    #: have met ``ENOSPC`` (``chaos.checks.implied``).
    disk_filled: bool = False
    #: The drivers' host lost power (``cut_host_power``): per cut, ``{"fault": what,
    #: "before": the log's commits in memory, "after": those the log kept}``
    #: (``chaos.faults.host_power.commits``), for G7.
    power_cuts: list[dict[str, Any]] = field(default_factory=list)
    #: The Space's commands frozen while its daemon answered (``pause_commands``): per
    #: pause, ``{"keys": those whose shims were frozen, alive, "from_ms", "to_ms"}``
    #: (``chaos.faults.plans.command_freezes``), for G5.
    command_freezes: list[dict[str, Any]] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["workspace"] = [e.to_json() for e in self.workspace]
        return out

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> Observation:
        """Also reads records of older campaigns (fields they lack keep their defaults)."""
        known = {f.name for f in fields(cls)}
        raw = {k: v for k, v in raw.items() if k in known}
        raw["calls"] = [ObservedCall(**c) for c in raw["calls"]]
        raw["workspace"] = [ScanEntry.from_json(r) if isinstance(r, dict) else _old_row(*r)
                            for r in raw["workspace"]]
        raw["effects"] = [tuple(e) for e in raw["effects"]]
        for key in ("inputs", "epoch_raises", "entry_epochs"):
            raw[key] = [tuple(r) for r in raw.get(key, [])]
        return cls(**raw)


@dataclass
class Verdict:
    valid: Valid
    errors: list[str] = field(default_factory=list)
    #: The checks that failed or could not decide, in ``CHECKS`` order (``"G2"``, ...).
    checks: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {"valid": self.valid, "errors": self.errors, "checks": self.checks,
                "check": self.checks[0] if self.checks else None}


def merge(verdicts: list[Valid]) -> Valid:
    """false > unknown > true."""
    if any(v is False for v in verdicts):
        return False
    if any(v == "unknown" for v in verdicts):
        return "unknown"
    return True


@dataclass
class Implied:
    #: The workspace the log implies (a scripted agent's model; a workload's is empty).
    workspace: WorkspaceModel
    #: The state the workspace must be in: the model's, or the golden run's.
    state: list[ScanEntry] = field(default_factory=list)
    #: call id → the result its step gives where the call ran (committed, non-interrupted);
    #: a workload call whose output is nondeterministic has none.
    expected: dict[str, Expected] = field(default_factory=dict)
    #: Committed non-interrupted calls in log order, with their steps.
    applied: list[tuple[ObservedCall, Step]] = field(default_factory=list)
    #: Calls that do not match the scenario (unknown step, other arguments).
    strangers: list[str] = field(default_factory=list)
    #: Calls a full disk cut short (their results say ``ENOSPC``; ``implied``).
    cut_short: set[str] = field(default_factory=set)


class Undecided(Exception):
    """A check cannot decide on this observation; the message says what was missing."""


@dataclass(frozen=True)
class CheckInput:
    scenario: Scenario
    obs: Observation
    campaign_mode: str
    implied: Implied


def _old_row(path: str, kind: EntryKind, mode: int, ident: str) -> ScanEntry:
    """A workspace row of a record written before the whole state was kept."""
    return ScanEntry(path, kind, size=0, mode=mode,
                     sha256=ident if kind == "file" else None,
                     target=ident if kind == "symlink" else None)
