"""Host tools of the scripted agents: side effects outside the workspace, counted in a file.

``record_never`` (``replay="never"``) and ``record_safe`` (``replay="safe"``) each append
``<tool> <marker>`` to an effects file that lives outside every Space, so the checker can
prove a never-tool never ran twice (and count how often a safe one reran).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from durable.tools import Tool, host_tool

SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"marker": {"type": "string", "minLength": 1}},
    "required": ["marker"],
    "additionalProperties": False,
}


def _recorder(path: Path, name: str):  # type: ignore[no-untyped-def]
    def record(args: dict[str, Any]) -> str:
        with open(path, "a") as f:
            f.write(f"{name} {args['marker']}\n")
            f.flush()
            os.fsync(f.fileno())
        return f"recorded {args['marker']}"
    return record


def effect_tools(effects: Path) -> list[Tool]:
    return [
        host_tool(_recorder(effects, "record_never"), name="record_never", schema=SCHEMA,
                  description="Record a marker (must never run twice).", replay="never"),
        host_tool(_recorder(effects, "record_safe"), name="record_safe", schema=SCHEMA,
                  description="Record a marker (safe to run again).", replay="safe"),
    ]


def read_effects(effects: Path) -> list[tuple[str, str]]:
    if not effects.exists():
        return []
    out = []
    for line in effects.read_text().splitlines():
        tool, _, marker = line.partition(" ")
        out.append((tool, marker))
    return out
