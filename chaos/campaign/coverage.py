"""The campaign's coverage of the adapter's recovery table: which rows (*cells*) a crash
campaign can reach, and which a campaign's runs did.

A *cell* is (mode, event kind, tool kind, cause): ``cell_of`` maps a recovery event the
adapter recorded to its cell, ``table_cells`` is every cell the adapter's tables
(``durable.adapter.decide``, ``durable.adapter.rebuild``) can produce, and
``REACHABLE_CELLS`` those a crash campaign with the coding tools can reach: the table's
minus the combinations the runner and the scenarios never make (``UNREACHABLE``, each with
its reason: facts about this campaign, not about the adapter). The SUMMARY's ``cells=K/N``
counts them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, get_args

from durable.adapter.decide import all_facts, decide
from durable.adapter.rebuild import all_rebuild_facts, decide_rebuild
from durable.adapter.state import Mode
from durable.tools import Replay

#: (mode, event kind, tool kind, cause): one row of the recovery table as events record it.
Cell = tuple[str, str, str, str]

#: The cell's mode of a Space rebuilt before the conversation's mode was decided.
UNDECIDED = "undecided"
#: The cell's tool kind of an event's tool.
TOOL_KINDS: dict[str, str] = {"bash": "bash", "write": "file", "edit": "file", "space": "space"}


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
