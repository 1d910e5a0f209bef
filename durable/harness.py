"""The agent harness: runs conversations over the log and resumes them after a crash.

The loop, per conversation: model call → assistant entry (with its tool calls as pending
slots) → for each call, in order: its intent committed (slot ``running``) → the tool runs →
one commit with the result entry, the slot marked ``done`` and the tool's document edits.

Everything the loop does next is derived from the log, never from memory, so a process that
crashed anywhere and reopens the log continues from the last commit:

- a slot ``pending`` never started: it runs;
- a slot ``running`` has an intent but no result: the call was interrupted. Its tool's
  ``recover`` decides when it has one (the Space adapter); otherwise ``replay="safe"``
  runs it again with the stored arguments and ``"never"`` ends it with an interrupted error
  result carrying the committed partial output;
- a slot ``done`` is never run again.

Errors: a tool's ``ToolError`` or any exception that is not a ``DurableError`` becomes an
error result the model sees. A ``DurableError`` that is not a ``ToolError`` (a fence refusal,
a halt, a storage failure, an unreachable Space) is not a result: it propagates out of
``Submission.wait`` and the call stays interrupted in the log, for recovery to decide.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from . import schema
from .env import ExecutionEnv
from .errors import DocConflict, DurableError, ToolError
from .failpoints import failpoint
from .log import ROOT_CONVERSATION, Log
from .models import Model, ModelError, ModelRequest
from .storage.base import Storage
from .storage.records import EntryRecord, SlotRecord
from .tools import (
    CallContext,
    Extension,
    Tool,
    ToolRegistry,
    ToolResult,
    error_result,
    interrupted_result,
)

#: Builds the env of a conversation: ``factory(log, conversation_id)``.
EnvFactory = Callable[[Log, int], ExecutionEnv]
DEFAULT_MAX_TURNS = 200
#: How often a result is committed again over documents another process keeps changing.
DOC_RETRIES = 50


@dataclass(frozen=True)
class Outcome:
    """How a submission ended: ``done`` (the model answered without tool calls) or
    ``unanswered`` with a reason."""

    state: str
    entry: int | None = None
    reason: str | None = None

    @property
    def done(self) -> bool:
        return self.state == "done"


def to_messages(entries: list[EntryRecord]) -> list[dict[str, Any]]:
    """The model's view of a history. System entries marked ``hidden`` are not shown."""
    out: list[dict[str, Any]] = []
    for e in entries:
        d = e.data
        if e.kind == "input":
            out.append({"role": "user", "content": d.get("content", ""), "entry": e.id})
        elif e.kind == "assistant":
            out.append({"role": "assistant", "content": d.get("text", ""),
                        "tool_calls": d.get("tool_calls", []), "meta": d.get("meta", {}),
                        "entry": e.id})
        elif e.kind == "tool_result":
            out.append({"role": "tool", "call_id": d["call_id"], "name": d["name"],
                        "content": d["content"], "is_error": d.get("is_error", False),
                        "interrupted": d.get("interrupted", False), "entry": e.id})
        elif e.kind == "system" and not d.get("hidden"):
            out.append({"role": "system", "content": d.get("content", ""), "entry": e.id})
    return out


