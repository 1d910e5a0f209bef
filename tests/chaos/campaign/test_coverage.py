"""The campaign's coverage of the recovery table (``chaos.campaign.coverage``): the cells a campaign
can reach, each decided from some consistent facts, every exclusion removing a real cell,
and a recorded event's cell."""

from __future__ import annotations

import itertools

import pytest

from chaos.campaign.coverage import (
    AUTO_ONLY,
    REACHABLE_CELLS,
    UNREACHABLE,
    cell_of,
    reachable_cells,
    table_cells,
)
from durable.adapter.decide import Facts, consistent, decide
from durable.adapter.rebuild import RebuildFacts, decide_rebuild
from tests.durable.adapter.test_decide import CHECKPOINTS, LEDGER, MODES, TOOLS, C, T, event_json

#: Written out so that a change to the reachable set is a visible change to this test.
EXPECTED_CELLS = {
    (T, "ran", "bash", "no_start_mark"), (T, "ran", "file", "no_start_mark"),
    (T, "ran", "bash", "key_unknown"), (T, "reattached", "bash", "running"),
    (T, "replayed", "bash", "exited"),
    (T, "reverted", "bash", "daemon_lost"), (T, "reverted", "bash", "fenced"),
    (T, "reverted", "bash", "space_lost"), (T, "reverted", "file", "space_lost"),
    (T, "reverted", "file", "file_cut"),
    (T, "reimaged", "space", "space_lost"), (T, "reimaged", "space", "unfinished"),
    (C, "adopted", "bash", "outcome_recorded"), (C, "adopted", "file", "outcome_recorded"),
    (C, "ran", "bash", "no_start_mark"), (C, "ran", "file", "no_start_mark"),
    (C, "ran", "bash", "key_unknown"), (C, "reattached", "bash", "running"),
    (C, "replayed", "bash", "exited"),
    (C, "restored", "bash", "daemon_lost"), (C, "interrupted", "bash", "daemon_lost"),
    (C, "restored", "bash", "fenced"), (C, "interrupted", "bash", "fenced"),
    (C, "restored", "bash", "space_lost"), (C, "interrupted", "bash", "space_lost"),
    (C, "restored", "file", "space_lost"), (C, "restored", "file", "file_cut"),
    (C, "restored", "space", "space_lost"), (C, "restored", "space", "unfinished"),
    (C, "reimaged", "space", "space_lost"), (C, "reimaged", "space", "unfinished"),
}


def test_reachable_cells() -> None:
    assert REACHABLE_CELLS == EXPECTED_CELLS
    assert AUTO_ONLY <= REACHABLE_CELLS
    assert reachable_cells("auto") == REACHABLE_CELLS
    assert reachable_cells(T) == {c for c in EXPECTED_CELLS if c[0] == T}
    assert reachable_cells(C) == {c for c in EXPECTED_CELLS if c[0] == C} - AUTO_ONLY
    with pytest.raises(ValueError, match="durable_mode"):
        reachable_cells("exhaustive")


def test_every_reachable_cell_is_decided_from_some_consistent_facts() -> None:
    """Enumerated here, not with the module's own enumeration, for the coding tools (every
    one ``replay="never"``)."""
    image: set[tuple[str, str, str, str]] = set()
    for mode, tool, mark, outcome, same, key, ledger, cp in itertools.product(
            MODES, TOOLS, *([(True, False)] * 4), LEDGER, CHECKPOINTS):
        f = Facts(mode, tool, "never", mark, outcome, same, key, ledger, cp)
        if consistent(f):
            d = decide(f)
            image |= {(mode, kind, tool, d.cause) for kind in d.events}
    for mode, recorded, exists, cp, inside in itertools.product(
            (None, *MODES), ("this", "none", "other"), *([(True, False)] * 3)):
        r = decide_rebuild(RebuildFacts(mode, recorded, exists, cp, inside))  # type: ignore[arg-type]
        image |= {(mode or "undecided", kind, "space", r.cause) for kind in r.events}
    assert image >= REACHABLE_CELLS, REACHABLE_CELLS - image
    assert image == table_cells(("never",))


def test_every_exclusion_removes_a_cell_of_the_table() -> None:
    cells = table_cells(("never",))
    for pattern, why in UNREACHABLE:
        assert why
        assert any(all(p in ("*", c) for p, c in zip(pattern, cell, strict=True))
                   for cell in cells), pattern


def test_cell_of() -> None:
    assert cell_of(event_json("restored", "edit", "file_cut")) == (
        C, "restored", "file", "file_cut")
    assert cell_of(event_json("reimaged", "space", "new_space", None)) == (
        "undecided", "reimaged", "space", "new_space")
    assert cell_of(event_json("mode", "bash", "process_running")) is None
    old = {"kind": "adopted", "mode": C, "call_id": "7.0", "detail": "", "conversation": 1}
    with pytest.raises(ValueError, match="no cause"):
        cell_of(old)


