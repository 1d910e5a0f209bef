"""``chaos shrink``: a failing run of a deliberately broken adapter, cut down end to end."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from chaos.campaign.records import ResultsDir
from chaos.cli import main
from chaos.faults.plans import Fault
from chaos.repro.shrink import Candidate, target_check
from chaos.run.runner import Run
from chaos.run.spec import RunSpec
from reports.__main__ import main as reports_main
from tests.chaos.campaign.test_campaign import BROKEN, campaign

#: A drawn checkpoint run of ten steps that the broken adapter (a command that already
#: exited runs again) fails (G1: log.txt has a line twice).
FAILING_SEED = 3


def test_a_failing_run_shrinks_to_a_smaller_plan_that_fails_the_same_check(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, text = campaign(tmp_path, mode="checkpoint", seeds=(FAILING_SEED,),
                             driver=BROKEN)
    assert code == 1, text
    results = ResultsDir.open(tmp_path / "results" / "latest")
    failing = results.runs()[0]
    check = target_check(failing)
    capsys.readouterr()
    assert main(["shrink", str(results.path), "--run", "0", "--jobs", "2",
                 "--confirm", "3"]) == 0
    out = capsys.readouterr().out
    shrunk = Path(failing["run_dir"]) / "shrunk.json"
    doc = json.loads(shrunk.read_text())
    assert doc["check"] == check
    before = (len(failing["plan"]["faults"]), failing["steps"])
    after = (len(doc["plan"]["faults"]), len(doc["keep_steps"]))
    assert after < before and after[0] <= before[0] and after[1] <= before[1], (before, after)
    assert doc["replays"] == {"failed": 3, "of": 3}
    assert f"The check {check} fails" in out and "reproduce: python -m chaos repro --plan" in out
    assert f"SHRUNK check={check} faults={before[0]}->{after[0]}" in out
    assert main(["repro", "--plan", str(shrunk)]) == 1  # the shrunk plan fails on replay
    page = tmp_path / "report.html"
    assert reports_main(["html", str(results.path), "--out", str(page), "--sample", "0"]) == 0
    assert f"still failing {check}" in page.read_text()  # the report tells the story too


def test_what_cannot_be_shrunk_is_refused(tmp_path: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    code, _, _ = campaign(tmp_path, mode="transactional", runs=1, steps=2)
    assert code == 0
    results = tmp_path / "results" / "latest"
    assert main(["shrink", str(results), "--run", "0"]) == 254
    assert "did not fail" in capsys.readouterr().err
    assert main(["shrink", str(results)]) == 254
    assert "needs --run N" in capsys.readouterr().err
    (tmp_path / "bad.json").write_text("{}")
    assert main(["repro", "--plan", str(tmp_path / "bad.json")]) == 254
    assert "not a shrunk plan" in capsys.readouterr().err


def test_smaller_means_fewer_faults_then_steps_then_earlier_occurrences() -> None:
    late = Fault("kill_driver", "failpoint", "call.result", 3)
    early = Fault("kill_driver", "failpoint", "call.result", 1)
    assert Candidate.whole((late,), 9).size() < Candidate.whole((early, early), 2).size()
    assert Candidate((late,), (4, 7)).size() < Candidate((early,), (0, 1, 2)).size()
    assert Candidate.whole((early,), 2).size() < Candidate.whole((late,), 2).size()
    assert Candidate((early,), (4, 7)).steps == 8  # drawn to its last kept step
    # then fewer steps left as they were drawn (a step simplified is simpler)
    assert Candidate((late,), (4, 7), (4,)).size() < Candidate((early,), (4, 7)).size()
    assert Candidate((early,), (4, 7), (4, 7)).kept((7,)) == Candidate((early,), (7,), (7,))


@pytest.mark.parametrize("mode", ["checkpoint", "transactional"])
def test_a_scenario_with_steps_dropped_passes_on_a_correct_adapter(tmp_path: Path,
                                                                   mode: str) -> None:
    """A shrunk scenario keeps only some steps, one of them simplified; the checks predict
    every result from the workspace the kept steps meet, so a correct adapter passes it
    under faults (else a shrink could end on a failure of the checker's own making)."""
    spec = RunSpec(index=0, seed=5, campaign_mode=mode, durable_mode=mode, backend="local",
                   preset="default", steps=10, work_dir=tmp_path, keep_steps=(1, 4, 6, 9),
                   simple_steps=(6,))
    run = Run(spec)
    assert [s.index for s in run.scenario.steps] == [1, 4, 6, 9]
    assert run.scenario.steps[2].params["simplified_from"] != "write"
    record = run.execute()
    assert record.verdict.valid is True, record.verdict
    assert record.steps == 4 and record.plan.faults  # a plan drawn for the kept steps


def test_a_repro_on_other_code_says_so_and_is_refused(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A campaign records the code it ran; a repro on other code would replay a different
    system, so it is refused unless --any-code (then it warns)."""
    code, _, _ = campaign(tmp_path, mode="transactional", runs=1, steps=2)
    assert code == 0
    results = tmp_path / "results" / "latest"
    config = json.loads((results / "campaign.json").read_text())
    assert len(config["code"]["sources"]) == 64
    capsys.readouterr()
    other = {**config, "code": {"sources": "0" * 64, "revision": "1234567890ab" + "0" * 28,
                                "dirty": True}}
    (results / "campaign.json").write_text(json.dumps(other))
    assert main(["repro", str(results), "--run", "0"]) == 254
    err = capsys.readouterr().err
    assert "ran revision 1234567890ab with uncommitted changes" in err, err
    assert "git checkout 1234567890ab" in err and "--any-code" in err
    assert main(["repro", str(results), "--run", "0", "--any-code"]) == 0
    assert "warning" in capsys.readouterr().err
    (results / "campaign.json").write_text(json.dumps({k: v for k, v in config.items()
                                                       if k != "code"}))
    assert main(["repro", str(results), "--run", "0"]) == 0
    assert "does not record the code it ran" in capsys.readouterr().err
