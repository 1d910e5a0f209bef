"""The reports of a real campaign with failing runs, and the HTML page in headless Chromium.

The failing runs are real: a small transactional campaign runs with its drivers replaced by
``tests/chaos/broken_driver.py`` (BROKEN_RULE=skip_recovery: a recovery that skips revert and
restore), so the records, SUMMARY, plots and repro commands are the campaign's own.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from chaos.campaign.campaign import CampaignConfig, repro_command, run_campaign
from reports.results import load
from tests.reports.conftest import dump_dom

BROKEN_DRIVER = Path(__file__).parents[1] / "chaos" / "broken_driver.py"


@pytest.fixture(scope="module")
def failing_campaign(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 4-run transactional campaign whose drivers run the broken adapter."""
    root = tmp_path_factory.mktemp("results")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("BROKEN_RULE", "skip_recovery")
        code = run_campaign(CampaignConfig(mode="transactional", runs=4, steps=8, seed_base=1,
                                           jobs=2, results_root=root,
                                           driver=str(BROKEN_DRIVER)))
    assert code == 1, "the broken adapter produced no failing run; try other seeds"
    return (root / "latest").resolve()


def _reports(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "reports", *args], capture_output=True,
                          text=True, timeout=300, check=False)


@pytest.mark.slow
def test_the_html_report_renders_in_chromium(failing_campaign: Path, tmp_path: Path,
                                              chromium: Path) -> None:
    out = tmp_path / "report.html"
    done = _reports("html", str(failing_campaign), "--out", str(out))
    assert done.returncode == 0, done.stderr
    dom = dump_dom(out, tmp_path / "profile")
    assert "<h2 id=\"summary\">SUMMARY</h2>" in dom and ">verdict</td>" in dom
    assert '<img src="data:image/png;base64,' in dom
    failing = [r for r in load(failing_campaign).records if r["verdict"]["valid"] is not True]
    assert failing
    for record in failing:
        assert repro_command(failing_campaign, record["index"]) in dom


@pytest.mark.slow
def test_the_latency_report_merges_results(failing_campaign: Path, tmp_path: Path) -> None:
    done = _reports("latency", str(failing_campaign), str(failing_campaign),
                    "--out", str(tmp_path))
    assert done.returncode == 0, done.stderr
    assert "| transactional |" in done.stdout and "kill_driver (" in done.stdout
    runs = load(failing_campaign).records
    faults = sum(len(r["latencies"]) for r in runs)
    assert (tmp_path / "latency.csv").read_text().count("\n") == 1 + 2 * faults
    assert {p.name for p in tmp_path.glob("*.png")} == {
        "recoveries.png", "kills_by_point.png", "recovery_latency_cdf.png"}
