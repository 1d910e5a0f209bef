"""Reading a Space's state back for audits, with no daemon: ``read_state(state_dir)``.

A checker proves what happened inside a Space from the files the daemon keeps: the exec
ledger (which keys were recorded, under which epoch), each key's claim (did a shim ever
start it) and exit file, the daemon's ``end`` records (kills, fences) and the fence journal
(what was alive of an older epoch at each advance, restore and start-up sweep). It reads a
daemon's state directory or a copy of it (``save_state`` of a provider copies exactly the
files named by ``protocol.is_audit_file``), and never writes to it.

The parsing is the daemon's own (``journal.load``, ``exec_ledger.replay`` and
``recorded_end``, ``exec_files.read_claim``, ``epoch_fence.read_floor``), so the audit and
the daemon cannot disagree about what a file says. What the audit does not do is look at
processes: whether a key still runs is for the live daemon (``exec_status``) to say.
"""

from __future__ import annotations

import os
from collections import Counter
from dataclasses import asdict, dataclass
from typing import Any

from . import exec_files, journal
from .epoch_fence import read_floor
from .exec_ledger import recorded_end, replay
from .protocol import STATE_EPOCH, STATE_EXEC_DIR, STATE_FENCES, STATE_LEDGER, STATE_SPACE_ID


@dataclass(frozen=True)
class KeyAudit:
    """One key of the ledger, as its files tell it."""

    key: str
    command: str
    cwd: str
    epoch: int
    started_ms: int
    #: A shim claimed the key (so the command was started); False when the claim says
    #: ``lost`` (it never will be) or there is no claim.
    spawned: bool
    #: How it ended (the exit file, else the daemon's ``end`` record); all None when no end
    #: is recorded (still running, or lost).
    exit_code: int | None = None
    signal: int | None = None
    ended_ms: int | None = None
    #: The epoch whose fence killed it, when that is how it ended.
    fenced_by: int | None = None
    #: How many start records the ledger holds for the key: more than one means it was
    #: started again under the same key (the ledger never must).
    starts: int = 1


@dataclass(frozen=True)
class StateAudit:
    #: The epoch floor.
    floor: int
    #: Every key, in the ledger's order.
    keys: list[KeyAudit]
    #: The fence journal's records as stored (see ``fence_journal``), in order.
    fences: list[dict[str, Any]]
    #: Which Space the state is of (``space_identity``); None for state older than ids.
    space_id: str | None = None

    def to_json(self) -> dict[str, Any]:
        out = {"floor": self.floor, "keys": [asdict(k) for k in self.keys],
               "fences": list(self.fences)}
        if self.space_id is not None:  # absent before ids: old records read as they were
            out["space_id"] = self.space_id
        return out

    def key(self, key: str) -> KeyAudit:
        """The audit of ``key``; KeyError if the ledger never recorded it."""
        for k in self.keys:
            if k.key == key:
                return k
        raise KeyError(f"key {key!r} is not in the ledger; recorded: "
                       f"{[k.key for k in self.keys]}")


def read_state(state_dir: str) -> StateAudit:
    """The audit of the daemon state in ``state_dir`` (missing files read as empty)."""
    if not os.path.isdir(state_dir):
        raise FileNotFoundError(f"{state_dir!r} is not a directory; give a daemon's state "
                                "directory or a copy made by a provider's save_state")
    exec_dir = os.path.join(state_dir, STATE_EXEC_DIR)
    keys = []
    records = journal.load(os.path.join(state_dir, STATE_LEDGER)).records
    starts = Counter(r.get("key") for r in records if r.get("t") == "start")
    for rec in replay(records).values():
        end = recorded_end(rec, exec_dir)
        status, fenced_by = end if end is not None else (None, None)
        keys.append(KeyAudit(
            key=rec.key, command=rec.command, cwd=rec.cwd, epoch=rec.epoch,
            started_ms=rec.started_ms,
            # a damaged claim may be the shim's: count it as started (G2 is conservative)
            spawned=isinstance(claim := exec_files.read_claim(rec.file(exec_dir, ".claim")),
                               exec_files.Claim) or claim == exec_files.DAMAGED,
            exit_code=status.exit_code if status else None,
            signal=status.signal if status else None,
            ended_ms=status.ended_ms if status else None,
            fenced_by=fenced_by,
            starts=starts[rec.key],
        ))
    try:
        with open(os.path.join(state_dir, STATE_SPACE_ID)) as f:
            space_id: str | None = f.read().strip() or None
    except FileNotFoundError:
        space_id = None
    return StateAudit(read_floor(os.path.join(state_dir, STATE_EPOCH)), keys,
                      journal.load(os.path.join(state_dir, STATE_FENCES)).records, space_id)
