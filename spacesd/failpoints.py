"""The failpoint channel's client, and the daemon's named failpoints.

A failpoint is a named place where the crash campaign may stop a process, from outside.
Off (the default) it costs an attribute read and a return. On, the channel is a unix or
TCP socket the runner listens on (``unix:/path/to/socket`` or ``tcp:127.0.0.1:PORT``);
each time the process reaches a point it sends one JSON line ``{"point", "n", "pid",
"info"}`` (``n`` counts hits of that point in this process, from 1) and blocks until the
runner answers a line. The runner answers to go on, or SIGKILLs the process while it
waits, so the crash happens exactly at that point.

If the channel breaks (the runner went away), the channel turns itself off and the process
goes on: a failpoint never changes what the program does, only when it may die.

One client serves every process that reports: the driver (``durable.failpoints`` keeps its
own ``POINTS`` and reports through a ``Channel``), the daemon and its shims (``POINTS``
below). The daemon reads its channel from ``CUA_FAILPOINTS`` and removes it from its
commands' environment; a shim gets it only through the variable ``spacesd.shim.failpoints_env``
sets (the channel and what the shim reports as its info), set by the daemon only when
failpoints are on and removed by the shim before it starts the command.

Standard library only, importing nothing of ``spacesd``: a shim imports this module only
when its variable is set, after its command exited, so its start-up, on the path of every
command, stays as cheap as before.
"""

from __future__ import annotations

import json
import os
import socket
import threading
from collections.abc import Mapping
from typing import Any

#: The variable naming the channel of the driver and of the daemon.
ENV_VAR = "CUA_FAILPOINTS"

#: The daemon's points. Every report's info holds ``process`` (``spacesd`` or ``shim``),
#: ``space_state`` (the daemon's state directory) and what the point is about.
POINTS: dict[str, str] = {
    "spacesd.exec.recorded": "the start record of a key is fsynced in the ledger; its shim "
                             "is not spawned yet (info: key, epoch)",
    "spacesd.exec.spawned": "the shim is spawned; the start answer is not sent yet, and the "
                            "shim may not have claimed the key (info: key, epoch, shim_pid)",
    "spacesd.exec.exit_writing": "reported by the shim: the command exited and its exit "
                                 "record is fsynced in the temp file, not renamed into place "
                                 "(info: key)",
    "spacesd.checkpoint.objects": "checkpoint_create stored the objects; the manifest is not "
                                  "saved (info: id)",
    "spacesd.restore.partial": "checkpoint_restore removed what the checkpoint lacks; files "
                               "are not written back yet (info: id)",
    "spacesd.advance.persisted": "advance_epoch raised and persisted the floor; older "
                                 "processes are not killed yet (info: epoch, floor_before)",
}


def _connect(address: str) -> socket.socket:
    if address.startswith("unix:"):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            s.connect(address[5:])
        except OSError:
            s.close()
            raise
        return s
    if address.startswith("tcp:"):
        host, _, port = address[4:].rpartition(":")
        return socket.create_connection((host, int(port)))
    raise ValueError(
        f"failpoint channel {address!r} is not a channel; use unix:/path or tcp:127.0.0.1:PORT"
    )


class Channel:
    """The client end of the failpoint channel of one process, for one registry of points.

    ``address`` None or empty: off. ``points`` are the names this process may report
    (``registry`` names where they are listed, for the error about an unknown one);
    ``context`` is merged into every report's info. The connection is made at the first
    report, so a process that reaches no point never connects.
    """

    def __init__(self, address: str | None, points: Mapping[str, str], *, registry: str,
                 context: Mapping[str, Any] | None = None) -> None:
        self.address = address or None
        #: Read before every report: off, a failpoint costs this attribute read.
        self.enabled = self.address is not None
        self._points = points
        self._registry = registry
        self._context = dict(context or {})
        self._lock = threading.Lock()
        self._sock: socket.socket | None = None
        self._reader: Any = None
        self._counts: dict[str, int] = {}

    @property
    def context(self) -> dict[str, Any]:
        """What every report's info holds (a copy)."""
        return dict(self._context)

    def report(self, point: str, info: Mapping[str, Any]) -> None:
        """Report ``point`` with ``info`` and wait for the runner's answer (when on)."""
        if not self.enabled:
            return
        if point not in self._points:
            raise ValueError(f"unknown failpoint {point!r}; add it to {self._registry}")
        with self._lock:
            if not self.enabled:  # another thread found the channel broken meanwhile
                return  # type: ignore[unreachable]  # mypy cannot see the other thread
            try:
                if self._sock is None:
                    assert self.address is not None
                    self._sock = _connect(self.address)
                    self._reader = self._sock.makefile("r", encoding="utf-8")
                n = self._counts.get(point, 0) + 1
                self._counts[point] = n
                msg = {"point": point, "n": n, "pid": os.getpid(),
                       "info": {**self._context, **info}}
                self._sock.sendall((json.dumps(msg) + "\n").encode())
                if not self._reader.readline():
                    raise ConnectionError("the runner closed the failpoint channel")
            except OSError:
                self._off()

    def _off(self) -> None:
        """The channel broke: stop reporting, in this process, for good."""
        self.enabled = False
        if self._reader is not None:
            self._reader.close()
            self._reader = None
        if self._sock is not None:
            self._sock.close()
            self._sock = None
