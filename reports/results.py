"""Campaign results directories as the reports read them: configuration, SUMMARY, run records.

Several directories (shards of one campaign run on different machines, or campaigns of
different modes) merge into one list of ``(Campaign, record)`` pairs: a record keeps its own
campaign so that its repro command names the directory that holds it.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from chaos.campaign.campaign import repro_command
from chaos.campaign.records import ResultsDir
from chaos.errors import BadResults as DamagedResults

from .errors import BadResults

HOW_TO_MAKE = ("make one with `python -m chaos run --mode checkpoint --runs 6 --results "
               "results` and pass results/latest")


@dataclass(frozen=True)
class Campaign:
    path: Path
    config: dict[str, Any]
    #: The SUMMARY line, or None when the campaign did not get to write it.
    summary: str | None
    records: list[dict[str, Any]]

    def repro(self, record: dict[str, Any]) -> str:
        return repro_command(self.path, record["index"])


def load(path: Path) -> Campaign:
    """Read one results directory; ``BadResults`` says what is missing and how to make it."""
    try:
        results = ResultsDir.open(path)
    except FileNotFoundError:
        nested = sorted({p.parent.resolve().name for p in Path(path).glob("*/campaign.json")})
        shown = ", ".join(nested[:3]) + (", ..." if len(nested) > 3 else "")
        hint = (f"; it holds campaigns ({shown}): pass one of them or {path}/latest"
                if nested else f"; {HOW_TO_MAKE}")
        raise BadResults(f"{path} is not a campaign results directory: expected "
                         f"{path}/campaign.json and {path}/runs.jsonl{hint}") from None
    if not (results.path / "runs.jsonl").exists():
        raise BadResults(f"{path} has no runs.jsonl (one JSON line per finished run): the "
                         f"campaign finished no run yet; {HOW_TO_MAKE}")
    summary_file = results.path / "SUMMARY"
    summary = summary_file.read_text().strip() if summary_file.exists() else None
    try:
        return Campaign(results.path, results.read_json("campaign.json"), summary,
                        results.runs())
    except DamagedResults as exc:
        raise BadResults(str(exc)) from None


def load_all(paths: Sequence[Path]) -> list[Campaign]:
    if not paths:
        raise BadResults(f"no results directory given; {HOW_TO_MAKE}")
    return [load(p) for p in paths]


def pairs(campaigns: Sequence[Campaign]) -> Iterator[tuple[Campaign, dict[str, Any]]]:
    for c in campaigns:
        for r in c.records:
            yield c, r


def records(campaigns: Sequence[Campaign]) -> list[dict[str, Any]]:
    """Every run record of every campaign (what ``chaos.campaign.plots`` takes)."""
    return [r for _, r in pairs(campaigns)]
