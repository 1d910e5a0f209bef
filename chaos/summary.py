"""The SUMMARY line: one line per campaign, ``key=value`` pairs, machine-parsable.

Counts that do not apply are 0, never omitted, so every SUMMARY line has the same keys in
the same order and a CI gate can parse any of them. ``cells=K/N``: of the N cells of the
adapter's recovery table (mode x decision x tool kind x cause,
``durable.adapter.decide.reachable_cells``) a campaign in this mode can reach, K were
exercised by some run. Recovery counts come from the recovery
events the adapter committed to each run's log; ``interrupted`` counts calls whose committed
result is interrupted (host never-tools included).
"""

from __future__ import annotations

from typing import Any

from durable.adapter.decide import Cell, cell_of, reachable_cells

from .checker import VERDICT_NAMES, merge

FAULT_KEYS = ("kills", "daemon_kills", "space_restarts", "lost_spaces", "fenced", "timeouts")
RECOVERY_KINDS = ("adopted", "reattached", "replayed", "ran", "restored", "reverted", "reimaged")


def cells_hit(records: list[dict[str, Any]]) -> set[Cell]:
    """The recovery-table cells the runs' recovery events exercised."""
    return {c for r in records for e in r["recoveries"] if (c := cell_of(e)) is not None}


def summarize(*, mode: str, backend: str, seed_base: int, records: list[dict[str, Any]],
              seconds: float, covered: int | None = None,
              durable_mode: str | None = None) -> dict[str, Any]:
    valid = [r["verdict"]["valid"] for r in records]
    out: dict[str, Any] = {
        "mode": mode, "backend": backend, "seed_base": seed_base, "runs": len(records),
        "ok": sum(v is True for v in valid), "failed": sum(v is False for v in valid),
        "unknown": sum(v == "unknown" for v in valid),
    }
    for key in FAULT_KEYS:
        out[key] = sum(r["counts"].get(key, 0) for r in records)
    for kind in RECOVERY_KINDS:
        out[kind] = sum(1 for r in records for e in r["recoveries"] if e["kind"] == kind)
    out["interrupted"] = sum(1 for r in records if r.get("observation")
                             for c in r["observation"]["calls"] if c["result"] == "info")
    out["mode_switches"] = sum(1 for r in records for e in r["recoveries"] if e["kind"] == "mode")
    out["covered"] = covered or 0
    out["process_kills"] = sum(r["counts"].get("process_kills", 0) for r in records)
    out["foreign"] = sum(r["counts"].get("foreign", 0) for r in records)
    reachable = reachable_cells(durable_mode or mode)
    out["cells"] = f"{len(cells_hit(records) & reachable)}/{len(reachable)}"
    out["seconds"] = round(seconds, 1)
    out["verdict"] = VERDICT_NAMES[merge(valid)]
    return out


def summary_line(summary: dict[str, Any]) -> str:
    return "SUMMARY " + " ".join(f"{k}={v}" for k, v in summary.items())


def parse_summary(line: str) -> dict[str, str]:
    """The key/value pairs of a SUMMARY line (values as strings)."""
    if not line.startswith("SUMMARY "):
        raise ValueError(f"not a SUMMARY line: {line[:60]!r}")
    return dict(part.split("=", 1) for part in line.split()[1:])
