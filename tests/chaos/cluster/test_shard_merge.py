"""Shards of a campaign (``chaos run --shard I/N``) merged (``chaos merge``) equal the whole
campaign; directories that are not the shards of one campaign are refused."""

from __future__ import annotations

import io
import json
import os
import shutil
from pathlib import Path
from typing import Any

import pytest

from chaos.campaign.records import ResultsDir
from chaos.campaign.summary import parse_summary
from chaos.cli import main
from chaos.cluster.merge import merge
from reports.__main__ import main as reports_main
from tests.chaos.campaign.test_campaign import campaign

#: Exhaustive over two failpoints (six runs): no timing can change a run's path, so the
#: fault counts are reproducible (``test_same_seeds_same_plans_and_fault_counts``).
DETERMINISTIC: dict[str, Any] = {"mode": "exhaustive", "durable_mode": "checkpoint",
                                 "points": ("space.file_op", "call.result")}
KEYS = ("runs", "ok", "failed", "unknown", "kills", "daemon_kills", "space_restarts",
        "lost_spaces", "covered")


def _results(text: str) -> Path:
    return Path(next(x for x in text.splitlines() if x.startswith("results: "))[9:])


def _shards(tmp_path: Path, n: int, **kw: Any) -> list[Path]:
    dirs = []
    for i in range(1, n + 1):
        code, _, text = campaign(tmp_path, shard=(i, n), **kw)
        assert code == 0, text
        dirs.append(_results(text))
    return dirs


def _runs(path: Path) -> list[tuple[int, int, Any, Any]]:
    return [(r["index"], r["seed"], r["plan"], r["verdict"]["valid"])
            for r in ResultsDir.open(path).runs()]


def test_shards_merged_equal_the_whole_campaign(tmp_path: Path) -> None:
    code, whole, text = campaign(tmp_path / "whole", **DETERMINISTIC)
    assert code == 0, text
    shards = _shards(tmp_path / "shards", 3, **DETERMINISTIC)
    parts = [_runs(d) for d in shards]
    assert all(parts) and sorted(i for p in parts for i, *_ in p) == \
        [i for i, *_ in _runs(_results(text))]  # each run in exactly one shard
    out = io.StringIO()
    assert merge(shards, tmp_path / "merged", out) == 0
    merged = parse_summary(next(x for x in out.getvalue().splitlines()
                                if x.startswith("SUMMARY ")))
    assert {k: merged[k] for k in KEYS} == {k: whole[k] for k in KEYS}
    assert _runs(_results(out.getvalue())) == _runs(_results(text))
    merged_dir = str(_results(out.getvalue()))
    assert reports_main(["latency", merged_dir]) == 0  # the reports read the whole campaign
    assert reports_main(["html", merged_dir, "--sample", "0"]) == 0


