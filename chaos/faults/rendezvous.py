"""The runner's end of the failpoint channel.

Drivers started with ``CUA_FAILPOINTS=unix:<path>`` connect here and report every failpoint
they reach, then wait for an answer. For each report the ``on_hit`` handler decides: return
``"continue"`` and the driver goes on; return ``"killed"`` after SIGKILLing the driver (the
handler owns the kill, since only it knows the process group) and the connection is simply
closed. The handler may also injure the Space before answering (kill its daemon, restart it).
A handler that raises is recorded in ``errors`` (never swallowed): the fault it was deciding
may not have happened, so the run cannot be called valid.

Hits are counted per rendezvous, across every process that connects, so a fault plan can say
"the 3rd time any driver of this run reaches ``space.running``" and mean it across crashes.
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal, Self

Answer = Literal["continue", "killed"]


@dataclass(frozen=True)
class Hit:
    point: str
    #: Occurrence of this point across the whole rendezvous (all drivers), from 1.
    occurrence: int
    pid: int
    info: dict[str, Any] = field(default_factory=dict)
    t: float = 0.0


class Rendezvous:
    """A unix-socket server for failpoint reports. Use as a context manager."""

    def __init__(self, path: str, on_hit: Callable[[Hit], Answer], *,
                 shared: bool = False) -> None:
        self.path = path
        #: Let other users reach the socket (a container's daemon runs as its own user):
        #: its directory becomes searchable and the socket writable by anyone on the host.
        self.shared = shared
        self.on_hit = on_hit
        self.hits: list[Hit] = []
        #: Errors raised by ``on_hit``: the fault it was deciding may not have happened.
        self.errors: list[str] = []
        self._counts: dict[str, int] = {}
        self._lock = threading.Lock()
        self._sock: socket.socket | None = None
        self._threads: list[threading.Thread] = []
        self._conns: list[socket.socket] = []
        self._closed = threading.Event()

    @property
    def address(self) -> str:
        return f"unix:{self.path}"

    def __enter__(self) -> Self:
        if os.path.exists(self.path):
            os.unlink(self.path)
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.bind(self.path)
        if self.shared:
            os.chmod(os.path.dirname(self.path) or ".", 0o711)
            os.chmod(self.path, 0o666)
        s.listen(16)
        self._sock = s
        t = threading.Thread(target=self._accept, name="rendezvous-accept", daemon=True)
        t.start()
        self._threads.append(t)
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._closed.set()
        if self._sock is not None:
            try:  # wakes the thread blocked in accept(); close() alone does not on Linux
                self._sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            self._sock.close()
            self._sock = None
        with self._lock:
            for c in self._conns:
                try:
                    c.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                c.close()
            self._conns.clear()
        for t in self._threads:
            t.join(timeout=5)
        if os.path.exists(self.path):
            os.unlink(self.path)

    def counts(self) -> dict[str, int]:
        """How often each point was reached so far, across every driver."""
        with self._lock:
            return dict(self._counts)

    def _accept(self) -> None:
        assert self._sock is not None
        sock = self._sock
        while not self._closed.is_set():
            try:
                conn, _ = sock.accept()
            except OSError:
                return
            with self._lock:
                self._conns.append(conn)
            t = threading.Thread(target=self._serve, args=(conn,), name="rendezvous-conn",
                                 daemon=True)
            t.start()
            self._threads.append(t)

    def _serve(self, conn: socket.socket) -> None:
        reader = conn.makefile("r", encoding="utf-8")
        try:
            for line in reader:
                raw = json.loads(line)
                with self._lock:
                    n = self._counts.get(raw["point"], 0) + 1
                    self._counts[raw["point"]] = n
                    hit = Hit(raw["point"], n, int(raw["pid"]), raw.get("info", {}), time.time())
                    self.hits.append(hit)
                try:
                    action = self.on_hit(hit)
                except Exception as exc:  # noqa: BLE001 - recorded: the runner reads errors
                    with self._lock:
                        self.errors.append(f"the fault handler failed at {hit.point}#"
                                           f"{hit.occurrence}: {type(exc).__name__}: {exc}")
                    return
                if action == "killed":
                    return
                conn.sendall(b"ok\n")
        except (OSError, ValueError):
            return
        finally:
            reader.close()
            with self._lock:
                if conn in self._conns:
                    self._conns.remove(conn)
            conn.close()
