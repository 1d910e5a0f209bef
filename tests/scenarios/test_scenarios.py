"""Scenarios: generated from the seed alone, every step's effect applies, presets validated."""

from __future__ import annotations

import random
from dataclasses import replace
from pathlib import Path

import pytest

from durable.models import ModelRequest
from scenarios import PresetError, generate, load
from scenarios.preset import STEP_KINDS, parse


@pytest.mark.parametrize("preset", ["default", "auto", "small"])
def test_same_seed_same_scenario(preset: str) -> None:
    a, b = generate(7, load(preset)), generate(7, load(preset))
    assert a.steps == b.steps and a.initial.files == b.initial.files
    assert generate(8, load(preset)).steps != a.steps


def test_markers_are_unique_and_effects_apply() -> None:
    scenario = generate(3, load("auto"), steps=40)
    ws = scenario.initial.copy()
    for step in scenario.steps:
        step.apply(ws)
    log = ws.files["log.txt"][0].decode().splitlines() if "log.txt" in ws.files else []
    assert len(log) == len(set(log)), "append markers repeat"
    assert {s.kind for s in scenario.steps} <= set(STEP_KINDS)
    assert ws.hash() != scenario.initial.hash()


def test_a_shrunk_scenario_keeps_its_steps_and_every_effect_applies() -> None:
    """Steps dropped and simplified (a shrink's candidates): the kept steps keep their index,
    arguments and marker, a simplified one becomes a write of its marker to a file of its
    own, and every edit still finds its slot's text (it follows the edits kept before it)."""
    rng = random.Random(0)
    for seed in range(60):
        whole = generate(seed, load("default"), steps=12)
        keep = tuple(sorted(rng.sample(range(12), rng.randint(1, 12))))
        simple = tuple(i for i in keep if rng.random() < 0.3)
        shrunk = generate(seed, load("default"), steps=12, keep=keep, simple=simple)
        assert [s.index for s in shrunk.steps] == list(keep)
        ws = shrunk.initial.copy()
        for step in shrunk.steps:
            original = whole.steps[step.index]
            if step.index in simple:
                assert (step.tool, step.args["path"]) == ("write", f"simple/s{step.index}.txt")
                assert step.params == {"simplified_from": original.kind}
            elif step.tool != "edit":
                assert step == original
            else:
                assert step.args["edits"][0]["new_text"] == original.args["edits"][0]["new_text"]
            step.apply(ws)  # an edit whose text is not there once raises
            if step.tool in ("write", "edit"):
                assert step.marker.encode() in (ws.content(step.args["path"]) or b"")
    assert generate(3, load("default"), keep=None, simple=()).steps == \
        generate(3, load("default")).steps


def test_scripted_model_plays_the_plan_and_reissues_by_seed() -> None:
    scenario = generate(5, load("default"), steps=3)
    model = scenario.model()
    messages: list[dict] = []
    first = model.complete(ModelRequest(1, messages, []))
    assert first.meta == {"step": 0, "attempt": 1}
    messages += [{"role": "assistant", "tool_calls": [{"id": "a"}], "meta": first.meta},
                 {"role": "tool", "call_id": "a", "interrupted": True}]
    again = model.complete(ModelRequest(1, messages, []))
    expected = (0, 2) if scenario.reissue(0, 1) else (1, 1)
    assert (again.meta["step"], again.meta["attempt"]) == expected


def test_a_forking_agent_forks_after_a_seeded_step_and_its_steps_are_the_same() -> None:
    """``forks`` draws from an RNG of its own: a preset's steps are the same with it or
    without, and the fork follows a step that has another after it. A shrunk scenario
    keeps its fork only where it keeps the step the fork follows."""
    forks, plain = load("forks"), load("default")
    assert forks.forks == 1.0 and plain.forks == 0.0
    after = set()
    for seed in range(1, 30):
        a, b = generate(seed, forks), generate(seed, replace(forks, forks=0.0))
        assert [s.args for s in a.steps] == [s.args for s in b.steps]
        assert b.fork_after is None and a.fork_after is not None
        assert a.fork_after in [s.index for s in a.steps[:-1]]
        after.add(a.fork_after)
        assert a.keep((a.fork_after,)).fork_after == a.fork_after
        others = tuple(s.index for s in a.steps if s.index != a.fork_after)
        assert a.keep(others).fork_after is None
    assert len(after) > 3, "the step the fork follows varies with the seed"


@pytest.mark.parametrize(("raw", "message"), [
    ({"steps": "10"}, "Expected int for 'steps'"),
    ({"mix": {"telepathy": 1}}, "unknown step kind"),
    ({"stepz": 3}, "unknown field"),
    ({"file_size": [10, 1]}, "file_size"),
    ({"reissue": 2}, "probability"),
    ({"forks": -0.5}, "forks must be a finite number >= 0"),
    ({"forks": 1.5}, "forks is a probability"),
    ({"mix": {"write": 0}}, "no step kind"),
    ({"name": [1, 2]}, "name is a non-empty string"),
    ({"steps": 100_000_000}, "steps is at most 10000"),
])
def test_bad_presets_say_what_is_wrong(raw: dict, message: str) -> None:
    with pytest.raises(PresetError, match=message):
        parse(raw, "test.yaml")


def test_unknown_preset_lists_known(tmp_path: Path) -> None:
    with pytest.raises(PresetError, match=r"known: .*default"):
        load("nope")
    bad = tmp_path / "bad.yaml"
    bad.write_text("steps: [unclosed")
    with pytest.raises(PresetError, match="not valid YAML"):
        load(str(bad))


def test_a_cut_short_command_leaves_unsure_a_directory_it_set_back() -> None:
    """A ``dated`` step makes its file in ``dated/`` (the directory's mtime: now), then sets
    the directory's mtime back with ``touch -d``. Its whole effect leaves the directory as it
    was, but a full disk that stops it in between (its ``printf >`` fails) leaves the new
    mtime: the directory must be unsure, not predicted (found by the full-disk step model
    test against real bash)."""
    scenario = generate(3, parse({"name": "dated", "sequence": ["dated", "dated"]}, "d.yaml"),
                        steps=2)
    first, second = scenario.steps
    ws = scenario.initial.copy()
    first.apply(ws)
    after = ws.copy()
    second.apply(after)
    assert after.times["dated"] == ws.times["dated"]  # the whole effect sets it back
    cut = ws.cut_short(after)
    assert {"dated", second.params["path"]} <= cut.unsure
    assert first.params["path"] not in cut.unsure
