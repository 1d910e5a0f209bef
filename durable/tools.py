"""Tools, their replay rules, the call context, the registry and extensions.

A tool is a name, a JSON input schema, a ``run`` function and a replay rule:

- ``replay="safe"``: running it again after a crash is harmless; an interrupted call reruns
  with its stored arguments.
- ``replay="never"`` (the default): it must not run twice; an interrupted call ends with an
  error result telling the model it may have partly run.

A tool may also carry ``recover``: the function the harness calls, instead of applying the
replay rule, for a call whose intent was committed but whose result was not. That is how a
wrapper (the Space adapter) takes over recovery per call.

Extensions add tools and wrap existing ones (``wrap`` returns a replacement or ``None``).

A tool reads and edits documents through its ``CallContext``; those edits are staged and
committed in the same transaction as the call's result, so a call that throws or is cut off
changes no document. ``ctx.commit_now()`` commits staged edits early (the adapter records a
command's start mark that way, before it spawns the command).
"""

from __future__ import annotations

import copy
import inspect
import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Literal, Protocol

from .docs import Doc, updated
from .errors import ToolError, UnknownTool
from .record_codec import JsonRecord
from .storage.records import SlotRecord

if TYPE_CHECKING:
    from .env import ExecutionEnv
    from .log import Log, Transaction

Replay = Literal["safe", "never"]

#: How often a tool's progress (output so far) is committed at most.
PROGRESS_INTERVAL_S = 0.1
#: Progress and bash output keep their last this-many characters.
OUTPUT_LIMIT = 50 * 1024


@dataclass(frozen=True)
class ToolResult(JsonRecord):
    content: str
    is_error: bool = False
    interrupted: bool = False
    details: dict[str, Any] = field(default_factory=dict)


def error_result(exc: Exception) -> ToolResult:
    """The result a call that raised ``ToolError`` gives the model."""
    return ToolResult(f"Error: {exc}", is_error=True)


def interrupted_result(name: str, partial: str = "", reason: str = "") -> ToolResult:
    """The result of a call that was cut off and will not run again."""
    text = (
        f"The {name} tool was interrupted and may have partially run; its effects are unknown."
    )
    if reason:
        text += f" {reason}"
    if partial:
        text += f"\nOutput before the interruption:\n{partial[-OUTPUT_LIMIT:]}"
    return ToolResult(text, is_error=True, interrupted=True)


#: Run with the transaction that commits a call's result and the result's entry id; what it
#: returns is not used.
ResultHook = Callable[["Transaction", int], object]


