"""The campaign report: one self-contained HTML file (no server, no network, images inlined
as ``data:`` URIs), for one or several results directories.

Sections: the SUMMARY lines as a table; every failing run (verdict false or unknown) with
its seed, first error and the exact ``chaos repro`` command (and, for a run ``chaos shrink``
cut down, its story and the shrunk plan's command); the recovery latency tables;
the campaign plots (``chaos.campaign.plots``, drawn from the merged records); optionally the cost
report of a ``reports cost`` output directory; and a timeline per run for every failing run
and a sample of passing ones. The sample takes the passing runs that fired the most faults
(ties by index): the eventful ones are where a reader checks what recovery looked like.
"""

from __future__ import annotations

import html
import json
import tempfile
import time
from collections.abc import Collection, Sequence
from pathlib import Path
from typing import Any

from chaos.campaign.plots import campaign_plots
from chaos.campaign.summary import parse_summary
from chaos.repro.shrink import SHRUNK_NAME

from . import latency, timeline
from .errors import BadResults
from .figures import data_uri
from .results import Campaign, pairs, records

CSS = """
body { font-family: system-ui, sans-serif; margin: 1.5em auto; padding: 0 1.5em;
       max-width: 1150px; color: #222; }
nav a { margin-right: 1em; }
h1 { margin-bottom: 0.2em; } h2 { border-bottom: 1px solid #ccc; padding-bottom: 0.2em; }
.meta { color: #666; font-size: 0.9em; }
.scroll { overflow-x: auto; }
table { border-collapse: collapse; font-size: 0.85em; margin: 0.6em 0 1.2em; }
th, td { border: 1px solid #ddd; padding: 0.25em 0.5em; text-align: right; white-space: nowrap; }
th { background: #f3f3f3; }
td.text, th.text { text-align: left; white-space: normal; }
tr.invalid td { background: #fdecea; } tr.unknown td { background: #fff6e0; }
.v-invalid { color: #b71c1c; font-weight: bold; } .v-unknown { color: #b26a00; font-weight: bold; }
code, pre { font-family: ui-monospace, monospace; font-size: 0.9em; }
code.repro { background: #f4f4f4; padding: 0.1em 0.3em; user-select: all; }
figure { margin: 0.8em 0 1.6em; } figure img { max-width: 100%; border: 1px solid #eee; }
figcaption { color: #555; font-size: 0.85em; }
details pre { white-space: pre-wrap; background: #f8f8f8; padding: 0.5em; }
"""

PLOT_CAPTIONS = {
    "recoveries.png": "Recovery decisions the adapter committed, per campaign mode.",
    "kills_by_point.png": "Faults fired, per failpoint (or time trigger).",
    "recovery_latency_cdf.png": "Time from each kill to the next driver's first step (CDF).",
}


def _e(value: object) -> str:
    return html.escape(str(value))


def _table(headers: Sequence[str], rows: Sequence[Sequence[str]], *,
           text_cols: Collection[int] = (0,), row_classes: Sequence[str] | None = None) -> str:
    """A table of already-escaped cells; the ``text_cols`` align left and wrap, the others
    (numbers) align right."""
    def cls(i: int) -> str:
        return ' class="text"' if i in text_cols else ""

    head = "".join(f"<th{cls(i)}>{h}</th>" for i, h in enumerate(headers))
    body = "".join(
        f"<tr{f' class={row_classes[n]!r}' if row_classes and row_classes[n] else ''}>"
        + "".join(f"<td{cls(i)}>{c}</td>" for i, c in enumerate(row)) + "</tr>"
        for n, row in enumerate(rows))
    return f'<div class="scroll"><table><tr>{head}</tr>{body}</table></div>'


def _figure(png: bytes | Path, alt: str, caption: str) -> str:
    return (f'<figure><img src="{data_uri(png)}" alt="{_e(alt)}">'
            f"<figcaption>{_e(caption)}</figcaption></figure>")


