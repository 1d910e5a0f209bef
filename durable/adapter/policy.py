"""The mode policy, as pure functions: which mode a conversation runs in, and when ``auto``
leaves transactional mode for checkpoint mode (for good, with the reason recorded).

Transactional mode keeps the workspace as an image in the log, so it holds only while the
image can follow the workspace: within the limits, with trackable names, and with no
process left running (a process may change files after the scan that recorded the call).
``transactional`` requested explicitly refuses a call it cannot keep (before it runs) or
marks the image stale (after it ran: the workspace changed under it); ``auto`` switches.

No I/O: ``modes`` (before a call) and ``runner`` (after it) gather the facts (a scan, the
image document), call these and carry the verdict out. ``tests/durable/adapter/test_policy.py``
enumerates every case.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, get_args

from .state import Mode, ModeCause

RequestedMode = Literal["auto", "transactional", "checkpoint"]


def requested_mode(raw: str) -> RequestedMode:
    """``raw``, checked to be a mode the adapter can be asked for."""
    for mode in get_args(RequestedMode):
        if raw == mode:
            checked: RequestedMode = mode
            return checked
    raise ValueError(f"mode must be 'auto', 'transactional' or 'checkpoint', got {raw!r}")


@dataclass(frozen=True)
class ModeChoice:
    mode: Mode
    #: Why, when the mode is decided now (to record); None when it was recorded before.
    reason: str | None


def conversation_mode(recorded: Mode | None, requested: RequestedMode, snapshot_kind: str,
                      can_scan: bool) -> ModeChoice:
    """The conversation's mode: the recorded one, else the requested one, else (``auto``)
    transactional when the workspace can be scanned and snapshots are of the workspace."""
    if recorded is not None:
        return ModeChoice(recorded, None)
    if requested != "auto":
        return ModeChoice(requested, f"mode={requested} requested")
    if snapshot_kind != "workspace":
        return ModeChoice("checkpoint", f"the snapshot provider takes {snapshot_kind} snapshots")
    if not can_scan:
        return ModeChoice("checkpoint", "the Space cannot scan its workspace")
    return ModeChoice("transactional", "auto: a new conversation starts transactional")


@dataclass(frozen=True)
class Verdict:
    """What becomes of transactional mode around a call.

    ``keep``: the image follows the workspace; ``refuse``: the call must not run
    (``transactional`` requested, the workspace cannot be kept); ``mark_stale``: the call ran
    but the image can no longer follow (``transactional`` requested); ``switch``: ``auto``
    goes to checkpoint mode, for ``cause``."""

    action: Literal["keep", "refuse", "mark_stale", "switch"]
    cause: ModeCause | None = None
    problem: str | None = None


KEEP = Verdict("keep")


def before_call(requested: RequestedMode, over_limits: str | None,
                stale: str | None) -> Verdict:
    """Before a call in transactional mode: ``over_limits`` is why the scanned workspace
    cannot be an image (None when it can), ``stale`` why the image went stale earlier."""
    problem = over_limits or stale
    if not problem:
        return KEEP
    if requested == "transactional":
        return Verdict("refuse", None, problem)
    return Verdict("switch", "over_limits" if over_limits else "image_stale", problem)


def after_call(requested: RequestedMode, over_limits: str | None, running: bool,
               running_keys: Sequence[str]) -> Verdict:
    """After a call in transactional mode, from the scan that would record it: ``running``
    (with the keys of the commands whose processes are left) only moves ``auto``."""
    cause: ModeCause = "over_limits"
    problem = over_limits
    if problem is None and requested == "auto" and running:
        cause, problem = "process_running", (
            f"a command left a process running in the Space "
            f"({', '.join(running_keys) or 'unknown key'})")
    if problem is None:
        return KEEP
    if requested == "transactional":
        return Verdict("mark_stale", None, problem)
    return Verdict("switch", cause, problem)
