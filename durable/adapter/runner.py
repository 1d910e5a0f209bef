"""Running one wrapped call in the conversation's Space, from its start mark to its recorded
outcome.

A call goes: the mode prepared (``modes``), the start mark committed (``cua.call``: the
Space generation and, for bash, the command's idempotency key), then the command started
through the exec ledger and streamed to its end, or the file written; then its outcome
settled as the mode says. In transactional mode the scan's diff is committed with the
result, unless the policy refuses to keep it (the image marked stale, or ``auto``'s switch
committed with the outcome); in checkpoint mode the outcome is committed first, then the
Space is checkpointed and the checkpoint recorded with the result. Recovery reuses the
streaming and the settling for a command it reattaches to or replays.
"""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Any

from spacesd.protocol import ExecInfo

from ..coding_tools import apply_edits, bash_result
from ..errors import SpaceError, SpaceUnavailable, ToolError
from ..failpoints import failpoint
from ..fence_contract import Fence
from ..log import Transaction
from ..spaces import SpaceClient
from ..tools import CallContext, ToolResult, error_result
from . import policy
from .checkpoint_keeper import CheckpointKeeper
from .events import EventRecorder
from .image_keeper import ImageKeeper
from .modes import ModeKeeper
from .space_env import tool_error
from .space_handle import SpaceHandle
from .space_keeper import SpaceKeeper
from .space_names import exec_key
from .state import CALL, SPACE, CallRecord, CommandMark, Mode

#: How often live output streaming checks the log's fence.
FENCE_CHECK_INTERVAL_S = 0.2


