"""A session for the documents-across-processes test: its tool adds an item to the
``app.todos`` document (draft style) ``CALLS`` times, in calls of its own."""

from __future__ import annotations

import sys
import time
from pathlib import Path

from durable.docs import define_doc
from durable.harness import Harness
from durable.models import PlannedCall, ScriptedModel
from durable.storage import SqliteStorage
from durable.tools import Tool, ToolRegistry, ToolResult

TODOS = define_doc("app.todos", 1, {"items": []}, history="rewindable")


def add(args: dict, ctx) -> ToolResult:
    ctx.update_doc(TODOS, lambda d: d["items"].append(args["item"]))
    time.sleep(0.01)  # the app's edits land between the read and the result's commit
    return ToolResult(f"added {args['item']}")


def main() -> int:
    path, calls = Path(sys.argv[1]), int(sys.argv[2])
    plan = [PlannedCall(i, "add_todo", {"item": f"session-{i}"}) for i in range(calls)]
    schema = {"type": "object", "properties": {"item": {"type": "string"}},
              "required": ["item"]}
    harness = Harness.open(SqliteStorage(path), models=ScriptedModel(plan),
                           registry=ToolRegistry([Tool("add_todo", "add", schema, add)]))
    outcome = harness.root("app").submit(content="go", request_id="r1").wait()
    harness.close()
    return 0 if outcome.done else 1


if __name__ == "__main__":
    sys.exit(main())