def _verdict_cell(verdict: str) -> str:
    return f"<span class='v-{_e(verdict)}'>{_e(verdict)}</span>"


def _verdict(record: dict[str, Any]) -> str:
    return {True: "valid", False: "invalid"}.get(record["verdict"]["valid"], "unknown")


# ---------------------------------------------------------------------- sections


def summary_section(campaigns: Sequence[Campaign]) -> str:
    """The SUMMARY lines as a table: a row per key, a column per campaign (a line has some
    25 keys; side by side they would not fit a page)."""
    parsed = [parse_summary(c.summary) if c.summary else {} for c in campaigns]
    keys: list[str] = []
    for p in parsed:
        keys += [k for k in p if k not in keys]
    rows = [[_e(k), *(_verdict_cell(p[k]) if k == "verdict" and k in p else _e(p.get(k, ""))
                      for p in parsed)] for k in keys]
    missing = [c for c in campaigns if not c.summary]
    note = "".join(f"<p>{_e(c.path.name)}: no SUMMARY, the campaign did not finish "
                   f"({len(c.records)} runs recorded).</p>" for c in missing)
    lines = "".join(f"<pre>{_e(c.summary)}</pre>" for c in campaigns if c.summary)
    return ("<h2 id='summary'>SUMMARY</h2>" + note
            + _table(["key", *(_e(c.path.name) for c in campaigns)], rows)
            + f"<details><summary>SUMMARY lines as printed</summary>{lines}</details>")


def failures_section(campaigns: Sequence[Campaign]) -> str:
    failing = [(c, r) for c, r in pairs(campaigns) if r["verdict"]["valid"] is not True]
    if not failing:
        return "<h2 id='failures'>Failing runs</h2><p>None: every run passed.</p>"
    rows, classes, details = [], [], []
    for c, r in failing:
        errors = r["verdict"]["errors"] or ["no detail"]
        rows.append([_e(c.path.name), _e(r["index"]), _e(r["seed"]), _e(r["campaign_mode"]),
                     _e(r["backend"]), _verdict_cell(_verdict(r)),
                     _e(", ".join(r["verdict"].get("checks") or []) or "-"),
                     _e(errors[0].splitlines()[0][:160]),
                     f'<code class="repro">{_e(c.repro(r))}</code>'])
        classes.append(_verdict(r))
        details.append(f"<details><summary>run {_e(r['index'])} (seed {_e(r['seed'])}): every "
                       f"error</summary><pre>{_e(chr(10).join(errors))}</pre></details>")
        details.append(_shrunk_story(r))
    return (f"<h2 id='failures'>Failing runs ({len(failing)})</h2>"
            "<p>Each reproduces exactly with its command (same seed, same fault plan).</p>"
            + _table(["results", "run", "seed", "mode", "backend", "verdict", "checks",
                      "first error", "reproduce"], rows, text_cols=(0, 7, 8),
                     row_classes=classes)
            + "".join(details))


def latency_section(campaigns: Sequence[Campaign]) -> str:
    faults = latency.frame(campaigns)
    if faults.empty:
        return "<h2 id='latency'>Recovery latency</h2><p>No faults fired.</p>"
    head, by_mode, by_kind = latency.tables(faults)
    return (f"<h2 id='latency'>Recovery latency</h2><p>{_e(latency.EXPLAIN)}</p>"
            + _table(["mode", *head], [[_e(c) for c in row] for row in by_mode])
            + _table(["mode", "fault", *head], [[_e(c) for c in row] for row in by_kind],
                     text_cols=(0, 1)))


def plots_section(campaigns: Sequence[Campaign]) -> str:
    with tempfile.TemporaryDirectory(prefix="reports-html-") as tmp:
        paths = campaign_plots(records(campaigns), Path(tmp))
        figures = "".join(_figure(p, p.stem, PLOT_CAPTIONS.get(p.name, p.stem)) for p in paths)
    return "<h2 id='plots'>Plots</h2>" + figures


