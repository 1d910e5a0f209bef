"""Documents read and updated from another process while a session runs: ``update_doc``
reads again from the storage on a conflict, a documents-only write needs no current view of
the log, the draft style, ``watch_doc``, ``prompt_docs`` and ``doc_tools``' names; and two
real processes, a session whose tool edits a document and an app that watches it and
updates it at once, losing nothing."""

from __future__ import annotations

import itertools
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from durable.doc_context import prompt_docs
from durable.docs import define_doc
from durable.errors import DocConflict
from durable.log import Log
from durable.models import ModelRequest
from durable.storage import SqliteStorage
from durable.tools import doc_tools
from tests.durable.doc_session_child import TODOS

CHILD = Path(__file__).with_name("doc_session_child.py")
NOTES = define_doc("test.cross.notes", 1, {"n": 0})


def two_logs(tmp_path: Path) -> tuple[Log, Log]:
    session = Log.open(SqliteStorage(tmp_path / "log.sqlite"))
    session.create_root("agent")
    return session, Log.open(SqliteStorage(tmp_path / "log.sqlite"))


def test_update_doc_reads_the_storage_again_on_a_conflict(tmp_path: Path) -> None:
    session, app = two_logs(tmp_path)
    app.update_doc(1, NOTES, lambda d: {"n": d["n"] + 1})
    assert session.read_doc(1, NOTES).value == {"n": 0}  # its view lags ...
    got = session.update_doc(1, NOTES, lambda d: {"n": d["n"] + 10})
    assert (got.value, got.revision) == ({"n": 11}, 2)  # ... but nothing is lost
    assert app.read_doc(1, NOTES, fresh=True).value == {"n": 11}
    app.update_doc(1, NOTES, lambda d: {"n": 0}, expect_revision=2)  # the stored revision
    with pytest.raises(DocConflict):
        app.update_doc(1, NOTES, lambda d: d, expect_revision=2)


def test_a_documents_only_write_needs_no_current_view_of_the_log(tmp_path: Path) -> None:
    session, app = two_logs(tmp_path)
    with session.transaction() as tx:  # the session moves on: the app's view lags now
        last = tx.append(1, "input", {"content": "hello"})
    app.update_doc(1, NOTES, lambda d: {"n": 7})
    reread = Log.open(SqliteStorage(tmp_path / "log.sqlite"))
    value = reread.read_doc(1, NOTES)
    assert value.value == {"n": 7} and value.at == last  # stamped where the log is
    with session.transaction() as tx:  # the session commits on as before
        tx.append(1, "input", {"content": "again"})


def test_the_draft_style_and_doc_tool_names(tmp_path: Path) -> None:
    log = Log.open(SqliteStorage(tmp_path / "log.sqlite"))
    log.create_root("agent")
    got = log.update_doc(1, TODOS, lambda d: d["items"].append("x"))
    assert got.value == {"items": ["x"]}
    assert [t.name for t in doc_tools([TODOS, NOTES])] == [
        "read_todos", "update_todos", "read_notes", "update_notes"]
    with pytest.raises(ValueError, match="would both have tools named read_todos"):
        doc_tools([TODOS, define_doc("other.todos", 1, [])])


def test_prompt_docs_shows_the_stored_value_at_each_turn(tmp_path: Path) -> None:
    session, app = two_logs(tmp_path)
    context = prompt_docs([TODOS])
    app.update_doc(1, TODOS, lambda d: d["items"].append("from the app"))
    (message,) = context(session, 1)
    assert message["role"] == "system" and "app.todos (revision 1)" in message["content"]
    assert '"from the app"' in message["content"]
    seen: list[list[dict]] = []

    class Echo:
        def complete(self, request: ModelRequest):
            from durable.models import AssistantMessage

            seen.append(request.messages)
            return AssistantMessage("done", [])

    from durable.harness import Harness

    harness = Harness.open(session, models=Echo(), context=context)
    assert harness.root("agent").submit(content="hi", request_id="r").wait().done
    assert seen[0][0]["role"] == "system" and "from the app" in seen[0][0]["content"]
    assert not any(e.kind == "system" for e in session.entries(1))  # context, not entries


def test_watch_doc_yields_every_revision_in_order(tmp_path: Path) -> None:
    session, app = two_logs(tmp_path)
    for i in range(5):
        app.update_doc(1, TODOS, lambda d, i=i: d["items"].append(i))
    got = list(session.watch_doc(1, TODOS, timeout=0.2, interval=0.01))
    assert [v.revision for v in got] == [1, 2, 3, 4, 5]
    assert got[-1].value == {"items": [0, 1, 2, 3, 4]}
    assert list(session.watch_doc(1, TODOS, after=4, timeout=0.05)) == got[-1:]


def test_a_session_and_an_app_edit_one_document_from_two_processes(tmp_path: Path) -> None:
    path = tmp_path / "log.sqlite"
    calls, app_updates = 20, 20
    child = subprocess.Popen([sys.executable, str(CHILD), str(path), str(calls)],
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 30
        while not path.exists() and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(0.2)
        app = Log.open(SqliteStorage(path))
        watcher = Log.open(SqliteStorage(path))
        stop = threading.Event()
        seen: list[tuple[int, list[str]]] = []

        def watch() -> None:
            for v in watcher.watch_doc(1, TODOS, stop=stop, interval=0.005):
                seen.append((v.revision, v.value["items"]))

        thread = threading.Thread(target=watch)
        thread.start()
        for i in range(app_updates):
            app.update_doc(1, TODOS, lambda d, i=i: d["items"].append(f"app-{i}"))
            time.sleep(0.005)
        out, _ = child.communicate(timeout=120)
        assert child.returncode == 0, out
        # The watcher saw the last revision (a fixed 0.1 s was a guess at how long it takes)
        last = app.read_doc(1, TODOS, fresh=True).revision
        deadline = time.monotonic() + 300  # only a hang takes this long
        while not (seen and seen[-1][0] >= last):
            assert time.monotonic() < deadline, f"the watcher never saw revision {last}"
            time.sleep(0.01)
        stop.set()
        thread.join(timeout=300)
        assert not thread.is_alive(), "the watcher did not stop"
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    final = app.read_doc(1, TODOS, fresh=True)
    items = final.value["items"]
    assert sorted(items) == sorted([f"session-{i}" for i in range(calls)]
                                   + [f"app-{i}" for i in range(app_updates)]), items
    assert final.revision == calls + app_updates  # every update its own revision
    assert [r for r, _ in seen] == list(range(1, final.revision + 1))  # all, in order
    for (_r, before), (_s, after) in itertools.pairwise(seen):
        assert after[:len(before)] == before  # each revision adds to the one before it
