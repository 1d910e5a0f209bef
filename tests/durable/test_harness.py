"""The harness in-process: tool errors, invalid arguments, documents edited by tools,
progress commits, replay rules on resume, request ids."""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from durable.coding_tools import apply_edits, coding_tools
from durable.docs import define_doc
from durable.env import LocalEnv
from durable.errors import ToolError, UnknownEntryKind
from durable.harness import Harness
from durable.log import Log
from durable.models import (
    AssistantMessage,
    ModelRequest,
    PlannedCall,
    ScriptedModel,
    ToolCallRequest,
)
from durable.storage import SqliteStorage
from durable.storage.records import Batch, EntryRecord
from durable.tools import (
    CallContext,
    HostIO,
    Tool,
    ToolRegistry,
    ToolResult,
    doc_tools,
    host_tool,
)

TASKS = define_doc("test.tasks", 1, [])


def harness_for(tmp_path: Path, plan: list[PlannedCall], tools: list[Tool]) -> Harness:
    registry = ToolRegistry(coding_tools() + tools)
    return Harness.open(SqliteStorage(tmp_path / "log.sqlite"), models=ScriptedModel(plan),
                        registry=registry, env=LocalEnv(tmp_path / "ws"))


def tool_results(h: Harness) -> list[dict[str, Any]]:
    return [e.data for e in h.log.entries(1) if e.kind == "tool_result"]


def test_bad_calls_become_error_results(tmp_path: Path) -> None:
    plan = [PlannedCall(0, "write", {"path": 5}), PlannedCall(1, "telepathy", {}),
            PlannedCall(2, "bash", {"command": "exit 3"}),
            PlannedCall(3, "edit", {"path": "nope.txt",
                                    "edits": [{"old_text": "a", "new_text": "b"}]}),
            PlannedCall(4, "read", {"path": "../../etc/passwd"})]
    h = harness_for(tmp_path, plan, [])
    assert h.root().submit(content="go").wait().done
    r = tool_results(h)
    assert "missing the required field 'content'" in r[0]["content"]
    assert "no tool named 'telepathy'" in r[1]["content"]
    assert "exited with code 3" in r[2]["content"]
    assert "file not found" in r[3]["content"]
    assert "outside the workspace" in r[4]["content"]
    assert all(x["is_error"] and not x["interrupted"] for x in r)
    h.close()


def test_tool_doc_edits_commit_with_the_result_or_not_at_all(tmp_path: Path) -> None:
    def add(args: dict[str, Any], ctx: CallContext) -> ToolResult:
        ctx.update_doc(TASKS, lambda v: [*v, args["item"]])
        if args["item"] == "boom":
            raise RuntimeError("tool bug after editing")
        return ToolResult("added")

    schema = {"type": "object", "properties": {"item": {"type": "string"}}, "required": ["item"]}
    plan = [PlannedCall(0, "add", {"item": "a"}), PlannedCall(1, "add", {"item": "boom"}),
            PlannedCall(2, "read_tasks", {}), PlannedCall(3, "update_tasks", {"value": ["z"]})]
    h = harness_for(tmp_path, plan, [Tool("add", "add", schema, add)] + doc_tools([TASKS]))
    assert h.root().submit(content="go").wait().done
    r = tool_results(h)
    assert r[1]["is_error"] and "tool bug" in r[1]["content"]
    assert r[2]["content"] == '["a"]', "the failed call's edit was not committed"
    assert h.log.read_doc(1, TASKS).value == ["z"]
    first_result = next(e for e in h.log.entries(1) if e.kind == "tool_result")
    assert h.log.read_doc(1, TASKS).revision == 2
    assert first_result.data["content"] == "added"
    h.close()


def test_progress_is_committed_while_the_tool_runs(tmp_path: Path) -> None:
    seen: list[str] = []

    def slow(args: dict[str, Any], ctx: CallContext) -> ToolResult:
        for i in range(5):
            ctx.progress(f"line {i}\n")
            time.sleep(0.12)
            seen.append(ctx.log.slot(1, ctx.call_id).progress)  # type: ignore[union-attr]
        return ToolResult("done")

    h = harness_for(tmp_path, [PlannedCall(0, "slow", {})],
                    [Tool("slow", "slow", {"type": "object"}, slow)])
    assert h.root().submit(content="go").wait().done
    assert any("line 0" in p for p in seen[:-1]), seen
    assert h.log.slots(1)[0].progress.startswith("line 0\n")
    h.close()