def cost_section(cost_dir: Path) -> str:
    md = cost_dir / "cost.md"
    if not md.exists():
        raise BadResults(f"{cost_dir} is not a cost report (no cost.md); make one with "
                         f"`python -m reports cost --backend local --out {cost_dir}`")
    figures = "".join(_figure(p, p.stem, p.stem) for p in sorted(cost_dir.glob("cost-*.png")))
    return f"<h2 id='cost'>Cost per call</h2><pre>{_e(md.read_text())}</pre>{figures}"


def timelines_section(campaigns: Sequence[Campaign], sample: int) -> str:
    all_runs = list(pairs(campaigns))
    failing = [(c, r) for c, r in all_runs if r["verdict"]["valid"] is not True]
    passing = sorted(((c, r) for c, r in all_runs if r["verdict"]["valid"] is True),
                     key=lambda cr: (-len(cr[1]["latencies"]), cr[1]["index"]))[:sample]
    parts = []
    for c, r in failing + passing:
        caption = (f"{c.path.name} run {r['index']}, seed {r['seed']}, {_verdict(r)}, "
                   f"{len(r['latencies'])} fault(s), {r['seconds']:.1f} s")
        parts.append(_figure(timeline.figure_png(r), f"timeline of run {r['index']}", caption))
    return (f"<h2 id='timelines'>Timelines ({len(failing)} failing, {len(passing)} passing "
            "of the most faults)</h2>" + "".join(parts))


# ---------------------------------------------------------------------- the page


def _shrunk_story(record: dict[str, Any]) -> str:
    """The story ``chaos shrink`` told of the run, when it was shrunk (its ``shrunk.json``)."""
    path = Path(record["run_dir"]) / SHRUNK_NAME if record.get("run_dir") else None
    if path is None or not path.is_file():
        return ""
    try:
        doc = json.loads(path.read_text())
        story, plan = list(doc["story"]), doc["plan"]
    except (OSError, ValueError, KeyError, TypeError):
        return (f"<p>run {_e(record['index'])}: {_e(path)} is not a readable shrunk plan; "
                "run chaos shrink again</p>")
    return (f"<details open><summary>run {_e(record['index'])} shrunk to "
            f"{_e(len(plan['faults']))} fault(s) and {_e(doc['steps'])} step(s), still failing "
            f"{_e(doc['check'])}</summary><pre>{_e(chr(10).join(story))}</pre>"
            f'<code class="repro">python -m chaos repro --plan {_e(path)}</code></details>')


def render(campaigns: Sequence[Campaign], *, cost_dir: Path | None = None,
           sample: int = 3) -> str:
    sections = [summary_section(campaigns), failures_section(campaigns),
                latency_section(campaigns), plots_section(campaigns)]
    if cost_dir is not None:
        sections.append(cost_section(cost_dir))
    sections.append(timelines_section(campaigns, sample))
    dirs = ", ".join(_e(c.path) for c in campaigns)
    nav = "".join(f"<a href='#{anchor}'>{anchor}</a>" for anchor in
                  ("summary", "failures", "latency", "plots",
                   *(["cost"] if cost_dir is not None else []), "timelines"))
    runs = sum(len(c.records) for c in campaigns)
    return ("<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>"
            "<title>Crash campaign report</title>"
            f"<style>{CSS}</style></head><body><h1>Crash campaign report</h1>"
            f"<p class='meta'>{runs} runs from {dirs}; generated "
            f"{_e(time.strftime('%Y-%m-%d %H:%M:%S %Z'))}</p><nav>{nav}</nav>"
            + "".join(sections) + "</body></html>\n")


def write(campaigns: Sequence[Campaign], out: Path, *, cost_dir: Path | None = None,
          sample: int = 3) -> Path:
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(render(campaigns, cost_dir=cost_dir, sample=sample))
    return out
