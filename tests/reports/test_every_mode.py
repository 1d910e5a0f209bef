"""Every report on every mode's results: a small real campaign per mode (and a merge of
shards), then ``reports html`` (every run's timeline drawn) and ``reports latency`` on it.
Before, ``reports html`` crashed on a redrive campaign (its driver operations carry an
attempt and a pid, no epoch). Each page is rendered by headless Chromium. ``machine`` runs
on microVM Spaces only (marker ``microvm``)."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import pytest

from chaos.campaign.campaign import CampaignConfig, run_campaign
from chaos.cluster.merge import merge
from chaos.errors import BackendUnavailable
from reports.__main__ import main as reports_main
from tests.reports.conftest import dump_dom

CAMPAIGNS: dict[str, dict[str, Any]] = {
    "checkpoint": {"mode": "checkpoint", "runs": 2, "steps": 3},
    "auto": {"mode": "auto", "runs": 2, "steps": 3},
    "stale": {"mode": "stale", "runs": 2, "steps": 3},
    "exhaustive": {"mode": "exhaustive", "points": ("call.result",), "steps": 2},
    "redrive": {"mode": "redrive", "runs": 2, "steps": 3},
    "virtual": {"mode": "transactional", "backend": "virtual", "runs": 2, "steps": 3},
    "machine": {"mode": "machine", "backend": "microvm", "runs": 1, "steps": 3},
}


def _campaign(root: Path, **kw: Any) -> Path:
    out = io.StringIO()
    try:
        code = run_campaign(CampaignConfig(results_root=root, jobs=2, **kw), out)
    except BackendUnavailable as exc:
        pytest.skip(f"the {kw.get('backend')} backend cannot be had here: {exc}")
    assert code == 0, out.getvalue()
    return (root / "latest").resolve()


@pytest.mark.parametrize("name", [
    *(pytest.param(n, marks=pytest.mark.microvm) if CAMPAIGNS[n].get("backend") == "microvm"
      else n for n in CAMPAIGNS),
    "merged shards"])
def test_every_report_runs_on_the_results_of(name: str, tmp_path: Path,
                                             chromium: Path) -> None:
    if name == "merged shards":
        small = {"mode": "transactional", "runs": 2, "steps": 3}
        shards = [_campaign(tmp_path / f"shard{i}", shard=(i, 2), **small) for i in (1, 2)]
        out = io.StringIO()
        assert merge(shards, tmp_path / "merged", out) == 0, out.getvalue()
        results = (tmp_path / "merged" / "latest").resolve()
    else:
        results = _campaign(tmp_path / "results", **CAMPAIGNS[name])
    page = tmp_path / "report.html"
    assert reports_main(["html", str(results), "--out", str(page), "--sample", "100"]) == 0
    html = page.read_text()
    assert "SUMMARY" in html and html.count('<img src="data:image/png;base64,') >= 2
    dom = dump_dom(page, tmp_path / "profile")
    assert "<h2 id=\"summary\">SUMMARY</h2>" in dom and ">verdict</td>" in dom
    assert reports_main(["latency", str(results), "--out", str(tmp_path / "latency")]) == 0
    assert (tmp_path / "latency" / "latency.csv").is_file()
