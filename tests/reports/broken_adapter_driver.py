"""The campaign's driver with a deliberately broken adapter, for the report tests.

Its recovery forgets the ledger, the image and the checkpoints: every interrupted call is
ended ``interrupted`` without looking at the Space (no adopt, reattach, replay, revert or
restore). In transactional mode that breaks the invariant on the first recovery (no call may
end interrupted there), and a command that did run leaves an effect the log disowns. The
tests launch this file in place of ``python -m chaos.driver``.
"""

from __future__ import annotations

import sys
from typing import Any

from chaos.driver import main
from durable.adapter.core import DurableSpaces
from durable.tools import CallContext, ToolResult, interrupted_result


def _forgetful_recover(self: DurableSpaces, tool: str, args: dict[str, Any], ctx: CallContext,
                       replay: str) -> ToolResult:
    return interrupted_result(tool, ctx.slot.progress, "(broken adapter: recovery skipped)")


DurableSpaces._recover = _forgetful_recover  # type: ignore[method-assign]

if __name__ == "__main__":
    sys.exit(main())
