"""Host tools of the scripted agents: side effects outside the workspace, counted in a file.

``record_never`` (``replay="never"``) and ``record_safe`` (``replay="safe"``) each append
``<tool> <marker> <call id>`` to an effects file that lives outside every Space, so the checker can
prove a never-tool never ran twice (and count how often a safe one reran).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from durable.tools import CallContext, Replay, Tool, ToolResult

SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"marker": {"type": "string", "minLength": 1}},
    "required": ["marker"],
    "additionalProperties": False,
}


def _recorder(path: Path, name: str, replay: Replay) -> Tool:
    def record(args: dict[str, Any], ctx: CallContext) -> ToolResult:
        with open(path, "a") as f:
            f.write(f"{name} {args['marker']} {ctx.call_id}\n")
            f.flush()
            os.fsync(f.fileno())
        return ToolResult(f"recorded {args['marker']}")
    return Tool(name, f"Record a marker ({replay} to run again).", SCHEMA, record, replay)


def effect_tools(effects: Path) -> list[Tool]:
    return [_recorder(effects, "record_never", "never"), _recorder(effects, "record_safe", "safe")]


def read_effects(effects: Path) -> list[tuple[str, str, str]]:
    """(tool, marker, call id) of every real run, in order."""
    if not effects.exists():
        return []
    out = []
    for line in effects.read_text().splitlines():
        parts = line.split(" ")
        if len(parts) == 3:
            out.append((parts[0], parts[1], parts[2]))
    return out