class TwoCalls:
    """Asks for a safe and a never call in one turn, then answers."""

    def complete(self, request: ModelRequest) -> AssistantMessage:
        if any(m["role"] == "assistant" for m in request.messages):
            return AssistantMessage("done")
        return AssistantMessage("both", [ToolCallRequest("safe", {}), ToolCallRequest("never", {})])


def test_a_host_tool_gets_the_conversations_log_and_streams_output(tmp_path: Path) -> None:
    """``host_tool``'s function gets a ``HostIO``: the conversation's log (here: the input
    it answers), its call, and ``write``, whose output the log keeps as the call's progress
    while it runs."""
    seen: list[tuple[int, str, bool, str, str]] = []

    def fetch(args: dict[str, Any], io: HostIO) -> str:
        io.write("fetching...\n")
        slot = io.log.slot(io.conversation, io.call_id)
        assert slot is not None
        inputs = [e.data["content"] for e in io.log.entries(io.conversation)
                  if e.kind == "input"]
        seen.append((io.conversation, io.call_id, io.recovering, slot.progress, inputs[0]))
        return "fetched"

    tool = host_tool(fetch, name="fetch", schema={"type": "object"})
    with pytest.raises(ToolError, match=r"must take \(args, io\)"):  # refused when made
        host_tool(lambda args: "no io", name="old", schema={"type": "object"})
    h = harness_for(tmp_path, [PlannedCall(0, "fetch", {})], [tool])
    try:
        assert h.root("a").submit(content="go fetch", request_id="r").wait().done
        ((conversation, call_id, recovering, progress, first_input),) = seen
        assert (conversation, recovering, progress, first_input) == \
            (1, False, "fetching...\n", "go fetch")
        results = [e.data for e in h.log.entries(1) if e.kind == "tool_result"]
        assert [(r["content"], r["call_id"]) for r in results] == [("fetched", call_id)]
    finally:
        h.close()


def test_resume_applies_replay_rules(tmp_path: Path) -> None:
    runs: list[str] = []
    safe = host_tool(lambda a, io: runs.append("safe") or "ok", name="safe", replay="safe",
                     schema={"type": "object"})
    never = host_tool(lambda a, io: runs.append("never") or "ok", name="never",
                      schema={"type": "object"})

    def open_harness() -> Harness:
        return Harness.open(SqliteStorage(tmp_path / "log.sqlite"), models=TwoCalls(),
                            registry=ToolRegistry([safe, never]))

    h = open_harness()
    sub = h.root().submit(content="go", request_id="r")
    h._model_turn(1)
    # A crash after both intents were committed (slots running, partial output), no results.
    for slot in h.log.slots(1):
        with h.log.transaction() as tx:
            tx.put_slot(replace(slot, state="running", progress="partial out"))
    h.close()
    h = open_harness()
    assert h.resume() == [1], "the conversation still owes a model turn"
    r = tool_results(h)
    assert runs == ["safe"], "safe reruns, never does not"
    assert not r[0]["is_error"] and r[0]["content"] == "ok"
    assert r[1]["interrupted"] and "may have partially run" in r[1]["content"]
    assert "partial out" in r[1]["content"]
    again = h.root().submit(content="go", request_id="r")
    assert sub.admitted and not again.admitted
    assert again.wait().done
    assert runs == ["safe"], "a call with a result never runs again"
    assert [e.kind for e in h.log.entries(1)].count("input") == 1
    h.close()


def test_unknown_entry_kind_in_a_stored_log(tmp_path: Path) -> None:
    storage = SqliteStorage(tmp_path / "log.sqlite")
    log = Log.open(storage)
    log.create_root("a")
    storage.commit(Batch(base_id=log.next_id, next_id=log.next_id + 1,
                         entries=[EntryRecord(log.next_id, 1, "hologram", {})]))
    log.close()
    with pytest.raises(UnknownEntryKind, match=r"hologram.*upgrade"):
        Log.open(SqliteStorage(tmp_path / "log.sqlite"))


def test_apply_edits_rules() -> None:
    assert apply_edits("a b c", [{"old_text": "a", "new_text": "x"},
                                 {"old_text": "c", "new_text": "z"}], "f") == "x b z"
    with pytest.raises(ToolError, match="occurs 2 times"):
        apply_edits("a a", [{"old_text": "a", "new_text": "x"}], "f")
    with pytest.raises(ToolError, match="overlap"):
        apply_edits("abc", [{"old_text": "ab", "new_text": "x"},
                            {"old_text": "bc", "new_text": "y"}], "f")