class CallRunner:
    def __init__(self, *, session: str, epoch: int, cwd: str, fence: Fence | None,
                 space: SpaceKeeper, modes: ModeKeeper, image: ImageKeeper,
                 checkpoints: CheckpointKeeper, recorder: EventRecorder) -> None:
        self.session = session
        self.epoch = epoch
        self.cwd = cwd
        self.fence = fence
        self.space = space
        self.modes = modes
        self.image = image
        self.checkpoints = checkpoints
        self.recorder = recorder

    def run(self, tool: str, args: dict[str, Any], ctx: CallContext, *, n: int = 1
            ) -> ToolResult:
        """Run the call; ``n`` numbers its command key (after recovery: the next one)."""
        log, conv = ctx.log, ctx.conversation
        handle = self.space.ensure(log, conv)
        mode, prepare = self.modes.prepare(log, conv, handle, ctx.call_id, tool)
        generation = SPACE.read(log, conv).generation
        key = exec_key(self.session, conv, ctx.call_id, n, self.epoch)
        record = CallRecord(ctx.call_id, tool, generation,
                            (CommandMark(key, self.epoch, n),) if tool == "bash" else ())

        def start_mark(tx: Transaction) -> None:
            prepare(tx)
            CALL.write(tx, conv, record)

        ctx.commit_now(start_mark)
        failpoint("space.start_mark", call=ctx.call_id, tool=tool)
        written: bytes | None = None
        if tool == "bash":
            boot = handle.client.health().get("started_ms")
            failpoint("space.before_spawn", call=ctx.call_id, key=key)
            info = handle.client.exec_start(key, args["command"], cwd=self.cwd)
            result = self.stream(ctx, handle, key, info, args.get("timeout"), boot)
        else:
            failpoint("space.file_op", call=ctx.call_id, tool=tool)
            try:
                result, written = _file_op(handle.client, tool, args)
            except ToolError as exc:
                # A write that failed changed no content, but it may have changed the
                # directory it was in (a temp file next to a target on a filesystem of its
                # own came and went): the image follows the workspace after it too.
                result = error_result(exc)
            failpoint("space.file_written", call=ctx.call_id, tool=tool)
        return self.settle(ctx, handle, mode, tool, result, written)

    def stream(self, ctx: CallContext, handle: SpaceHandle, key: str, info: ExecInfo,
               timeout: float | None, boot: int | None = None) -> ToolResult:
        """Stream a started (or reattached) command to its end; its output from byte 0.

        ``boot`` is the daemon's start time read before the command was started: a different
        one at the end means the daemon died and came back while the command ran on, and
        the ledger reattached to it (the client retried through the restart)."""
        failpoint("space.running", call=ctx.call_id, key=key)
        client = handle.client
        chunks: list[str] = []
        last_check = [time.monotonic()]

        def on_output(text: str) -> None:
            now = time.monotonic()
            if self.fence is not None and now - last_check[0] >= FENCE_CHECK_INTERVAL_S:
                last_check[0] = now
                self.fence.check()
            chunks.append(text)
            ctx.progress(text)

        timed_out = False
        if info.state in ("started", "running"):
            ctx.reset_progress()
            info = client.exec_wait(key, offset=0, on_output=on_output, timeout=timeout)
            if (boot is not None and info.state == "exited"
                    and client.health().get("started_ms") != boot):
                # In-process: the client retried through the restart and the ledger
                # answered for the command, which kept running (the cell of a recovery
                # that found it running).
                self.recorder.with_result(ctx, "bash", "reattached", "running",
                                          f"command {key} outlived a daemon restart",
                                          SPACE.read(ctx.log, ctx.conversation).mode)
            if info.state == "running":  # the tool's own timeout: kill it and say so
                info = client.exec_kill(key)
                timed_out = True
        else:
            info = client.exec_wait(key, offset=0)
            chunks = [info.output]
        failpoint("space.exited", call=ctx.call_id, key=key)
        if info.state == "lost":
            raise SpaceUnavailable(f"command {key} was lost with the Space's daemon; "
                                   "its outcome is unknown")
        return bash_result(info.exit_code, "".join(chunks), timed_out)

    def settle(self, ctx: CallContext, handle: SpaceHandle, mode: Mode, tool: str,
               result: ToolResult, written: bytes | None = None) -> ToolResult:
        """Record the outcome (and image diff, or the switch) and checkpoint as the mode says.
        ``written``: the bytes a file call wrote, which the image's diff then need not read
        back from the Space (only if the scan found exactly them)."""
        log, conv = ctx.log, ctx.conversation
        if mode == "transactional":
            scan = self.image.scan(handle.client)
            verdict = policy.after_call(self.modes.requested, self.image.over_limits(scan),
                                        scan.running, scan.running_keys)
            if verdict.action == "keep":
                def stage(tx: Transaction) -> None:
                    self.image.stage(tx, conv, handle.client, scan, ctx.call_id,
                                     known=() if written is None else (written,))
                ctx.record_before_result(stage)
                return result
            problem = verdict.problem
            assert problem is not None
            if verdict.action == "mark_stale":
                ctx.on_result(lambda tx, _entry: self.image.mark_stale(tx, conv, problem))
                return result
            # auto: the outcome and the switch land together, then the checkpoint follows
            cause = verdict.cause
            assert cause is not None
            record = _with_outcome(CALL.read(log, conv), result)

            def switch(tx: Transaction) -> None:
                CALL.write(tx, conv, record)
                self.modes.switch(tx, conv, ctx.call_id, tool, cause, problem)
            ctx.commit_now(switch)
        else:
            record = _with_outcome(CALL.read(log, conv), result)
            ctx.commit_now(lambda tx: CALL.write(tx, conv, record))
        failpoint("space.outcome", call=ctx.call_id, tool=tool)
        self.checkpoints.after_call(ctx, handle.client)
        return result


def _with_outcome(record: CallRecord | None, result: ToolResult) -> CallRecord:
    assert record is not None, "the call's start mark is committed before its outcome"
    return replace(record, outcome=result)


def _file_op(client: SpaceClient, tool: str,
             args: dict[str, Any]) -> tuple[ToolResult, bytes]:
    """The call's result and the bytes it wrote."""
    path = args["path"]
    try:
        if tool == "write":
            data = args["content"].encode("utf-8")
            client.write_file(path, data)
            return ToolResult(f"Wrote {len(data)} bytes to {path}"), data
        text = client.read_file(path).decode("utf-8")
        data = apply_edits(text, args["edits"], path).encode("utf-8")
        client.write_file(path, data)
        return ToolResult(f"Applied {len(args['edits'])} edit(s) to {path}"), data
    except SpaceError as exc:
        raise tool_error(exc) from None