class Harness:
    """Runs conversations on a log. Create with ``Harness.open``."""

    def __init__(
        self,
        log: Log,
        *,
        models: dict[str, Model] | Model,
        registry: ToolRegistry,
        env: ExecutionEnv | EnvFactory | None = None,
        max_turns: int = DEFAULT_MAX_TURNS,
        context: Callable[[Log, int], list[dict[str, Any]]] | None = None,
    ) -> None:
        self.log = log
        self._models = models
        self.registry = registry
        #: Messages put before the history at each model turn, not logged
        #: (``doc_context.prompt_docs``).
        self.context = context
        self._env = env
        self._envs: dict[int, ExecutionEnv] = {}
        self.max_turns = max_turns
        self._conv_locks: dict[int, threading.Lock] = {}
        self._locks_lock = threading.Lock()

    @classmethod
    def open(
        cls,
        storage: Storage | Log,
        *,
        models: dict[str, Model] | Model,
        registry: ToolRegistry | None = None,
        env: ExecutionEnv | EnvFactory | None = None,
        extensions: list[Extension] | None = None,
        max_turns: int = DEFAULT_MAX_TURNS,
        context: Callable[[Log, int], list[dict[str, Any]]] | None = None,
    ) -> Harness:
        log = storage if isinstance(storage, Log) else Log.open(storage)
        reg = registry if registry is not None else ToolRegistry()
        for ext in extensions or []:
            reg.extend(ext)
        return cls(log, models=models, registry=reg, env=env, max_turns=max_turns, context=context)

    def close(self) -> None:
        self.log.close()

    # ------------------------------------------------------------------ conversations

    def root(self, agent: str = "default") -> Conversation:
        return Conversation(self, self.log.create_root(agent))

    def conversation(self, conversation_id: int) -> Conversation:
        self.log.conversation(conversation_id)
        return Conversation(self, conversation_id)

    def env_for(self, conversation: int) -> ExecutionEnv | None:
        if self._env is None or hasattr(self._env, "exec"):
            return self._env  # type: ignore[return-value]  # has exec: an env, not a factory
        if conversation not in self._envs:
            self._envs[conversation] = self._env(self.log, conversation)
        return self._envs[conversation]

    def model_for(self, conversation: int) -> Model:
        if isinstance(self._models, dict):
            agent = self.log.conversation(conversation).agent
            try:
                return self._models[agent]
            except KeyError:
                raise ModelError(
                    f"no model for agent {agent!r}; pass models={{{agent!r}: model, ...}}"
                ) from None
        return self._models

    def _lock_for(self, conversation: int) -> threading.Lock:
        with self._locks_lock:
            return self._conv_locks.setdefault(conversation, threading.Lock())

    # ------------------------------------------------------------------ resume

    def resume(self) -> list[int]:
        """Finish every interrupted call (intent committed, no result) of every
        conversation by its recovery rule. Returns the conversations that still have work
        (a model turn or calls not yet started): ``wait`` on a submission continues them."""
        pending: list[int] = []
        for conv in self.log.conversations():
            with self._lock_for(conv.id):
                for slot in self._open_slots(conv.id):
                    if slot.state == "running":
                        self._finish_call(conv.id, slot)
            if self._next_step(conv.id) != "idle":
                pending.append(conv.id)
        return pending

    # ------------------------------------------------------------------ the loop

    def _last_assistant(self, conversation: int) -> EntryRecord | None:
        return self.log.last_entry(conversation, lambda e: e.kind == "assistant")

    def _open_slots(self, conversation: int) -> list[SlotRecord]:
        last = self._last_assistant(conversation)
        if last is None:
            return []
        out = []
        for call in last.data.get("tool_calls", []):
            slot = self.log.slot(conversation, call["id"])
            if slot is not None and slot.state != "done":
                out.append(slot)
        return out

    def _next_step(self, conversation: int) -> str:
        """``calls`` (open slots), ``model`` (a turn is due), or ``idle``."""
        if self._open_slots(conversation):
            return "calls"
        last = self.log.last_entry(conversation, lambda e: e.kind != "system")
        if last is not None and last.kind in ("input", "tool_result"):
            return "model"
        return "idle"

    def run(self, conversation: int, *, since: int = 0) -> Outcome:
        """Run ``conversation`` until the model answers without tool calls."""
        with self._lock_for(conversation):
            turns = 0
            while True:
                step = self._next_step(conversation)
                if step == "calls":
                    for slot in self._open_slots(conversation):
                        self._finish_call(conversation, slot)
                    continue
                if step == "idle":
                    last = self._last_assistant(conversation)
                    entry = last.id if last is not None and last.id > since else None
                    if entry is None:
                        return Outcome("unanswered", reason="nothing to answer")
                    return Outcome("done", entry=entry)
                turns += 1
                if turns > self.max_turns:
                    return Outcome("unanswered", reason=f"more than {self.max_turns} model turns")
                try:
                    self._model_turn(conversation)
                except ModelError as exc:
                    return Outcome("unanswered", reason=str(exc))

    def _model_turn(self, conversation: int) -> None:
        messages = to_messages(self.log.entries(conversation))
        if self.context is not None:
            messages = [*self.context(self.log, conversation), *messages]
        reply = self.model_for(conversation).complete(
            ModelRequest(conversation, messages, self.registry.specs())
        )
        with self.log.transaction() as tx:
            calls: list[dict[str, Any]] = []
            entry_id = tx.last_id + 1  # the id append() allocates next
            for i, request in enumerate(reply.tool_calls):
                calls.append({"id": f"{entry_id}.{i}", "name": request.name,
                              "args": request.args})
            got = tx.append(conversation, "assistant",
                            {"text": reply.text, "tool_calls": calls, "meta": reply.meta})
            assert got == entry_id
            for c in calls:
                replay = self._replay_of(c["name"])
                tx.put_slot(SlotRecord(conversation, c["id"], entry_id, c["name"], c["args"],
                                       replay, "pending"))

    def _replay_of(self, name: str) -> str:
        try:
            return self.registry.get(name).replay
        except ToolError:
            return "never"

    # ------------------------------------------------------------------ one call

    def _finish_call(self, conversation: int, slot: SlotRecord) -> None:
        """Run (pending) or recover (running) one call and commit its result."""
        ctx = CallContext(log=self.log, conversation=conversation, slot=slot,
                          env=None, recovering=slot.state == "running")
        try:
            tool = self.registry.get(slot.name)
            schema.check(slot.args, tool.schema)
        except ToolError as exc:
            self._commit_result(ctx, error_result(exc))
            return
        ctx.env = self.env_for(conversation)
        if slot.state == "pending":
            failpoint("call.begin", call=slot.call_id, tool=slot.name)
            running = replace(slot, state="running")
            with self.log.transaction() as tx:
                tx.put_slot(running)
            ctx.slot = running
            failpoint("call.intent", call=slot.call_id, tool=slot.name)
            result = self._invoke(tool.run, slot.args, ctx)
        elif tool.recover is not None:
            result = self._invoke(tool.recover, slot.args, ctx)
        elif tool.replay == "safe":
            result = self._invoke(tool.run, slot.args, ctx)
        else:
            result = interrupted_result(slot.name, slot.progress)
        failpoint("call.returned", call=slot.call_id, tool=slot.name)
        self._commit_result(ctx, result)
        failpoint("call.result", call=slot.call_id, tool=slot.name)

    @staticmethod
    def _invoke(fn: Callable[[dict[str, Any], CallContext], ToolResult | str],
                args: dict[str, Any], ctx: CallContext) -> ToolResult:
        try:
            out = fn(args, ctx)
        except ToolError as exc:
            ctx.discard()  # a call that throws changes no document
            return error_result(exc)
        except DurableError:
            raise
        except Exception as exc:  # noqa: BLE001 - a tool's own bug is the model's error result
            ctx.discard()
            return ToolResult(f"Error: {type(exc).__name__}: {exc}", is_error=True)
        return out if isinstance(out, ToolResult) else ToolResult(str(out))

    def _commit_result(self, ctx: CallContext, result: ToolResult) -> None:
        """Commit the result with the call's document edits. A document another process
        changed meanwhile (``DocConflict``) is read again and the call's edits applied on
        it anew (they are ops on the value, ``CallContext``), so no edit is lost."""
        for attempt in range(DOC_RETRIES):
            slot = self.log.slot(ctx.conversation, ctx.call_id) or ctx.slot
            try:
                with self.log.transaction() as tx:
                    ctx.records_into(tx)
                    entry = tx.append(ctx.conversation, "tool_result", {
                        "call_id": slot.call_id, "name": slot.name, **result.to_json()})
                    tx.put_slot(replace(slot, state="done", result_entry=entry,
                                       progress=ctx.progress_text))
                    ctx.finish_into(tx, entry)
                return
            except DocConflict:
                if not ctx.staged_docs or attempt == DOC_RETRIES - 1:
                    raise
                for doc in ctx.staged_docs:
                    self.log.refresh_doc(ctx.conversation, doc)


