"""Named failpoints: where the crash campaign may stop a process, from outside.

Off (the default) a failpoint is one global lookup and a return. On, the environment
variable ``CUA_FAILPOINTS`` names a control channel (``unix:/path/to/socket`` or
``tcp:127.0.0.1:PORT``); each time the process reaches a point it sends one JSON line
``{"point", "n", "pid", "info"}`` (``n`` counts hits of that point in this process, from 1)
and blocks until the runner answers a line. The runner answers ``ok`` to go on, or simply
SIGKILLs the process while it waits, so the crash happens exactly at that point.

If the channel breaks (the runner went away), failpoints turn themselves off and the
process goes on: a failpoint never changes what the program does, only when it may die.

The point names are listed in ``POINTS`` so the campaign can plan over all of them and
check it covered each one.
"""

from __future__ import annotations

import json
import os
import socket
import threading
from typing import Any

ENV_VAR = "CUA_FAILPOINTS"

#: Every named point, by the part of the system that reaches it.
POINTS: dict[str, str] = {
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
    "space.outcome": "the call's outcome (and image diff) is committed",
    "checkpoint.before": "a checkpoint is about to be taken",
    "checkpoint.during": "the checkpoint exists in the Space; not yet copied to the store",
    "checkpoint.after": "the checkpoint is taken (and stored); not yet recorded in the log",
    # recovery
    "recovery.begin": "recovery of an interrupted call starts",
    "recovery.restore": "a checkpoint restore is about to run",
    "recovery.reimage": "the workspace is about to be made equal to the image",
    "recovery.decided": "recovery decided; the call's result is not committed",
    # the driver
    "session.end": "the session finished; the driver is about to exit 0",
}

_lock = threading.Lock()
_channel: socket.socket | None = None
_reader: Any = None
_counts: dict[str, int] = {}
_enabled = bool(os.environ.get(ENV_VAR))


def _connect(address: str) -> socket.socket:
    if address.startswith("unix:"):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.connect(address[5:])
        return s
    if address.startswith("tcp:"):
        host, _, port = address[4:].rpartition(":")
        return socket.create_connection((host, int(port)))
    raise ValueError(
        f"{ENV_VAR}={address!r} is not a channel; use unix:/path or tcp:127.0.0.1:PORT"
    )


def failpoint(point: str, **info: Any) -> None:
    """Report ``point`` to the runner and wait for its answer (when enabled)."""
    if not _enabled:
        return
    _hit(point, info)


def _hit(point: str, info: dict[str, Any]) -> None:
    global _channel, _reader, _enabled
    if point not in POINTS:
        raise ValueError(f"unknown failpoint {point!r}; add it to durable.failpoints.POINTS")
    with _lock:
        try:
            if _channel is None:
                _channel = _connect(os.environ[ENV_VAR])
                _reader = _channel.makefile("r", encoding="utf-8")
            n = _counts.get(point, 0) + 1
            _counts[point] = n
            msg = {"point": point, "n": n, "pid": os.getpid(), "info": info}
            _channel.sendall((json.dumps(msg) + "\n").encode())
            answer = _reader.readline()
            if not answer:
                raise ConnectionError("runner closed the failpoint channel")
        except OSError:
            _enabled = False
            if _channel is not None:
                _channel.close()
                _channel = None


def enabled() -> bool:
    return _enabled
