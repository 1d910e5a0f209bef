"""The cost report: per-call cost of the adapter per mode, call kind and workspace size.

``run`` measures (``cost_bench``) and ``write`` turns the samples into what is published: a CSV
of every sample, one Markdown table per backend and workspace size (one row per mode, one
column per call kind, as the seed document's cost tables), the fitted growth per mode, and
two plots per backend: cost against workspace size (log-log) and log growth against the
number of calls.

The growth is stated, not left to the reader: for each mode and call kind a least-squares
line through the medians at each workspace size gives the milliseconds a call gains per 100
files; the line per mode gives their mean and each kind's. A line fitted over sizes spread
by decades is dominated by the largest one: it is the cost a big workspace adds, which is
what a reader of the table needs to extrapolate.
"""

from __future__ import annotations

import math
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from matplotlib.axes import Axes
from matplotlib.ticker import FuncFormatter, NullFormatter

from chaos.errors import BackendUnavailable

from . import cost_bench
from .errors import NoBackend
from .figures import Figure, plt, save
from .markdown import table

KIND_LABEL = {"write": "write", "edit": "edit", "bash": "bash append"}
#: What the numbers are, said above the tables.
METHOD = ("Time from the start of the call's intent commit to the end of its result commit; "
          "log bytes are the SQLite file's growth after a WAL checkpoint, per submission of "
          "one call (input, two model turns, the call): unwrapped is that baseline.")


def run(backends: list[str], repeat: int, sizes: tuple[int, ...], modes: tuple[str, ...],
        out: Path) -> str:
    """Measure every backend that can be had (a skipped one says why), write the report
    into ``out`` and return its Markdown."""
    samples: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="reports-cost-") as tmp:
        for backend in backends:
            work = Path(tmp) / backend
            try:
                spaces = cost_bench.backend_spaces(backend, work)
            except BackendUnavailable as exc:
                print(f"cost: skipping backend {backend}: {exc}", file=sys.stderr)
                continue
            print(f"cost: {backend}: {len(modes)} modes x {len(sizes)} sizes x "
                  f"{len(cost_bench.KINDS)} kinds, {repeat} rounds", file=sys.stderr)
            with cost_bench.open_cells(backend, spaces, modes, sizes, work) as cells:
                samples += cost_bench.measure(cells, repeat)
    if not samples:
        raise NoBackend(f"no backend could be measured (asked for {', '.join(backends)}); "
                        "the reasons are printed above")
    return write(pd.DataFrame(samples), out, repeat)


def cells(samples: pd.DataFrame) -> pd.DataFrame:
    """Median, p95 and count of the call time, mean log bytes, and the adapter mode(s) the
    calls ran in, per cell and kind."""
    g = samples.groupby(["backend", "mode", "files", "kind"], sort=False)
    return g.agg(median_ms=("ms", "median"), p95_ms=("ms", lambda s: s.quantile(0.95)),
                 n=("ms", "size"), log_bytes=("log_bytes", "mean"),
                 runs_as=("effective_mode", lambda s: ", ".join(sorted(set(s))))
                 ).reset_index()


def _ordered_modes(frame: pd.DataFrame) -> list[str]:
    present = set(frame["mode"])
    return [m for m in cost_bench.MODES if m in present]


def tables(stats: pd.DataFrame, repeat: int) -> list[str]:
    """One Markdown table per backend and workspace size."""
    out = []
    for (backend, files), part in stats.groupby(["backend", "files"], sort=True):
        kinds = [k for k in cost_bench.KINDS if k in set(part["kind"])]
        rows = []
        for mode in _ordered_modes(part):
            cell = part[part["mode"] == mode].set_index("kind")
            modes = set(", ".join(cell["runs_as"]).split(", ")) - {cost_bench.ADAPTER_MODE[mode]}
            runs_as = ", ".join(sorted(modes))
            rows.append([f"{mode} (runs as {runs_as})" if runs_as else mode,
                         *(f"{cell['median_ms'][k]:.1f} / {cell['p95_ms'][k]:.1f}"
                           for k in kinds),
                         f"{cell['log_bytes'].mean() / 1024:.1f}"])
        out.append(f"**{backend}, {files} files of 4 KiB** (ms per call, median / p95 of "
                   f"{repeat} calls; log KiB per call, mean over the kinds)\n\n"
                   + table(["mode", *(KIND_LABEL[k] for k in kinds), "log KiB/call"], rows))
    return out


def growth(stats: pd.DataFrame) -> list[str]:
    """The fitted growth per backend and mode, one line each."""
    lines = []
    for backend, part in stats.groupby("backend", sort=True):
        if part["files"].nunique() < 2:
            lines.append(f"{backend}: growth not fitted: it needs at least two workspace "
                         "sizes (--sizes)")
            continue
        for mode in _ordered_modes(part):
            per_kind = {}
            for kind, rows in part[part["mode"] == mode].groupby("kind", sort=False):
                per_kind[kind] = 100 * np.polyfit(rows["files"], rows["median_ms"], 1)[0]
            log_slope = 100 * np.polyfit(*_mean_log(part[part["mode"] == mode]), 1)[0]
            kinds = ", ".join(f"{KIND_LABEL[k]} {_signed(per_kind[k], 1)}" for k in cost_bench.KINDS
                              if k in per_kind)
            lines.append(f"{backend} {mode}: {_signed(np.mean(list(per_kind.values())), 1)} ms "
                         f"per 100 files ({kinds}); log {_signed(log_slope, 0)} B per call per "
                         "100 files")
    return lines


