"""The plain records a log is made of, and the batch a commit writes.

A storage knows nothing about harnesses or tools: it keeps these records durably and commits
a ``Batch`` atomically. The ``Log`` (``durable.log``) allocates ids, validates, and keeps the
committed state in memory; a storage only has to persist, enforce the few invariants that
must hold across processes (id continuity, request-id uniqueness, document revisions) and
give everything back on ``load``.

Ids: one global counter shared by conversations and entries. It only grows, across reopen.
The root conversation is id 1. A batch says which ids it used: ``base_id`` (the first id it
may use, which must equal the storage's current counter) and ``next_id`` (the counter after
it). A batch whose ``base_id`` is not the storage's counter was built on a stale view of the
log and is refused with ``LogConflict``.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

from ..record_codec import JsonRecord

SlotState = Literal["pending", "running", "done"]
DocHistory = Literal["latest", "rewindable"]

#: Size limit of one encoded document value.
DOC_MAX_BYTES = 64 * 1024


@dataclass(frozen=True)
class ConversationRecord:
    id: int
    agent: str
    parent_conversation: int | None = None
    parent_entry: int | None = None
    created_ms: int = 0


@dataclass(frozen=True)
class EntryRecord:
    id: int
    conversation: int
    kind: str
    data: dict[str, Any]
    created_ms: int = 0


@dataclass(frozen=True)
class SlotRecord:
    """The state of one tool call. Upserted whole, keyed by (conversation, call_id)."""

    conversation: int
    call_id: str
    assistant_entry: int
    name: str
    args: dict[str, Any]
    replay: str
    state: SlotState
    result_entry: int | None = None
    progress: str = ""
    updated_ms: int = 0


@dataclass(frozen=True)
class DocRecord:
    """One write of a document.

    ``at`` is the log position the write takes effect at: the first entry its batch
    appended, or the highest id allocated before it when it appended none (``next_id -
    1``; written before 2026-12-03: always that). Reading ``as_of`` entry E sees the last
    write with ``at <= E``, so a fork at an entry sees the documents committed with it.
    ``revision`` counts writes of this (conversation, kind) from 1; a write must carry the
    stored revision + 1, else the storage raises ``DocConflict``. For ``history="latest"``
    a storage may keep only the newest write.
    """

    conversation: int
    kind: str
    version: int
    revision: int
    value: Any
    at: int
    history: DocHistory = "latest"


@dataclass(frozen=True)
class RequestRecord:
    """A request id admitted in a conversation, with the entry that admitted it."""

    conversation: int
    request_id: str
    entry: int


@dataclass
class Batch(JsonRecord):
    # A JSONL log's line holds its writer's epoch beside the batch (``storage.jsonl``).
    json_extra: ClassVar[Literal["refuse", "ignore"]] = "ignore"

    base_id: int
    next_id: int
    conversations: list[ConversationRecord] = field(default_factory=list)
    entries: list[EntryRecord] = field(default_factory=list)
    slots: list[SlotRecord] = field(default_factory=list)
    docs: list[DocRecord] = field(default_factory=list)
    requests: list[RequestRecord] = field(default_factory=list)

    def is_empty(self) -> bool:
        return not (self.conversations or self.entries or self.slots or self.docs or self.requests)



@dataclass
class Snapshot:
    """Everything a storage holds, as returned by ``Storage.load``.

    ``docs`` holds every kept write (all of them for rewindable documents, at least the
    newest for latest-only ones), in commit order. ``slots`` holds the newest state of each
    slot.
    """

    next_id: int = 1
    conversations: list[ConversationRecord] = field(default_factory=list)
    entries: list[EntryRecord] = field(default_factory=list)
    slots: list[SlotRecord] = field(default_factory=list)
    docs: list[DocRecord] = field(default_factory=list)
    requests: list[RequestRecord] = field(default_factory=list)


def encode_json(value: Any) -> str:
    """The one JSON encoding used for stored values (compact, key order kept). A string
    holding a lone surrogate (a file name's bytes that are not UTF-8, as ``os.fsdecode``
    carries them) is written escaped (``\\udce9``), which every storage can hold and
    ``json.loads`` gives back exactly; everything else is kept as its UTF-8 text."""
    text = json.dumps(value, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    if not text.isascii() and _SURROGATE.search(text):
        return json.dumps(value, separators=(",", ":"), ensure_ascii=True, allow_nan=False)
    return text


_SURROGATE = re.compile("[\ud800-\udfff]")
