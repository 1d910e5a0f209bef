"""Pi-style coding tools on the call's execution env: read, write, edit, bash.

``read`` is safe to replay; ``write`` and ``edit`` are not declared safe here (an edit that
already applied would fail the second time) and ``bash`` never is: only the Space adapter,
which knows what the Space did, may rerun them.

``edit`` takes a list of exact replacements: each ``old_text`` must occur exactly once in
the file as it was before the call, and no two may overlap; either every edit applies or
none does.
"""

from __future__ import annotations

import itertools
from typing import Any

from .env import ExecutionEnv
from .errors import ToolError
from .tools import OUTPUT_LIMIT, CallContext, Tool, ToolResult

READ_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "path": {"type": "string", "minLength": 1},
        "offset": {"type": "integer", "minimum": 1},
        "limit": {"type": "integer", "minimum": 1},
    },
    "required": ["path"],
    "additionalProperties": False,
}
WRITE_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"path": {"type": "string", "minLength": 1}, "content": {"type": "string"}},
    "required": ["path", "content"],
    "additionalProperties": False,
}
EDIT_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "path": {"type": "string", "minLength": 1},
        "edits": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {"old_text": {"type": "string", "minLength": 1},
                               "new_text": {"type": "string"}},
                "required": ["old_text", "new_text"],
                "additionalProperties": False,
            },
        },
    },
    "required": ["path", "edits"],
    "additionalProperties": False,
}
BASH_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "command": {"type": "string", "minLength": 1},
        "timeout": {"type": "number", "minimum": 0},
    },
    "required": ["command"],
    "additionalProperties": False,
}


def _env(ctx: CallContext) -> ExecutionEnv:
    if ctx.env is None:
        raise ToolError("this harness has no execution env; pass env= to Harness.open")
    return ctx.env


def apply_edits(text: str, edits: list[dict[str, str]], path: str) -> str:
    """``text`` with every edit applied, or ``ToolError`` saying which edit failed."""
    spans: list[tuple[int, int, str]] = []
    for i, e in enumerate(edits):
        old = e["old_text"]
        count = text.count(old)
        if count == 0:
            raise ToolError(f"edit {i}: old_text not found in {path}; read the file and copy "
                            "the text exactly")
        if count > 1:
            raise ToolError(f"edit {i}: old_text occurs {count} times in {path}; include more "
                            "context so it matches once")
        start = text.index(old)
        spans.append((start, start + len(old), e["new_text"]))
    spans.sort()
    for (a0, a1, _), (b0, _b1, _) in itertools.pairwise(spans):
        if b0 < a1:
            raise ToolError(f"edits overlap in {path} (at characters {a0}-{a1} and {b0}); "
                            "merge them into one")
    out: list[str] = []
    pos = 0
    for start, end, new in spans:
        out.append(text[pos:start])
        out.append(new)
        pos = end
    out.append(text[pos:])
    return "".join(out)


def _read(args: dict[str, Any], ctx: CallContext) -> ToolResult:
    data = _env(ctx).read_file(args["path"]).decode("utf-8", "replace")
    lines = data.splitlines(keepends=True)
    start = args.get("offset", 1) - 1
    limit = args.get("limit")
    chosen = lines[start:] if limit is None else lines[start:start + limit]
    return ToolResult("".join(chosen)[-OUTPUT_LIMIT:])


def _write(args: dict[str, Any], ctx: CallContext) -> ToolResult:
    content: str = args["content"]
    _env(ctx).write_file(args["path"], content.encode("utf-8"))
    return ToolResult(f"Wrote {len(content.encode('utf-8'))} bytes to {args['path']}")


def _edit(args: dict[str, Any], ctx: CallContext) -> ToolResult:
    env = _env(ctx)
    path = args["path"]
    text = env.read_file(path).decode("utf-8")
    env.write_file(path, apply_edits(text, args["edits"], path).encode("utf-8"))
    return ToolResult(f"Applied {len(args['edits'])} edit(s) to {path}")


def bash_result(exit_code: int | None, output: str, timed_out: bool = False) -> ToolResult:
    """The result of a shell command: output tail, nonzero exit reported as an error."""
    tail = output[-OUTPUT_LIMIT:]
    if len(output) > OUTPUT_LIMIT:
        tail = f"[output truncated to the last {OUTPUT_LIMIT} characters]\n" + tail
    if timed_out:
        return ToolResult(f"{tail}\nCommand timed out and was killed", is_error=True,
                          details={"exit_code": exit_code, "timed_out": True})
    if exit_code != 0:
        return ToolResult(f"{tail}\nCommand exited with code {exit_code}", is_error=True,
                          details={"exit_code": exit_code})
    return ToolResult(tail, details={"exit_code": 0})


def _bash(args: dict[str, Any], ctx: CallContext) -> ToolResult:
    r = _env(ctx).exec(args["command"], timeout=args.get("timeout"), on_output=ctx.progress)
    return bash_result(r.exit_code, r.output, r.timed_out)


def coding_tools() -> list[Tool]:
    return [
        Tool("read", "Read a file (optionally a range of lines).", READ_SCHEMA, _read, "safe"),
        Tool("write", "Write a file, replacing its content.", WRITE_SCHEMA, _write, "never"),
        Tool("edit", "Replace exact text in a file; each old_text must match once.",
             EDIT_SCHEMA, _edit, "never"),
        Tool("bash", "Run a shell command in the workspace.", BASH_SCHEMA, _bash, "never"),
    ]
