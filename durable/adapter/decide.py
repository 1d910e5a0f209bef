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
``cause``. A *cell* is (mode, event kind, tool kind, cause): ``cell_of`` maps a recorded
event to its cell and ``REACHABLE_CELLS`` is the set a crash campaign with the coding tools
can reach, derived from this table and the rebuild table minus the combinations that
cannot happen (each with its reason), so a campaign can say which rows it exercised
(``cells=K/N``).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, fields
from typing import Any, Literal, get_args

from spacesd.protocol import ExecInfo

from ..tools import Replay
from .rebuild import all_rebuild_facts, decide_rebuild
from .state import Cause, EventKind, Mode

ToolKind = Literal["bash", "file"]
LedgerState = Literal["running", "exited", "fenced", "lost", "unknown"]
#: The checkpoint ``cua.space`` records: none, one from before this call, or this call's.
CheckpointFact = Literal["none", "earlier", "this_call"]
Action = Literal["adopt", "reattach", "replay", "run", "revert", "restore_rerun",
                 "restore_interrupt"]
#: (mode, event kind, tool kind, cause): one row of the recovery table as events record it.
Cell = tuple[str, str, str, str]

#: The cell's mode of a Space rebuilt before the conversation's mode was decided.
UNDECIDED = "undecided"
#: The cell's tool kind of an event's tool.
TOOL_KINDS: dict[str, str] = {"bash": "bash", "write": "file", "edit": "file", "space": "space"}

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


# ---------------------------------------------------------------- cells


def cell_of(event: Mapping[str, Any]) -> Cell | None:
    """The cell of a recorded recovery event (its JSON, extra keys allowed), or None for an
    event that is not a recovery decision (a mode switch)."""
    if event["kind"] == "mode":
        return None
    tool, cause = event.get("tool"), event.get("cause")
    if tool not in TOOL_KINDS or cause is None:
        raise ValueError(
            f"recovery event {dict(event)!r} has no known tool or no cause: it was written "
            "before events carried them (or by another program); count cells only on logs "
            "written by this adapter")
    return (event["mode"] or UNDECIDED, event["kind"], TOOL_KINDS[tool], cause)


def table_cells(replays: tuple[Replay, ...] = ("safe", "never")) -> frozenset[Cell]:
    """Every cell ``decide`` and ``decide_rebuild`` can produce over consistent facts."""
    cells: set[Cell] = {(f.mode, kind, f.tool, d.cause)
                        for f in all_facts(replays) for d in (decide(f),) for kind in d.events}
    cells |= {(f.mode or UNDECIDED, kind, "space", d.cause)
              for f in all_rebuild_facts() for d in (decide_rebuild(f),) for kind in d.events}
    return frozenset(cells)


#: Cells of the table a campaign cannot reach, as patterns (``*`` matches anything), each
#: with the reason.
UNREACHABLE: tuple[tuple[Cell, str], ...] = (
    (("transactional", "adopted", "*", "*"),
     ("transactional mode records no outcome before the result: an outcome is recorded in "
      "checkpoint mode, or in the same transaction as auto's switch to checkpoint, and a "
      "conversation never switches back")),
    (("*", "ran", "bash", "no_key"),
     "a bash start mark is committed with its command key in the same record"),
    (("undecided", "*", "space", "*"),
     ("the runner seeds conversation 1's Space before the first driver, which adopts it at "
      "start and records the mode in the same commit; a Space is rebuilt only after that")),
    (("*", "*", "space", "new_space"),
     ("the adopted seeded Space is recorded before any fault can land (Space faults arm "
      "after the adoption), so only a fork's Space is a conversation's first: a campaign "
      "whose agent forks (the forks preset) reaches these cells, beyond the N of its "
      "cells=K/N")),
)

#: Reachable only by a conversation that ``auto`` switched to checkpoint mode: the switch
#: commits the outcome and the mode together, the checkpoint only lands with the result,
#: and a Space lost in between is rebuilt from the image (there is no checkpoint yet). A
#: conversation in checkpoint mode from the start records a base checkpoint when it adopts
#: its Space, so it always restores.
AUTO_ONLY: frozenset[Cell] = frozenset({
    ("checkpoint", "reimaged", "space", "space_lost"),
    ("checkpoint", "reimaged", "space", "unfinished"),
})


def _matches(pattern: Cell, cell: Cell) -> bool:
    return all(p in ("*", c) for p, c in zip(pattern, cell, strict=True))


#: The cells a crash campaign with the coding tools (bash, write, edit: all ``replay=
#: "never"``, write and edit being file tools) can reach, over both modes (``reachable_cells``
#: for one campaign's). ``replay`` only tells ``restore_rerun`` from ``restore_interrupt``
#: for bash, which the ``interrupted`` cell shows; file tools never end interrupted.
#:
#: ``reattached`` is reached in-process only: a new driver advances the epoch before it
#: asks the ledger, which kills every older command (``fenced``), so only the driver that
#: started a command finds it running, after its Space's daemon restarted. The client
#: retries a request through the restart, so that is nearly always the runner noting that
#: the command outlived the restart; recovery's own reattach needs the daemon to die
#: between an answer's headers and its body. Both record the cell (reattached, running).
REACHABLE_CELLS: frozenset[Cell] = frozenset(
    c for c in table_cells(("never",))
    if not any(_matches(pattern, c) for pattern, _why in UNREACHABLE))


def reachable_cells(durable_mode: str) -> frozenset[Cell]:
    """The cells a campaign whose adapter is built with ``mode=durable_mode`` can reach
    (``auto``: every cell, since it starts transactional and may switch)."""
    if durable_mode == "auto":
        return REACHABLE_CELLS
    if durable_mode not in get_args(Mode):
        raise ValueError(f"durable_mode must be 'auto', 'transactional' or 'checkpoint', "
                         f"got {durable_mode!r}")
    return frozenset(c for c in REACHABLE_CELLS if c[0] == durable_mode and c not in AUTO_ONLY)
