"""One run on one time axis, as Jepsen's timeline shows operations: driver attempts, tool
calls, faults and recovery decisions, each in its lane.

Bars span an operation from its invoke to its completion, coloured by the completion's type
(ok, fail, info = indeterminate: killed or cut off); a call that spans a kill is one long bar
finished by a later driver. Faults are markers with a line across every lane, so what a kill
cut through can be read straight down; a held fault (a pause, a cut link, a clock jump, a
full disk) also spans its lane until its release, as Jepsen shades a nemesis's interval.
Recovery events carry Unix milliseconds while the history counts seconds from the run's
start; the start is recovered from any call, whose observation has both.
"""

from __future__ import annotations

from typing import Any

from chaos.faults.plans import FROZEN, HELD_KINDS, RELEASE, THAWING
from chaos.run.runner import CLEAN_ATTEMPT

from .figures import plt, png_bytes

LANES = ("driver", "calls", "faults", "recoveries")
TYPE_COLOR = {"ok": "#4c9a2a", "fail": "#e08a1e", "info": "#c0392b"}
HATCH = {"info": "//"}
TYPE_LABEL = {"ok": "ok", "fail": "fail (fenced, permanent, tool error)",
              "info": "info (killed or cut off)"}
FAULT_STYLE = {"kill_driver": ("X", "#c0392b"), "kill_daemon": ("v", "#8e44ad"),
               "restart_space": ("s", "#7f5a1e"), "delete_space": ("D", "#222222"),
               "kill_process": ("*", "#6c3483"), "power_loss": ("^", "#000000"),
               "hold_driver": ("|", "#777777"), "pause_driver": ("P", "#2471a3"),
               "pause_space": ("P", "#117a65"), "cut_link": ("x", "#b9770e"),
               "jump_clock": (">", "#1f618d"), "pause_daemon": ("p", "#0e6655"),
               "fill_state_disk": ("H", "#7b241c"), "fill_work_disk": ("h", "#a93226"),
               "fill_log_disk": ("8", "#641e16"), "cut_host_power": ("^", "#7e5109"),
               "wake_driver": ("p", "#5dade2"), "wake_host": ("p", "#1b4f72")}
RECOVERY_COLOR = {"adopted": "#2e86c1", "reattached": "#17a589", "replayed": "#48c9b0",
                  "ran": "#5d6d7e", "restored": "#d68910", "reverted": "#ca6f1e",
                  "reimaged": "#a04000", "interrupted": "#c0392b", "mode": "#7d3c98"}


def run_start(record: dict[str, Any]) -> float | None:
    """The run's start in Unix seconds (``started_at``; older records without it: worked out
    from an observed call, or None when there is none)."""
    if record.get("started_at") is not None:
        return float(record["started_at"])
    calls = {c["call_id"]: c for c in (record.get("observation") or {}).get("calls", [])}
    for op in record["history"]:
        if op["process"] == "agent" and op["type"] == "invoke":
            call = calls.get(op["value"]["call"])
            if call is not None:
                return float(call["invoked_ms"] / 1000 - op["time"])
    return None


def _spans(history: list[dict[str, Any]], process: str, keys: tuple[str, ...]
           ) -> list[tuple[float, float | None, str, dict[str, Any], str]]:
    """(start, end or None, completion type, invoke value, f) of each operation of
    ``process``, paired by the first of ``keys`` its value has (a driver attempt of the
    adapter's runs has its epoch; one the coordinator launched, its attempt and pid)."""
    open_ops: dict[Any, dict[str, Any]] = {}
    spans = []
    for op in history:
        if op["process"] != process:
            continue
        ident = next(((k, op["value"][k]) for k in keys if k in op["value"]), None)
        if op["type"] == "invoke":
            open_ops[ident] = op
        elif ident in open_ops:
            start = open_ops.pop(ident)
            spans.append((start["time"], op["time"], op["type"], op["value"], op["f"]))
    spans += [(op["time"], None, "info", op["value"], op["f"]) for op in open_ops.values()]
    return spans


