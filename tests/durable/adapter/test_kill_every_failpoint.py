"""For each mode: SIGKILL a real driver at every failpoint of a call (write, edit, appending
bash, long bash) in turn, and again at the next driver's first recovery decision; a driver
with the next epoch resumes the same log and Space.

This is the campaign's exhaustive mode on the ``small`` scenario. Each run's check asserts
the invariant: the workspace equals the log-implied state (which an uninterrupted run also
reaches), and in transactional mode the log's image; every step once; no error result but
interrupted (none at all in transactional mode).
"""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from chaos.campaign.campaign import CampaignConfig, run_campaign
from chaos.campaign.records import ResultsDir
from chaos.campaign.summary import parse_summary

EXPECTED_POINTS = {
    "transactional": {"call.begin", "call.intent", "call.returned", "call.result",
                      "space.start_mark", "space.before_spawn", "space.running",
                      "space.exited", "space.file_op", "space.file_written"},
}
EXPECTED_POINTS["checkpoint"] = EXPECTED_POINTS["transactional"] | {
    "space.outcome", "checkpoint.before", "checkpoint.during", "checkpoint.after"}
EXPECTED_POINTS["auto"] = EXPECTED_POINTS["transactional"]


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["transactional", "checkpoint", "auto"])
def test_kill_at_every_failpoint(tmp_path: Path, mode: str) -> None:
    out = io.StringIO()
    code = run_campaign(CampaignConfig(mode="exhaustive", durable_mode=mode, preset="small",
                                       jobs=2, results_root=tmp_path), out)
    text = out.getvalue()
    summary = parse_summary(next(x for x in text.splitlines() if x.startswith("SUMMARY")))
    assert code == 0 and summary["failed"] == "0" and summary["unknown"] == "0", text
    assert summary["covered"] == summary["runs"], "every (point, occurrence) got its kill"
    records = ResultsDir.open(tmp_path / "latest").runs()
    killed_at = {lat["point"] for r in records for lat in r["latencies"] if lat["killed"]}
    assert EXPECTED_POINTS[mode] <= killed_at, EXPECTED_POINTS[mode] - killed_at
    assert any(lat["point"] == "recovery.decided" for r in records for lat in r["latencies"]
               if lat["killed"]), "crashes during recovery itself"
    tools = {c["tool"] for r in records for c in r["observation"]["calls"]}
    assert {"write", "edit", "bash"} <= tools