class CallContext:
    """What a running tool call may use: its identity, the env, documents, progress."""

    def __init__(
        self,
        *,
        log: Log,
        conversation: int,
        slot: SlotRecord,
        env: ExecutionEnv | None,
        recovering: bool = False,
    ) -> None:
        self.log = log
        self.conversation = conversation
        self.slot = slot
        self.call_id = slot.call_id
        self.env = env
        #: True when this call is being finished by recovery after a crash.
        self.recovering = recovering
        self._staged: dict[str, tuple[Doc, list[tuple[str, Any]]]] = {}
        self._hooks: list[ResultHook] = []
        self._records: list[Callable[[Transaction], object]] = []
        self._progress = slot.progress
        self._progress_sent = slot.progress
        self._progress_at = 0.0
        self._lock = threading.Lock()

    # -- documents -------------------------------------------------------------
    #
    # A call's document edits are staged and committed with its result, each as an op on
    # the value found at commit time: a write sets it, an update is a function of it. So an
    # edit another process committed meanwhile is kept: the harness reads the document
    # again and applies the ops anew (``DocConflict`` at the result's commit).

    def read_doc(self, doc: Doc) -> Any:
        """The value as this call sees it (its own staged edits included)."""
        return self._apply(doc, self.log.read_doc(self.conversation, doc).value)

    def write_doc(self, doc: Doc, value: Any) -> None:
        doc.encode(value)
        self._staged[doc.kind] = (doc, [("set", copy.deepcopy(value))])

    def update_doc(self, doc: Doc, fn: Callable[[Any], Any]) -> Any:
        """Stage ``fn`` (returns the new value, or changes its draft and returns None);
        the value it gives on what the document holds now."""
        doc.encode(updated(fn, self.read_doc(doc)))  # a value that cannot be stored: now
        ops = self._staged.get(doc.kind, (doc, []))[1]
        self._staged[doc.kind] = (doc, [*ops, ("fn", fn)])
        return self.read_doc(doc)

    def _apply(self, doc: Doc, value: Any) -> Any:
        for op, arg in self._staged.get(doc.kind, (doc, []))[1]:
            value = copy.deepcopy(arg) if op == "set" else updated(arg, value)
        return value

    @property
    def staged_docs(self) -> list[Doc]:
        return [doc for doc, _ops in self._staged.values()]

    def commit_now(self, extra: Callable[[Transaction], object] | None = None) -> None:
        """Commit the staged document edits (and ``extra``'s additions) now, in one
        transaction, instead of with the result."""
        with self.log.transaction() as tx:
            self.stage_into(tx)
            if extra is not None:
                extra(tx)
        self._staged.clear()

    def discard(self) -> None:
        """Drop the staged edits and result hooks (the call failed: it changes nothing)."""
        self._staged.clear()
        self._hooks.clear()
        self._records.clear()

    def on_result(self, hook: ResultHook) -> None:
        """Run ``hook(tx, result_entry_id)`` inside the transaction that commits the result,
        after the result's entry."""
        self._hooks.append(hook)

    def record_before_result(self, hook: Callable[[Transaction], object]) -> None:
        """Run ``hook(tx)`` inside the transaction that commits the result, before the
        result's entry: the entries it appends (what the call left the workspace as) come
        before the result, so a conversation forked at the result holds them."""
        self._records.append(hook)

    def records_into(self, tx: Transaction) -> None:
        """Called by the harness inside the result transaction, before the result's entry."""
        for hook in self._records:
            hook(tx)

    def stage_into(self, tx: Transaction) -> None:
        for doc, _ops in self._staged.values():
            tx.write_doc(self.conversation, doc, self._apply(
                doc, tx.read_doc(self.conversation, doc)))

    def finish_into(self, tx: Transaction, result_entry: int) -> None:
        """Called by the harness inside the result transaction: the hooks first (they may
        still stage document edits), then every staged edit."""
        for hook in self._hooks:
            hook(tx, result_entry)
        self.stage_into(tx)

    # -- progress --------------------------------------------------------------

    @property
    def progress_text(self) -> str:
        return self._progress

    def reset_progress(self) -> None:
        """Start the output over (a reattached command is streamed again from byte 0)."""
        with self._lock:
            self._progress = ""

    def progress(self, text: str) -> None:
        """Add output; committed to the slot at most every ``PROGRESS_INTERVAL_S``."""
        with self._lock:
            self._progress = (self._progress + text)[-OUTPUT_LIMIT:]
            now = time.monotonic()
            if now - self._progress_at < PROGRESS_INTERVAL_S \
                    or self._progress == self._progress_sent:
                return
            self._progress_at = now
            snapshot = self._progress
        current = self.log.slot(self.conversation, self.call_id) or self.slot
        with self.log.transaction() as tx:
            tx.put_slot(_with_progress(current, snapshot))
        self._progress_sent = snapshot


def _with_progress(slot: SlotRecord, progress: str) -> SlotRecord:
    return replace(slot, progress=progress)


class ToolFn(Protocol):
    def __call__(self, args: dict[str, Any], ctx: CallContext) -> ToolResult | str: ...


class RecoverFn(Protocol):
    def __call__(self, args: dict[str, Any], ctx: CallContext) -> ToolResult | str: ...


@dataclass(frozen=True)
class Tool:
    name: str
    description: str
    schema: dict[str, Any]
    run: ToolFn
    replay: Replay = "never"
    recover: RecoverFn | None = None

    def spec(self) -> dict[str, Any]:
        """What a model is shown."""
        return {"name": self.name, "description": self.description, "input_schema": self.schema}


class Extension(Protocol):
    """Adds tools and wraps existing ones."""

    def tools(self) -> list[Tool]: ...

    def wrap(self, tool: Tool) -> Tool | None: ...


