"""What the adapter keeps in the log: its documents and recovery events, as dataclasses.

``cua.space`` (``SpaceState``; rewindable, forks read it as of the fork entry) is the
conversation's Space state: which Space serves it, its generation (bumped, and committed,
*before* a Space is created, so a command started in an earlier generation is known to be
lost with it), whether the Space was brought to the log's state (``ready``), the mode and
why, and the newest recorded checkpoint (``CheckpointMark``).

``cua.call`` (``CallRecord``; latest only) is the record of the wrapped call in flight: its
start mark (commands started, with their idempotency keys and the Space generation) and, in
checkpoint mode, its outcome once recorded. Calls run one at a time per Space, so one record
suffices; recovery reads it to learn how far the interrupted call got.

``cua.space.image`` (``ImageState``) says how big the image is, and why it went stale when
it can no longer follow the workspace.

Each dataclass's ``to_json`` is the stored form, key for key and in the same order as the
dicts written before these classes existed, so old logs read unchanged and a value read and
written back encodes to the same bytes. ``Stored`` reads and writes one document as its
dataclass, in the log, a transaction or a call's staged edits.

Recovery events are hidden system entries (``{"hidden": true, "recovery": {...}}``, the
``RecoveryEvent`` as JSON), so they are in the log beside the calls they concern and the
campaign can count them (``chaos.campaign.coverage.cell_of``). ``tool``, ``cause`` and
``epoch`` came later: entries written before them read with None.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Generic, Literal, TypeVar

from ..docs import Doc, define_doc
from ..record_codec import OMIT_NONE, JsonRecord
from ..tools import ToolResult
from .snapshots import CheckpointRef

if TYPE_CHECKING:
    from ..log import Log, Transaction
    from ..tools import CallContext

Mode = Literal["transactional", "checkpoint"]
EventKind = Literal[
    "adopted", "reattached", "replayed", "ran", "restored", "reverted", "reimaged",
    "interrupted", "mode",
]
#: Why a recovery decision was taken: what recovery found (``decide`` takes them).
Cause = Literal[
    # the outcome is known, or nothing happened yet
    "outcome_recorded",  # the outcome was committed before the crash (checkpoint mode)
    "running",           # the ledger says the command is still running
    "exited",            # the ledger recorded the command's own exit
    "no_start_mark",     # the call's start mark is not in the log: it never reached the Space
    "no_key",            # a bash start mark without a command key: nothing was started
    "key_unknown",       # the ledger never saw the key: it never reached the Space
    # the outcome is unknown: revert or restore
    "daemon_lost",       # the ledger says lost: gone with its daemon, without an exit status
    "fenced",            # the command was killed by a newer epoch's advance
    "space_lost",        # the Space generation changed (also a rebuilt Space's: it was lost)
    "file_cut",          # a write or edit cut off: it may have partly changed the workspace
    # a rebuilt Space's only
    "unfinished",        # a rebuild a crash cut short (same generation)
    "new_space",         # the conversation's first Space of its own (new, or a fork's)
]
#: Why ``auto`` switched a conversation to checkpoint mode (``mode`` events).
ModeCause = Literal["over_limits", "image_stale", "process_running"]
RECOVERY_KEY = "recovery"


@dataclass(frozen=True)
class CheckpointMark(JsonRecord):
    """The newest checkpoint ``cua.space`` records."""

    space: str
    id: str
    #: The call it follows; None for a base checkpoint (taken before a first call).
    call_id: str | None = None
    #: The result entry it was recorded with; None until that result is committed.
    entry: int | None = None

    @property
    def ref(self) -> CheckpointRef:
        return CheckpointRef(self.space, self.id)



@dataclass(frozen=True)
class SpaceState(JsonRecord):
    """``cua.space``."""

    space: str | None = None
    generation: int = 0
    ready: bool = False
    mode: Mode | None = None
    mode_reason: str | None = None
    checkpoint: CheckpointMark | None = None
    #: The id of the Space that holds the log's state (``SpaceClient.describe``), recorded
    #: when it was adopted or rebuilt: a Space made again under the name has another id.
    #: None in logs written before ids, and for a daemon that has none (absent from the
    #: JSON then: old documents encode as they were).
    space_id: str | None = field(default=None, metadata=OMIT_NONE)


@dataclass(frozen=True)
class ImageState(JsonRecord):
    """``cua.space.image``: the image's size, and why it is stale (None while it is not)."""

    stale: str | None = None
    files: int = 0
    bytes: int = 0


