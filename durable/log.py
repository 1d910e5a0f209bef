"""The durable log: conversations, entries, tool-call slots and documents over a storage.

The ``Log`` keeps the committed state in memory and changes it only after the storage has
committed a batch, so nothing is ever visible that is not durable. It is the single writer
of its storage within a process: every transaction runs under one lock, allocates ids from
the counter, and is committed whole. A commit whose outcome is uncertain
(``StorageUncertain``) closes the log: the in-memory state might no longer match the
storage, and serving it would be serving a half-state. Reopen to continue.

Fork history: a conversation forked at entry E of its parent reads the parent's history up
to E (recursively), then its own entries.
"""

from __future__ import annotations

import copy
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import Any

from .docs import Doc, defined_docs, updated
from .errors import (
    DocConflict,
    DocError,
    StorageClosed,
    StorageUncertain,
    UnknownEntryKind,
)
from .storage.base import Storage
from .storage.records import (
    Batch,
    ConversationRecord,
    DocRecord,
    EntryRecord,
    RequestRecord,
    SlotRecord,
)

ENTRY_KINDS = ("input", "assistant", "tool_result", "system")
ROOT_CONVERSATION = 1


def now_ms() -> int:
    return int(time.time() * 1000)


@dataclass(frozen=True)
class DocValue:
    value: Any
    revision: int
    #: The log position of the write that produced this value (0 for the initial value).
    at: int = 0


class Transaction:
    """One atomic batch under construction. Obtain with ``Log.transaction()``."""

    def __init__(self, log: Log) -> None:
        self._log = log
        self._next = log.next_id
        self.batch = Batch(base_id=log.next_id, next_id=log.next_id)
        self._doc_revs: dict[tuple[int, str], int] = {}
        self._staged_docs: dict[tuple[int, str], Any] = {}

    def _alloc(self) -> int:
        i = self._next
        self._next += 1
        self.batch.next_id = self._next
        return i

    def new_conversation(
        self, agent: str, *, parent: int | None = None, parent_entry: int | None = None
    ) -> int:
        cid = self._alloc()
        self.batch.conversations.append(
            ConversationRecord(cid, agent, parent, parent_entry, now_ms())
        )
        return cid

    def append(self, conversation: int, kind: str, data: dict[str, Any]) -> int:
        if kind not in ENTRY_KINDS:
            raise UnknownEntryKind(f"entry kind {kind!r} is not one of {ENTRY_KINDS}")
        if not self._log.has_conversation(conversation) and not any(
            c.id == conversation for c in self.batch.conversations
        ):
            raise ValueError(f"conversation {conversation} does not exist")
        eid = self._alloc()
        self.batch.entries.append(
            EntryRecord(eid, conversation, kind, copy.deepcopy(data), now_ms()))
        return eid

    def put_slot(self, slot: SlotRecord) -> None:
        self.batch.slots = [
            s for s in self.batch.slots
            if (s.conversation, s.call_id) != (slot.conversation, slot.call_id)
        ]
        self.batch.slots.append(replace(slot, updated_ms=now_ms()))

    def admit(self, conversation: int, request_id: str, entry: int) -> None:
        self.batch.requests.append(RequestRecord(conversation, request_id, entry))

    def write_doc(
        self, conversation: int, doc: Doc, value: Any, *, expect_revision: int | None = None
    ) -> int:
        """Stage a write of ``doc``; returns the revision it will have."""
        doc.encode(value)
        key = (conversation, doc.kind)
        current = self._doc_revs.get(key)
        if current is None:
            current = self._log.read_doc(conversation, doc).revision
        if expect_revision is not None and expect_revision != current:
            raise DocConflict(
                f"document {doc.kind!r} of conversation {conversation} is at revision "
                f"{current}, expected {expect_revision}: another edit landed first; read it again"
            )
        rev = current + 1
        self._doc_revs[key] = rev
        self._staged_docs[key] = copy.deepcopy(value)
        self.batch.docs.append(
            DocRecord(conversation, doc.kind, doc.version, rev, copy.deepcopy(value), 0,
                      doc.history)
        )
        return rev

    def staged_doc(self, conversation: int, doc: Doc) -> tuple[bool, Any]:
        key = (conversation, doc.kind)
        if key in self._staged_docs:
            return True, copy.deepcopy(self._staged_docs[key])
        return False, None

    def read_doc(self, conversation: int, doc: Doc) -> Any:
        """The value of ``doc`` as this transaction would leave it."""
        found, value = self.staged_doc(conversation, doc)
        return value if found else self._log.read_doc(conversation, doc).value

    @property
    def last_id(self) -> int:
        """The highest id this transaction allocated so far (or the log's last id)."""
        return self._next - 1


