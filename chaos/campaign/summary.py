"""The SUMMARY line: one line per campaign, ``key=value`` pairs, machine-parsable.

The line has a fixed core (mode, backend, seed_base, runs, ok, failed, unknown, the fault
counts every campaign can have, seconds, verdict) and the groups that apply to the
campaign's mode and backend (``printed_keys``): the adapter's recovery counts and cells
where there is an adapter (not on a virtual workspace), ``log`` when the drivers' log is
not the default SQLite one (``--log jsonl``), ``covered`` in exhaustive,
``foreign`` in stale, the coordinator's keys in redrive, ``power_losses`` where power can
be cut (microvm). A key's place never changes. ``summary.json`` keeps every key (0 where it
does not apply), for tools that read them all. ``cells=K/N``: of the N cells of the
adapter's recovery table (mode x decision x tool kind x cause,
``chaos.campaign.coverage.reachable_cells``) a campaign in this mode can reach, K were
exercised by some run. Recovery counts come from the recovery
events the adapter committed to each run's log; ``interrupted`` counts calls whose committed
result is interrupted (host never-tools included).
"""

from __future__ import annotations

from typing import Any, get_args

from chaos.campaign.coverage import Cell, cell_of, reachable_cells
from chaos.checks.model import VERDICT_NAMES, merge
from chaos.faults.plans import HELD_KINDS, KIND_COUNTS, held_flags
from chaos.modes.mode import Group
from chaos.modes.redrive_stats import redrive_summary
from chaos.modes.registry import MODES
from chaos.space_providers import BACKEND_DESCRIPTORS
from durable.session_log import DEFAULT_LOG_STORAGE

FAULT_KEYS = ("kills", "daemon_kills", "space_restarts", "lost_spaces", "fenced", "timeouts")
RECOVERY_KINDS = ("adopted", "reattached", "replayed", "ran", "restored", "reverted", "reimaged")


def cells_hit(records: list[dict[str, Any]]) -> set[Cell]:
    """The recovery-table cells the runs' recovery events exercised."""
    return {c for r in records for e in r["recoveries"] if (c := cell_of(e)) is not None}


def summarize(*, mode: str, backend: str, seed_base: int, records: list[dict[str, Any]],
              seconds: float, covered: int | None = None,
              durable_mode: str | None = None,
              log_storage: str = DEFAULT_LOG_STORAGE,
              held: tuple[str, ...] = ()) -> dict[str, Any]:
    valid = [r["verdict"]["valid"] for r in records]
    out: dict[str, Any] = {
        "mode": mode, "backend": backend, "log": log_storage, "seed_base": seed_base,
        "runs": len(records),
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
    out["pauses"] = sum(r["counts"].get("pauses", 0) for r in records)
    for key in (*HELD_KEYS, *STRUCK_KEYS):
        out[key] = sum(r["counts"].get(key, 0) for r in records)
    out.update(held_flags(held))  # the campaign's flags: not keys of the line
    reachable = campaign_cells(backend, durable_mode or mode)
    out["cells"] = f"{len(cells_hit(records) & reachable)}/{len(reachable)}"
    out.update(redrive_summary(records))
    out["power_losses"] = sum(r["counts"].get("power_losses", 0) for r in records)
    out["seconds"] = round(seconds, 1)
    out["verdict"] = VERDICT_NAMES[merge(valid)]
    return out


def campaign_cells(backend: str, durable_mode: str) -> frozenset[Cell]:
    """The cells of the adapter's recovery table a campaign can reach: none on a virtual
    workspace, which has no adapter (its calls just run again)."""
    return reachable_cells(durable_mode) if _has_spaces(backend) else frozenset()


def _has_spaces(backend: str) -> bool:
    """Whether ``backend`` (a name read back from a summary: perhaps one no longer known)
    has Spaces, hence an adapter."""
    return backend not in BACKEND_DESCRIPTORS or BACKEND_DESCRIPTORS[backend].spaces


#: The held kinds' counts (``plans.HELD_KINDS``), each printed with its flag on.
HELD_KEYS = tuple(k.key for k in HELD_KINDS.values())
#: The keys of the coordinator's group (redrive).
REDRIVE_KEYS = ("drives", "refused_tokens", "coordinator_kills", "redrive_kinds",
                "resume_p50_ms", "resume_p95_ms", "race_start_p50_ms", "race_start_max_ms")


#: The counts of fault kinds (``plans.KIND_COUNTS``) that have no place of their own in
#: the line: each printed, after the held kinds', in a campaign where it struck.
STRUCK_KEYS = tuple(key for key in dict.fromkeys(KIND_COUNTS.values()) if key not in (
    *FAULT_KEYS, "process_kills", "pauses", *HELD_KEYS, "power_losses"))
#: Every key of a summary, in the order a SUMMARY line prints them.
KEYS = ("mode", "backend", "log", "seed_base", "runs", "ok", "failed", "unknown", *FAULT_KEYS,
        *RECOVERY_KINDS, "interrupted", "mode_switches", "covered", "process_kills", "foreign",
        "pauses", *HELD_KEYS, *STRUCK_KEYS, "cells", *REDRIVE_KEYS, "power_losses",
        "seconds", "verdict")


def printed_keys(summary: dict[str, Any]) -> list[str]:
    """The keys the SUMMARY line of ``summary``'s mode and backend prints, in order (a
    summary read back from ``summary.json`` prints as the campaign did)."""
    backend = summary["backend"]
    mode = MODES.get(summary["mode"])
    groups: frozenset[str] = mode.groups if mode is not None else frozenset()
    applies = {"log": summary.get("log", DEFAULT_LOG_STORAGE) != DEFAULT_LOG_STORAGE,
               "adapter": _has_spaces(backend),
               **{group: group in groups for group in get_args(Group)},
               **{k.key: bool(summary.get(k.field)) for k in HELD_KINDS.values()},
               "power": backend in BACKEND_DESCRIPTORS and BACKEND_DESCRIPTORS[backend].machines}
    keys = []
    for key in KEYS:
        group = ("adapter" if key in (*RECOVERY_KINDS, "mode_switches", "cells") else
                 "redrive" if key in REDRIVE_KEYS else
                 "power" if key == "power_losses" else
                 key if key in ("log", "covered", "pauses", *HELD_KEYS) else
                 "stale" if key == "foreign" else
                 "struck" if key in STRUCK_KEYS else None)
        if key in summary and (group is None or (summary[key] if group == "struck" else
                                                 applies[group])):
            keys.append(key)
    return keys


def summary_line(summary: dict[str, Any]) -> str:
    return "SUMMARY " + " ".join(f"{k}={summary[k]}" for k in printed_keys(summary))


def parse_summary(line: str) -> dict[str, str]:
    """The key/value pairs of a SUMMARY line (values as strings)."""
    if not line.startswith("SUMMARY "):
        raise ValueError(f"not a SUMMARY line: {line[:60]!r}")
    return dict(part.split("=", 1) for part in line.split()[1:])