@dataclass(frozen=True)
class CommandMark(JsonRecord):
    """A command a call started: its idempotency key, the epoch and its number in the call."""

    key: str
    epoch: int
    n: int


@dataclass(frozen=True)
class CallRecord(JsonRecord):
    """``cua.call``: the start mark of the wrapped call in flight, then its outcome."""

    call_id: str
    tool: str
    #: The Space generation it started in.
    generation: int
    commands: tuple[CommandMark, ...] = ()
    outcome: ToolResult | None = None


def _call_from_json(raw: dict[str, Any] | None) -> CallRecord | None:
    return None if raw is None else CallRecord.from_json(raw)


def _call_to_json(record: CallRecord | None) -> dict[str, Any] | None:
    return None if record is None else record.to_json()


SPACE_DOC = define_doc("cua.space", 1, SpaceState().to_json(), history="rewindable",
                       fork="as_of")
IMAGE_DOC = define_doc("cua.space.image", 1, ImageState().to_json(), history="rewindable",
                       fork="as_of")
CALL_DOC = define_doc("cua.call", 1, None)

T = TypeVar("T")


@dataclass(frozen=True)
class Stored(Generic[T]):
    """One document, read and written as its dataclass."""

    doc: Doc
    load: Callable[[Any], T]
    dump: Callable[[T], Any]

    def read(self, log: Log, conversation: int, *, as_of: int | None = None) -> T:
        """The committed value (``as_of`` an entry: as it was right after it)."""
        return self.load(log.read_doc(conversation, self.doc, as_of=as_of).value)

    def read_in(self, tx: Transaction, conversation: int) -> T:
        """The value as ``tx`` would leave it (its own writes included)."""
        return self.load(tx.read_doc(conversation, self.doc))

    def write(self, tx: Transaction, conversation: int, value: T) -> None:
        tx.write_doc(conversation, self.doc, self.dump(value))

    def staged(self, ctx: CallContext) -> T:
        """The value as the call sees it (its staged edits included)."""
        return self.load(ctx.read_doc(self.doc))

    def stage(self, ctx: CallContext, value: T) -> None:
        """Stage ``value``: it is committed with the call's result (or ``commit_now``)."""
        ctx.write_doc(self.doc, self.dump(value))


SPACE: Stored[SpaceState] = Stored(SPACE_DOC, SpaceState.from_json, SpaceState.to_json)
IMAGE_STATE: Stored[ImageState] = Stored(IMAGE_DOC, ImageState.from_json, ImageState.to_json)
CALL: Stored[CallRecord | None] = Stored(CALL_DOC, _call_from_json, _call_to_json)


@dataclass(frozen=True)
class RecoveryEvent(JsonRecord):
    kind: EventKind
    mode: str | None
    call_id: str | None = None
    detail: str = ""
    conversation: int | None = None
    #: The wrapped tool (bash, write, edit), or ``space`` for a rebuilt Space (and for a mode
    #: switched when the Space was adopted, outside any call).
    tool: str | None = None
    #: ``Cause`` (``ModeCause`` for a mode switch).
    cause: str | None = None
    #: The epoch of the driver that decided.
    epoch: int | None = None

    def to_entry(self) -> dict[str, Any]:
        return {"hidden": True, RECOVERY_KEY: self.to_json()}

    @classmethod
    def from_entry(cls, data: dict[str, Any]) -> RecoveryEvent:
        """The event a recovery entry holds (one written before ``tool``, ``cause`` and
        ``epoch`` existed reads with None there)."""
        return cls.from_json(data[RECOVERY_KEY])
