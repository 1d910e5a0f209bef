"""Campaign plots (matplotlib, PNG): recovery kinds per mode, kills per failpoint, and the
time from each kill to the next driver's first step (CDF).

They take run records (the dicts of ``runs.jsonl``), so the HTML report (``reports``) draws
the very same figures from the same files.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from chaos.campaign.summary import RECOVERY_KINDS

KINDS = (*RECOVERY_KINDS, "interrupted", "mode")


def recovery_by_mode(records: list[dict[str, Any]], out: Path) -> Path:
    counts: dict[str, Counter[str]] = defaultdict(Counter)
    for r in records:
        for e in r["recoveries"]:
            counts[r["campaign_mode"]][e["kind"]] += 1
    modes = sorted(counts) or ["(none)"]
    fig, ax = plt.subplots(figsize=(8, 4))
    width = 0.8 / max(1, len(modes))
    for i, mode in enumerate(modes):
        ax.bar([k + i * width for k in range(len(KINDS))],
               [counts[mode][kind] for kind in KINDS], width, label=mode)
    ax.set_xticks([k + width * (len(modes) - 1) / 2 for k in range(len(KINDS))])
    ax.set_xticklabels(KINDS, rotation=30, ha="right")
    ax.set_ylabel("recovery events (count)")
    ax.set_xlabel("recovery decision")
    ax.set_title("Recovery decisions per campaign mode")
    ax.legend(title="mode")
    fig.tight_layout()
    path = out / "recoveries.png"
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def kills_by_point(records: list[dict[str, Any]], out: Path) -> Path:
    counts: Counter[str] = Counter()
    for r in records:
        for lat in r["latencies"]:
            if lat["killed"] or lat["action"] != "kill_driver":
                label = lat["point"] or f"time ({lat['action']})"
                counts[label] += 1
    labels = sorted(counts) or ["(none)"]
    fig, ax = plt.subplots(figsize=(8, max(3, 0.3 * len(labels))))
    ax.barh(labels, [counts[label] for label in labels], label="faults fired")
    ax.set_xlabel("faults fired (count)")
    ax.set_ylabel("failpoint or trigger")
    ax.set_title("Faults per failpoint")
    ax.legend()
    fig.tight_layout()
    path = out / "kills_by_point.png"
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def recovery_latency_cdf(records: list[dict[str, Any]], out: Path) -> Path:
    by_mode: dict[str, list[float]] = defaultdict(list)
    for r in records:
        for lat in r["latencies"]:
            if lat["killed"] and lat["t_next_step"] is not None:
                by_mode[r["campaign_mode"]].append(1000 * (lat["t_next_step"] - lat["t_fault"]))
    fig, ax = plt.subplots(figsize=(7, 4))
    for mode, values in sorted(by_mode.items()):
        values.sort()
        ax.step(values, [(i + 1) / len(values) for i in range(len(values))], where="post",
                label=f"{mode} (n={len(values)})")
    ax.set_xlabel("time from kill to the next driver's first step (ms)")
    ax.set_ylabel("fraction of kills")
    ax.set_title("Recovery latency (CDF)")
    ax.set_ylim(0, 1.02)
    if by_mode:
        ax.legend(title="mode")
    fig.tight_layout()
    path = out / "recovery_latency_cdf.png"
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def campaign_plots(records: list[dict[str, Any]], out: Path) -> list[Path]:
    return [recovery_by_mode(records, out), kills_by_point(records, out),
            recovery_latency_cdf(records, out)]
