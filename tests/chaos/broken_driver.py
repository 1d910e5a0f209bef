"""A driver whose adapter breaks one recovery rule: a shell command that already exited is
run again instead of having its recorded outcome replayed. The campaign must catch it."""

from __future__ import annotations

import sys
from typing import Any

from chaos.driver import main
from durable.adapter.core import DurableSpaces
from durable.tools import CallContext, ToolResult

original = DurableSpaces._recover


def rerun_everything(self: DurableSpaces, tool: str, args: dict[str, Any], ctx: CallContext,
                     replay: str) -> ToolResult:
    if tool == "bash":
        return self._run_call(tool, args, ctx, n=9)
    return original(self, tool, args, ctx, replay)


DurableSpaces._recover = rerun_everything  # type: ignore[method-assign]

if __name__ == "__main__":
    sys.exit(main())
