"""A harness process for the crash tests: run a fixed script of host and coding tools on a
SQLite log in STATE_DIR, reporting failpoints when CUA_FAILPOINTS is set.

Side effects of host tools are appended to ``STATE_DIR/effects`` (one line per real run), so
the test can count how many times each call really ran. A host tool then holds while the
file ``STATE_DIR/hold-<marker>`` exists: a kill in the middle of the tool lands while it
holds.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from durable.coding_tools import coding_tools
from durable.env import LocalEnv
from durable.harness import Harness
from durable.models import PlannedCall, ScriptedModel
from durable.storage.sqlite import SqliteStorage
from durable.tools import ToolRegistry, host_tool

state = Path(sys.argv[1])
effects = state / "effects"


def effect(name: str):
    def run(args: dict, _io: object) -> str:
        with open(effects, "a") as f:
            f.write(f"{name}:{args['marker']}\n")
        held = state / f"hold-{args['marker']}"
        deadline = time.monotonic() + 600
        while held.exists() and time.monotonic() < deadline:  # until the test kills it
            time.sleep(0.01)
        return f"{name} {args['marker']} ran"
    return run


SCHEMA = {"type": "object", "properties": {"marker": {"type": "string"}},
          "required": ["marker"]}
PLAN = [
    PlannedCall(0, "never_tool", {"marker": "n0"}),
    PlannedCall(1, "safe_tool", {"marker": "s1"}),
    PlannedCall(2, "write", {"path": "a.txt", "content": "one\n"}),
    PlannedCall(3, "never_tool", {"marker": "n3"}),
]

registry = ToolRegistry(coding_tools())
registry.add(host_tool(effect("never"), name="never_tool", schema=SCHEMA, replay="never"))
registry.add(host_tool(effect("safe"), name="safe_tool", schema=SCHEMA, replay="safe"))
harness = Harness.open(SqliteStorage(state / "log.sqlite"), models=ScriptedModel(PLAN),
                       registry=registry, env=LocalEnv(state / "work"))
harness.resume()
outcome = harness.root("scripted").submit(content="run the script", request_id="req-1").wait()
harness.close()
print("OUTCOME", outcome.state, flush=True)
sys.exit(0 if outcome.done else 3)
