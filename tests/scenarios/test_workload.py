"""Workload files: the format, its one-line refusals, the bundled ones, and ``chaos workload
from-log`` turning a kept campaign log into a workload that runs."""

from __future__ import annotations

import io
import subprocess
import sys
from pathlib import Path

import pytest

from chaos.campaign.campaign import CampaignConfig, run_campaign
from chaos.campaign.summary import parse_summary
from scenarios import scenario_of
from scenarios.plan import workload_scenario
from scenarios.workload import PREFIX, WorkloadError, bundled, load, parse

ROOT = Path(__file__).resolve().parents[2]


def test_a_workload_becomes_a_scripted_agent() -> None:
    w = parse({"name": "w", "initial": {"a.txt": "x\n", "run.sh": {"content": "#!\n",
                                                                  "mode": 0o755},
                                        "latest": {"symlink": "a.txt"}},
               "calls": [{"bash": "ls"}, {"bash": {"command": "date", "output":
                                                   "nondeterministic"}},
                         {"write": {"path": "b", "content": "c"}},
                         {"edit": {"path": "b", "old": "c", "new": "d"}},
                         {"edit": {"path": "b", "edits": [{"old": "d", "new": "e"}]}},
                         {"read": {"path": "b"}}, {"record_never": {}}]}, "w.yaml")
    s = workload_scenario(w, 7)
    assert [st.tool for st in s.steps] == ["bash", "bash", "write", "edit", "edit", "read",
                                           "record_never"]
    assert s.steps[1].params["nondeterministic"] and not s.steps[0].params["nondeterministic"]
    assert s.steps[3].args == {"path": "b", "edits": [{"old_text": "c", "new_text": "d"}]}
    assert s.steps[6].args == {"marker": "step-6"}
    assert s.initial.files["run.sh"] == (b"#!\n", 0o755) and s.initial.links["latest"] == "a.txt"
    with pytest.raises(ValueError, match="golden run"):
        s.steps[0].apply(s.initial.copy())


@pytest.mark.parametrize(("raw", "phrase"), [
    ([], "a YAML mapping"),
    ({"calls": []}, "non-empty list"),
    ({"calls": [{"ssh": "x"}]}, "unknown tool 'ssh'"),
    ({"calls": [{"bash": "x", "write": {}}]}, "a mapping of one tool name"),
    ({"calls": [{"write": {"path": "a"}}]}, "write needs ['content']"),
    ({"calls": [{"edit": {"path": "a", "old": "x"}}]}, "needs both old and new"),
    ({"calls": [{"bash": {"command": "x", "output": "random"}}]}, "output is"),
    ({"calls": [{"bash": {"command": 3}}]}, "command is a string"),
    ({"calls": [{"bash": "x"}], "initial": {"a": {"content": "x", "mode": "rw"}}}, "mode"),
    ({"calls": [{"bash": "x"}], "flavour": 1}, "unknown field(s) ['flavour']"),
])
def test_a_bad_workload_says_what_and_where(raw: object, phrase: str) -> None:
    with pytest.raises(WorkloadError) as caught:
        parse(raw, "bad.yaml")
    assert phrase in str(caught.value) and "bad.yaml" in str(caught.value)


def test_every_bundled_workload_loads_and_names_its_programs() -> None:
    names = {load(str(p)).name for p in bundled()}
    assert names == {"git", "python", "archives", "sqlite", "make", "odd-objects"}
    assert load("git").requires == ("git",) and load("git").volatile == ("repo/.git/index",)
    with pytest.raises(WorkloadError, match="no workload file 'nope'"):
        load("nope")


def test_the_real_preset_draws_a_bundled_workload_by_seed() -> None:
    names = [scenario_of("real:git,odd-objects", seed).workload.name for seed in range(4)]
    assert names == ["git", "odd-objects", "git", "odd-objects"]
    assert scenario_of(PREFIX + str(bundled()[0]), 1).workload is not None


def test_from_log_turns_a_kept_log_into_a_workload_that_runs(tmp_path: Path) -> None:
    out = io.StringIO()
    code = run_campaign(CampaignConfig(mode="transactional", preset="shapes", runs=1,
                                       keep=True, results_root=tmp_path / "r", jobs=1), out)
    assert code == 0, out.getvalue()
    log = next((tmp_path / "r" / "latest" / "runs").glob("run-*/state/log.sqlite"))
    made = subprocess.run([sys.executable, "-m", "chaos", "workload", "from-log", str(log),
                           "--out", str(tmp_path / "w.yaml")], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)
    assert made.returncode == 0, made.stderr
    w = load(str(tmp_path / "w.yaml"))
    assert len(w.calls) >= 5 and w.initial, w
    out = io.StringIO()
    code = run_campaign(CampaignConfig(mode="checkpoint", preset=PREFIX + str(tmp_path /
                                                                             "w.yaml"),
                                       runs=3, results_root=tmp_path / "again", jobs=2), out)
    summary = parse_summary(next(x for x in out.getvalue().splitlines()
                                 if x.startswith("SUMMARY")))
    assert code == 0 and summary["ok"] == "3", out.getvalue()
    bad = subprocess.run([sys.executable, "-m", "chaos", "workload", "from-log",
                          str(tmp_path / "nothing.sqlite")], cwd=ROOT, capture_output=True,
                         text=True, timeout=120)
    assert bad.returncode == 254 and "no log at" in bad.stderr


def test_a_nondeterministic_workload_gets_no_verdict_and_from_log_declares_it(
        tmp_path: Path) -> None:
    """Two clean runs that differ (a timestamp in a file and in an output) are the workload's
    doing, not a recovery's: the runs are unknown with what to declare; ``from-log`` finds
    both by running the workload twice, and the workload it writes then runs valid."""
    (tmp_path / "w.yaml").write_text(
        "calls:\n"
        "  - bash: date +%s%N | tee stamp\n"
        "  - write: {path: notes.txt, content: \"steady\\n\"}\n"
        "  - bash: cat notes.txt\n")
    out = io.StringIO()
    code = run_campaign(CampaignConfig(mode="transactional", preset=PREFIX + str(tmp_path /
                                                                                 "w.yaml"),
                                       runs=1, keep=True, results_root=tmp_path / "r", jobs=1),
                        out)
    text = out.getvalue()
    summary = parse_summary(next(x for x in text.splitlines() if x.startswith("SUMMARY")))
    assert code != 0 and summary["unknown"] == "1" and summary["failed"] == "0", text
    assert "two clean runs of the workload 'w' ended differently: path(s) 'stamp' differ; " \
           "the output of call(s) 0 differs" in text, text
    log = next((tmp_path / "r" / "latest" / "runs").glob("run-*/state/log.sqlite"))
    made = subprocess.run([sys.executable, "-m", "chaos", "workload", "from-log", str(log),
                           "--out", str(tmp_path / "again.yaml")], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert made.returncode == 0, made.stderr
    w = load(str(tmp_path / "again.yaml"))
    assert w.volatile == ("stamp",), w
    assert [c.nondeterministic for c in w.calls] == [True, False, False], w
    out = io.StringIO()
    code = run_campaign(CampaignConfig(mode="checkpoint", preset=PREFIX + str(tmp_path /
                                                                             "again.yaml"),
                                       runs=2, results_root=tmp_path / "again", jobs=2), out)
    assert code == 0, out.getvalue()
