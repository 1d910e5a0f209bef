"""The crash campaign end to end: real drivers, real SIGKILL, real local Spaces."""

from __future__ import annotations

import io
import os
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from chaos.campaign.campaign import (
    LEAD_TRIES,
    CampaignConfig,
    ScriptedRun,
    lead_retry,
    run_campaign,
)
from chaos.campaign.ci_subset import BY_NAME, SLICES, run_slices
from chaos.campaign.records import ResultsDir
from chaos.campaign.summary import parse_summary
from chaos.cli import main
from chaos.faults.kinds import RestartSpace
from chaos.faults.nemesis import Operation
from chaos.faults.plans import Fault, FaultPlan
from chaos.run.runner import Run
from chaos.run.spec import RunSpec
from tests.liveness import running

BROKEN = str(Path(__file__).parents[1] / "broken_driver.py")


def campaign(tmp_path: Path, **kw: Any) -> tuple[int, dict[str, str], str]:
    out = io.StringIO()
    code = run_campaign(CampaignConfig(results_root=tmp_path / "results", jobs=2, **kw), out)
    text = out.getvalue()
    line = next(x for x in text.splitlines() if x.startswith("SUMMARY "))
    return code, parse_summary(line), text


def run_slice(tmp_path: Path, name: str) -> tuple[int, dict[str, str], str]:
    out = io.StringIO()
    code = run_slices([name], results_root=tmp_path / "results", jobs=2,
                      stop_on_failure=False, out=out)
    text = out.getvalue()
    line = next(x for x in text.splitlines() if x.startswith("SUMMARY "))
    return code, parse_summary(line), text


@pytest.mark.crash_ci
@pytest.mark.parametrize("name", [s.name for s in SLICES])
def test_ci_slice(tmp_path: Path, name: str) -> None:
    """The fast fixed-seed subset: every slice passes, kills, and the mode slices reach
    every reachable cell of the recovery table."""
    needs = BY_NAME[name].needs
    if BY_NAME[name].needs_root and os.geteuid() != 0:
        pytest.skip(f"slice {name} needs root (a mount)")
    if needs is not None:
        from chaos.errors import BackendUnavailable
        from chaos.space_providers import make_spaces

        try:
            make_spaces(needs, tmp_path / "probe")
        except BackendUnavailable as exc:
            pytest.skip(f"slice {name} needs the {needs} backend: {exc}")
    code, summary, text = run_slice(tmp_path, name)
    assert summary["failed"] == "0" and summary["unknown"] == "0", text
    assert code == 0
    # (a key of a group the mode does not print counts 0)
    faults = sum(int(summary.get(k, 0)) for k in ("kills", "daemon_kills", "space_restarts",
                                                   "lost_spaces", "process_kills", "fenced",
                                                   "foreign", "power_losses",
                                                   "coordinator_kills", "pauses",
                                                   "host_power_cuts"))
    assert faults >= int(summary["runs"]), "the nemesis must actually strike"
    k, n = map(int, summary.get("cells", "0/0").split("/"))  # none on a virtual workspace
    if BY_NAME[name].full_cells:
        assert k == n, f"cells {k}/{n}:\n{text}"
    if summary["mode"] == "exhaustive":
        assert int(summary["covered"]) == int(summary["runs"]) > 0, text
    if summary["mode"] == "stale":
        # a race (or the detached kind's) has an older driver that must exit 75; the
        # foreign kind meets another session or log in every run instead; a paused driver
        # ends before its pause only when its point was among its last few milliseconds,
        # and is not fenced when it paused holding the log's lock (the newer one fails)
        kind = BY_NAME[name].config.get("stale_kind")
        if kind == "paused":
            assert 2 * int(summary["pauses"]) >= int(summary["runs"]), text
        else:
            met = "foreign" if kind == "foreign" else "fenced"
            # (an older driver that died with its host, parked, met its end before its fence)
            dead = int(summary.get("host_power_cuts", 0)) if met == "fenced" else 0
            assert int(summary[met]) <= int(summary["runs"]) <= int(summary[met]) + dead, \
                f"every run must meet its other party ({met})"
            assert int(summary[met]) >= int(summary["runs"]) // 2, f"a fence must be met:\n{text}"


