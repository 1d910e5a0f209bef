"""The SUMMARY line: one line per campaign, ``key=value`` pairs, machine-parsable.

Counts that do not apply are 0, never omitted, so every SUMMARY line has the same keys in
the same order and a CI gate can parse any of them. Recovery counts come from the recovery
events the adapter committed to each run's log; ``interrupted`` counts calls whose committed
result is interrupted (host never-tools included).
"""

from __future__ import annotations

from typing import Any

from .checker import merge

FAULT_KEYS = ("kills", "daemon_kills", "space_restarts", "lost_spaces", "fenced", "timeouts")
RECOVERY_KINDS = ("adopted", "reattached", "replayed", "ran", "restored", "reverted", "reimaged")


def summarize(*, mode: str, backend: str, seed_base: int, records: list[dict[str, Any]],
              seconds: float, covered: int | None = None) -> dict[str, Any]:
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
    out["seconds"] = round(seconds, 1)
    out["verdict"] = {True: "valid", False: "invalid", "unknown": "unknown"}[merge(valid)]
    return out


def summary_line(summary: dict[str, Any]) -> str:
    return "SUMMARY " + " ".join(f"{k}={v}" for k, v in summary.items())


def parse_summary(line: str) -> dict[str, str]:
    """The key/value pairs of a SUMMARY line (values as strings)."""
    if not line.startswith("SUMMARY "):
        raise ValueError(f"not a SUMMARY line: {line[:60]!r}")
    return dict(part.split("=", 1) for part in line.split()[1:])
