"""The crash campaign end to end: real drivers, real SIGKILL, real local Spaces."""

from __future__ import annotations

import io
from pathlib import Path

import psutil
import pytest

from chaos.campaign import CampaignConfig, run_campaign
from chaos.cli import main
from chaos.records import ResultsDir
from chaos.summary import parse_summary

BROKEN = str(Path(__file__).with_name("broken_driver.py"))


def campaign(tmp_path: Path, **kw: object) -> tuple[int, dict[str, str], str]:
    out = io.StringIO()
    code = run_campaign(CampaignConfig(results_root=tmp_path / "results", jobs=2, **kw), out)
    text = out.getvalue()
    line = next(x for x in text.splitlines() if x.startswith("SUMMARY "))
    return code, parse_summary(line), text


@pytest.mark.crash_ci
@pytest.mark.parametrize("mode", ["transactional", "checkpoint", "auto"])
def test_fixed_seed_campaign(tmp_path: Path, mode: str) -> None:
    code, summary, text = campaign(tmp_path, mode=mode, runs=6, steps=6, seed_base=101)
    assert summary["failed"] == "0" and summary["unknown"] == "0", text
    assert code == 0
    assert int(summary["kills"]) >= 4, "the nemesis must actually kill drivers"
    assert int(summary["ok"]) == 6


@pytest.mark.crash_ci
def test_stale_drivers_are_fenced(tmp_path: Path) -> None:
    code, summary, text = campaign(tmp_path, mode="stale", runs=4, steps=5, seed_base=7)
    assert code == 0 and summary["failed"] == "0", text
    assert summary["fenced"] == "4", "every older driver must exit 75"


@pytest.mark.crash_ci
def test_exhaustive_slice(tmp_path: Path) -> None:
    code, summary, text = campaign(tmp_path, mode="exhaustive", durable_mode="transactional",
                                   points=("space.running", "space.exited", "space.file_op"))
    assert code == 0 and summary["failed"] == "0", text
    assert int(summary["covered"]) >= 4 and summary["covered"] == summary["runs"]


@pytest.mark.crash_ci
def test_a_broken_adapter_is_caught(tmp_path: Path) -> None:
    """Rerunning a command that already exited duplicates its append: the campaign must fail
    and print the repro line; repro replays the same plan and gives the same verdict."""
    code, summary, text = campaign(tmp_path, mode="exhaustive", durable_mode="checkpoint",
                                   points=("space.exited",), driver=BROKEN)
    assert code == 1, text
    assert int(summary["failed"]) > 0
    assert "reproduce: python -m chaos repro" in text
    results = ResultsDir.open(tmp_path / "results" / "latest")
    failing = next(r for r in results.runs() if r["verdict"]["valid"] is False)
    assert any("appears 2 times in log.txt" in e for e in failing["verdict"]["errors"])
    assert (Path(failing["run_dir"]) / "state" / "log.sqlite").exists()
    assert (Path(failing["run_dir"]) / "workspace.tar").exists()
    assert main(["repro", str(results.path), "--run", str(failing["index"])]) == 1
    assert main(["analyze", str(results.path)]) == 1, "analyze re-checks the stored records"


def test_bad_arguments_exit_254(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", "--mode", "checkpoint", "--runs", "0"]) == 254
    assert "--runs must be at least 1" in capsys.readouterr().err
    assert main(["run", "--mode", "checkpoint", "--preset", "nope"]) == 254
    assert "no preset 'nope'" in capsys.readouterr().err
    assert main(["run", "--mode", "exhaustive", "--points", "call.nowhere"]) == 254
    assert "unknown failpoint" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exc:
        main(["run", "--mode", "sideways"])
    assert exc.value.code == 254


@pytest.mark.crash_ci
def test_same_seeds_same_plans_and_fault_counts(tmp_path: Path) -> None:
    """Plans are drawn from the seeds alone. The fault counts are equal too where no timing
    can change the path: failpoint kills of file calls (a kill at a random time, or while a
    command runs, may land elsewhere on a loaded machine; see test_faults_and_checker)."""
    keys = ("kills", "daemon_kills", "space_restarts", "lost_spaces", "runs", "failed")
    runs = []
    for name in ("a", "b"):
        kw = dict(mode="exhaustive", durable_mode="checkpoint",
                  points=("call.intent", "space.file_op"))
        summary = campaign(tmp_path / name, **kw)[1]
        plans = [r["plan"] for r in ResultsDir.open(tmp_path / name / "results" / "latest").runs()]
        runs.append(({k: summary[k] for k in keys}, plans))
    assert runs[0] == runs[1]
    assert int(runs[0][0]["kills"]) >= 4


def test_clean_removes_local_spaces_left_behind(tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    from backends.local import LocalSpaces

    spaces = LocalSpaces(tmp_path / "results" / "c" / "runs" / "run-0000" / "spaces")
    spaces.create("cua-c1")
    daemon = spaces.get("cua-c1").daemon()
    assert daemon is not None
    assert main(["clean", "--results", str(tmp_path / "results"), "--backend", "local"]) == 0
    assert "removed 1 Space(s)" in capsys.readouterr().out
    assert not spaces.exists("cua-c1")
    try:
        gone = psutil.Process(daemon[0]).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        gone = True
    assert gone, "the left-behind daemon was killed"
