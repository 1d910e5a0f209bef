"""Part of G5 (faithful): a command the campaign held frozen is alive, so no driver may be
told it was lost while it was.

``pause_commands`` stops every process of a Space's commands while their daemon answers,
and the history names the keys whose shims it stopped and from when to when
(``Observation.command_freezes``). A stopped process is alive: its key must read
``running``. A daemon that reads it ``lost`` (a liveness test that takes a stopped process
for a dead one) makes the driver's recovery restore and rerun, or tell the agent its command
was interrupted, though the command was only waiting to go on; every other check passes
such a run, since a lost command's effects are undone by the restore. So: a recovery event
caused by ``daemon_lost`` for the call of a frozen key, committed while it was frozen, is
an error. Committed then, the ledger was read no later; and a frozen command was alive
from its start to the end of the freeze, so no reading of it before was ``lost`` either.
"""

from __future__ import annotations

from typing import Any

from chaos.checks.model import Observation
from durable.adapter.space_names import call_of_key


def check(obs: Observation) -> list[str]:
    errors = []
    for freeze in obs.command_freezes:
        calls = {call for key in freeze["keys"] if (call := call_of_key(key)) is not None}
        for event in obs.events:
            if _lost_while_frozen(event, calls, freeze):
                errors.append(
                    f"the ledger said the command of call {event['call_id']} was lost (a "
                    f"{event['kind']} event at {event['time_ms']} ms) while the campaign held "
                    f"it frozen, alive, from {freeze['from_ms']} to {freeze['to_ms']} ms: a "
                    f"stopped command must read running")
    return errors


def _lost_while_frozen(event: dict[str, Any], calls: set[tuple[int, str]],
                       freeze: dict[str, Any]) -> bool:
    return (event.get("cause") == "daemon_lost"
            and (event.get("conversation"), event.get("call_id")) in calls
            and freeze["from_ms"] <= event.get("time_ms", -1) <= freeze["to_ms"])
