"""Documents and the Log over every storage: migrate, size limit, conflicts, as_of, forks,
atomic commits and what an uncertain storage failure does."""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from durable.docs import define_doc
from durable.errors import (
    DocConflict,
    DocError,
    DocTooLarge,
    DocVersionError,
    DuplicateRequest,
    StorageClosed,
    StorageUncertain,
    UnknownEntryKind,
)
from durable.log import Log
from durable.storage import MemoryStorage, Storage
from durable.storage.jsonl import JsonlStorage
from durable.storage.records import Batch
from durable.storage.sqlite import SqliteStorage

NOTES = define_doc("test.notes", 1, {"items": []}, history="rewindable", fork="as_of")
COUNTER = define_doc("test.counter", 1, 0)


class ReopenableMemory:
    """A view of one MemoryStorage whose close leaves the data for the next view ("reopen")."""

    def __init__(self, memory: MemoryStorage) -> None:
        self.memory = memory
        self.closed = False

    def load(self):  # type: ignore[no-untyped-def]
        if self.closed:
            raise StorageClosed("closed view")
        return self.memory.load()

    def commit(self, batch: Batch) -> None:
        if self.closed:
            raise StorageClosed("closed view")
        self.memory.commit(batch)

    def load_docs(self, conversation: int, kind: str):  # type: ignore[no-untyped-def]
        if self.closed:
            raise StorageClosed("closed view")
        return self.memory.load_docs(conversation, kind)

    def close(self) -> None:
        self.closed = True


@pytest.fixture(params=["memory", "sqlite", "jsonl"])
def open_storage(request: pytest.FixtureRequest, tmp_path: Path) -> Callable[[], Storage]:
    memory = MemoryStorage()

    def factory() -> Storage:
        if request.param == "memory":
            return ReopenableMemory(memory)
        if request.param == "sqlite":
            return SqliteStorage(tmp_path / "log.sqlite")
        return JsonlStorage(tmp_path / "jsonl")

    return factory


def test_rewindable_as_of_and_fork(open_storage: Callable[[], Storage]) -> None:
    log = Log.open(open_storage())
    root = log.create_root("agent")
    marks = []
    for i in range(3):
        with log.transaction() as tx:
            marks.append(tx.append(root, "input", {"content": f"m{i}"}))
            tx.write_doc(root, NOTES, {"items": list(range(i + 1))})
    assert log.read_doc(root, NOTES, as_of=marks[0]).value == {"items": [0]}
    assert log.read_doc(root, NOTES, as_of=marks[1]).value == {"items": [0, 1]}
    assert log.read_doc(root, NOTES).value == {"items": [0, 1, 2]}
    child = log.fork(root, marks[1])
    assert [e.id for e in log.entries(child)] == marks[:2]
    assert log.read_doc(child, NOTES).value == {"items": [0, 1]}
    with log.transaction() as tx:
        mine = tx.append(child, "input", {"content": "child"})
    assert [e.id for e in log.entries(child)] == [*marks[:2], mine]
    assert mine not in [e.id for e in log.entries(root)]
    # last_entry walks the same history back: the child's own, then its parent's up to the
    # fork point (never the parent's later entries), as entries() gives it.
    for conv in (root, child):
        for where in (lambda e: True, lambda e: e.kind == "input",
                      lambda e: e.data.get("content") != "child", lambda e: e.id < marks[1],
                      lambda e: e.kind == "assistant"):
            expected = [e for e in log.entries(conv) if where(e)]
            found = log.last_entry(conv, where)
            assert found == (expected[-1] if expected else None)
    assert log.last_entry(child, lambda e: e.id > marks[1] and e.id != mine) is None
    log.close()
    # reopen: the same history, ids keep growing
    log = Log.open(open_storage())
    assert [e.id for e in log.entries(child)] == [*marks[:2], mine]
    assert log.read_doc(root, NOTES, as_of=marks[0]).value == {"items": [0]}
    with log.transaction() as tx:
        later = tx.append(root, "input", {"content": "later"})
    assert later > mine
    log.close()


def test_a_fork_at_an_entry_sees_the_documents_committed_with_it(
        open_storage: Callable[[], Storage]) -> None:
    """A transaction's documents go with its first entry: a call's result is committed with
    the adapter's recovery events after it and its Space's new checkpoint, so a fork at the
    result must see that checkpoint (it saw the one before, and started from a state
    without the call's effects: found by the campaign's forks, seed 1 of the forks preset),
    and a read as of the entry before the transaction must not."""
    log = Log.open(open_storage())
    root = log.create_root("agent")
    with log.transaction() as tx:
        before = tx.append(root, "input", {"content": "go"})
        tx.write_doc(root, NOTES, {"items": [0]})
    with log.transaction() as tx:
        result = tx.append(root, "tool_result", {"call_id": "c1"})
        tx.append(root, "system", {"event": "recovered"})
        tx.write_doc(root, NOTES, {"items": [0, 1]})
    assert log.read_doc(root, NOTES, as_of=before).value == {"items": [0]}
    assert log.read_doc(root, NOTES, as_of=result).value == {"items": [0, 1]}
    child = log.fork(root, result)
    assert log.read_doc(child, NOTES).value == {"items": [0, 1]}
    with log.transaction() as tx:  # documents alone: after every entry before them
        tx.write_doc(root, NOTES, {"items": [0, 1, 2]})
    assert log.read_doc(root, NOTES, as_of=result).value == {"items": [0, 1]}
    assert log.read_doc(root, NOTES).value == {"items": [0, 1, 2]}
    log.close()


