"""G3 fenced before restore: before a restore or revert changes any file, no process started
before it is alive: none of an older epoch, and none of the restoring driver's own (a
command an in-process recovery gave up on, a background job of an earlier call).

spacesd records, at each ``advance_epoch`` (and its start-up sweep), what it killed and what
of an older epoch it still found alive afterwards, and at each checkpoint restore the
request's epoch, the floor, what it killed and what started at or below the request's epoch
it still found alive (``fences.jsonl``). Checked: nothing alive after any advance, sweep or
restore; every restore comes from the owner of the floor (a restore by a higher epoch did
not advance first) and follows an ``advance_epoch`` of its epoch in the journal; and every
restore or revert the adapter recorded at epoch ``e`` has an ``advance_epoch(e)`` of the
Space (one that changed files has its restore record, ordered above).

Order is the journal's, never a clock's: the journal's times are the Space's clock and the
adapter's events the driver's, and a microVM's clock is its own (stepped by a clock jump,
behind after a pause or a boot), so comparing the two judged by whichever clock ran ahead."""

from __future__ import annotations

from typing import TYPE_CHECKING

from chaos.checks.model import Undecided

if TYPE_CHECKING:
    from chaos.checks.model import CheckInput


def check(inp: CheckInput) -> list[str]:
    obs = inp.obs
    # A fork's history holds its parent's recoveries too: they were in the parent's Space.
    recoveries = [e for e in obs.events if e.get("kind") in ("restored", "reverted")
                  and e.get("conversation", obs.conversation) == obs.conversation]
    if obs.ledgers is None:
        if recoveries:
            raise Undecided("the run recorded no fence records of its Space")
        return []
    errors: list[str] = []
    advanced: set[int] = set()  # epochs advanced to so far, in the journals' order
    for ledger in obs.ledgers:
        for r in ledger["audit"]["fences"]:
            alive = r.get("alive_after", r.get("alive_older", []))
            if alive:
                own = r.get("own") or (r["t"] == "restore" and "alive_after" in r)
                started = "started at or below its epoch" if own else "of an older epoch"
                errors.append(f"{r['t']} at epoch {r.get('epoch', r.get('floor'))} left "
                              f"{len(alive)} process(es) {started} alive: {alive[:3]}")
            if r["t"] == "advance":
                advanced.add(r["epoch"])
            if r["t"] == "restore" and r["epoch"] != r["floor"]:
                errors.append(f"checkpoint {r['id']} was restored by epoch {r['epoch']} while "
                              f"the Space's floor was {r['floor']}: the Space was not fenced "
                              "at that epoch first")
            elif r["t"] == "restore" and r["epoch"] not in advanced:
                errors.append(f"checkpoint {r['id']} was restored by epoch {r['epoch']} before "
                              f"any advance_epoch({r['epoch']}) in the Space's fence journal")
    for e in recoveries:
        epoch = e.get("epoch")
        if epoch is None:
            continue  # an event of an older adapter: nothing to match
        if epoch not in advanced:
            errors.append(f"{e['kind']} of {e.get('call_id') or 'the Space'} at epoch {epoch} "
                          f"(entry {e['entry']}) was not preceded by advance_epoch({epoch}) "
                          "in the Space")
    return errors
