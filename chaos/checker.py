"""The invariant checker: every guarantee of docs/architecture.md, each as its own named check.

It works on an ``Observation`` (plain data taken from the log, the Space, the Space's
ledgers and fence records, and the effects file after a clean driver finished the run), so
``chaos analyze`` can re-check stored records without re-running anything. The checks live
in ``chaos/checks/``, one module each:

- ``run``: the clean driver finished the session and the run made progress;
- ``G1`` state: the workspace (content, permission bits, symlinks) equals the state the
  committed log implies, and in transactional mode the log's image equals it too;
- ``G2`` never twice: no shell command that started was started again by recovery (the
  Space's exec ledgers, earlier generations included);
- ``G3`` fenced before restore: no process started before a restore or revert (of an older
  epoch, or the restoring driver's own) was alive when it changed the workspace;
- ``G4`` stale writers: no entry landed from a driver after a newer epoch took the log
  over, and no refusal of a stale driver became a tool result;
- ``G5`` once and faithful: every call took effect once, in order, with the result its step
  gives (real exit status and output, even when replayed or adopted); the input was admitted
  once; never-tools ran at most once; no unplanned error or interruption.

Verdicts are three-valued (Jepsen): ``True``, ``False``, or ``"unknown"`` when a check could
not decide (it lacked data, or crashed); a crashing check never aborts the campaign.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from typing import TYPE_CHECKING, Any, Literal

from scenarios import Scenario
from spacesd.protocol import EntryKind, ScanEntry

if TYPE_CHECKING:
    from .golden import Golden

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
    #: Redrive mode: what the coordinator did and what was done to it (``chaos.redrive``'s
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


def check(scenario: Scenario, obs: Observation, *, campaign_mode: str,
          golden: Golden | None = None) -> Verdict:
    """Run every check; see ``chaos.checks``. A redrive race's second session (``second``)
    ran on the first's Space after it: it is checked in full from the state the first
    session's log implies, and the first's workspace check (G1) is left to it (the Space
    holds both sessions' changes; the second's G1 sees a wrong first state too)."""
    from .checks import run_checks

    if obs.second is None:
        return _with_forks(run_checks(scenario, obs, campaign_mode, golden=golden), scenario,
                           obs, campaign_mode)
    from dataclasses import replace

    from .checks.implied import implied
    from .redrive import second_scenario

    first = run_checks(scenario, obs, campaign_mode, skip=("G1",))
    after_first = implied(scenario, obs.calls).workspace
    scenario_b = replace(second_scenario(obs.second["scenario"]), initial=after_first)
    second = run_checks(scenario_b, Observation.from_json(obs.second["observation"]),
                        campaign_mode)
    checks = first.checks + [c for c in second.checks if c not in first.checks]
    return Verdict(merge([first.valid, second.valid]),
                   first.errors + [f"second session: {e}" for e in second.errors], checks)


def _with_forks(verdict: Verdict, scenario: Scenario, obs: Observation,
                campaign_mode: str) -> Verdict:
    """``verdict`` and every check on each fork of the agent's conversation: a fork's
    Space must hold what its own history implies (its parent's calls up to the fork, then
    its own), and its calls must have taken effect once, faithfully. A scenario that forks
    must have its fork once its agent finished."""
    from .checks import run_checks

    verdicts, errors, checks = [verdict.valid], list(verdict.errors), list(verdict.checks)
    if scenario.fork_after is not None and obs.final_outcome_done and not obs.forks:
        verdicts.append(False)
        errors.append(f"run finished: the agent forks after step {scenario.fork_after}, "
                      "but the log has no fork")
        checks += [] if "run" in checks else ["run"]
    for fork in obs.forks:
        got = run_checks(scenario, Observation.from_json(fork["observation"]), campaign_mode,
                         skip=("G6",))
        verdicts.append(got.valid)
        errors += [f"fork c{fork['conversation']} (after step {fork['after_step']}): {e}"
                   for e in got.errors]
        checks += [c for c in got.checks if c not in checks]
    return Verdict(merge(verdicts), errors, checks)


def _old_row(path: str, kind: EntryKind, mode: int, ident: str) -> ScanEntry:
    """A workspace row of a record written before the whole state was kept."""
    return ScanEntry(path, kind, size=0, mode=mode,
                     sha256=ident if kind == "file" else None,
                     target=ident if kind == "symlink" else None)
