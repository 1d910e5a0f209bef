"""The latency report: how long recovery takes after each fault, from campaign records.

For every fault a run fired (``latencies`` in its record): the time from the fault to the
next driver's first failpoint (``t_next_step``; only for faults that killed a driver, since
only those need a next driver) and to the run's completion by its clean driver
(``t_done``). The tables give n, p50, p95 and max per mode and per fault kind; the plots are
the campaign's own (``chaos.campaign.plots``): the CDF of kill to next step, recovery decisions per
mode and faults per failpoint, drawn from the merged records.

A fault kind is the action and how it was triggered (``kill_driver (failpoint)``,
``restart_space (time)``...): a kill at a failpoint lands mid-call, a timed one anywhere,
and their recoveries differ.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pandas as pd

from chaos.campaign.plots import campaign_plots

from .markdown import table
from .results import Campaign, pairs, records

COLUMNS = ["results", "index", "seed", "mode", "backend", "fault", "point", "killed",
           "next_step_ms", "done_s"]


def frame(campaigns: Sequence[Campaign]) -> pd.DataFrame:
    """One row per fault fired, over every campaign."""
    rows = []
    for c, r in pairs(campaigns):
        for lat in r["latencies"]:
            next_ms = (1000 * (lat["t_next_step"] - lat["t_fault"])
                       if lat["killed"] and lat["t_next_step"] is not None else None)
            done_s = lat["t_done"] - lat["t_fault"] if lat["t_done"] is not None else None
            rows.append([str(c.path), r["index"], r["seed"], r["campaign_mode"], r["backend"],
                         f"{lat['action']} ({lat['trigger']})", lat["point"], lat["killed"],
                         next_ms, done_s])
    return pd.DataFrame(rows, columns=COLUMNS).astype({"next_step_ms": float, "done_s": float})


def _stats(values: pd.Series, fmt: str) -> list[str]:
    v = values.dropna()
    if v.empty:
        return ["0", "-", "-", "-"]
    return [str(len(v)), *(format(x, fmt) for x in (v.quantile(0.5), v.quantile(0.95), v.max()))]


def _rows(faults: pd.DataFrame, keys: list[str]) -> list[list[str]]:
    out = []
    for key, part in faults.groupby(keys, sort=True):
        labels = [str(k) for k in key] if isinstance(key, tuple) else [str(key)]
        out.append([*labels, *_stats(part["next_step_ms"], ".0f"), *_stats(part["done_s"], ".1f")])
    return out


#: What the two latencies measure, said under every table of them.
EXPLAIN = ("Kill to next step: from a fault that killed the driver to the next driver's first "
           "failpoint. Run done: from any fault to the end of the run's clean driver.")
HEAD = ["kills n", "next step p50 ms", "p95 ms", "max ms", "faults n", "run done p50 s",
        "p95 s", "max s"]


def tables(faults: pd.DataFrame) -> tuple[list[str], list[list[str]], list[list[str]]]:
    """Headers, rows per mode and rows per (mode, fault kind)."""
    return HEAD, _rows(faults, ["mode"]), _rows(faults, ["mode", "fault"])


def markdown(faults: pd.DataFrame) -> str:
    if faults.empty:
        return "## Recovery latency\n\nNo faults fired in these campaigns.\n"
    head, by_mode, by_kind = tables(faults)
    return "\n\n".join([
        "## Recovery latency",
        EXPLAIN,
        "**Per mode**\n\n" + table(["mode", *head], by_mode),
        "**Per mode and fault kind**\n\n" + table(["mode", "fault", *head], by_kind,
                                                  ["l", "l", *"r" * len(head)]),
    ]) + "\n"


def write(campaigns: Sequence[Campaign], out: Path) -> str:
    """Write ``latency.csv``, ``latency.md`` and the plots into ``out``; return the Markdown."""
    out.mkdir(parents=True, exist_ok=True)
    faults = frame(campaigns)
    faults.to_csv(out / "latency.csv", index=False)
    campaign_plots(records(campaigns), out)
    text = markdown(faults)
    (out / "latency.md").write_text(text)
    return text