def held_spans(history: list[dict[str, Any]], end: float
               ) -> list[tuple[str, float, float]]:
    """``(action, start, stop)`` of every held fault that struck: from its operation to the
    first release of its action after it (overlapping ones end together, as the nemesis
    ends them), or to ``end`` when none was recorded."""
    spans = []
    for op in history:
        if op["process"] == "nemesis" and op["type"] == "info" and op["f"] in HELD_KINDS \
                and HELD_KINDS[op["f"]].holds:  # a host power cut strikes once
            stop = next((o["time"] for o in history if o["process"] == "nemesis" and
                         o["f"] == RELEASE and o["time"] >= op["time"] and
                         (o["value"] or {}).get("action") == op["f"]), end)
            spans.append((op["f"], op["time"], stop))
    return spans


def figure_png(record: dict[str, Any]) -> bytes:
    """The timeline of ``record`` as PNG bytes."""
    history = record["history"]
    end = max([op["time"] for op in history] + [record["seconds"]])
    fig, ax = plt.subplots(figsize=(11, 3.2))
    y = {lane: len(LANES) - 1 - i for i, lane in enumerate(LANES)}
    seen: dict[str, Any] = {}
    for start, stop, type_, value, _f in _spans(history, "driver", ("epoch", "attempt")):
        width = (stop if stop is not None else end) - start
        bar = ax.barh(y["driver"], width, left=start, height=0.6, color=TYPE_COLOR[type_],
                      edgecolor="white", hatch=HATCH.get(type_))
        seen.setdefault(TYPE_LABEL[type_], bar)
        tag = "clean" if value.get("attempt") == CLEAN_ATTEMPT else \
            f"e{value['epoch']}" if "epoch" in value else f"#{value.get('attempt')}"
        ax.text(start + width / 2, y["driver"], tag, ha="center", va="center", fontsize=7,
                color="white", clip_on=True)
    for start, stop, type_, _value, f in _spans(history, "agent", ("call",)):
        width = max((stop if stop is not None else end) - start, end / 400)
        bar = ax.barh(y["calls"], width, left=start, height=0.6, color=TYPE_COLOR[type_],
                      edgecolor="white", hatch=HATCH.get(type_))
        seen.setdefault(TYPE_LABEL[type_], bar)
        if width > end / 40:
            ax.text(start + width / 2, y["calls"], f, ha="center", va="center", fontsize=6,
                    color="white", clip_on=True)
    for action, start, stop in held_spans(history, end):
        ax.barh(y["faults"], max(stop - start, end / 400), left=start, height=0.35,
                color=FAULT_STYLE.get(action, ("o", "#555555"))[1], alpha=0.3, zorder=2)
    for op in history:
        if op["process"] == "nemesis" and op["f"] in (RELEASE, FROZEN, THAWING):
            continue  # drawn as its fault's span
        if op["process"] == "nemesis":
            marker, color = FAULT_STYLE.get(op["f"], ("o", "#555555"))

            ax.axvline(op["time"], color=color, alpha=0.25, linewidth=1)
            seen.setdefault(op["f"] + ("" if op["type"] == "info" else " (failed)"),
                            ax.scatter(op["time"], y["faults"], marker=marker, color=color,
                                       s=60, zorder=3))
    t0 = run_start(record)
    if t0 is not None:
        for event in record["recoveries"]:
            color = RECOVERY_COLOR.get(event["kind"], "#555555")
            seen.setdefault(f"recovery: {event['kind']}",
                            ax.scatter(event["time_ms"] / 1000 - t0, y["recoveries"], marker="o",
                                       color=color, s=45, zorder=3))
    elif record["recoveries"]:
        ax.text(0, y["recoveries"], "  recovery times unknown: no call was observed",
                va="center", fontsize=8)
    ax.set_yticks([y[lane] for lane in LANES], LANES)
    ax.set_ylim(-0.6, len(LANES) - 0.4)
    ax.set_xlim(0, end * 1.02)
    ax.set_xlabel("time since the run started (s)")
    verdict = record["verdict"]["valid"]
    state = {True: "passed", False: "FAILED"}.get(verdict, "unknown")
    ax.set_title(f"run {record['index']} seed {record['seed']} ({record['campaign_mode']}, "
                 f"{record['backend']}): {state}")
    ax.grid(True, axis="x", alpha=0.3)
    ax.legend(list(seen.values()), list(seen), loc="upper left", bbox_to_anchor=(1.01, 1.0),
              fontsize=7, title="legend", title_fontsize=8)
    fig.tight_layout()
    return png_bytes(fig, dpi=80)
