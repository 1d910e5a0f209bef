"""The adapter's recovery table (``durable.adapter.decide``, ``durable.adapter.rebuild``),
without a Space or a log: every row crossed with mode and replay rule, properties over all
facts, the rebuild decision, and the cells a campaign can reach."""

from __future__ import annotations

from dataclasses import replace
from typing import Any, get_args

import pytest
from hypothesis import given
from hypothesis import strategies as st

from durable.adapter.decide import (
    Action,
    CheckpointFact,
    Decision,
    Facts,
    LedgerState,
    ToolKind,
    consistent,
    decide,
    ledger_state,
    needs_ledger,
)
from durable.adapter.rebuild import RebuildDecision, RebuildFacts, decide_rebuild
from durable.adapter.recovery import _EXECUTORS
from durable.adapter.state import RECOVERY_KEY, Mode, RecoveryEvent
from spacesd.protocol import ExecInfo

T, C = "transactional", "checkpoint"
MODES: tuple[Mode, ...] = get_args(Mode)
TOOLS: tuple[ToolKind, ...] = get_args(ToolKind)
LEDGER: tuple[LedgerState | None, ...] = (None, *get_args(LedgerState))
CHECKPOINTS: tuple[CheckpointFact, ...] = get_args(CheckpointFact)


def D(action: str, cause: str, **kw: Any) -> Decision:
    return Decision(action, cause, **kw)  # type: ignore[arg-type]


def adopt(take: bool) -> Decision:
    return D("adopt", "outcome_recorded", take_checkpoint=take)


def restore(action: str, cause: str, source: str = "checkpoint") -> Decision:
    return D(action, cause, restore_from=source)


# ---------------------------------------------------------------- the table

#: (situation, tool, facts that differ from a bash/file call whose start mark is in the log
#: in the same Space with no outcome and an earlier checkpoint) and the expected decision in
#: transactional mode (replay never, safe), then checkpoint mode (never, safe).
ROWS: list[tuple[str, ToolKind, dict[str, Any], Decision, Decision, Decision, Decision]] = [
    ("no start mark", "bash", dict(start_mark=False, same_generation=False, key=False),
     D("run", "no_start_mark"), D("run", "no_start_mark"),
     D("run", "no_start_mark"), D("run", "no_start_mark")),
    ("start mark without a key", "bash", dict(key=False),
     D("run", "no_key"), D("run", "no_key"), D("run", "no_key"), D("run", "no_key")),
    ("outcome recorded", "bash", dict(outcome=True),
     adopt(False), adopt(False), adopt(True), adopt(True)),
    ("outcome and its checkpoint recorded", "bash",
     dict(outcome=True, checkpoint="this_call"),
     adopt(False), adopt(False), adopt(False), adopt(False)),
    ("outcome recorded, no checkpoint at all", "bash", dict(outcome=True, checkpoint="none"),
     adopt(False), adopt(False), adopt(True), adopt(True)),
    ("outcome recorded in a lost Space", "bash", dict(outcome=True, same_generation=False),
     D("revert", "space_lost"), D("revert", "space_lost"),
     restore("restore_interrupt", "space_lost"), restore("restore_rerun", "space_lost")),
    ("ledger: running", "bash", dict(ledger="running"),
     D("reattach", "running"), D("reattach", "running"),
     D("reattach", "running"), D("reattach", "running")),
    ("ledger: exited", "bash", dict(ledger="exited"),
     D("replay", "exited"), D("replay", "exited"), D("replay", "exited"), D("replay", "exited")),
    ("ledger: key unknown", "bash", dict(ledger="unknown"),
     D("run", "key_unknown"), D("run", "key_unknown"),
     D("run", "key_unknown"), D("run", "key_unknown")),
    ("ledger: fenced by a newer epoch", "bash", dict(ledger="fenced"),
     D("revert", "fenced"), D("revert", "fenced"),
     restore("restore_interrupt", "fenced"), restore("restore_rerun", "fenced")),
    ("ledger: lost with the daemon", "bash", dict(ledger="lost"),
     D("revert", "daemon_lost"), D("revert", "daemon_lost"),
     restore("restore_interrupt", "daemon_lost"), restore("restore_rerun", "daemon_lost")),
    ("ledger: lost, no checkpoint at all", "bash", dict(ledger="lost", checkpoint="none"),
     D("revert", "daemon_lost"), D("revert", "daemon_lost"),
     restore("restore_interrupt", "daemon_lost", "image"),
     restore("restore_rerun", "daemon_lost", "image")),
    ("started in a lost Space", "bash", dict(same_generation=False),
     D("revert", "space_lost"), D("revert", "space_lost"),
     restore("restore_interrupt", "space_lost"), restore("restore_rerun", "space_lost")),
    ("no start mark", "file", dict(start_mark=False, same_generation=False),
     D("run", "no_start_mark"), D("run", "no_start_mark"),
     D("run", "no_start_mark"), D("run", "no_start_mark")),
    ("cut off", "file", {},
     D("revert", "file_cut"), D("revert", "file_cut"),
     restore("restore_rerun", "file_cut"), restore("restore_rerun", "file_cut")),
    ("cut off, no checkpoint at all", "file", dict(checkpoint="none"),
     D("revert", "file_cut"), D("revert", "file_cut"),
     restore("restore_rerun", "file_cut", "image"), restore("restore_rerun", "file_cut", "image")),
    ("started in a lost Space", "file", dict(same_generation=False),
     D("revert", "space_lost"), D("revert", "space_lost"),
     restore("restore_rerun", "space_lost"), restore("restore_rerun", "space_lost")),
    ("outcome recorded", "file", dict(outcome=True),
     adopt(False), adopt(False), adopt(True), adopt(True)),
    ("outcome recorded in a lost Space", "file", dict(outcome=True, same_generation=False),
     D("revert", "space_lost"), D("revert", "space_lost"),
     restore("restore_rerun", "space_lost"), restore("restore_rerun", "space_lost")),
]
COLUMNS = [(T, "never"), (T, "safe"), (C, "never"), (C, "safe")]


