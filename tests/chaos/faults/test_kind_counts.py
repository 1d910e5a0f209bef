"""A fault kind's count is named once (``plans.KIND_COUNTS``): the nemesis counts by it,
run records keep it, progress sums it as a fault, and the SUMMARY line has a place for it."""

from __future__ import annotations

from typing import get_args

from chaos.campaign.progress import FAULT_COUNTS, faults_fired
from chaos.campaign.summary import KEYS, printed_keys, summarize
from chaos.faults.plans import HELD_KINDS, KIND_COUNTS, Action
from chaos.run.state import COUNTS, RunState


def test_every_action_has_a_count_that_records_progress_and_the_summary_know() -> None:
    assert set(KIND_COUNTS) == set(get_args(Action))
    for action, key in KIND_COUNTS.items():
        assert key in COUNTS and key in FAULT_COUNTS and key in KEYS, action
    assert {KIND_COUNTS[a] for a in HELD_KINDS} == {k.key for k in HELD_KINDS.values()}


def test_a_struck_kind_is_counted_once_and_shows_in_the_line() -> None:
    state = RunState()
    state.count(KIND_COUNTS["kill_process"])
    state.count(KIND_COUNTS["pause_commands"])
    counts = state.counts()
    assert faults_fired(counts) == 2
    record = {"verdict": {"valid": True}, "counts": counts, "recoveries": [],
              "observation": None}
    summary = summarize(mode="transactional", backend="local", seed_base=1, records=[record],
                        seconds=1.0, held=("pause_commands",))
    keys = printed_keys(summary)
    assert summary["process_kills"] == 1 and "process_kills" in keys
    assert summary["command_pauses"] == 1 and "command_pauses" in keys


def test_what_is_in_effect_at_an_instant_of_a_runs_history() -> None:
    from chaos.faults.plans import RELEASE, in_effect_at

    def op(t: float, f: str, value: object = None, process: str = "nemesis",
           type_: str = "info") -> dict[str, object]:
        return {"process": process, "type": type_, "f": f, "value": value, "time": t}

    history = [op(1.0, "pause_space"), op(1.5, "cut_link"),
               op(2.0, RELEASE, {"action": "cut_link"}), op(2.5, "pause", "older paused"),
               op(2.6, "kill_driver", type_="fail"), op(4.0, RELEASE, {"action": "pause_space"}),
               op(5.0, "kill_daemon")]
    assert in_effect_at(history, 0.5) == (set(), True)
    assert in_effect_at(history, 1.8) == ({"pause_space", "cut_link"}, True)
    assert in_effect_at(history, 3.0) == ({"pause_space"}, True)
    assert in_effect_at(history, 4.5) == (set(), True)  # the daemon's kill at 5.0
    assert in_effect_at(history, 6.0) == (set(), False)  # all over: none can stop a driver


def test_a_kind_for_some_stale_kinds_refuses_the_others_with_one_message() -> None:
    """``chaos run`` and a stale run replayed by ``chaos repro`` refuse with these words."""
    cut = HELD_KINDS["cut_host_power"]
    assert cut.stale_refusal("race") is None and cut.stale_refusal("detached") is None
    why = cut.stale_refusal("paused")
    assert why is not None and why.startswith(
        "--cut-host-power is for --stale-kind race or detached, not paused: ")
    assert why.endswith(cut.stale_why)
    assert HELD_KINDS["pause_space"].stale_refusal("paused") is None