class ToolRegistry:
    """The tools a harness offers, after every extension has added and wrapped."""

    def __init__(self, tools: list[Tool] | None = None) -> None:
        self._tools: dict[str, Tool] = {}
        for t in tools or []:
            self.add(t)

    def add(self, tool: Tool) -> None:
        if tool.replay not in ("safe", "never"):
            raise ToolError(f"tool {tool.name!r}: replay must be 'safe' or 'never', got "
                            f"{tool.replay!r}")
        if tool.name in self._tools:
            raise ToolError(f"a tool named {tool.name!r} is already registered; use wrap to "
                            "replace it")
        self._tools[tool.name] = tool

    def extend(self, extension: Extension) -> None:
        for name, tool in list(self._tools.items()):
            wrapped = extension.wrap(tool)
            if wrapped is not None:
                if wrapped.name != name:
                    raise ToolError(f"a wrapper renamed {name!r} to {wrapped.name!r}; keep the "
                                    "name")
                self._tools[name] = wrapped
        for tool in extension.tools():
            self.add(tool)

    def get(self, name: str) -> Tool:
        try:
            return self._tools[name]
        except KeyError:
            raise UnknownTool(
                f"no tool named {name!r}; available: {sorted(self._tools)}"
            ) from None

    def specs(self) -> list[dict[str, Any]]:
        return [t.spec() for t in self._tools.values()]

    def names(self) -> list[str]:
        return list(self._tools)


@dataclass(frozen=True)
class HostIO:
    """What a host tool's function gets beside its arguments: the conversation's log (to
    read; the call's result is what it commits), which conversation and call it runs in,
    and ``write`` to stream output, kept as the call's progress (committed to the log at
    most every ``PROGRESS_INTERVAL_S``, so a crash loses at most that much of it)."""

    log: Log
    conversation: int
    call_id: str
    #: True when recovery runs the call again after a crash (a ``replay="safe"`` tool).
    recovering: bool
    write: Callable[[str], None]


def host_tool(
    fn: Callable[[dict[str, Any], HostIO], Any],
    *,
    name: str,
    schema: dict[str, Any],
    description: str = "",
    replay: Replay = "never",
) -> Tool:
    """A tool from any Python callable taking the arguments dict and a ``HostIO``. Its
    return value becomes the result text (``str`` as is, anything else as JSON)."""
    try:
        inspect.signature(fn).bind({}, None)
    except TypeError:
        raise ToolError(f"host tool {name!r}: its function must take (args, io): the "
                        "arguments dict and a HostIO (the conversation's log, the call, "
                        "write for output); write it as def fn(args, io)") from None
    except ValueError:
        pass  # no signature to read (a builtin): it is called as given

    def run(args: dict[str, Any], ctx: CallContext) -> ToolResult:
        out = fn(args, HostIO(ctx.log, ctx.conversation, ctx.call_id, ctx.recovering,
                              ctx.progress))
        if isinstance(out, ToolResult):
            return out
        return ToolResult(out if isinstance(out, str) else json.dumps(out))

    return Tool(name, description or (fn.__doc__ or name).strip(), schema, run, replay)


def doc_tools(docs: list[Doc]) -> list[Tool]:
    """A ``read_<name>`` and an ``update_<name>`` tool per document, named from the last
    part of its kind (``read_todos`` and ``update_todos`` for ``app.todos``); update
    replaces the value, and the write commits with the call's result. Two documents whose
    kinds end alike are refused (their tools would share names)."""

    out: list[Tool] = []
    names: dict[str, str] = {}
    for doc in docs:
        safe = doc.kind.rsplit(".", 1)[-1].replace("-", "_")
        if safe in names:
            raise ValueError(f"documents {names[safe]!r} and {doc.kind!r} would both have tools "
                             f"named read_{safe}/update_{safe}; give one a kind whose last part "
                             "differs")
        names[safe] = doc.kind

        def read(args: dict[str, Any], ctx: CallContext, doc: Doc = doc) -> ToolResult:
            return ToolResult(json.dumps(ctx.read_doc(doc)))

        def update(args: dict[str, Any], ctx: CallContext, doc: Doc = doc) -> ToolResult:
            ctx.write_doc(doc, args["value"])
            return ToolResult(f"{doc.kind} updated")

        out.append(Tool(f"read_{safe}", f"Read the {doc.kind} document.",
                        {"type": "object", "properties": {}}, read, "safe"))
        out.append(Tool(f"update_{safe}", f"Replace the value of the {doc.kind} document.",
                        {"type": "object", "properties": {"value": {}}, "required": ["value"]},
                        update, "safe"))
    return out