class Log:
    """Committed state of one log, in memory, over a ``Storage``."""

    def __init__(self, storage: Storage) -> None:
        self.storage = storage
        self._lock = threading.RLock()
        self._closed = False
        self._load()

    @classmethod
    def open(cls, storage: Storage) -> Log:
        return cls(storage)

    # ------------------------------------------------------------------ state

    def _load(self) -> None:
        snap = self.storage.load()
        self.next_id = snap.next_id
        self._conversations: dict[int, ConversationRecord] = {}
        self._entries: dict[int, list[EntryRecord]] = {}
        self._entry_by_id: dict[int, EntryRecord] = {}
        self._slots: dict[int, dict[str, SlotRecord]] = {}
        self._docs: dict[tuple[int, str], list[DocRecord]] = {}
        self._requests: dict[tuple[int, str], int] = {}
        self._apply(snap.conversations, snap.entries, snap.slots, snap.docs, snap.requests)

    def _apply(
        self,
        conversations: list[ConversationRecord],
        entries: list[EntryRecord],
        slots: list[SlotRecord],
        docs: list[DocRecord],
        requests: list[RequestRecord],
    ) -> None:
        for c in conversations:
            self._conversations[c.id] = c
            self._entries.setdefault(c.id, [])
        for e in entries:
            if e.kind not in ENTRY_KINDS:
                raise UnknownEntryKind(
                    f"the log holds entry {e.id} of kind {e.kind!r}, unknown to this version "
                    f"(known: {ENTRY_KINDS}); upgrade the code that reads this log"
                )
            self._entries.setdefault(e.conversation, []).append(e)
            self._entry_by_id[e.id] = e
        for s in slots:
            self._slots.setdefault(s.conversation, {})[s.call_id] = s
        for d in docs:
            history = self._docs.setdefault((d.conversation, d.kind), [])
            if d.history == "latest":
                history.clear()
            history.append(d)
        for r in requests:
            self._requests[(r.conversation, r.request_id)] = r.entry

    def _check_open(self) -> None:
        if self._closed:
            raise StorageClosed("this log is closed; open it again to continue")

    @property
    def closed(self) -> bool:
        return self._closed

    def close(self) -> None:
        with self._lock:
            if not self._closed:
                self._closed = True
                self.storage.close()

    # ------------------------------------------------------------------ writes

    @contextmanager
    def transaction(self) -> Iterator[Transaction]:
        """Build and commit one batch atomically. Raising inside the block commits nothing."""
        with self._lock:
            self._check_open()
            tx = Transaction(self)
            yield tx
            self._commit(tx)

    def _commit(self, tx: Transaction) -> None:
        batch = tx.batch
        if batch.is_empty():
            return
        # The entry the documents are read as of (``read_doc(as_of=)``, a fork's copy): the
        # transaction's first, when it appended any, so that a fork at an entry sees what
        # was committed with it (a result's documents, with recovery events after it in one
        # transaction); else the entry before them.
        at = batch.base_id if batch.next_id > batch.base_id else batch.base_id - 1
        batch.docs = [replace(d, at=at) for d in batch.docs]
        try:
            self.storage.commit(batch)
        except StorageUncertain:
            self._closed = True
            try:
                self.storage.close()
            finally:
                raise
        self.next_id = batch.next_id
        self._apply(batch.conversations, batch.entries, batch.slots, batch.docs, batch.requests)

    def create_root(self, agent: str) -> int:
        with self._lock:
            if ROOT_CONVERSATION in self._conversations:
                return ROOT_CONVERSATION
            with self.transaction() as tx:
                cid = tx.new_conversation(agent)
            if cid != ROOT_CONVERSATION:
                raise DocError(f"root conversation got id {cid}; the log was not empty")
            return cid

    def fork(self, conversation: int, at_entry: int, *, agent: str | None = None) -> int:
        """Create a conversation forked from ``conversation`` at ``at_entry`` (an entry in its
        history) and copy its documents by each definition's fork rule."""
        with self._lock:
            parent = self.conversation(conversation)
            if at_entry not in {e.id for e in self.entries(conversation)}:
                raise ValueError(
                    f"entry {at_entry} is not in the history of conversation {conversation}"
                )
            with self.transaction() as tx:
                cid = tx.new_conversation(
                    agent or parent.agent, parent=conversation, parent_entry=at_entry
                )
                for doc in defined_docs():
                    if doc.fork == "initial" or (conversation, doc.kind) not in self._docs:
                        continue
                    as_of = at_entry if doc.fork == "as_of" else None
                    value = self.read_doc(conversation, doc, as_of=as_of)
                    if value.revision:
                        tx.write_doc(cid, doc, value.value)
            return cid

    # ------------------------------------------------------------------ reads

    def has_conversation(self, conversation: int) -> bool:
        return conversation in self._conversations

    def conversation(self, conversation: int) -> ConversationRecord:
        try:
            return self._conversations[conversation]
        except KeyError:
            raise ValueError(f"conversation {conversation} does not exist in this log") from None

    def conversations(self) -> list[ConversationRecord]:
        return sorted(self._conversations.values(), key=lambda c: c.id)

    def entry(self, entry_id: int) -> EntryRecord:
        return self._entry_by_id[entry_id]

    def entries(self, conversation: int, *, upto: int | None = None) -> list[EntryRecord]:
        """The history of ``conversation``: its ancestors' entries up to each fork point, then
        its own, optionally cut at entry id ``upto``."""
        with self._lock:
            c = self.conversation(conversation)
            out: list[EntryRecord] = []
            if c.parent_conversation is not None:
                assert c.parent_entry is not None
                out = self.entries(c.parent_conversation, upto=c.parent_entry)
            out.extend(self._entries.get(conversation, []))
            if upto is not None:
                out = [e for e in out if e.id <= upto]
            return out

    def last_entry(self, conversation: int,
                   where: Callable[[EntryRecord], bool]) -> EntryRecord | None:
        """The newest entry of ``conversation``'s history (as ``entries`` gives it) for which
        ``where`` holds, found walking back from the end: a step of the loop costs what it
        looks at, not the length of the session."""
        with self._lock:
            c = self.conversation(conversation)
            upto: int | None = None
            while True:
                for e in reversed(self._entries.get(c.id, [])):
                    if (upto is None or e.id <= upto) and where(e):
                        return e
                if c.parent_conversation is None:
                    return None
                upto = c.parent_entry
                c = self.conversation(c.parent_conversation)

    def slot(self, conversation: int, call_id: str) -> SlotRecord | None:
        return self._slots.get(conversation, {}).get(call_id)

    def slots(self, conversation: int) -> list[SlotRecord]:
        return list(self._slots.get(conversation, {}).values())

    def request_entry(self, conversation: int, request_id: str) -> int | None:
        return self._requests.get((conversation, request_id))

    def read_doc(self, conversation: int, doc: Doc, *, as_of: int | None = None,
                 fresh: bool = False) -> DocValue:
        """The value of ``doc`` in ``conversation`` (migrated to the code's version).

        ``as_of`` an entry id reads the value as it was right after that entry (a
        transaction's documents count as written with its first entry); it needs a
        rewindable document. ``fresh`` reads it from the storage first, with what other
        processes committed (``refresh_doc``); otherwise this log's view is read.
        """
        with self._lock:
            if fresh:
                self._refresh(conversation, doc)
            history = self._docs.get((conversation, doc.kind), [])
            if as_of is not None:
                if doc.history != "rewindable":
                    raise DocError(
                        f"document {doc.kind!r} keeps only its latest value; define it with "
                        "history='rewindable' to read it as_of an entry"
                    )
                history = [d for d in history if d.at <= as_of]
            if not history:
                return DocValue(doc.initial_value(), 0, 0)
            last = history[-1]
            value = doc.decode(copy.deepcopy(last.value), last.version)
            return DocValue(value, last.revision, last.at)

    def refresh_doc(self, conversation: int, doc: Doc) -> DocValue:
        """Read ``doc`` again from the storage: another process (an app beside a running
        session) may have written it since this log last looked."""
        return self.read_doc(conversation, doc, fresh=True)

    def _refresh(self, conversation: int, doc: Doc) -> None:
        self._check_open()
        stored = self.storage.load_docs(conversation, doc.kind)
        mine = self._docs.get((conversation, doc.kind), [])
        if stored and (not mine or stored[-1].revision >= mine[-1].revision):
            self._docs[(conversation, doc.kind)] = stored

    def update_doc(
        self,
        conversation: int,
        doc: Doc,
        fn: Callable[[Any], Any],
        *,
        expect_revision: int | None = None,
        attempts: int = 100,
    ) -> DocValue:
        """Apply ``fn`` to the current value and commit the result.

        ``fn`` gets a copy of the value (a draft) and returns the new value, or changes the
        draft in place and returns None (``lambda d: d["items"].append(x)``). It runs outside
        any lock on the revision it read; when another edit landed first (in this process or
        another: the value is read again from the storage then) it is called again on the
        new value. With ``expect_revision``, a mismatch with the stored revision raises
        ``DocConflict`` instead.
        """
        for _ in range(attempts):
            current = self.read_doc(conversation, doc)
            if expect_revision is not None and current.revision != expect_revision:
                current = self.refresh_doc(conversation, doc)  # this view may lag
                if current.revision != expect_revision:
                    raise DocConflict(
                        f"document {doc.kind!r} of conversation {conversation} is at "
                        f"revision {current.revision}, expected {expect_revision}; read it "
                        "again"
                    )
            new_value = updated(fn, current.value)
            try:
                with self.transaction() as tx:
                    tx.write_doc(conversation, doc, new_value, expect_revision=current.revision)
            except DocConflict:
                if expect_revision is not None:
                    raise
                self.refresh_doc(conversation, doc)
                continue
            return self.read_doc(conversation, doc)
        raise DocConflict(
            f"document {doc.kind!r} kept changing under update_doc ({attempts} attempts)"
        )

    def watch_doc(self, conversation: int, doc: Doc, *, after: int = 0,
                  interval: float = 0.1, stop: threading.Event | None = None,
                  timeout: float | None = None) -> Iterator[DocValue]:
        """The revisions of ``doc`` after revision ``after``, in order, as they are
        committed by any process (the storage is polled every ``interval`` seconds), until
        ``stop`` is set or ``timeout`` seconds have passed. A rewindable document yields
        every revision; a ``latest`` one keeps only its newest, so a watcher that polls
        slower than it changes sees the newest at each look."""
        seen = after
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            for rec in self.storage.load_docs(conversation, doc.kind):
                if rec.revision > seen:
                    seen = rec.revision
                    yield DocValue(doc.decode(copy.deepcopy(rec.value), rec.version),
                                   rec.revision, rec.at)
            if stop is not None and stop.is_set():
                return
            if deadline is not None and time.monotonic() >= deadline:
                return
            if stop is not None:
                stop.wait(interval)
            else:
                time.sleep(interval)