def call_facts(mode: str, tool: ToolKind, replay: str, **changes: Any) -> Facts:
    base = dict(mode=mode, tool=tool, replay=replay, start_mark=True, outcome=False,
                same_generation=True, key=tool == "bash", ledger=None, checkpoint="earlier")
    return Facts(**{**base, **changes})  # type: ignore[arg-type]


@pytest.mark.parametrize(("situation", "tool", "changes", "column", "expected"), [
    pytest.param(row[0], row[1], row[2], column, row[3 + i],
                 id=f"{row[1]}: {row[0]} [{column[0]}, replay={column[1]}]")
    for row in ROWS for i, column in enumerate(COLUMNS)])
def test_recovery_table(situation: str, tool: ToolKind, changes: dict[str, Any],
                        column: tuple[str, str], expected: Decision) -> None:
    facts = call_facts(column[0], tool, column[1], **changes)
    assert consistent(facts), f"the row {situation!r} describes facts that cannot occur"
    assert decide(facts) == expected


def test_the_table_covers_every_action_and_cause() -> None:
    decisions = {row[3 + i] for row in ROWS for i in range(4)}
    assert {d.action for d in decisions} == {
        "adopt", "reattach", "replay", "run", "revert", "restore_rerun", "restore_interrupt"}
    assert {d.cause for d in decisions} == {
        "outcome_recorded", "running", "exited", "no_start_mark", "no_key", "key_unknown",
        "daemon_lost", "fenced", "space_lost", "file_cut"}


def test_every_action_has_one_executor() -> None:
    """Each decision the table can take is carried out by exactly one executor."""
    assert set(_EXECUTORS) == set(get_args(Action))


def test_a_restore_that_interrupts_records_both_events() -> None:
    assert restore("restore_interrupt", "fenced").events == ("restored", "interrupted")
    assert restore("restore_rerun", "file_cut").events == ("restored",)


def test_the_ledger_is_asked_first() -> None:
    with pytest.raises(ValueError, match="needs_ledger"):
        decide(call_facts(C, "bash", "never"))


@pytest.mark.parametrize(("info", "state"), [
    (ExecInfo("k", "running"), "running"),
    (ExecInfo("k", "exited", exit_code=3), "exited"),
    (ExecInfo("k", "exited", signal=9, fenced_by=4), "fenced"),
    (ExecInfo("k", "lost"), "lost"),
    (ExecInfo("k", "unknown"), "unknown"),
])
def test_ledger_state(info: ExecInfo, state: str) -> None:
    assert ledger_state(info) == state


def test_ledger_state_refuses_started() -> None:
    with pytest.raises(ValueError, match="only exec_start"):
        ledger_state(ExecInfo("k", "started"))


# ---------------------------------------------------------------- properties

any_facts = st.builds(
    Facts, mode=st.sampled_from(MODES), tool=st.sampled_from(TOOLS),
    replay=st.sampled_from(("safe", "never")), start_mark=st.booleans(),
    outcome=st.booleans(), same_generation=st.booleans(), key=st.booleans(),
    ledger=st.sampled_from(LEDGER), checkpoint=st.sampled_from(CHECKPOINTS))


