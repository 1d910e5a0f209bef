"""The adapter's recovery decisions, as pure functions of what the log and the ledger say.

Before, one method read the log, asked the ledger and acted in one pass, so the rules
(module docstring of ``recovery``) could only be tested by crashing real drivers.
Here they are a table: ``decide(Facts) -> Decision`` for an interrupted wrapped call
(``rebuild.decide_rebuild`` is the table of a Space rebuilt after it was lost). No I/O, no
log, no Space: ``recovery`` gathers the facts, calls ``decide`` and carries the decision
out. A test enumerates every fact in milliseconds.

The ledger is asked only for a bash call whose start mark (with its key) is in the log and
ran in the current Space generation, and whose outcome is not recorded: ``needs_ledger``
says so, and the executor fills ``Facts.ledger`` only then (``decide`` refuses a missing
answer it needs and ignores one it does not).

Every decision is recorded as ``RecoveryEvent``s (``Decision.events``), each carrying its
``cause``; ``all_facts`` enumerates what the table can be asked. Which of its rows a crash
campaign can reach, and which it did, is the campaign's business (``chaos.campaign.coverage``).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import dataclass, fields
from typing import Any, Literal, get_args

from spacesd.protocol import ExecInfo

from ..tools import Replay
from .state import Cause, EventKind, Mode

ToolKind = Literal["bash", "file"]
LedgerState = Literal["running", "exited", "fenced", "lost", "unknown"]
#: The checkpoint ``cua.space`` records: none, one from before this call, or this call's.
CheckpointFact = Literal["none", "earlier", "this_call"]
Action = Literal["adopt", "reattach", "replay", "run", "revert", "restore_rerun",
                 "restore_interrupt"]

_EVENTS: dict[Action, tuple[EventKind, ...]] = {
    "adopt": ("adopted",),
    "reattach": ("reattached",),
    "replay": ("replayed",),
    "run": ("ran",),
    "revert": ("reverted",),
    "restore_rerun": ("restored",),
    "restore_interrupt": ("restored", "interrupted"),
}


# ---------------------------------------------------------------- an interrupted call


@dataclass(frozen=True)
class Facts:
    """What the log and the ledger say about one interrupted wrapped call."""

    #: The conversation's mode now.
    mode: Mode
    #: ``bash``, or ``file`` for write and edit.
    tool: ToolKind
    #: The tool's replay rule (``safe``: may run again after a restore).
    replay: Replay
    #: ``cua.call`` holds this call's start mark.
    start_mark: bool
    #: ... and its outcome (checkpoint mode records it before the result).
    outcome: bool
    #: ... and the Space generation it names is the current one (False without a mark).
    same_generation: bool
    #: ... and it recorded a command key (bash).
    key: bool
    #: The ledger's state of the last key, when asked (``needs_ledger``); else None.
    ledger: LedgerState | None
    #: The checkpoint ``cua.space`` records (whose: an earlier call's, or this one's).
    checkpoint: CheckpointFact


@dataclass(frozen=True)
class Decision:
    action: Action
    cause: Cause
    #: adopt in checkpoint mode: this call's checkpoint is not recorded; take it now.
    take_checkpoint: bool = False
    #: restore_*: where the state before the call comes from (a checkpoint, else the image).
    restore_from: Literal["checkpoint", "image"] | None = None

    @property
    def events(self) -> tuple[EventKind, ...]:
        """The recovery events that record this decision, in order (a restore that ends the
        call interrupted records both, with the same cause)."""
        return _EVENTS[self.action]


def needs_ledger(facts: Facts) -> bool:
    """Whether ``decide`` needs the ledger's state of the call's last key."""
    return (facts.tool == "bash" and facts.start_mark and facts.key
            and facts.same_generation and not facts.outcome)


def ledger_state(info: ExecInfo) -> LedgerState:
    """The fact an ``exec_status`` answer gives."""
    if info.state == "exited":
        return "exited" if info.fenced_by is None else "fenced"
    if info.state == "started":
        raise ValueError(
            f"exec_status answered 'started' for {info.key}, which only exec_start may "
            "answer: the Space's daemon does not follow spacesd.protocol; rebuild its image")
    return info.state


def decide(facts: Facts) -> Decision:
    """What to do with an interrupted call, in the order of ``recovery``'s module docstring."""
    if facts.start_mark and facts.outcome and facts.same_generation:
        return Decision("adopt", "outcome_recorded",
                        take_checkpoint=facts.mode == "checkpoint"
                        and facts.checkpoint != "this_call")
    if not facts.start_mark:
        return Decision("run", "no_start_mark")
    if facts.tool == "bash" and not facts.key:
        return Decision("run", "no_key")
    if needs_ledger(facts):
        if facts.ledger is None:
            raise ValueError(f"decide needs the ledger's state of the last key ({facts}); "
                             "ask exec_status when needs_ledger(facts) is true")
        if facts.ledger == "running":
            return Decision("reattach", "running")
        if facts.ledger == "exited":
            return Decision("replay", "exited")
        if facts.ledger == "unknown":
            return Decision("run", "key_unknown")
        return _unknown(facts, "fenced" if facts.ledger == "fenced" else "daemon_lost")
    return _unknown(facts, "file_cut" if facts.same_generation else "space_lost")


def _unknown(facts: Facts, cause: Cause) -> Decision:
    """The outcome is unknown: revert (transactional) or restore (checkpoint)."""
    if facts.mode == "transactional":
        return Decision("revert", cause)
    source: Literal["checkpoint", "image"] = (
        "image" if facts.checkpoint == "none" else "checkpoint")
    rerun = facts.tool == "file" or facts.replay == "safe"
    return Decision("restore_rerun" if rerun else "restore_interrupt", cause,
                    restore_from=source)


def consistent(facts: Facts) -> bool:
    """Whether the log and the ledger can say ``facts`` together: an outcome, a generation
    and a key belong to a start mark, a key to bash, and the ledger is asked exactly when
    ``needs_ledger``."""
    if not facts.start_mark and (facts.outcome or facts.same_generation or facts.key):
        return False
    if facts.tool == "file" and facts.key:
        return False
    return (facts.ledger is not None) == needs_ledger(facts)


def all_facts(replays: tuple[Replay, ...] = ("safe", "never")) -> Iterator[Facts]:
    """Every consistent ``Facts`` (with the given replay rules)."""
    yes_no = (True, False)
    domains: dict[str, tuple[Any, ...]] = {
        "mode": get_args(Mode), "tool": get_args(ToolKind), "replay": replays,
        "start_mark": yes_no, "outcome": yes_no, "same_generation": yes_no, "key": yes_no,
        "ledger": (None, *get_args(LedgerState)), "checkpoint": get_args(CheckpointFact)}
    names = [f.name for f in fields(Facts)]
    for values in itertools.product(*(domains[n] for n in names)):
        facts = Facts(**dict(zip(names, values, strict=True)))
        if consistent(facts):
            yield facts
