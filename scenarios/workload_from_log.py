"""A workload from a durable log: the tool calls a real session committed, to crash-test.

``chaos workload from-log LOG`` reads a session's log (the SQLite file its driver kept, a
campaign run's ``state/log.sqlite``) and writes the workload of its root conversation:

- the workspace it started from, when the log holds it (the first image entry, which a
  transactional or auto session commits when it adopts its Space; a checkpoint-mode
  session's lives in its checkpoint store, and the workload then starts empty, said in a
  comment);
- every tool call that took effect, in the order the agent made them: a call whose result
  was committed as interrupted (the Space was restored to before it) is left out, with a
  comment, since it changed nothing the rest depends on.

What a real program does differently on each run (git's index holds inodes, ``date``
prints the time) has no single golden answer: the paths given as ``volatile`` are declared
so and the calls given as ``nondeterministic`` marked ``output: nondeterministic``
(``chaos workload from-log`` finds both by running the workload twice without faults,
``chaos.checks.golden.probe``).
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from pathlib import Path
from typing import Any

import yaml

from durable.adapter.image import IMAGE_KEY, Image, blob_from
from durable.log import ROOT_CONVERSATION, Log
from durable.session_log import open_log_at

from .workload import TOOLS, WorkloadError


def from_log(path: Path, *, name: str | None = None, conversation: int = ROOT_CONVERSATION,
             volatile: Sequence[str] = (), nondeterministic: Collection[int] = ()) -> str:
    """The workload of ``conversation`` of the log at ``path`` (a SQLite file or a JSONL
    log's directory), as YAML text, with
    ``volatile`` paths (globs) and the calls ``nondeterministic`` (their indices in the
    workload) marked so."""
    if not path.exists():
        raise WorkloadError(f"no log at {path}: give the log a session's driver kept (a "
                            "campaign run's state/log.sqlite, or state/log with --log jsonl)")
    log = Log.open(open_log_at(path))
    try:
        entries = log.entries(conversation)
        results = {e.data.get("call_id"): e for e in entries if e.kind == "tool_result"}
        calls: list[dict[str, Any]] = []
        notes: list[str] = []
        for e in entries:
            if e.kind != "assistant":
                continue
            for call in e.data.get("tool_calls", []):
                result = results.get(call["id"])
                if result is None or result.data.get("interrupted"):
                    notes.append(f"left out: {call['name']} call {call['id']} (its result was "
                                 f"{'never committed' if result is None else 'interrupted'})")
                    continue
                if call["name"] not in TOOLS:
                    notes.append(f"left out: call {call['id']} of the tool {call['name']!r}, "
                                 "which a workload cannot make")
                    continue
                calls.append(_call(call["name"], call["args"]))
        initial = _initial(log, entries)
    finally:
        log.close()
    if not calls:
        raise WorkloadError(f"{path}: conversation {conversation} committed no tool call a "
                            "workload can make; nothing to replay")
    if initial is None:
        notes.insert(0, "the log holds no image of the starting workspace (checkpoint "
                        "mode keeps it in its store): the workload starts empty")
    doc: dict[str, Any] = {"name": name or path.stem,
                           "description": f"the tool calls committed in {path}"}
    if volatile:
        doc["volatile"] = list(volatile)
    if initial:
        doc["initial"] = initial
    for i in nondeterministic:
        ((tool, args),) = calls[i].items()
        calls[i] = {tool: {**args, "output": "nondeterministic"}}
    doc["calls"] = calls
    header = "".join(f"# {n}\n" for n in notes)
    return header + yaml.dump(doc, Dumper=_Dumper, sort_keys=False, allow_unicode=True,
                              width=100)


class _Dumper(yaml.SafeDumper):
    """Text with newlines as literal blocks (``|``), as a person writes a workload."""


def _text(dumper: yaml.SafeDumper, text: str) -> yaml.ScalarNode:
    block = "\n" in text and "\r" not in text and \
        all(line == line.rstrip() for line in text.splitlines())
    style = "|" if block else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", text, style=style)


_Dumper.add_representer(str, _text)


def _call(tool: str, args: dict[str, Any]) -> dict[str, Any]:
    if tool == "edit":
        edits = [{"old": e["old_text"], "new": e["new_text"]} for e in args["edits"]]
        out: dict[str, Any] = {"path": args["path"]}
        if len(edits) == 1:
            out.update(edits[0])
        else:
            out["edits"] = edits
        return {"edit": out}
    if tool in ("record_never", "record_safe"):
        return {tool: {}}
    allowed = TOOLS[tool][0]
    return {tool: {k: v for k, v in args.items() if k in allowed}}


def _initial(log: Log, entries: list[Any]) -> dict[str, Any] | None:
    """The workspace the conversation adopted (its first image entry), or None."""
    first = next((e for e in entries if e.kind == "system" and IMAGE_KEY in e.data), None)
    if first is None or first.data[IMAGE_KEY].get("call_id") is not None:
        return None
    image = Image()
    image.fold(first.id, first.data[IMAGE_KEY])
    out: dict[str, Any] = {}
    for path, row in sorted(image.table.items()):
        if row.kind == "symlink":
            out[path] = {"symlink": row.ident}
        elif row.kind == "file":
            data = blob_from(log.entry(image.blobs[row.ident]).data, row.ident)
            try:
                text = data.decode("utf-8")
            except UnicodeDecodeError:
                raise WorkloadError(f"the starting workspace holds {path!r}, which is not "
                                    "text; a workload's initial files are text") from None
            out[path] = text if row.mode == 0o644 else {"content": text, "mode": row.mode}
    return out
