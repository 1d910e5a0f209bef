"""G6 coordinator: what the coordinator did in a redrive run, from its store's sessions and
events (``Observation.coordinator``), held against the rules it must keep. Written apart
from ``durable.coordinator``: a rule restated here is checked, not trusted.

- every session ended ``done`` (a driver exited 0), and the coordinator neither crashed nor
  ran out of time;
- every drive's epoch is ``max(previous + 1, lease token)``, or one above the Space's floor
  when that already is at or above it; ``previous`` is the session's previous drive's;
  epochs grow, and a later session of the Space runs above every epoch of an earlier one;
- no two drivers were alive at once for a Space: each launch follows the end of the one
  before it (its exit, or, when its coordinator died, the next coordinator's finding it
  gone or ending it), and no epoch was launched twice;
- a Space lost during a drive is noticed before the next drive (a ``space_gone`` event
  between the loss and that drive), never found out by a failing driver;
- a driver frozen (SIGSTOP) mid-call is noticed: its drive ends ``stalled`` and the
  session is driven on by a new driver;
- a driver frozen with its coordinator (their host paused) is taken over: another
  coordinator claims the session once the frozen claim lapsed (not before: the expiry the
  store held when they froze) and launches a newer driver before they are woken (that the
  two drivers then overlap is the fences' to make harmless, G4), and the frozen
  coordinator, woken, records how its drive ended;
- in a race, the second session waited for the first (``held``), took the next lease token
  and started promptly after the first ended; the first session's superseded token was
  refused.
"""

from __future__ import annotations

import itertools
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from chaos.checks.model import CheckInput

#: How soon after the first session of a Space ends the next must be launched.
PROMPT_START_S = 5.0


def check(inp: CheckInput) -> list[str]:
    facts = inp.obs.coordinator
    if facts is None:
        return []
    errors = list(facts["errors"])
    records = {r["spec"]["name"]: r for r in facts["records"]}
    events = facts["events"]
    for name, rec in records.items():
        if rec["state"] != "done":
            errors.append(f"session {name} ended {rec['state']}: {rec['reason']}")
    order = sorted(records, key=lambda n: first_at(events, n, "launched"))
    errors += _epochs(events, order)
    freezes = facts.get("host_freezes", [])
    errors += _one_driver_at_a_time(events, order, [*facts.get("host_cuts", []),
                                                    *facts["coordinator_kills"]],
                                    [f["at"] for f in freezes])
    errors += _losses_noticed(events, facts["losses"])
    errors += _stalls_noticed(events, facts.get("pauses", []))
    errors += _frozen_hosts_taken_over(events, freezes)
    if facts.get("second"):
        errors += _race(events, records, facts["session"], facts["second"], facts["probes"])
    return errors


def of(events: list[dict[str, Any]], session: str, kind: str) -> list[dict[str, Any]]:
    return [e for e in events if e["session"] == session and e["kind"] == kind]


def first_at(events: list[dict[str, Any]], session: str, kind: str) -> float:
    found = of(events, session, kind)
    return found[0]["at"] if found else float("inf")


def _epochs(events: list[dict[str, Any]], order: list[str]) -> list[str]:
    errors = []
    before = 0  # the highest epoch of the Space's earlier sessions
    for name in order:
        previous = 0
        highest = 0
        for e in of(events, name, "drive"):
            d = e["data"]
            want = max(previous + 1, d["token"] or 1)
            if d["floor"] is not None and d["floor"] >= want:
                want = d["floor"] + 1
            if d["previous"] != previous:
                errors.append(f"session {name} drive {d['attempt']}: recorded previous epoch "
                              f"{d['previous']}, but its previous drive ran at {previous}")
            if d["epoch"] != want:
                errors.append(f"session {name} drive {d['attempt']} ran at epoch "
                              f"{d['epoch']}; the rule gives {want} (previous {previous}, "
                              f"lease token {d['token']}, the Space's floor {d['floor']})")
            if d["epoch"] <= before:
                errors.append(f"session {name} drive {d['attempt']} ran at epoch {d['epoch']}, "
                              f"not above epoch {before} of an earlier session of its Space")
            previous = d["epoch"]
            highest = max(highest, d["epoch"])
        before = max(before, highest)
    return errors