def test_latest_doc_cannot_be_read_as_of(open_storage: Callable[[], Storage]) -> None:
    log = Log.open(open_storage())
    root = log.create_root("agent")
    with pytest.raises(DocError, match="rewindable"):
        log.read_doc(root, COUNTER, as_of=1)
    log.close()


def test_migrate_and_newer_version(open_storage: Callable[[], Storage]) -> None:
    log = Log.open(open_storage())
    root = log.create_root("agent")
    v1 = define_doc("test.shape", 1, {"n": 0})
    with log.transaction() as tx:
        tx.write_doc(root, v1, {"n": 5})
    from durable import docs as docs_module

    # a newer definition of the same kind, as a later code version would have
    v2 = docs_module.Doc("test.shape", 2, {"count": 0},
                         migrate=lambda value, v: {"count": value["n"]})
    assert log.read_doc(root, v2).value == {"count": 5}
    with log.transaction() as tx:
        tx.write_doc(root, v2, {"count": 6})
    with pytest.raises(DocVersionError, match="stored by version 2"):
        log.read_doc(root, v1)
    no_migrate = docs_module.Doc("test.shape", 3, {})
    with pytest.raises(DocVersionError, match="no migrate"):
        log.read_doc(root, no_migrate)
    log.close()


def test_too_large_and_not_json(open_storage: Callable[[], Storage]) -> None:
    log = Log.open(open_storage())
    root = log.create_root("agent")
    with pytest.raises(DocTooLarge, match="65536-byte"), log.transaction() as tx:
        tx.append(root, "input", {"content": "x"})
        tx.write_doc(root, COUNTER, "x" * 70_000)
    with pytest.raises(DocError, match="not JSON"), log.transaction() as tx:
        tx.write_doc(root, COUNTER, {1, 2})
    # neither transaction landed anything
    assert log.entries(root) == []
    assert log.read_doc(root, COUNTER).revision == 0
    log.close()


def test_update_doc_retries_and_expect_revision(open_storage: Callable[[], Storage]) -> None:
    log = Log.open(open_storage())
    root = log.create_root("agent")
    raced = threading.Event()

    def slow_increment(value: int) -> int:
        if not raced.is_set():
            raced.set()
            log.update_doc(root, COUNTER, lambda v: v + 100)  # another edit lands first
        return value + 1

    result = log.update_doc(root, COUNTER, slow_increment)
    assert result.value == 101 and result.revision == 2
    with pytest.raises(DocConflict, match="expected 1"):
        log.update_doc(root, COUNTER, lambda v: v + 1, expect_revision=1)
    assert log.update_doc(root, COUNTER, lambda v: v + 1, expect_revision=2).value == 102
    log.close()


def test_atomic_commit_and_request_ids(open_storage: Callable[[], Storage]) -> None:
    log = Log.open(open_storage())
    root = log.create_root("agent")
    with log.transaction() as tx:
        e = tx.append(root, "input", {"content": "a"})
        tx.admit(root, "req", e)
    before = log.next_id
    with pytest.raises(DuplicateRequest), log.transaction() as tx:
        e2 = tx.append(root, "input", {"content": "again"})
        tx.write_doc(root, COUNTER, 7)
        tx.admit(root, "req", e2)
    assert log.next_id == before
    assert [x.data["content"] for x in log.entries(root)] == ["a"]
    assert log.read_doc(root, COUNTER).value == 0
    with pytest.raises(UnknownEntryKind), log.transaction() as tx:
        tx.append(root, "thought", {})
    log.close()
    log = Log.open(open_storage())
    assert log.request_entry(root, "req") == e
    log.close()


class FlakyStorage(MemoryStorage):
    """Fails one commit with an uncertain error, as a disk error at fsync would."""

    def commit(self, batch: Batch) -> None:
        raise StorageUncertain("I/O error at fsync")


def test_uncertain_failure_closes_the_log() -> None:
    storage = FlakyStorage()
    log = Log.open(storage)
    with pytest.raises(StorageUncertain):
        log.create_root("agent")
    assert log.closed
    with pytest.raises(StorageClosed), log.transaction():
        pass