class Submission:
    """An admitted input. ``wait()`` runs the conversation until it settles."""

    def __init__(self, harness: Harness, conversation: int, entry: int, admitted: bool) -> None:
        self.harness = harness
        self.conversation = conversation
        self.entry = entry
        #: False when the request id had already been admitted (a retry).
        self.admitted = admitted

    def wait(self) -> Outcome:
        return self.harness.run(self.conversation, since=self.entry)


class Conversation:
    def __init__(self, harness: Harness, conversation_id: int) -> None:
        self.harness = harness
        self.id = conversation_id

    def submit(self, *, kind: str = "input", content: str,
               request_id: str | None = None) -> Submission:
        """Admit ``content`` once per ``request_id`` (a retry returns the first admission)."""
        log = self.harness.log
        if kind not in ("input", "system"):
            raise ValueError(f"submit kind must be 'input' or 'system', got {kind!r}")
        if request_id is not None:
            known = log.request_entry(self.id, request_id)
            if known is not None:
                return Submission(self.harness, self.id, known, admitted=False)
        with log.transaction() as tx:
            entry = tx.append(self.id, kind, {"content": content, "request_id": request_id})
            if request_id is not None:
                tx.admit(self.id, request_id, entry)
        return Submission(self.harness, self.id, entry, admitted=True)

    def fork(self, at_entry: int, *, agent: str | None = None) -> Conversation:
        return Conversation(self.harness, self.harness.log.fork(self.id, at_entry, agent=agent))

    def entries(self) -> list[EntryRecord]:
        return self.harness.log.entries(self.id)

    def messages(self) -> list[dict[str, Any]]:
        return to_messages(self.entries())


__all__ = ["ROOT_CONVERSATION", "Conversation", "Harness", "Outcome", "Submission", "Tool"]
