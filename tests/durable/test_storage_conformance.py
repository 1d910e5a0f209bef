"""One suite every storage must pass; ``MemoryStorage`` is the reference semantics.

Each test gets ``opener``: calling it opens the storage under test, ``opener.reopen(s)``
closes ``s`` and opens the same storage again, as a restarted process would (for memory,
whose contents live only in the object, "reopen" returns the same object). Every assertion
that matters after a commit is made again after a reopen, so the persistent storages are held
to what they read back from disk, not to what they keep in memory.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from durable.errors import (
    DocConflict,
    DuplicateRequest,
    LogConflict,
    StorageClosed,
    StorageError,
)
from durable.storage import (
    Batch,
    ConversationRecord,
    DocRecord,
    EntryRecord,
    JsonlStorage,
    MemoryStorage,
    RequestRecord,
    SlotRecord,
    Snapshot,
    SqliteStorage,
    Storage,
)


@dataclass
class Opener:
    kind: str
    path: Path
    opened: list[Storage] = field(default_factory=list)
    memory: MemoryStorage = field(default_factory=MemoryStorage)

    def __call__(self) -> Storage:
        if self.kind == "memory":
            storage: Storage = self.memory
        elif self.kind == "sqlite":
            storage = SqliteStorage(self.path / "log.sqlite")
        else:
            storage = JsonlStorage(self.path / "log")
        self.opened.append(storage)
        return storage

    def reopen(self, storage: Storage) -> Storage:
        if self.kind != "memory":
            storage.close()
        return self()


@pytest.fixture(params=["memory", "sqlite", "jsonl"])
def opener(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Opener]:
    o = Opener(request.param, tmp_path)
    yield o
    for storage in o.opened:
        storage.close()


# ---------------------------------------------------------------- records used below

ROOT = ConversationRecord(id=1, agent="main", created_ms=10)


def entry(i: int, conversation: int = 1, kind: str = "user", **data: object) -> EntryRecord:
    return EntryRecord(id=i, conversation=conversation, kind=kind, data=dict(data), created_ms=i)


def slot(call_id: str, state: str = "pending", result: int | None = None) -> SlotRecord:
    return SlotRecord(
        conversation=1,
        call_id=call_id,
        assistant_entry=2,
        name="bash",
        args={"command": f"echo {call_id}"},
        replay="never",
        state=state,  # type: ignore[arg-type]
        result_entry=result,
        progress=f"{call_id} {state}",
        updated_ms=7,
    )


def doc(kind: str, revision: int, at: int, history: str = "latest", **value: object) -> DocRecord:
    return DocRecord(
        conversation=1,
        kind=kind,
        version=1,
        revision=revision,
        value=dict(value),
        at=at,
        history=history,  # type: ignore[arg-type]
    )


def first_batch() -> Batch:
    """A mixed batch touching every table: conversation, entries, slot, doc, request."""
    return Batch(
        base_id=1,
        next_id=4,
        conversations=[ROOT],
        entries=[
            entry(2, text="hello", nested={"a": [1, 2.5, None, True]}),
            entry(3, kind="assistant"),
        ],
        slots=[slot("c1")],
        docs=[doc("plan", 1, at=3, steps=["a", "b"])],
        requests=[RequestRecord(conversation=1, request_id="r1", entry=2)],
    )


FIRST = Snapshot(
    next_id=4,
    conversations=[ROOT],
    entries=first_batch().entries,
    slots=[slot("c1")],
    docs=[doc("plan", 1, at=3, steps=["a", "b"])],
    requests=[RequestRecord(conversation=1, request_id="r1", entry=2)],
)


# ---------------------------------------------------------------- tests


def test_is_a_storage(opener: Opener) -> None:
    assert isinstance(opener(), Storage)


def test_new_storage_is_empty(opener: Opener) -> None:
    assert opener().load() == Snapshot()


def test_mixed_batch_lands_whole_and_reads_back_after_reopen(opener: Opener) -> None:
    s = opener()
    s.commit(first_batch())
    assert s.load() == FIRST
    assert opener.reopen(s).load() == FIRST


def test_load_returns_a_copy(opener: Opener) -> None:
    s = opener()
    s.commit(first_batch())
    snap = s.load()
    snap.entries[0].data["text"] = "changed"
    snap.entries.clear()
    assert s.load() == FIRST


def _refused_batch(problem: str) -> tuple[Batch, type[StorageError] | type[DocConflict]]:
    """A batch built on FIRST that touches every table and is refused for ``problem``."""
    batch = Batch(
        base_id=4,
        next_id=7,
        conversations=[ConversationRecord(4, "sub", parent_conversation=1, parent_entry=3)],
        entries=[entry(5, conversation=4), entry(6, kind="tool_result")],
        slots=[slot("c1", "done", result=6), slot("c2")],
        docs=[doc("plan", 2, at=6), doc("notes", 1, at=6, history="rewindable")],
        requests=[RequestRecord(conversation=1, request_id="r2", entry=5)],
    )
    if problem == "duplicate request id":
        batch.requests.append(RequestRecord(conversation=1, request_id="r1", entry=6))
        return batch, DuplicateRequest
    if problem == "doc revision conflict":
        batch.docs.append(doc("plan", 2, at=6))  # a second writer of revision 2
        return batch, DocConflict
    batch.base_id = 3  # built on a stale view
    return batch, LogConflict


@pytest.mark.parametrize(
    "problem", ["duplicate request id", "doc revision conflict", "stale base_id"]
)
def test_refused_batch_leaves_nothing_and_the_next_commit_works(
    opener: Opener, problem: str
) -> None:
    s = opener()
    s.commit(first_batch())
    bad, error = _refused_batch(problem)
    with pytest.raises(error):
        s.commit(bad)
    assert s.load() == FIRST
    s = opener.reopen(s)
    assert s.load() == FIRST

    good, _ = _refused_batch("stale base_id")
    good.base_id = 4
    s.commit(good)
    expected = Snapshot(
        next_id=7,
        conversations=FIRST.conversations + good.conversations,
        entries=FIRST.entries + good.entries,
        slots=[slot("c1", "done", result=6), slot("c2")],
        docs=[doc("plan", 2, at=6), doc("notes", 1, at=6, history="rewindable")],
        requests=FIRST.requests + good.requests,
    )
    assert s.load() == expected
    assert opener.reopen(s).load() == expected


def test_ids_keep_growing_across_reopen(opener: Opener) -> None:
    s = opener()
    s.commit(Batch(base_id=1, next_id=3, conversations=[ROOT], entries=[entry(2)]))
    s = opener.reopen(s)
    assert s.load().next_id == 3
    with pytest.raises(LogConflict, match="built on id 1 but the log is at 3"):
        s.commit(Batch(base_id=1, next_id=2, entries=[entry(1)]))
    s.commit(Batch(base_id=3, next_id=5, entries=[entry(3), entry(4)]))
    s = opener.reopen(s)
    snap = s.load()
    assert snap.next_id == 5
    assert [e.id for e in snap.entries] == [2, 3, 4]


def test_ids_outside_the_batch_range_are_refused(opener: Opener) -> None:
    s = opener()
    with pytest.raises(StorageError, match="outside the batch's range"):
        s.commit(Batch(base_id=1, next_id=2, conversations=[ROOT], entries=[entry(2)]))
    assert opener.reopen(s).load() == Snapshot()


def test_slot_upsert_keeps_the_newest_state_of_each_slot(opener: Opener) -> None:
    s = opener()
    s.commit(
        Batch(base_id=1, next_id=3, conversations=[ROOT], entries=[entry(2)],
              slots=[slot("a"), slot("b")])
    )
    s.commit(Batch(base_id=3, next_id=3, slots=[slot("a", "running")]))
    s.commit(Batch(base_id=3, next_id=4, entries=[entry(3)], slots=[slot("a", "done", result=3)]))
    expected = [slot("a", "done", result=3), slot("b")]  # first-insertion order, one per key
    assert s.load().slots == expected
    assert opener.reopen(s).load().slots == expected


def test_fork_records_read_back(opener: Opener) -> None:
    s = opener()
    s.commit(first_batch())
    fork = ConversationRecord(4, "forked", parent_conversation=1, parent_entry=3, created_ms=99)
    s.commit(Batch(base_id=4, next_id=6, conversations=[fork], entries=[entry(5, conversation=4)]))
    snap = opener.reopen(s).load()
    assert snap.conversations == [ROOT, fork]
    assert snap.entries[-1] == entry(5, conversation=4)


def test_rewindable_docs_keep_every_write_in_commit_order_latest_keeps_the_newest(
    opener: Opener,
) -> None:
    s = opener()
    s.commit(
        Batch(
            base_id=1,
            next_id=2,
            conversations=[ROOT],
            docs=[doc("image", 1, at=1, history="rewindable", n=1), doc("state", 1, at=1, n=1)],
        )
    )
    s.commit(Batch(base_id=2, next_id=3, entries=[entry(2)], docs=[doc("state", 2, at=2, n=2)]))
    s.commit(
        Batch(
            base_id=3,
            next_id=4,
            entries=[entry(3)],
            docs=[
                doc("image", 2, at=3, history="rewindable", n=2),
                doc("image", 3, at=3, history="rewindable", n=3),
                doc("state", 3, at=3, n=3),
            ],
        )
    )
    expected = [
        doc("image", 1, at=1, history="rewindable", n=1),
        doc("image", 2, at=3, history="rewindable", n=2),
        doc("image", 3, at=3, history="rewindable", n=3),
        doc("state", 3, at=3, n=3),
    ]
    assert s.load().docs == expected
    s = opener.reopen(s)
    assert s.load().docs == expected
    # Revisions continue from what is stored, also after reopen.
    with pytest.raises(DocConflict, match="at revision 3"):
        s.commit(Batch(base_id=4, next_id=4, docs=[doc("image", 3, at=3, history="rewindable")]))
    s.commit(Batch(base_id=4, next_id=4, docs=[doc("state", 4, at=3, n=4)]))
    assert opener.reopen(s).load().docs == expected[:3] + [doc("state", 4, at=3, n=4)]


def test_request_ids_are_admitted_once_across_reopen(opener: Opener) -> None:
    s = opener()
    s.commit(first_batch())
    s = opener.reopen(s)
    with pytest.raises(DuplicateRequest, match="'r1' was already admitted in conversation 1"):
        s.commit(
            Batch(base_id=4, next_id=5, entries=[entry(4)],
                  requests=[RequestRecord(conversation=1, request_id="r1", entry=4)])
        )
    with pytest.raises(DuplicateRequest):
        s.commit(
            Batch(
                base_id=4,
                next_id=6,
                entries=[entry(4), entry(5)],
                requests=[RequestRecord(1, "twice", 4), RequestRecord(1, "twice", 5)],
            )
        )
    # The same id in another conversation is a different request.
    s.commit(Batch(base_id=4, next_id=5, entries=[entry(4, conversation=2)],
                   requests=[RequestRecord(conversation=2, request_id="r1", entry=4)]))
    requests = opener.reopen(s).load().requests
    assert requests == [RequestRecord(1, "r1", 2), RequestRecord(2, "r1", 4)]


def test_close_rejects_everything(opener: Opener) -> None:
    s = opener()
    s.commit(first_batch())
    s.close()
    with pytest.raises(StorageClosed):
        s.load()
    with pytest.raises(StorageClosed):
        s.commit(Batch(base_id=4, next_id=5, entries=[entry(4)]))
    s.close()  # idempotent
    with pytest.raises(StorageClosed):
        s.load()


def test_a_value_that_is_not_json_is_refused_or_kept_whole(opener: Opener) -> None:
    """Persistent storages refuse a non-JSON value before writing anything; none stores half."""
    if opener.kind == "memory":
        pytest.skip("memory keeps any Python object: the reference has no encoding")
    s = opener()
    bad = Batch(base_id=1, next_id=3, conversations=[ROOT], entries=[entry(2, when=object())])
    with pytest.raises(StorageError, match="cannot be stored as JSON"):
        s.commit(bad)
    assert opener.reopen(s).load() == Snapshot()


def test_empty_batch_only_moves_the_counter(opener: Opener) -> None:
    s = opener()
    s.commit(Batch(base_id=1, next_id=1))
    s.commit(Batch(base_id=1, next_id=4))
    assert opener.reopen(s).load() == Snapshot(next_id=4)


def test_threads_of_one_process_share_a_storage(opener: Opener) -> None:
    """Each thread reads the counter and commits on it; the loser of a race gets LogConflict
    and retries. Every commit lands exactly once, with contiguous ids."""
    s = opener()
    s.commit(Batch(base_id=1, next_id=2, conversations=[ROOT]))

    def work(name: str) -> None:
        done = 0
        while done < 25:
            i = s.load().next_id
            try:
                s.commit(Batch(base_id=i, next_id=i + 1, entries=[entry(i, by=name)]))
                done += 1
            except LogConflict:
                pass

    threads = [threading.Thread(target=work, args=(f"t{n}",)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    snap = opener.reopen(s).load()
    assert [e.id for e in snap.entries] == list(range(2, 102))
    assert sorted(e.data["by"] for e in snap.entries) == sorted([f"t{n}" for n in range(4)] * 25)