@pytest.mark.parametrize("trigger", ["failpoint", "time"])
def test_a_fault_that_cannot_fire_is_never_silent(tmp_path: Path, trigger: str,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """An error inside the nemesis (here: restarting the Space fails) makes the run
    unknown with that error, whether the fault came from a failpoint or a timer."""
    def broken(self: RestartSpace, op: Operation) -> None:
        raise RuntimeError("injected: the nemesis could not restart the Space")

    monkeypatch.setattr(RestartSpace, "strike", broken)
    fault = (Fault("restart_space", "failpoint", "call.intent", 2, kill_driver=False)
             if trigger == "failpoint" else
             Fault("restart_space", "time", attempt=1, delay=0.3, kill_driver=False))
    spec = RunSpec(index=0, seed=3, campaign_mode="checkpoint", durable_mode="checkpoint",
                   backend="local", preset="small", steps=3, work_dir=tmp_path,
                   plan=FaultPlan(3, (fault,)))
    verdict = Run(spec).execute().verdict
    assert verdict.valid == "unknown", verdict
    assert verdict.checks[0] == "nemesis"
    assert any("injected: the nemesis could not restart the Space" in e for e in verdict.errors)


def test_a_planned_fault_that_never_came_due_is_recorded_as_skipped(tmp_path: Path) -> None:
    plan = FaultPlan(3, (Fault("kill_driver", "failpoint", "call.intent", 99),))
    spec = RunSpec(index=0, seed=3, campaign_mode="checkpoint", durable_mode="checkpoint",
                   backend="local", preset="small", steps=3, work_dir=tmp_path, plan=plan)
    record = Run(spec).execute()
    assert record.verdict.valid is True, record.verdict
    assert record.fired == []
    skipped = [op for op in record.history if op["f"] == "skipped"]
    assert skipped and "call.intent was reached 3 time(s)" in skipped[0]["value"]


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


@pytest.mark.parametrize("seed", [1, 2, 3, 4])
def test_an_older_driver_no_newer_one_overtook_may_finish(tmp_path: Path, seed: int) -> None:
    """A race's newer driver killed (by a planned fault) before it opened the log overtakes
    nothing: the older one, released, rightly finishes the session (found by a docker
    stale campaign with held faults: a slow link's kill at a daemon failpoint, reached by
    the older driver's command, killed the newer one 80 ms after its launch; G4 wanted the
    older fenced)."""
    spec = RunSpec(index=0, seed=seed, campaign_mode="stale", durable_mode="auto",
                   backend="local", preset="default", steps=4, work_dir=tmp_path,
                   driver=str(Path(__file__).parents[1] / "dead_newer_driver.py"),
                   stale_kind="race")
    record = Run(spec).execute()
    assert record.verdict.valid is True, record.verdict
    assert any(op["f"] == "not_overtaken" for op in record.history), record.history


def test_a_machine_too_slow_for_the_foreign_fence_makes_the_run_unknown(
        tmp_path: Path) -> None:
    """When the session's first driver reaches the Space only after the earlier log's
    command slept out its sleep and wrote, the fence was not tested: the run is unknown,
    never failed (a CI machine under load once made this a false G1 failure)."""
    spec = RunSpec(index=0, seed=3, campaign_mode="stale", durable_mode="auto",
                   backend="local", preset="default", steps=2, work_dir=tmp_path,
                   driver=str(Path(__file__).parents[1] / "slow_driver.py"),
                   stale_kind="foreign")
    record = Run(spec).execute()
    assert record.verdict.valid == "unknown", record.verdict
    assert "untested" in record.verdict.checks
    assert any("too slow a machine to test the fence" in e for e in record.verdict.errors)
    assert any(op["f"] == "untested" for op in record.history)


def test_bad_arguments_exit_254(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", "--mode", "checkpoint", "--runs", "0"]) == 254
    assert "--runs must be from 1 to" in capsys.readouterr().err
    assert main(["run", "--mode", "checkpoint", "--preset", "nope"]) == 254
    assert "no preset 'nope'" in capsys.readouterr().err
    assert main(["run", "--mode", "exhaustive", "--points", "call.nowhere"]) == 254
    assert "unknown failpoint" in capsys.readouterr().err
    assert main(["run", "--mode", "exhaustive", "--pause-spaces"]) == 254
    assert "--pause-spaces holds a fault on a Space in --mode transactional, checkpoint, " \
        "auto, stale, redrive" in capsys.readouterr().err
    assert main(["run", "--mode", "transactional", "--backend", "virtual", "--cut-links"]) \
        == 254
    assert "--cut-links holds a fault on a Space" in capsys.readouterr().err
    assert main(["run", "--mode", "auto", "--jump-clocks"]) == 254
    assert "--jump-clocks needs --backend microvm, not local: a microVM keeps a clock of " \
        "its own" in capsys.readouterr().err
    if os.geteuid() == 0:  # (a non-root user is told it needs root first)
        assert main(["run", "--mode", "checkpoint", "--backend", "microvm",
                     "--fill-work-disks"]) == 254
        assert "--fill-work-disks fills a microVM's one disk, and a whole-machine " \
            "checkpoint" in capsys.readouterr().err
    # a frozen daemon or frozen commands kept by a machine checkpoint came back after the
    # fault's end, frozen for good (found by a microvm auto campaign: every driver after
    # the restore waited on a daemon that never answered)
    for flag, what in (("--pause-daemons", "freezes the daemon"),
                       ("--pause-commands", "freezes the commands")):
        assert main(["run", "--mode", "auto", "--backend", "microvm", flag]) == 254
        assert f"{flag} {what} inside a microVM, and a whole-machine checkpoint taken " \
            "while it holds would bring it back" in capsys.readouterr().err
        assert main(["run", "--mode", "stale", "--stale-kind", "paused",
                     "--cut-host-power"]) == 254
        assert "--cut-host-power is for --stale-kind race or detached, not paused: it " \
            "strikes only where no commit is in flight" in capsys.readouterr().err
    assert main(["ci", "--slice", "nowhere"]) == 254
    assert "no CI slice ['nowhere']; known: transactional" in capsys.readouterr().err
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
        summary = campaign(tmp_path / name, mode="exhaustive", durable_mode="checkpoint",
                           points=("space.file_op",))[1]
        plans = [r["plan"] for r in ResultsDir.open(tmp_path / name / "results" / "latest").runs()]
        runs.append(({k: summary[k] for k in keys}, plans))
    assert runs[0] == runs[1]
    assert int(runs[0][0]["kills"]) >= 3


def test_fault_counts_do_not_depend_on_how_soon_a_driver_is_known(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A driver can reach its first failpoints before its launcher registered it (forked,
    it runs while the launcher waits for its pid; on a loaded machine, long enough to
    reach a recovery's points). A fault due there must still kill it, not be aimed at the
    driver before it and skipped (found by a stress run: the same exhaustive plan's kill
    at ``recovery.decided`` fired in one campaign and not in another). Here every launch
    is registered half a second late."""
    from chaos.run.attempts import AttemptScope

    keys = ("kills", "daemon_kills", "space_restarts", "lost_spaces", "runs", "ok", "covered")
    exhaustive: dict[str, Any] = {"mode": "exhaustive", "durable_mode": "checkpoint",
                                  "points": ("space.file_op", "call.result")}
    prompt = campaign(tmp_path / "prompt", **exhaustive)[1]
    launch = AttemptScope.launch

    def late(self: AttemptScope, *args: Any, **kwargs: Any) -> Any:
        driver = launch(self, *args, **kwargs)
        time.sleep(0.5)
        return driver

    # The second driver's first failpoint is its Space's: the daemon's, as it raises the
    # Space's epoch to the driver's (a driver killed there is the second one).
    at_the_daemon: dict[str, Any] = {"mode": "checkpoint", "plans": (ScriptedRun(FaultPlan(
        1, (Fault("kill_driver", "failpoint", "call.result", 1),
            Fault("kill_driver", "failpoint", "spacesd.advance.persisted", 2)), 0.0,
        max_attempts=5)),)}
    prompt_daemon = campaign(tmp_path / "prompt-daemon", **at_the_daemon)[1]
    monkeypatch.setattr(AttemptScope, "launch", late)
    slow = campaign(tmp_path / "slow", **exhaustive)[1]
    slow_daemon = campaign(tmp_path / "slow-daemon", **at_the_daemon)[1]
    assert {k: slow[k] for k in keys} == {k: prompt[k] for k in keys}
    assert int(prompt["kills"]) >= 5
    assert slow_daemon["kills"] == prompt_daemon["kills"] == "2"


def test_a_drivers_exit_line_is_read_from_its_log(tmp_path: Path) -> None:
    """A paused older driver that had printed its ``CUA-EXIT`` line before the pause ended
    while its epoch was the newest (the pause caught it closing its log): ``stale-paused``
    reads that line from the log the runner gives it (``driver_log``) and does not call its
    exit 0 a stale finish, as G4 did when the pause landed there (found reviewing the
    driver's fix that reads the floor before it reports)."""
    from contextlib import redirect_stderr

    from chaos.modes.stale_kinds import _exit_line
    from chaos.run.launch import driver_log
    from durable.session_driver import EXIT_OK, exit_line

    log = driver_log(tmp_path, 1, 3)
    with open(log, "w") as out, redirect_stderr(out):
        print("CUA-HEARTBEAT 3 1", file=sys.stderr, flush=True)
        assert _exit_line(log) is None  # running: its verdict is not decided yet
        exit_line(EXIT_OK, "finished")
    assert _exit_line(log) == "CUA-EXIT 0 finished"
    assert _exit_line(driver_log(tmp_path, 2, 4)) is None  # no such driver


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
    assert not running(daemon[0]), "the left-behind daemon was killed"


def test_a_revert_is_recorded_before_the_rerun_it_allows(tmp_path: Path) -> None:
    """Regression (found by G2): a transactional revert was recorded only with the call's
    result, so a driver killed while the call ran again left a second start of the command
    with no revert in the log. The append's shim dies (its outcome is unknown: revert, run
    again), then the driver dies while the rerun runs: the log must hold the revert."""
    plan = FaultPlan(33, (
        Fault("kill_process", "failpoint", "spacesd.exec.exit_writing", 2, kill_driver=False),
        Fault("kill_driver", "failpoint", "space.running", 3)))
    spec = RunSpec(index=0, seed=33, campaign_mode="transactional",
                   durable_mode="transactional", backend="local", preset="ci-commands",
                   steps=None, work_dir=tmp_path, plan=plan)
    record = Run(spec).execute()
    assert record.fired == [0, 1]
    assert record.verdict.valid is True, record.verdict.errors
    assert record.observation is not None and record.observation.ledgers is not None
    append = next(c for c in record.observation.calls
                  if c.tool == "bash" and "step-2" in c.args["command"])
    starts = [k for led in record.observation.ledgers for k in led["audit"]["keys"]
              if f":{append.call_id}:" in k["key"] and k["spawned"]]
    # Started, then again after the revert; on a busy machine the next driver's fence can
    # also catch the rerun still running: reverted and started a third time.
    assert len(starts) >= 2, "the append started, then started again after the revert"
    reverts = [e for e in record.recoveries
               if e["kind"] == "reverted" and e["call_id"] == append.call_id]
    assert len(reverts) == len(starts) - 1 and append.result_entry is not None, \
        "every rerun was allowed by a revert the log holds"
    assert all(r["entry"] < append.result_entry for r in reverts)


def test_an_exhaustive_run_whose_kill_missed_is_tried_again_and_says_why() -> None:
    """A run of the exhaustive mode exists for one (point, occurrence): when its lead fault
    did not land it runs again (``LEAD_TRIES`` in all), and the record that stays says why
    each try missed; a run that failed its check is never retried (the failure stands)."""
    lead = {"action": "kill_driver", "point": "space.outcome", "occurrence": 2}
    spec = RunSpec(index=7, seed=1, campaign_mode="exhaustive", durable_mode="auto",
                   backend="local", preset="small", steps=None, work_dir=Path("/nonexistent"))

    def record(fired: list[int], valid: bool | None = True) -> dict:
        return {"index": 7, "fired": fired, "plan": {"faults": [lead]},
                "verdict": {"valid": valid}, "history": []}

    tries = []
    current: RunSpec | None = spec
    while current is not None:
        last = record([1])
        tries.append(current)
        current = lead_retry(current, last)
    assert len(tries) == LEAD_TRIES
    assert last["lead_misses"] == ["the run never reached space.outcome#2 (its driver took "
                                   "another path than the reference run)"] * LEAD_TRIES
    landed = record([0, 1])
    assert lead_retry(tries[1], landed) is None and len(landed["lead_misses"]) == 1
    broken = record([], valid=False)
    assert lead_retry(spec, broken) is None and broken["lead_misses"] == []