def _signed(value: float, digits: int) -> str:
    """``value`` with its sign, never ``-0.0`` (adding 0.0 turns a negative zero positive)."""
    return f"{round(float(value), digits) + 0.0:+.{digits}f}"


def _mean_log(rows: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    by_size = rows.groupby("files")["log_bytes"].mean()
    return by_size.index.to_numpy(dtype=float), by_size.to_numpy(dtype=float)


#: Markers and dashes tell apart modes whose lines coincide (a mode that runs as another).
STYLE: dict[str, dict[str, Any]] = {
    "unwrapped": {"marker": "o", "linestyle": "-"},
    "transactional": {"marker": "s", "linestyle": "-"},
    "checkpoint": {"marker": "^", "linestyle": "--"},
    "checkpoint+store": {"marker": "v", "linestyle": "-."},
    "auto": {"marker": "D", "linestyle": ":", "markerfacecolor": "none"},
    "machine": {"marker": "P", "linestyle": (0, (5, 1, 1, 1))},
}
PLAIN = FuncFormatter(lambda value, _pos: f"{value:g}")
#: Minor ticks of a log axis labelled at 2 and 5 times a power of ten only.
TWOS_FIVES = FuncFormatter(lambda value, _pos: f"{value:g}" if value > 0 and round(
    value / 10 ** math.floor(math.log10(value))) in (2, 5) else "")


def _legend(fig: Figure, ax: Axes) -> None:
    """One legend for every panel, below them, so that it hides no line."""
    handles, labels = ax.get_legend_handles_labels()
    fig.legend(handles, labels, title="mode", loc="lower center", ncol=len(labels),
               fontsize="small")
    fig.tight_layout(rect=(0, 0.12, 1, 0.95))


def plot_cost_vs_size(stats: pd.DataFrame, backend: str, out: Path) -> Path:
    part = stats[stats["backend"] == backend]
    kinds = [k for k in cost_bench.KINDS if k in set(part["kind"])]
    fig, axes = plt.subplots(1, len(kinds), figsize=(4.2 * len(kinds), 4), sharey=True,
                             squeeze=False)
    for ax, kind in zip(axes[0], kinds, strict=True):
        for mode in _ordered_modes(part):
            rows = part[(part["mode"] == mode) & (part["kind"] == kind)].sort_values("files")
            line, = ax.plot(rows["files"], rows["median_ms"], label=mode, **STYLE[mode])
            ax.fill_between(rows["files"], rows["median_ms"], rows["p95_ms"],
                            color=line.get_color(), alpha=0.12)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xticks(sorted(set(part["files"])))
        ax.xaxis.set_major_formatter(PLAIN)
        ax.xaxis.set_minor_formatter(NullFormatter())
        ax.yaxis.set_major_formatter(PLAIN)
        ax.yaxis.set_minor_formatter(TWOS_FIVES)
        ax.set_title(KIND_LABEL[kind])
        ax.set_xlabel("workspace size (files of 4 KiB)")
        ax.grid(True, which="both", alpha=0.3)
    axes[0][0].set_ylabel("time per call (ms; line median, band to p95)")
    _legend(fig, axes[0][0])
    fig.suptitle(f"Per-call cost against workspace size ({backend})")
    return save(fig, out / f"cost-{backend}-size.png")


def plot_log_growth(samples: pd.DataFrame, backend: str, out: Path) -> Path:
    part = samples[samples["backend"] == backend]
    sizes = sorted(set(part["files"]))
    fig, axes = plt.subplots(1, len(sizes), figsize=(4.2 * len(sizes), 4), sharey=True,
                             squeeze=False)
    for ax, files in zip(axes[0], sizes, strict=True):
        for mode in _ordered_modes(part):
            rows = part[(part["mode"] == mode) & (part["files"] == files)].sort_values("call")
            grown = [0.0, *(rows["log_bytes"].cumsum() / 1024)]
            ax.plot(range(len(grown)), grown, label=mode, markevery=max(1, len(grown) // 8),
                    **STYLE[mode])
        ax.set_title(f"{files} files")
        ax.set_xlabel("timed calls (count)")
        ax.grid(True, alpha=0.3)
    axes[0][0].set_ylabel("log growth (KiB)")
    _legend(fig, axes[0][0])
    fig.suptitle(f"Log growth against the number of calls ({backend}; SQLite file size "
                 "after a WAL checkpoint)")
    return save(fig, out / f"cost-{backend}-log.png")


def write(samples: pd.DataFrame, out: Path, repeat: int) -> str:
    """Write ``samples.csv``, ``cells.csv``, ``cost.md`` and the PNGs into ``out``; return
    the Markdown."""
    out.mkdir(parents=True, exist_ok=True)
    samples.to_csv(out / "samples.csv", index=False)
    stats = cells(samples)
    stats.to_csv(out / "cells.csv", index=False)
    for backend in sorted(set(samples["backend"])):
        plot_cost_vs_size(stats, backend, out)
        plot_log_growth(samples, backend, out)
    text = "\n\n".join([
        "## Cost per call",
        METHOD,
        *tables(stats, repeat),
        "Fitted growth (least squares through the medians at each size):",
        "\n".join(f"- {line}" for line in growth(stats)),
    ]) + "\n"
    (out / "cost.md").write_text(text)
    return text