def _one_driver_at_a_time(events: list[dict[str, Any]], order: list[str],
                          deaths: list[float], freezes: list[float]) -> list[str]:
    """``deaths``: when the nemesis killed coordinators (a host power cut, a coordinator's
    SIGKILL): the only way a driver found gone by the next coordinator may have died.
    ``freezes``: when it froze a driver with its coordinator: another coordinator's driver
    launched after that may overlap it."""
    errors = []
    launches = sorted((e for e in events if e["kind"] == "launched" and e["session"] in order),
                      key=lambda e: e["seq"])
    epochs = [e["data"]["epoch"] for e in launches]
    twice = sorted({x for x in epochs if epochs.count(x) > 1})
    if twice:
        errors.append(f"epoch(s) {twice} were launched twice")
    ends = {(e["session"], e["data"]["epoch"]): e for e in events if e["kind"] == "exited"}
    # A drive whose coordinator died ended when the next coordinator found its driver gone
    # or killed it (by pid and start time): its ``orphan_ended``.
    orphans = {(e["session"], e["data"]["pid"]): e for e in events
               if e["kind"] == "orphan_ended"}
    frozen = {d["seq"]: t for t in freezes if (d := _running_at(events, t)) is not None}
    for a, b in itertools.pairwise(launches):
        if a["seq"] in frozen and b["at"] > frozen[a["seq"]] and \
                b["data"]["coordinator"] != a["data"]["coordinator"]:
            continue  # taken over from a frozen host (``_frozen_hosts_taken_over``)
        end = ends.get((a["session"], a["data"]["epoch"]))
        orphan = orphans.get((a["session"], a["data"]["pid"]))
        if end is None and orphan is not None:
            if not orphan["data"]["killed"] and \
                    not any(a["at"] <= t <= orphan["at"] for t in deaths):
                errors.append(f"the driver of session {a['session']} at epoch "
                              f"{a['data']['epoch']} (pid {a['data']['pid']}) was found gone "
                              "by the next coordinator, but nothing killed it or its "
                              "coordinator: it was never shown to have ended")
            end = orphan
        if end is None or not a["seq"] < end["seq"] < b["seq"]:
            errors.append(f"the driver of session {a['session']} at epoch {a['data']['epoch']} "
                          f"(pid {a['data']['pid']}) had not ended when session "
                          f"{b['session']} was launched at epoch {b['data']['epoch']}: two "
                          "drivers of one Space at once")
    return errors


def _running_at(events: list[dict[str, Any]], t: float) -> dict[str, Any] | None:
    """The ``launched`` event of the drive running at ``t``: the last launched before it."""
    launched = [e for e in events if e["kind"] == "launched" and e["at"] <= t]
    return launched[-1] if launched else None


def _frozen_hosts_taken_over(events: list[dict[str, Any]],
                             freezes: list[dict[str, Any]]) -> list[str]:
    """Each driver frozen at ``at`` with its coordinator until ``woken``: another
    coordinator claimed the session no sooner than the frozen claim lapsed
    (``claim_until``) and launched a driver in between, and the frozen coordinator
    recorded the frozen drive's end (``exited``) once woken."""
    errors = []
    for f in freezes:
        t, woken = f["at"], f["woken"]
        drive = _running_at(events, t)
        if drive is None:
            errors.append(f"a driver was frozen with its host at {t:.3f} before any was "
                          "launched")
            continue
        session, epoch = drive["session"], drive["data"]["epoch"]
        owner = drive["data"]["coordinator"]
        what = (f"the driver of session {session} at epoch {epoch}, frozen at {t:.3f} with "
                f"its coordinator {owner}")
        if woken is None:
            errors.append(f"{what}, was never woken")
            continue
        claimed = [e for e in events if e["kind"] == "claimed" and e["session"] == session
                   and e["at"] > t and e["data"]["coordinator"] != owner]
        lapsed = f.get("claim_until")
        if claimed and lapsed is not None and claimed[0]["at"] < lapsed:
            errors.append(f"{what}, was claimed by {claimed[0]['data']['coordinator']} at "
                          f"{claimed[0]['at']:.3f}, before the frozen claim lapsed at "
                          f"{lapsed:.3f}: a live claim was taken")
        if not any(e["kind"] == "launched" and e["session"] == session and t < e["at"] <= woken
                   and e["data"]["coordinator"] != owner for e in events):
            errors.append(f"{what}, was not taken over by another coordinator before the "
                          f"nemesis woke them at {woken:.3f}: its lapsed claim was never "
                          "claimed, and the session waited on a frozen host")
        if not any(e["kind"] == "exited" and e["session"] == session
                   and e["data"]["epoch"] == epoch for e in events):
            errors.append(f"{what}, was woken at {woken:.3f}, and its coordinator never "
                          "recorded how that drive ended")
    return errors


