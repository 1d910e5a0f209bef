"""Redrive mode: a campaign with a run of each kind keeps the invariant and the coordinator's
rules, and the coordinator check (G6) fails on each rule broken in a recorded history."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest

from chaos.campaign.records import ResultsDir
from chaos.checks.coordinator import check
from chaos.modes.redrive import KINDS, kind_of
from tests.chaos.campaign.test_campaign import campaign


def test_a_run_of_each_kind_keeps_the_invariant_and_the_coordinators_rules(
        tmp_path: Path) -> None:
    seeds: dict[str, int] = {}
    for seed in range(1, 4 * len(KINDS)):  # the first seed of each kind
        seeds.setdefault(kind_of(seed, None), seed)
    assert sorted(seeds) == sorted(KINDS)
    code, summary, text = campaign(tmp_path, mode="redrive", seeds=tuple(seeds.values()))
    assert code == 0, text
    assert summary["failed"] == "0" and summary["unknown"] == "0", text
    assert summary["redrive_kinds"] == ",".join(f"{k}:1" for k in sorted(KINDS))
    assert int(summary["drives"]) >= 9  # every kind re-drives at least once; race: 3
    assert summary["refused_tokens"] == "2" and summary["coordinator_kills"] == "1"
    assert int(summary["resume_p50_ms"]) > 0
    records = {r["seed"]: r for r in ResultsDir.open(tmp_path / "results" / "latest").runs()}
    for kind, seed in seeds.items():
        facts = records[seed]["observation"]["coordinator"]
        kinds = [e["kind"] for e in facts["events"]]
        if kind in ("lost_after_kill", "lost_live"):
            assert "space_gone" in kinds and kinds.count("space_placed") == 1, (kind, kinds)
        if kind == "lost_live":  # the driver met the loss itself and halted: exit 1
            exits = [e["data"]["exit"] for e in facts["events"] if e["kind"] == "exited"]
            assert exits[0] == 1 and exits[-1] == 0, exits
        if kind == "race":
            assert records[seed]["observation"]["second"] is not None
            assert "held" in kinds
        if kind == "frozen":  # noticed by its silence, killed, replaced
            assert "stalled" in kinds and facts["pauses"], (kinds, facts["pauses"])
        if kind == "frozen_host":  # taken over by the other coordinator, then woken
            drivers = [e["data"]["coordinator"] for e in facts["events"]
                       if e["kind"] == "launched"]
            assert len(set(drivers)) == 2 and "stalled" not in kinds, facts["events"]
            assert [f["woken"] is not None for f in facts["host_freezes"]] == [True]


def _facts() -> dict[str, Any]:
    """A recorded history that keeps every rule: a driver frozen, noticed as stalled and
    killed, a Space lost and noticed, then the race's second session, waiting, on the next
    token."""
    def ev(seq: int, session: str, at: float, kind: str, **data: Any) -> dict[str, Any]:
        return {"seq": seq, "session": session, "at": at, "kind": kind, "data": data}

    def rec(name: str, token: int) -> dict[str, Any]:
        return {"spec": {"name": name}, "state": "done", "reason": "finished",
                "lease_token": token}

    events = [
        ev(1, "b", 1.0, "held", holder="a"),
        ev(2, "a", 1.0, "drive", attempt=1, epoch=1, previous=0, token=1, floor=0),
        ev(3, "a", 1.1, "launched", epoch=1, pid=10),
        ev(4, "a", 2.0, "exited", epoch=1, exit=-9),
        ev(5, "a", 2.2, "space_gone", space="s"),
        ev(6, "a", 2.3, "drive", attempt=2, epoch=2, previous=1, token=1, floor=None),
        ev(7, "a", 2.4, "launched", epoch=2, pid=11),
        ev(8, "a", 3.0, "exited", epoch=2, exit=0),
        ev(9, "a", 3.0, "lease_released", token=1),
        ev(10, "b", 3.1, "drive", attempt=1, epoch=3, previous=0, token=2, floor=2),
        ev(11, "b", 3.2, "launched", epoch=3, pid=12),
        ev(12, "b", 4.0, "exited", epoch=3, exit=0),
        ev(13, "a", 2.0, "stalled", epoch=1, silent_secs=0.4),
    ]
    return {"kind": "race", "session": "a", "second": "b", "records": [rec("a", 1), rec("b", 2)],
            "events": events, "losses": [2.1], "pauses": [1.5], "coordinator_kills": [],
            "errors": [],
            "probes": [{"op": "renew", "token": 1, "refused": True}]}


class _Obs:
    def __init__(self, facts: dict[str, Any]) -> None:
        self.coordinator = facts


class _Input:
    def __init__(self, facts: dict[str, Any]) -> None:
        self.obs = _Obs(facts)


def errors_of(facts: dict[str, Any]) -> list[str]:
    return check(_Input(facts))  # type: ignore[arg-type]


def _edit(facts: dict[str, Any], seq: int, **data: Any) -> None:
    event = next(e for e in facts["events"] if e["seq"] == seq)
    event["data"].update(data)


BROKEN = {
    "an epoch off the rule": (lambda f: _edit(f, 10, epoch=2), "the rule gives 3"),
    "a wrong previous epoch": (lambda f: _edit(f, 6, previous=0), "recorded previous epoch 0"),
    "a later session not above": (lambda f: (_edit(f, 10, epoch=2, floor=None, token=2),
                                             _edit(f, 11, epoch=2)), "not above epoch 2"),
    "two drivers at once": (lambda f: f["events"].__setitem__(
        7, {**f["events"][7], "seq": 13}), "two drivers of one Space at once"),
    "a loss not noticed": (lambda f: f["events"].pop(4), "without the coordinator noticing"),
    "no wait": (lambda f: f["events"].pop(0), "did not wait for a"),
    "a late start": (lambda f: f["events"][10].update(at=9.5), "at most 5 s"),
    "a token not next": (lambda f: f["records"][1].update(lease_token=5), "the next after"),
    "a superseded token accepted": (lambda f: f["probes"][0].update(refused=False),
                                    "was accepted"),
    "a session that failed": (lambda f: f["records"][0].update(state="failed"),
                              "session a ended failed"),
    "a freeze not noticed": (lambda f: f["events"].pop(), "never noticed as stalled"),
    "the coordinator crashed": (lambda f: f["errors"].append("coordinator c1 exited 1"),
                                "coordinator c1 exited 1"),
}


def test_a_history_that_keeps_the_rules_passes() -> None:
    assert errors_of(_facts()) == []


@pytest.mark.parametrize("rule", sorted(BROKEN))
def test_each_broken_rule_is_found(rule: str) -> None:
    facts = copy.deepcopy(_facts())
    breaks, message = BROKEN[rule]
    breaks(facts)
    found = errors_of(facts)
    assert any(message in e for e in found), found


def test_a_drive_whose_coordinator_died_ends_when_the_next_finds_its_driver_gone() -> None:
    """A host power cut kills the coordinator with its driver: that drive has no ``exited``;
    the next coordinator's ``orphan_ended`` for the driver's pid is its end: one that
    killed it, or one that found it gone after the nemesis killed its host. Found gone
    with nothing that killed it, or for another pid, it is not."""
    facts = copy.deepcopy(_facts())
    facts["events"][3] = {**facts["events"][3], "kind": "orphan_ended",
                          "data": {"pid": 10, "killed": False}}
    facts["host_cuts"] = [1.5]
    assert errors_of(facts) == []
    facts["host_cuts"] = []
    assert any("nothing killed it" in e for e in errors_of(facts))
    facts["events"][3]["data"]["killed"] = True
    assert errors_of(facts) == []
    facts["events"][3]["data"]["pid"] = 99
    assert any("two drivers of one Space at once" in e for e in errors_of(facts))


def _frozen_host_facts() -> dict[str, Any]:
    """A history that keeps the rules: c1's driver frozen with c1 at 2.0, c2 takes the
    session over at epoch 2, the frozen driver is woken at 3.0 and c1 records its end."""
    def ev(seq: int, at: float, kind: str, **data: Any) -> dict[str, Any]:
        return {"seq": seq, "session": "a", "at": at, "kind": kind, "data": data}

    events = [
        ev(1, 1.0, "drive", attempt=1, epoch=1, previous=0, token=1, floor=0),
        ev(2, 1.1, "launched", epoch=1, pid=10, coordinator="c1"),
        ev(8, 2.45, "claimed", coordinator="c2", from_state="running", from_owner="c1"),
        ev(3, 2.5, "drive", attempt=2, epoch=2, previous=1, token=1, floor=1),
        ev(4, 2.6, "launched", epoch=2, pid=11, coordinator="c2"),
        ev(5, 3.2, "exited", epoch=1, exit=75),
        ev(6, 3.2, "claim_lost", coordinator="c1"),
        ev(7, 4.0, "exited", epoch=2, exit=0),
    ]
    return {"kind": "frozen_host", "session": "a", "second": None,
            "records": [{"spec": {"name": "a"}, "state": "done", "reason": "finished",
                         "lease_token": 1}],
            "events": events, "losses": [], "pauses": [], "coordinator_kills": [],
            "host_freezes": [{"at": 2.0, "woken": 3.0, "claim_until": 2.4}], "errors": [],
            "probes": []}


def test_a_driver_frozen_with_its_coordinator_is_taken_over_by_another() -> None:
    """The two drivers overlap (the frozen one ends after the newer one started): allowed
    only for a drive frozen with its host and taken over by another coordinator before the
    host was woken, whose end its coordinator then recorded."""
    assert errors_of(_frozen_host_facts()) == []
    facts = _frozen_host_facts()
    _edit(facts, 4, coordinator="c1")  # the frozen coordinator drove on
    assert any("not taken over by another coordinator" in e for e in errors_of(facts))
    assert any("two drivers of one Space at once" in e for e in errors_of(facts))
    facts = _frozen_host_facts()
    facts["host_freezes"][0]["woken"] = 2.55  # woken before the takeover
    assert any("not taken over by another coordinator" in e for e in errors_of(facts))
    facts = _frozen_host_facts()
    facts["events"] = [e for e in facts["events"] if e["seq"] != 5]  # its end never recorded
    found = errors_of(facts)
    assert any("never recorded how that drive ended" in e for e in found), found
    facts = _frozen_host_facts()
    facts["host_freezes"][0]["claim_until"] = 2.5  # claimed before the claim lapsed
    assert any("before the frozen claim lapsed" in e for e in errors_of(facts))
    facts = _frozen_host_facts()
    facts["host_freezes"][0]["woken"] = None
    assert any("was never woken" in e for e in errors_of(facts))
    facts = _frozen_host_facts()
    facts["host_freezes"] = []  # no freeze: the overlap is two drivers at once
    assert any("two drivers of one Space at once" in e for e in errors_of(facts))
