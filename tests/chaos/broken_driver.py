"""A driver whose adapter breaks one recovery rule, to prove the campaign catches it.

``BROKEN_RULE`` picks the rule (the runner passes its environment to every driver):

- ``rerun_exited`` (default): a shell command that already exited is run again instead of
  having its recorded outcome replayed, so its append shows up twice;
- ``skip_recovery``: every interrupted call ends ``interrupted`` without looking at the
  Space (no adopt, reattach, replay, revert or restore), which transactional mode forbids
  and which leaves effects the log disowns.
"""

from __future__ import annotations

import os
import sys
from typing import Any

from chaos.driver import main
from durable.adapter.recovery import Recovery
from durable.tools import CallContext, ToolResult, interrupted_result

original = Recovery.recover


def rerun_exited(self: Recovery, tool: str, args: dict[str, Any], ctx: CallContext,
                 replay: str) -> ToolResult:
    if tool == "bash":
        return self.runner.run(tool, args, ctx, n=9)
    return original(self, tool, args, ctx, replay)


def skip_recovery(self: Recovery, tool: str, args: dict[str, Any], ctx: CallContext,
                  replay: str) -> ToolResult:
    return interrupted_result(tool, ctx.slot.progress, "(broken adapter: recovery skipped)")


RULES = {"rerun_exited": rerun_exited, "skip_recovery": skip_recovery}
Recovery.recover = RULES[os.environ.get("BROKEN_RULE", "rerun_exited")]  # type: ignore[method-assign]

if __name__ == "__main__":
    sys.exit(main())
