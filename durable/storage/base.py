"""The storage contract, its shared checks, and ``MemoryStorage`` (the reference semantics).

A storage persists ``Batch``es atomically and returns everything on ``load``. All three
storages (memory, SQLite, JSONL) pass one conformance suite (``tests/durable/
test_storage_conformance.py``); ``MemoryStorage`` is the reference the others are held to.

The invariants a storage enforces itself, because they must hold across processes that
each have their own in-memory ``Log``:

- id continuity: ``batch.base_id`` equals the stored counter (else ``LogConflict``), and
  the counter becomes ``batch.next_id``;
- request ids: a (conversation, request_id) pair is admitted once (else ``DuplicateRequest``);
- document revisions: a write carries the stored revision + 1 (else ``DocConflict``).

A batch that writes only documents (no conversation, entry, slot or request, no id) does not
need the counter to match: its revisions are its guard. So another process (an app) can
update a session's documents while the session runs and writes entries: each side's
writes are refused only when they meet on the same document. The storage stamps such a
batch's documents with its own position (``rebased``), not the writer's, which may lag.

``validate_batch`` implements all three against lookups the storage provides, so every
storage applies exactly the same rules.
"""

from __future__ import annotations

import copy
import threading
from collections.abc import Callable
from dataclasses import replace
from typing import Protocol, runtime_checkable

from ..errors import (
    DocConflict,
    DuplicateRequest,
    LogConflict,
    StorageClosed,
    StorageError,
)
from .records import Batch, DocRecord, Snapshot


@runtime_checkable
class Storage(Protocol):
    """Where a log lives. Implementations: memory, SQLite, JSONL."""

    def load(self) -> Snapshot:
        """Everything committed so far. Raises ``StorageClosed`` after ``close``."""
        ...

    def commit(self, batch: Batch) -> None:
        """Persist ``batch`` atomically: all of it or nothing.

        Raises ``LogConflict``/``DuplicateRequest``/``DocConflict`` (nothing written),
        ``StaleEpochError`` for a fenced storage whose epoch is below the floor (nothing
        written), ``StorageUncertain`` when the outcome is unknown, ``StorageClosed`` after
        ``close``.
        """
        ...

    def load_docs(self, conversation: int, kind: str) -> list[DocRecord]:
        """The stored writes of one document, oldest first (only the newest for a
        ``latest`` document): what another process committed too."""
        ...

    def close(self) -> None:
        """Release the storage. Every later call raises ``StorageClosed``. Idempotent."""
        ...


def docs_only(batch: Batch) -> bool:
    """Whether ``batch`` writes only documents (allocates no id, touches nothing else)."""
    return bool(batch.docs) and batch.next_id == batch.base_id and not (
        batch.conversations or batch.entries or batch.slots or batch.requests)


def rebased(batch: Batch, next_id: int) -> Batch:
    """``batch`` as a storage at ``next_id`` commits it: a documents-only batch built on an
    older counter is moved onto the current one, its writes stamped at the newest entry."""
    if not docs_only(batch) or batch.base_id == next_id:
        return batch
    return replace(batch, base_id=next_id, next_id=next_id,
                   docs=[replace(d, at=next_id - 1) for d in batch.docs])


def validate_batch(
    batch: Batch,
    *,
    next_id: int,
    has_request: Callable[[int, str], bool],
    doc_revision: Callable[[int, str], int],
) -> None:
    """Check ``batch`` against the stored state; raise the matching error if it breaks a rule.

    ``has_request(conversation, request_id)`` tells whether the pair was admitted;
    ``doc_revision(conversation, kind)`` gives the stored revision (0 when never written).
    """
    if batch.base_id != next_id and not docs_only(batch):
        raise LogConflict(
            f"batch was built on id {batch.base_id} but the log is at {next_id}: another "
            "writer committed since this log was opened; reopen it"
        )
    if batch.next_id < batch.base_id:
        raise StorageError(f"batch next_id {batch.next_id} is below its base_id {batch.base_id}")
    used = [c.id for c in batch.conversations] + [e.id for e in batch.entries]
    for i in used:
        if not batch.base_id <= i < batch.next_id:
            raise StorageError(
                f"id {i} is outside the batch's range [{batch.base_id}, {batch.next_id})"
            )
    if len(set(used)) != len(used):
        raise StorageError("a batch used the same id twice")
    seen: set[tuple[int, str]] = set()
    for r in batch.requests:
        key = (r.conversation, r.request_id)
        if key in seen or has_request(*key):
            raise DuplicateRequest(
                f"request id {r.request_id!r} was already admitted in conversation "
                f"{r.conversation}"
            )
        seen.add(key)
    expected: dict[tuple[int, str], int] = {}
    for d in batch.docs:
        key = (d.conversation, d.kind)
        want = expected.get(key, doc_revision(*key)) + 1
        if d.revision != want:
            raise DocConflict(
                f"document {d.kind!r} of conversation {d.conversation} is at revision "
                f"{want - 1}, this write expected {d.revision - 1}: another edit landed first"
            )
        expected[key] = d.revision


class MemoryStorage:
    """A storage in memory: the reference semantics, for tests and ephemeral logs.

    Commits are atomic (validated first, then applied under a lock); ``load`` returns deep
    copies so callers cannot change what is stored.
    """

    def __init__(self) -> None:
        self._snap = Snapshot()
        self._requests: set[tuple[int, str]] = set()
        self._revisions: dict[tuple[int, str], int] = {}
        self._lock = threading.Lock()
        self._closed = False

    def _check_open(self) -> None:
        if self._closed:
            raise StorageClosed("this MemoryStorage is closed; create a new one")

    def load(self) -> Snapshot:
        with self._lock:
            self._check_open()
            return copy.deepcopy(self._snap)

    @property
    def next_id(self) -> int:
        with self._lock:
            return self._snap.next_id

    def load_docs(self, conversation: int, kind: str) -> list[DocRecord]:
        with self._lock:
            self._check_open()
            return [copy.deepcopy(d) for d in self._snap.docs
                    if (d.conversation, d.kind) == (conversation, kind)]

    def commit(self, batch: Batch) -> None:
        with self._lock:
            self._check_open()
            batch = rebased(batch, self._snap.next_id)
            validate_batch(
                batch,
                next_id=self._snap.next_id,
                has_request=lambda c, r: (c, r) in self._requests,
                doc_revision=lambda c, k: self._revisions.get((c, k), 0),
            )
            batch = copy.deepcopy(batch)
            s = self._snap
            s.next_id = batch.next_id
            s.conversations.extend(batch.conversations)
            s.entries.extend(batch.entries)
            by_key = {(x.conversation, x.call_id): i for i, x in enumerate(s.slots)}
            for slot in batch.slots:
                i = by_key.get((slot.conversation, slot.call_id))
                if i is None:
                    by_key[(slot.conversation, slot.call_id)] = len(s.slots)
                    s.slots.append(slot)
                else:
                    s.slots[i] = slot
            for d in batch.docs:
                self._keep_doc(d)
                self._revisions[(d.conversation, d.kind)] = d.revision
            s.requests.extend(batch.requests)
            self._requests.update((r.conversation, r.request_id) for r in batch.requests)

    def _keep_doc(self, d: DocRecord) -> None:
        docs = self._snap.docs
        if d.history == "latest":
            docs[:] = [x for x in docs if (x.conversation, x.kind) != (d.conversation, d.kind)]
        docs.append(d)

    def close(self) -> None:
        self._closed = True