def test_what_is_not_one_campaigns_shards_is_refused(tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    small: dict[str, Any] = {"mode": "transactional", "runs": 3, "steps": 2}
    one, two = _shards(tmp_path / "a", 2, **small)
    other = _shards(tmp_path / "b", 2, **{**small, "steps": 3})[1]
    _, _, text = campaign(tmp_path / "c", **small)
    whole = _results(text)
    capsys.readouterr()  # the campaigns' own progress lines
    for dirs, says in (([one], "shard(s) 2/2 missing"),
                       ([one, one, two], "are both shard 1/2: overlapping shards"),
                       ([one, other], "differ in steps"),
                       ([one, whole], "is not a shard")):
        assert main(["merge", *map(str, dirs), "--results", str(tmp_path / "m")]) == 254
        err = capsys.readouterr().err
        assert says in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert main(["run", "--mode", "transactional", "--shard", "3/2"]) == 254
    assert "--shard '3/2' is not I/N" in capsys.readouterr().err


def test_a_record_naming_a_directory_outside_its_results_is_refused(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A shard's record is input: a run_dir of /etc once made merge copy /etc/shadow. Only
    ``runs/<run>`` of the shard itself is read (found there even after the results moved)."""
    one, two = _shards(tmp_path / "a", 2, mode="transactional", runs=2, steps=2, keep=True)
    runs = one / "runs.jsonl"
    lines = runs.read_text().splitlines()
    first = json.loads(lines[0])
    assert first["run_dir"] and Path(first["run_dir"]).parent == one / "runs"
    for hostile in ("/etc", "/", "../../x", str(one / "runs" / ".."), 7):
        runs.write_text("\n".join([json.dumps({**first, "run_dir": hostile}), *lines[1:]]) +
                        "\n")
        assert main(["merge", str(one), str(two), "--results", str(tmp_path / "m")]) == 254
        err = capsys.readouterr().err
        assert f"runs.jsonl, line 1: run_dir {hostile!r} is not a run directory" in err, err
        assert "Traceback" not in err
    assert not list((tmp_path / "m").rglob("shadow"))
    (one / "runs" / "outside").symlink_to("/etc")
    runs.write_text("\n".join([json.dumps({**first, "run_dir": str(one / "runs" / "outside")}),
                               *lines[1:]]) + "\n")
    assert main(["merge", str(one), str(two), "--results", str(tmp_path / "m")]) == 254
    assert "is a symlink" in capsys.readouterr().err
    (one / "runs" / "outside").unlink()
    runs.write_text("\n".join(lines) + "\n")
    moved = [shutil.copytree(d, tmp_path / "moved" / d.name, symlinks=True) for d in (one, two)]
    shutil.rmtree(tmp_path / "a")
    out = io.StringIO()
    assert merge(moved, tmp_path / "m", out) == 0, out.getvalue()
    merged = ResultsDir.open(_results(out.getvalue()))
    kept = [Path(r["run_dir"]) for r in merged.runs()]
    assert len(kept) == 2 and all(d.is_dir() and d.parent == merged.runs_dir for d in kept)


def test_a_shard_whose_records_were_changed_is_refused(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Before, merge accepted a shard missing a record (runs=3 of 4, exit 0), a run of
    another shard, a changed seed and a run judged valid without an observation; a FIFO
    runs.jsonl hung it; a hostile shard number or plan gave tracebacks."""
    one, two = _shards(tmp_path / "a", 2, mode="transactional", runs=4, steps=2)
    runs = one / "runs.jsonl"
    lines = runs.read_text().splitlines()
    first = json.loads(lines[0])
    damaged = {
        "a record missing": (lines[1:], "a record is missing or extra"),
        "another shard's run": ([json.dumps({**first, "index": 1}), *lines[1:]],
                                "is not shard 1/2's"),
        "a changed seed": ([json.dumps({**first, "seed": 99}), *lines[1:]],
                           "has seed 99, but that run's seed is 1"),
        "no observation": ([json.dumps({**first, "observation": None}), *lines[1:]],
                           "line 1: a run judged valid without an observation"),
        "a null plan": ([json.dumps({**first, "plan": None}), *lines[1:]],
                        "line 1: plan is not a fault plan"),
        "an unknown fault": ([json.dumps({**first, "plan": {**first["plan"], "faults": [
            {"action": "rm -rf", "trigger": "time", "delay": 1}]}}), *lines[1:]],
            "unknown fault action 'rm -rf'"),
        "negative steps": ([json.dumps({**first, "steps": -1}), *lines[1:]],
                           "line 1: steps -1 is not a positive whole number"),
    }
    for name, (text, says) in damaged.items():
        runs.write_text("\n".join(text) + "\n")
        assert main(["merge", str(one), str(two), "--results", str(tmp_path / "m")]) == 254, \
            name
        err = capsys.readouterr().err
        assert says in err and "Traceback" not in err, (name, err)
        if name in ("a null plan", "negative steps"):
            assert main(["repro", str(one), "--run", "0"]) == 254, name
            assert says.split(": ", 1)[1] in capsys.readouterr().err
    runs.unlink()
    os.mkfifo(runs)
    assert main(["merge", str(one), str(two), "--results", str(tmp_path / "m")]) == 254
    assert "is not a regular file" in capsys.readouterr().err
    runs.unlink()
    runs.write_text("\n".join(lines) + "\n")
    config = json.loads((one / "campaign.json").read_text())
    (one / "campaign.json").write_text(json.dumps({**config, "shard": "../../x"}))
    assert main(["merge", str(one), str(two), "--results", str(tmp_path / "m")]) == 254
    assert "is not [I, N]" in capsys.readouterr().err
