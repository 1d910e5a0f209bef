"""The mode policy (``durable.adapter.policy``) as a table, without a Space or a log: which
mode a conversation runs in, and what becomes of transactional mode before and after a
call, for every mode one may ask for."""

from __future__ import annotations

import itertools

import pytest

from durable.adapter.policy import (
    KEEP,
    ModeChoice,
    RequestedMode,
    Verdict,
    after_call,
    before_call,
    conversation_mode,
    requested_mode,
)
from durable.adapter.state import Mode

REQUESTED: tuple[RequestedMode, ...] = ("auto", "transactional", "checkpoint")
T: Mode = "transactional"
C: Mode = "checkpoint"


@pytest.mark.parametrize(("recorded", "requested", "kind", "can_scan", "expected"), [
    (T, "checkpoint", "machine", False, ModeChoice(T, None)),
    (C, "auto", "workspace", True, ModeChoice(C, None)),
    (None, "transactional", "machine", False, ModeChoice(T, "mode=transactional requested")),
    (None, "checkpoint", "workspace", True, ModeChoice(C, "mode=checkpoint requested")),
    (None, "auto", "machine", True,
     ModeChoice(C, "the snapshot provider takes machine snapshots")),
    (None, "auto", "workspace", False, ModeChoice(C, "the Space cannot scan its workspace")),
    (None, "auto", "workspace", True,
     ModeChoice(T, "auto: a new conversation starts transactional")),
])
def test_conversation_mode(recorded: Mode | None, requested: RequestedMode, kind: str,
                           can_scan: bool, expected: ModeChoice) -> None:
    assert conversation_mode(recorded, requested, kind, can_scan) == expected


def test_a_recorded_mode_is_kept_whatever_is_asked() -> None:
    for recorded, requested, kind, can_scan in itertools.product(
            (T, C), REQUESTED, ("workspace", "machine"), (True, False)):
        assert conversation_mode(recorded, requested, kind, can_scan) == ModeChoice(
            recorded, None)


OVER, STALE = "13 files exceed max_files=10", "an earlier call left 12 files"


@pytest.mark.parametrize(("requested", "over", "stale", "expected"), [
    (r, None, None, KEEP) for r in REQUESTED] + [
    ("transactional", OVER, None, Verdict("refuse", None, OVER)),
    ("transactional", None, STALE, Verdict("refuse", None, STALE)),
    ("transactional", OVER, STALE, Verdict("refuse", None, OVER)),
    ("auto", OVER, None, Verdict("switch", "over_limits", OVER)),
    ("auto", None, STALE, Verdict("switch", "image_stale", STALE)),
    ("auto", OVER, STALE, Verdict("switch", "over_limits", OVER)),
    # a conversation auto left transactional, resumed by a driver asked for checkpoint mode
    ("checkpoint", None, STALE, Verdict("switch", "image_stale", STALE)),
])
def test_before_call(requested: RequestedMode, over: str | None, stale: str | None,
                     expected: Verdict) -> None:
    assert before_call(requested, over, stale) == expected


RUNNING = "a command left a process running in the Space (s:1:7.0:1@1)"


@pytest.mark.parametrize(("requested", "over", "running", "keys", "expected"), [
    (r, None, False, [], KEEP) for r in REQUESTED] + [
    ("transactional", None, True, ["s:1:7.0:1@1"], KEEP),
    ("checkpoint", None, True, ["s:1:7.0:1@1"], KEEP),
    ("auto", None, True, ["s:1:7.0:1@1"], Verdict("switch", "process_running", RUNNING)),
    ("auto", None, True, [], Verdict(
        "switch", "process_running",
        "a command left a process running in the Space (unknown key)")),
    ("auto", OVER, True, ["s:1:7.0:1@1"], Verdict("switch", "over_limits", OVER)),
    ("transactional", OVER, False, [], Verdict("mark_stale", None, OVER)),
    ("checkpoint", OVER, False, [], Verdict("switch", "over_limits", OVER)),
])
def test_after_call(requested: RequestedMode, over: str | None, running: bool,
                    keys: list[str], expected: Verdict) -> None:
    assert after_call(requested, over, running, keys) == expected


def test_only_auto_switches_and_only_transactional_refuses_or_goes_stale() -> None:
    for requested, over, stale, running in itertools.product(
            REQUESTED, (None, OVER), (None, STALE), (True, False)):
        for verdict in (before_call(requested, over, stale),
                        after_call(requested, over, running, [])):
            if verdict.action in ("refuse", "mark_stale"):
                assert requested == "transactional"
            if verdict.action == "switch":
                assert requested != "transactional" and verdict.cause is not None
            assert (verdict.problem is None) == (verdict.action == "keep")


def test_requested_mode() -> None:
    assert [requested_mode(m) for m in REQUESTED] == list(REQUESTED)
    with pytest.raises(ValueError, match="mode must be"):
        requested_mode("exhaustive")
