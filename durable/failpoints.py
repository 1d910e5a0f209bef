"""Named failpoints of the driver: where the crash campaign may stop it, from outside.

Off (the default) a failpoint is one global lookup, an attribute read and a return. On, the
environment variable ``CUA_FAILPOINTS`` names a control channel (``unix:/path/to/socket``
or ``tcp:127.0.0.1:PORT``); each time the process reaches a point it sends one JSON line
``{"point", "n", "pid", "info"}`` (``n`` counts hits of that point in this process, from 1)
and blocks until the runner answers a line. The runner answers ``ok`` to go on, or simply
SIGKILLs the process while it waits, so the crash happens exactly at that point.

If the channel breaks (the runner went away), failpoints turn themselves off and the
process goes on: a failpoint never changes what the program does, only when it may die.

The client of the channel is ``spacesd.failpoints.Channel``, the one the daemon inside a
Space reports through as well (its points are ``spacesd.failpoints.POINTS``). The driver's
point names are listed here in ``POINTS`` so the campaign can plan over all of them and
check it covered each one.
"""

from __future__ import annotations

import os
from typing import Any

from spacesd.failpoints import ENV_VAR, Channel

#: Every named point, by the part of the system that reaches it.
POINTS: dict[str, str] = {
    # the log
    "log.commit": "a commit is about to take the log's write lock (SQLite's transaction, "
                  "the JSONL commit lock); nothing of it is written",
    # harness: one tool call
    "call.begin": "a call is about to commit its intent",
    "call.intent": "the intent (arguments, replay rule) is committed",
    "call.returned": "the tool returned; its result is not committed",
    "call.result": "the result entry is committed",
    # adapter: inside a wrapped call
    "space.start_mark": "the command's start mark (key, epoch) is committed",
    "space.before_spawn": "the exec request is about to be sent",
    "space.running": "the command is running in the Space",
    "space.exited": "the command exited; its outcome is not recorded",
    "space.file_op": "a file tool is about to change the Space",
    "space.file_written": "a file tool changed the Space; its outcome is not recorded",
    "space.outcome": "the call's outcome (and image diff) is committed",
    "checkpoint.before": "a checkpoint is about to be taken",
    "checkpoint.during": "the checkpoint exists in the Space; not yet copied to the store",
    "checkpoint.after": "the checkpoint is taken (and stored); not yet recorded in the log",
    # recovery
    "recovery.begin": "recovery of an interrupted call starts",
    "recovery.restore": "a checkpoint restore is about to run",
    "recovery.reimage": "the workspace is about to be made equal to the image",
    "recovery.decided": "recovery decided; the call's result is not committed",
    # a virtual workspace's call (durable.virtual)
    "virtual.ran": "the tool ran on the call's files in memory; its change is not committed",
    "virtual.blobs_written": "the change's larger files are in the blob store; not committed",
    # the driver
    "session.end": "the session finished; the driver is about to exit 0",
}

def _from_environment() -> Channel:
    return Channel(os.environ.get(ENV_VAR), POINTS, registry="durable.failpoints.POINTS")


_channel = _from_environment()


def reopen() -> None:
    """Take the channel from the environment again: in a process forked from one that
    imported this module (``chaos.run.driver_server``), whose environment is its own."""
    global _channel
    _channel = _from_environment()


def failpoint(point: str, **info: Any) -> None:
    """Report ``point`` to the runner and wait for its answer (when enabled)."""
    if _channel.enabled:
        _channel.report(point, info)


def enabled() -> bool:
    return _channel.enabled
