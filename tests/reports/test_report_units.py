"""Fast tests of the reports' pure parts: tables, the growth fit, latency rows, the timeline,
the HTML page and the CLI's answers to bad input. No process is started."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from reports import cost, html, latency, timeline
from reports.__main__ import EXIT_BAD_ARGS, main
from reports.errors import BadResults
from reports.markdown import table
from reports.results import load_all

T0_MS = 1_800_000_000_000


def _record(index: int, valid: bool | str = True) -> dict[str, Any]:
    """A small run record of the shape ``chaos.run.record.RunRecord.to_json`` gives: one call cut
    by a kill at 1.5 s, finished by the next driver, with one recovery event."""
    def op(process: str, type_: str, f: str, value: Any, time: float) -> dict[str, Any]:
        return {"process": process, "type": type_, "f": f, "value": value, "time": time}

    history = [
        op("driver", "invoke", "attempt", {"attempt": 1, "epoch": 1}, 0.5),
        op("agent", "invoke", "bash", {"step": 0, "call": "3.0"}, 1.0),
        op("nemesis", "info", "kill_driver", "kill_driver at space.running#1", 1.5),
        op("driver", "info", "attempt", {"attempt": 1, "epoch": 1, "exit": -9}, 1.6),
        op("driver", "invoke", "attempt", {"attempt": 2, "epoch": 2}, 1.7),
        op("agent", "ok", "bash", {"step": 0, "call": "3.0"}, 2.5),
        op("driver", "ok", "attempt", {"attempt": 2, "epoch": 2, "exit": 0}, 3.0),
        op("driver", "invoke", "attempt", {"attempt": 99, "epoch": 3}, 3.1),
        op("driver", "ok", "attempt", {"attempt": 99, "epoch": 3, "exit": 0}, 3.9),
    ]
    calls = [{"call_id": "3.0", "step": 0, "tool": "bash", "attempt": 1, "args": {},
              "content": "", "result": "ok", "result_entry": 4,
              "invoked_ms": T0_MS + 1000, "completed_ms": T0_MS + 2500}]
    return {
        "index": index, "seed": 100 + index, "campaign_mode": "checkpoint",
        "durable_mode": "checkpoint", "backend": "local", "preset": "default", "steps": 1,
        "plan": {"seed": 100 + index, "faults": [], "max_attempts": 7, "backoff": 0.0},
        "history": history,
        "recoveries": [{"kind": "reattached", "mode": "checkpoint", "call_id": "3.0",
                        "detail": "", "conversation": 1, "entry": 4, "time_ms": T0_MS + 2400}],
        "counts": {"kills": 1, "daemon_kills": 0, "space_restarts": 0, "lost_spaces": 0,
                   "fenced": 0, "timeouts": 0, "attempts": 3},
        "latencies": [{"action": "kill_driver", "trigger": "failpoint", "point": "space.running",
                       "t_fault": 1.5, "t_next_step": 1.9, "t_done": 3.9, "killed": True}],
        "points_hit": {}, "final_exit": 0,
        "verdict": {"valid": valid, "errors": [] if valid is True else ["workspace differs"]},
        "observation": {"calls": calls}, "seconds": 4.0, "run_dir": None,
    }


def _campaign_dir(root: Path, records: list[dict[str, Any]], summary: bool = True) -> Path:
    path = root / "checkpoint-local-1"
    path.mkdir(parents=True)
    (path / "campaign.json").write_text(json.dumps({"mode": "checkpoint"}))
    (path / "runs.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    if summary:
        (path / "SUMMARY").write_text("SUMMARY mode=checkpoint backend=local runs=2 ok=1 "
                                      "failed=1 verdict=invalid\n")
    return path


def test_markdown_table_aligns_columns() -> None:
    text = table(["mode", "ms"], [["transactional", "1.5"], ["auto", "12.0"]])
    assert text.splitlines() == ["| mode          |   ms |", "|:--------------|-----:|",
                                 "| transactional |  1.5 |", "| auto          | 12.0 |"]


def test_every_cost_mode_has_a_line_style() -> None:
    from reports import cost_bench

    assert set(cost.STYLE) == set(cost_bench.MODES)


def test_cost_tables_and_the_fitted_growth() -> None:
    rows = [{"backend": "local", "mode": mode, "files": files, "kind": kind, "round": r,
             "call": r, "ms": base + slope * files + r * 0.01, "log_bytes": 4096 + files,
             "effective_mode": "checkpoint" if mode == "auto" and files == 1000 else
             {"auto": "transactional"}.get(mode, mode)}
            for mode, base, slope in (("unwrapped", 2.0, 0.0), ("transactional", 10.0, 0.008),
                                      ("auto", 10.0, 0.02))
            for files in (10, 100, 1000) for kind in ("write", "edit", "bash") for r in range(3)]
    stats = cost.cells(pd.DataFrame(rows))
    tables = cost.tables(stats, 3)
    assert len(tables) == 3 and "local, 1000 files" in tables[2]
    assert "| auto (runs as checkpoint) |" in tables[2]
    assert "| auto (runs as transactional) |" in tables[1]
    assert "| write |" not in tables[0] and "bash append" in tables[0]
    growth = cost.growth(stats)
    assert growth[0].startswith("local unwrapped: +0.0 ms per 100 files")
    assert growth[1].startswith("local transactional: +0.8 ms per 100 files (write +0.8, edit "
                                "+0.8, bash append +0.8); log +100 B per call per 100 files")
    assert growth[2].startswith("local auto: +2.0 ms per 100 files")
    one_size = cost.cells(pd.DataFrame([r for r in rows if r["files"] == 10]))
    assert "growth not fitted" in cost.growth(one_size)[0]


def test_latency_rows_per_mode_and_fault_kind(tmp_path: Path) -> None:
    campaigns = load_all([_campaign_dir(tmp_path, [_record(0), _record(1)])])
    faults = latency.frame(campaigns)
    assert list(faults["next_step_ms"].round()) == [400, 400]
    _, by_mode, by_kind = latency.tables(faults)
    assert by_mode == [["checkpoint", "2", "400", "400", "400", "2", "2.4", "2.4", "2.4"]]
    assert by_kind[0][:2] == ["checkpoint", "kill_driver (failpoint)"]


def test_the_timeline_places_recoveries_on_the_run_clock() -> None:
    record = _record(0)
    assert timeline.run_start(record) == pytest.approx(T0_MS / 1000)
    assert timeline.figure_png(record).startswith(b"\x89PNG")
    record["observation"] = None
    assert timeline.run_start(record) is None
    assert timeline.figure_png(record).startswith(b"\x89PNG")


def test_a_held_fault_spans_the_timeline_until_its_release() -> None:
    """Two overlapping pauses end at the one release of their action; a cut link that was
    never released runs to the end; a fault that was skipped spans nothing, and so does one
    that strikes once (a host power cut)."""
    def nemesis(type_: str, f: str, value: Any, time: float) -> dict[str, Any]:
        return {"process": "nemesis", "type": type_, "f": f, "value": value, "time": time}

    record = _record(0)
    record["history"] += [
        nemesis("info", "pause_space", "pause_space for 2s at space.running#1", 1.0),
        nemesis("info", "cut_link", "cut_link for 5s at call.intent#1", 1.2),
        nemesis("info", "pause_space", "pause_space for 1s at space.exited#1", 1.5),
        nemesis("fail", "fill_state_disk", "skipped: no Space", 1.6),
        nemesis("info", "cut_host_power", "cut_host_power at call.result#1", 1.7),
        nemesis("info", "release", {"action": "pause_space"}, 3.0),
        nemesis("info", "release", {"action": "pause_space"}, 3.5),
    ]
    record["history"].sort(key=lambda op: op["time"])
    assert timeline.held_spans(record["history"], 4.0) == [
        ("pause_space", 1.0, 3.0), ("cut_link", 1.2, 4.0), ("pause_space", 1.5, 3.0)]
    assert timeline.figure_png(record).startswith(b"\x89PNG")


def test_the_page_has_the_summary_failures_and_inline_images(tmp_path: Path) -> None:
    path = _campaign_dir(tmp_path, [_record(0), _record(1, valid=False)])
    page = html.render(load_all([path]), sample=1)
    assert "<h2 id='summary'>SUMMARY</h2>" in page and ">verdict<" in page
    assert f"python -m chaos repro {path.resolve()} --run 1" in page
    assert page.count('<img src="data:image/png;base64,') == 3 + 2  # plots + 2 timelines
    assert "http://" not in page and "https://" not in page  # nothing fetched


def test_bad_input_exits_254_with_what_was_expected(tmp_path: Path, capsys) -> None:
    half = tmp_path / "half"
    half.mkdir()
    (half / "campaign.json").write_text("{}")
    assert main(["html", str(half)]) == EXIT_BAD_ARGS
    err = capsys.readouterr().err
    assert "no runs.jsonl" in err and "python -m chaos run" in err
    assert main(["latency", str(tmp_path / "nothing")]) == EXIT_BAD_ARGS
    assert "expected" in capsys.readouterr().err
    for argv in (["cost", "--backend", "nope"], ["cost", "--repeat", "0"], ["html"]):
        with pytest.raises(SystemExit) as exc:
            main(argv)
        assert exc.value.code == EXIT_BAD_ARGS


def test_ctrl_c_exits_130_and_a_crash_255_as_the_campaign_does(
        monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    """One handler ends both command lines (``chaos.exits``): Ctrl-C in a report exited 255,
    as if the reports had crashed."""
    import reports.__main__ as cli

    def interrupted(_args: object) -> int:
        raise KeyboardInterrupt

    def crashed(_args: object) -> int:
        raise RuntimeError("a bug")

    monkeypatch.setattr(cli, "_run", interrupted)
    assert main(["html", "anything"]) == 130
    assert capsys.readouterr().err == "reports: interrupted\n"
    monkeypatch.setattr(cli, "_run", crashed)
    assert main(["html", "anything"]) == 255
    err = capsys.readouterr().err
    assert "RuntimeError: a bug" in err and "reports: the reports themselves crashed" in err


def test_the_page_embeds_a_cost_report(tmp_path: Path) -> None:
    path = _campaign_dir(tmp_path / "results", [_record(0)])
    cost_dir = tmp_path / "cost"
    cost_dir.mkdir()
    with pytest.raises(BadResults, match=r"no cost\.md"):
        html.render(load_all([path]), cost_dir=cost_dir)
    (cost_dir / "cost.md").write_text("## Cost per call\n\n| mode | write |\n")
    (cost_dir / "cost-local-size.png").write_bytes(timeline.figure_png(_record(0)))
    page = html.render(load_all([path]), cost_dir=cost_dir, sample=0)
    assert "<h2 id='cost'>Cost per call</h2>" in page and "| mode | write |" in page
    assert page.count('<img src="data:image/png;base64,') == 3 + 1
