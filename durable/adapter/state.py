"""What the adapter keeps in the log: its documents and recovery events.

``cua.space`` (rewindable, forks read it as of the fork entry) is the conversation's Space
state: which Space serves it, its generation (bumped, and committed, *before* a Space is
created, so a command started in an earlier generation is known to be lost with it), whether
the Space was brought to the log's state (``ready``), the mode and why, and the newest
recorded checkpoint.

``cua.call`` (latest only) is the record of the wrapped call in flight: its start mark
(commands started, with their idempotency keys and the Space generation) and, in checkpoint
mode, its outcome once recorded. Calls run one at a time per Space, so one record suffices;
recovery reads it to learn how far the interrupted call got.

Recovery events are hidden system entries (``{"hidden": true, "recovery": {...}}``, the
``RecoveryEvent`` as JSON), so they are in the log beside the calls they concern and the
campaign can count them (``decide.cell_of``). ``tool``, ``cause`` and ``epoch`` came later:
entries written before them read with None.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Literal

from ..docs import define_doc

Mode = Literal["transactional", "checkpoint"]
EventKind = Literal[
    "adopted", "reattached", "replayed", "ran", "restored", "reverted", "reimaged",
    "interrupted", "mode",
]
RECOVERY_KEY = "recovery"

SPACE_DOC = define_doc(
    "cua.space",
    1,
    {"space": None, "generation": 0, "ready": False, "mode": None, "mode_reason": None,
     "checkpoint": None},
    history="rewindable",
    fork="as_of",
)
IMAGE_DOC = define_doc(
    "cua.space.image", 1, {"stale": None, "files": 0, "bytes": 0},
    history="rewindable", fork="as_of",
)
CALL_DOC = define_doc("cua.call", 1, None)


@dataclass(frozen=True)
class RecoveryEvent:
    kind: EventKind
    mode: str | None
    call_id: str | None = None
    detail: str = ""
    conversation: int | None = None
    #: The wrapped tool (bash, write, edit), or ``space`` for a rebuilt Space (and for a mode
    #: switched when the Space was adopted, outside any call).
    tool: str | None = None
    #: ``decide.Cause`` (``decide.ModeCause`` for a mode switch).
    cause: str | None = None
    #: The epoch of the driver that decided.
    epoch: int | None = None

    def to_entry(self) -> dict[str, Any]:
        return {"hidden": True, RECOVERY_KEY: asdict(self)}

    @classmethod
    def from_entry(cls, data: dict[str, Any]) -> RecoveryEvent:
        """The event a recovery entry holds (one written before ``tool``, ``cause`` and
        ``epoch`` existed reads with None there)."""
        return cls(**data[RECOVERY_KEY])


def call_record(call_id: str, tool: str, generation: int) -> dict[str, Any]:
    return {"call_id": call_id, "tool": tool, "generation": generation, "commands": [],
            "outcome": None}