@st.composite
def gathered_facts(draw: st.DrawFn) -> Facts:
    """Facts as the executor gathers them: consistent, the ledger asked when needed."""
    f = draw(any_facts)
    mark = f.start_mark
    f = replace(f, outcome=f.outcome and mark, same_generation=f.same_generation and mark,
                key=f.key and mark and f.tool == "bash", ledger=None)
    if needs_ledger(f):
        f = replace(f, ledger=draw(st.sampled_from(LEDGER[1:])))
    assert consistent(f)
    return f


@given(gathered_facts())
def test_transactional_mode_never_interrupts_or_restores(f: Facts) -> None:
    d = decide(f)
    if f.mode == T:
        assert d.action not in ("restore_rerun", "restore_interrupt")
        assert not {"restored", "interrupted"} & set(d.events)


@given(gathered_facts())
def test_checkpoint_mode_never_reruns_a_command_that_reached_the_space(f: Facts) -> None:
    if f.mode == C and f.tool == "bash" and f.ledger in ("running", "exited", "fenced", "lost"):
        d = decide(f)
        assert d.action != "run"
        if f.replay == "never":
            assert d.action != "restore_rerun"


@given(gathered_facts())
def test_a_recorded_outcome_in_the_same_space_is_adopted(f: Facts) -> None:
    if f.outcome and f.same_generation:
        assert decide(f).action == "adopt"


@given(gathered_facts())
def test_only_bash_is_reattached_or_replayed(f: Facts) -> None:
    if decide(f).action in ("reattach", "replay"):
        assert f.tool == "bash"


@given(any_facts)
def test_an_unasked_ledger_does_not_matter(f: Facts) -> None:
    """Where the executor does not ask the ledger, its answer changes nothing."""
    if needs_ledger(f):
        return
    decisions = {decide(replace(f, ledger=state)) for state in LEDGER}
    assert len(decisions) == 1, decisions


@given(gathered_facts())
def test_an_unknown_outcome_is_reverted_or_restored(f: Facts) -> None:
    """Revert and restore go together with exactly the unknown causes."""
    d = decide(f)
    unknown = d.cause in ("daemon_lost", "fenced", "space_lost", "file_cut")
    assert unknown == (d.action in ("revert", "restore_rerun", "restore_interrupt"))
    assert (d.restore_from is not None) == d.action.startswith("restore")


# ---------------------------------------------------------------- rebuilt Spaces


@pytest.mark.parametrize(("facts", "expected"), [
    (RebuildFacts(T, "this", False, False, False), RebuildDecision("reimage", "space_lost", True)),
    (RebuildFacts(T, "this", True, False, False), RebuildDecision("reimage", "unfinished", False)),
    (RebuildFacts(T, "none", False, False, False), RebuildDecision("reimage", "new_space", True)),
    (RebuildFacts(None, "none", False, False, False),
     RebuildDecision("reimage", "new_space", True)),
    (RebuildFacts(C, "this", False, True, False), RebuildDecision("restore", "space_lost", True)),
    (RebuildFacts(C, "this", True, True, True), RebuildDecision("restore", "unfinished", False)),
    (RebuildFacts(C, "this", False, True, True), RebuildDecision("fail", "space_lost", True)),
    (RebuildFacts(C, "other", False, True, False), RebuildDecision("restore", "new_space", True)),
    (RebuildFacts(C, "this", False, False, False),
     RebuildDecision("reimage", "space_lost", True)),
])
def test_rebuild_table(facts: RebuildFacts, expected: RebuildDecision) -> None:
    assert decide_rebuild(facts) == expected


def event_json(kind: str, tool: str, cause: str, mode: str | None = C) -> dict[str, Any]:
    event = RecoveryEvent(kind, mode, "7.0", "detail", 1, tool, cause, 3)  # type: ignore[arg-type]
    return {**event.to_entry()[RECOVERY_KEY], "entry": 12, "time_ms": 0}


def test_recovery_event_json_shape_and_old_entries() -> None:
    assert event_json("ran", "bash", "key_unknown") == {
        "kind": "ran", "mode": C, "call_id": "7.0", "detail": "detail", "conversation": 1,
        "tool": "bash", "cause": "key_unknown", "epoch": 3, "entry": 12, "time_ms": 0}
    old = {"hidden": True, RECOVERY_KEY: {"kind": "restored", "mode": C, "call_id": None,
                                          "detail": "Space rebuilt", "conversation": 1}}
    event = RecoveryEvent.from_entry(old)
    assert (event.kind, event.tool, event.cause, event.epoch) == ("restored", None, None, None)