def _stalls_noticed(events: list[dict[str, Any]], pauses: list[float]) -> list[str]:
    """Each driver frozen at ``t`` is the one driven then (its ``drive`` event is saved
    before it starts): its drive must end stalled, and another drive must follow."""
    errors = []
    drives = [e for e in events if e["kind"] == "drive"]
    for t in pauses:
        frozen = [e for e in drives if e["at"] <= t][-1:]
        if not frozen:
            errors.append(f"a driver was frozen at {t:.3f} before any was driven")
            continue
        session, epoch = frozen[0]["session"], frozen[0]["data"]["epoch"]
        stalled = [e for e in events if e["kind"] == "stalled" and e["session"] == session
                   and e["data"]["epoch"] == epoch]
        later = [e for e in drives if e["session"] == session and e["at"] > t]
        if not stalled:
            errors.append(f"the driver of session {session} at epoch {epoch}, frozen at "
                          f"{t:.3f}, was never noticed as stalled by its coordinator")
        elif not later:
            errors.append(f"the driver of session {session} at epoch {epoch} stalled and no "
                          "new driver was launched after it")
    return errors


def _losses_noticed(events: list[dict[str, Any]], losses: list[float]) -> list[str]:
    errors = []
    drives = [e for e in events if e["kind"] == "drive"]
    for t in losses:
        nxt = next((d for d in drives if d["at"] > t), None)
        if nxt is None:
            continue  # the session ended before another drive: the re-drive rebuilds it
        noticed = [e for e in events if e["kind"] == "space_gone" and t < e["at"] <= nxt["at"]
                   and e["session"] == nxt["session"]]
        if not noticed:
            errors.append(f"the Space was lost at {t:.3f} and drive {nxt['data']['attempt']} of "
                          f"session {nxt['session']} was launched at {nxt['at']:.3f} without the "
                          "coordinator noticing (no space_gone before it)")
    return errors


def _race(events: list[dict[str, Any]], records: dict[str, dict[str, Any]], first: str,
          second: str, probes: list[dict[str, Any]]) -> list[str]:
    errors = []
    held = of(events, second, "held")
    if not held or held[0]["data"].get("holder") != first:
        errors.append(f"session {second} did not wait for {first} (no held event naming it)")
    released = of(events, first, "lease_released")
    launched = of(events, second, "launched")
    if released and launched:
        delay = launched[0]["at"] - released[-1]["at"]
        if delay < 0:
            errors.append(f"session {second} was launched {-delay:.3f} s before {first} "
                          "released the Space")
        elif delay > PROMPT_START_S:
            errors.append(f"session {second} started {delay:.1f} s after {first} ended (at "
                          f"most {PROMPT_START_S:.0f} s)")
    a, b = records[first].get("lease_token"), records[second].get("lease_token")
    if a is not None and b is not None and b != a + 1:
        errors.append(f"session {second} holds lease token {b}; the next after {first}'s {a} "
                      f"is {a + 1}")
    if not probes:
        errors.append("the superseded lease token was never probed")
    for p in probes:
        if not p["refused"]:
            errors.append(f"{p['op']} with the superseded lease token {p['token']} was "
                          "accepted")
    return errors
