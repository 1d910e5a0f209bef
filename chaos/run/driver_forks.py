"""The runner's side of ``chaos.run.driver_server``: drivers forked from a process that has
imported them, owned like spawned ones.

One server per campaign process, started with the first forked driver and ended with the
process (its drivers die with it; see the server's docstring). ``ForkedDriver`` is what
``OwnedProcess`` is for a spawned driver: the same ``poll``, ``wait``, ``kill_group`` and
``close``, with the exit code the server reports (a forked driver is the server's child, not
ours). Only the campaign's own driver program is forked (``forkable``); a ``--driver`` of
the user's, and coordinators, are spawned. ``CHAOS_FORK_DRIVERS=0`` spawns every driver
(to rule the server out when a run behaves oddly; the results must not differ).
"""

from __future__ import annotations

import atexit
import json
import os
import signal
import socket
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

from chaos.run.processes import Owned, python_argv

DRIVER_MODULE = "chaos.driver"
FORK_ENV = "CHAOS_FORK_DRIVERS"
#: How long a launch waits for the server's answer (its first one includes its imports).
LAUNCH_TIMEOUT_S = 60.0
#: How long ``close`` waits for the server's report of a killed driver's exit: a bound only a
#: wedged server reaches (it reaps its children as they die).
REAP_TIMEOUT_S = 120.0


def forkable(argv: list[str]) -> bool:
    """Whether ``argv`` runs the campaign's driver, which the server can fork."""
    return (argv[:3] == python_argv(DRIVER_MODULE)
            and os.environ.get(FORK_ENV, "1") != "0")


class ForkedDriver(Owned):
    """A driver forked by the server: a process group of its own, like a spawned one."""

    def __init__(self, pid: int, argv: list[str]) -> None:
        self.pid = pid
        self.argv = argv
        self.killed = False
        self._code: int | None = None
        self._ended = threading.Event()
        self._lock = threading.Lock()

    def exited(self, code: int) -> None:
        self._code = code
        self._ended.set()

    def poll(self) -> int | None:
        return self._code

    def wait(self, timeout: float | None = None) -> int:
        if not self._ended.wait(timeout):
            raise subprocess.TimeoutExpired(self.argv, timeout or 0.0)
        assert self._code is not None
        return self._code

    def close(self, grace: float = 3.0) -> None:
        self._end(grace)
        if not self._ended.wait(REAP_TIMEOUT_S):
            raise OSError(f"driver {self.pid} was killed, but the driver server did not "
                          f"report its exit within {REAP_TIMEOUT_S:.0f} s (the server's "
                          f"output is this process's stderr); set {FORK_ENV}=0 to spawn "
                          "drivers instead")


class DriverServer:
    """The server process, its channel, and the thread that reads the channel."""

    def __init__(self) -> None:
        ours, theirs = socket.socketpair()
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
        self._proc = subprocess.Popen(
            python_argv("chaos.run.driver_server", str(theirs.fileno())), env=env,
            pass_fds=(theirs.fileno(),), stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL, start_new_session=True)
        theirs.close()
        self._channel = ours
        self._lock = threading.Lock()
        self._next_id = 0
        self._answers: dict[int, tuple[threading.Event, list[ForkedDriver | str]]] = {}
        self._drivers: dict[int, ForkedDriver] = {}
        self._argv: dict[int, list[str]] = {}
        self._reader = threading.Thread(target=self._read, name="driver-server", daemon=True)
        self._reader.start()

    def launch(self, argv: list[str], env: dict[str, str], log: Path) -> ForkedDriver:
        """Fork a driver running ``argv`` (``python -m MODULE ARGS...``: ``main(ARGS)`` of
        the module) with ``env``, its output to ``log``; raises ``OSError`` if the server
        cannot."""
        if argv[1:2] != ["-m"] or len(argv) < 3:
            raise ValueError(f"the driver server runs python -m MODULE ...; not {argv[:3]}")
        done = threading.Event()
        answer: list[ForkedDriver | str] = []
        with self._lock:
            self._next_id += 1
            ident = self._next_id
            self._answers[ident] = (done, answer)
            self._argv[ident] = argv
            request = {"id": ident, "module": argv[2], "argv": argv[3:], "env": env,
                       "log": str(log)}
            try:
                self._channel.sendall((json.dumps(request) + "\n").encode())
            except OSError as exc:
                raise OSError(f"the driver server is gone ({exc}); set {FORK_ENV}=0 to "
                              "spawn drivers instead") from exc
        if not done.wait(LAUNCH_TIMEOUT_S) or not answer:
            raise OSError(f"the driver server did not answer within {LAUNCH_TIMEOUT_S:.0f} s "
                          f"(its output is this process's stderr); set {FORK_ENV}=0 to spawn "
                          "drivers instead")
        if isinstance(answer[0], str):
            raise OSError(answer[0])
        return answer[0]

    def _read(self) -> None:
        with self._channel.makefile("rb") as reader:
            self._read_from(reader)
        # The server is gone: its drivers died with it (they ask for SIGKILL at its death).
        with self._lock:
            orphans, self._drivers = list(self._drivers.values()), {}
            waiting, self._answers = list(self._answers.values()), {}
        for driver in orphans:
            driver.exited(-signal.SIGKILL)
        for done, _answer in waiting:
            done.set()

    def _read_from(self, reader: Any) -> None:
        for line in reader:
            message = json.loads(line)
            if "exited" in message:
                with self._lock:
                    driver = self._drivers.pop(message["exited"], None)
                if driver is not None:
                    driver.exited(message["code"])
                continue
            with self._lock:
                done, answer = self._answers.pop(message["id"])
                argv = self._argv.pop(message["id"])
                if "pid" in message:
                    driver = ForkedDriver(message["pid"], argv)
                    self._drivers[driver.pid] = driver
                    answer.append(driver)
                else:
                    answer.append(str(message["error"]))
            done.set()

    def close(self) -> None:
        """Close the channel: the server SIGKILLs what is left of its drivers and exits."""
        try:
            self._channel.shutdown(socket.SHUT_WR)  # the reader thread still reads it
        except OSError:
            pass
        try:
            self._proc.wait(10)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()
        self._reader.join(10)
        self._channel.close()


_server: DriverServer | None = None
_server_lock = threading.Lock()


def server() -> DriverServer:
    """This process's driver server, started on first use."""
    global _server
    with _server_lock:
        if _server is None:
            _server = DriverServer()
            atexit.register(_server.close)
        return _server
