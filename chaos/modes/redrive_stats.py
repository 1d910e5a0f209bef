"""A redrive campaign's numbers, from its run records: resume latency per kill (without
the coordinator's backoff), the race's start delay, runs per kind; the SUMMARY's redrive
group (``redrive_summary``) and the table printed before it (``redrive_table``)."""

from __future__ import annotations

from typing import Any


def _pct(values: list[float], q: float) -> int:
    if not values:
        return 0
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))])


def resume_latencies(record: dict[str, Any]) -> list[dict[str, float]]:
    """A redrive run's kills, each with the time to the next driver's first step and the
    coordinator's backoff in it (ms)."""
    facts = (record.get("observation") or {}).get("coordinator")
    if not facts:
        return []
    backoffs = sorted((e["at"], e["data"]["delay"]) for e in facts["events"]
                      if e["kind"] == "backoff")
    out = []
    for lat in record["latencies"]:
        if not lat["killed"] or lat["t_next_step"] is None:
            continue
        at = record["started_at"] + lat["t_fault"]
        delay = next((d for t, d in backoffs if t >= at), 0.0)
        total = (lat["t_next_step"] - lat["t_fault"]) * 1000
        out.append({"total_ms": total, "backoff_ms": delay * 1000,
                    "resume_ms": max(0.0, total - delay * 1000)})
    return out


def race_start_ms(record: dict[str, Any]) -> float | None:
    """A redrive race's delay from the first session's end to the second's launch (ms)."""
    facts = (record.get("observation") or {}).get("coordinator")
    if not facts or not facts.get("second"):
        return None
    released = [e["at"] for e in facts["events"]
                if e["session"] == facts["session"] and e["kind"] == "lease_released"]
    launched = [e["at"] for e in facts["events"]
                if e["session"] == facts["second"] and e["kind"] == "launched"]
    return (launched[0] - released[-1]) * 1000 if released and launched else None


def redrive_kind(record: dict[str, Any]) -> str | None:
    return next((k[len("kind_"):] for k, v in record["counts"].items()
                 if k.startswith("kind_") and v), None)


def redrive_summary(records: list[dict[str, Any]]) -> dict[str, Any]:
    """The redrive keys of every summary (0 in other modes): per-kind run counts, drives,
    refused superseded tokens, coordinator kills, resume latency without the backoffs
    (p50, p95), and the race's start delay (p50, max)."""
    kinds: dict[str, int] = {}
    for r in records:
        kind = redrive_kind(r)
        if kind:
            kinds[kind] = kinds.get(kind, 0) + 1
    resume = [x["resume_ms"] for r in records for x in resume_latencies(r)]
    races = [d for r in records if (d := race_start_ms(r)) is not None]
    return {"drives": sum(r["counts"].get("drives", 0) for r in records),
            "refused_tokens": sum(r["counts"].get("refused_tokens", 0) for r in records),
            "coordinator_kills": sum(r["counts"].get("coordinator_kills", 0) for r in records),
            "redrive_kinds": ",".join(f"{k}:{n}" for k, n in sorted(kinds.items())) or 0,
            "resume_p50_ms": _pct(resume, 0.5), "resume_p95_ms": _pct(resume, 0.95),
            "race_start_p50_ms": _pct(races, 0.5), "race_start_max_ms": _pct(races, 1.0)}


def redrive_table(records: list[dict[str, Any]]) -> list[str]:
    """Resume latency per redrive kind: kill to the next driver's first step, with the
    coordinator's backoff apart."""
    by: dict[str, list[dict[str, float]]] = {}
    for r in records:
        kind = redrive_kind(r)
        if kind:
            by.setdefault(kind, []).extend(resume_latencies(r))
    lines = ["resume latency by kind (kill -> next driver's first step; ms):",
             f"  {'kind':<18}{'kills':>6}{'p50':>8}{'p95':>8}{'backoff p50':>13}"
             f"{'total p50':>11}"]
    for kind in sorted(by):
        xs = by[kind]
        if not xs:
            lines.append(f"  {kind:<18}{0:>6}{'-':>8}{'-':>8}{'-':>13}{'-':>11}  (no kills)")
            continue
        lines.append(f"  {kind:<18}{len(xs):>6}{_pct([x['resume_ms'] for x in xs], .5):>8}"
                     f"{_pct([x['resume_ms'] for x in xs], .95):>8}"
                     f"{_pct([x['backoff_ms'] for x in xs], .5):>13}"
                     f"{_pct([x['total_ms'] for x in xs], .5):>11}")
    return lines
