"""G2 never twice: a shell command that started is never started a second time by recovery.

Audited from the Space's exec ledgers (every generation of the Space the run had: the runner
saves a Space's ledger before it destroys the Space): for each call, the keys that reached
a spawn (a shim claimed them). Checkpoint mode: at most one, ever. Transactional mode: a
second start only after a recorded revert of that call (``reverted`` events), one more per
revert. A call the model issues again is a new call with its own id, not a rerun. Every key
that started must also be the call's own command: a key that ran another call's command
means keys were reused. Every key carries the run's session: a key of another session in
its Space means two sessions shared one."""

from __future__ import annotations

import re
from collections import Counter
from typing import TYPE_CHECKING, Any

from chaos.checks.model import Undecided

if TYPE_CHECKING:
    from chaos.checks.model import CheckInput

#: ``<session>:<conversation>:<call id>:<n>@<epoch>``, the adapter's idempotency keys.
KEY = re.compile(r"^(?P<session>[^:]+):(?P<conv>\d+):(?P<call>.+):(?P<n>\d+)@(?P<epoch>\d+)$")


def started_keys(ledgers: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Every key of every saved ledger that reached a spawn, once per Space generation.
    Copies of one Space's state (taken before a machine restore, and its final one) share
    its id: a key in several of them is one start."""
    seen: set[tuple[int | str, str]] = set()
    out = []
    for generation, ledger in enumerate(ledgers):
        space = ledger["audit"].get("space_id") or generation
        for k in ledger["audit"]["keys"]:
            if k["spawned"] and (space, k["key"]) not in seen:
                seen.add((space, k["key"]))
                out.append({**k, "generation": generation, "why": ledger["why"]})
    return out


def check(inp: CheckInput) -> list[str]:
    obs = inp.obs
    bash_calls = {c.call_id: c for c in obs.calls if c.tool == "bash"}
    if obs.ledgers is None:
        if bash_calls:
            raise Undecided("the run recorded no exec ledger of its Space; re-run it "
                            "(records of older campaigns lack them)")
        return []
    errors: list[str] = []
    reverts = Counter(e.get("call_id") for e in obs.events if e.get("kind") == "reverted")
    per_call: dict[str, list[dict[str, Any]]] = {}
    foreign = set(obs.foreign_keys)
    for k in started_keys(obs.ledgers):
        if k["key"] in foreign:
            continue  # an earlier log's, started before this log's first driver
        m = KEY.match(k["key"])
        if m and obs.session is not None and m["session"] != obs.session:
            errors.append(f"key {k['key']} of session {m['session']!r} started a command "
                          f"({k['command'][:60]!r}) in the Space of session "
                          f"{obs.session!r}: two sessions shared one Space")
            continue
        call = bash_calls.get(m["call"]) if m else None
        if call is None:
            errors.append(f"key {k['key']} started a command ({k['command'][:60]!r}) that no "
                          "shell call of the log issued")
            continue
        if k["command"] != call.args.get("command"):
            errors.append(f"key {k['key']} ran {k['command'][:60]!r}, but call "
                          f"{call.call_id} is {call.args.get('command', '')[:60]!r}: a key "
                          "was reused across calls")
        if k.get("starts", 1) > 1:
            errors.append(f"key {k['key']} was started {k['starts']} times in one ledger")
        per_call.setdefault(call.call_id, []).append(k)
    for call_id, keys in sorted(per_call.items()):
        allowed = 1 + reverts[call_id]
        if len(keys) > allowed:
            shown = ", ".join(f"{k['key']} (gen {k['generation']})" for k in keys)
            errors.append(f"call {call_id} (step {bash_calls[call_id].step}) started its "
                          f"command {len(keys)} times ({shown}); at most {allowed} allowed "
                          f"({reverts[call_id]} recorded revert(s))")
    return errors
