"""The daemon's side of the shim launcher: one long-lived process that forks a shim per
command, and the wake-up pipe through which shims say they recorded an exit.

Why (see ``shim``): a fresh Python per command costs more than the command. The launcher
(``python3 -I -S shim.py --serve``) is started on the first command and again whenever it
is found dead; requests are serialized by the caller (the ledger starts keys under its
lock). It lives in a session of its own and ends when the daemon closes its channel, or
dies with it. Whatever happens to it, the claim and exit files stay the whole truth about a
key: a shim that never claimed its key reads as ``lost``, exactly as before.

``ExitWakeup``: shims write a byte to its pipe after each exit record; a waiter takes the
``generation`` before it looks at a key and ``wait``s for it to change, so an exit recorded
between its look and its wait is never missed. Shims of an earlier daemon cannot reach this
one: waiters keep a timeout, and look again when it passes.
"""

from __future__ import annotations

import contextlib
import os
import select
import socket
import threading

from .shim import CHANNEL_FD, RESET_SIGNALS, SHIM_PATH, WAKE_FD, encode_request


class LaunchFailed(OSError):
    """The launcher could not start a shim (the command did not run)."""


class ExitWakeup:
    """A pipe shims write to after an exit record, and a thread that turns it into a
    generation counter waiters can wait on."""

    def __init__(self) -> None:
        self._read, self.write_fd = os.pipe()
        self._stop_read, self._stop_write = os.pipe()
        self._changed = threading.Condition()
        self._generation = 0
        self._thread = threading.Thread(target=self._run, name="spacesd-exit-wakeup",
                                        daemon=True)
        self._thread.start()

    def _run(self) -> None:
        poller = select.poll()
        poller.register(self._read, select.POLLIN)
        poller.register(self._stop_read, select.POLLIN)
        while True:
            ready = {fd for fd, _ in poller.poll()}
            if self._stop_read in ready:
                return
            os.read(self._read, 4096)  # the daemon holds a write end: never at EOF
            with self._changed:
                self._generation += 1
                self._changed.notify_all()

    @property
    def generation(self) -> int:
        with self._changed:
            return self._generation

    def wait(self, since: int, timeout: float) -> None:
        """Until an exit is recorded after ``generation`` was ``since``, or ``timeout``."""
        with self._changed:
            self._changed.wait_for(lambda: self._generation != since, timeout)

    def close(self) -> None:
        os.write(self._stop_write, b".")
        self._thread.join()
        for fd in (self._read, self.write_fd, self._stop_read, self._stop_write):
            os.close(fd)


def _read_line(channel: socket.socket) -> bytes:
    """One answer line from the launcher (it writes one per request), or b"" at the end."""
    data = b""
    while not data.endswith(b"\n"):
        chunk = channel.recv(256)
        if not chunk:
            return b""
        data += chunk
    return data


class ShimLauncher:
    """Starts shims through the launcher process (``shim.serve``)."""

    def __init__(self, python: str, env: dict[str, str], wakeup: ExitWakeup) -> None:
        self._python = python
        self._env = env  # the commands' base environment: the Space's marker with it
        self._wakeup = wakeup
        self._channel: socket.socket | None = None
        self._pid: int | None = None

    def _start(self) -> socket.socket:
        ours, theirs = socket.socketpair()
        try:
            self._pid = os.posix_spawn(
                self._python, [self._python, "-I", "-S", SHIM_PATH, "--serve"], self._env,
                file_actions=[(os.POSIX_SPAWN_DUP2, theirs.fileno(), CHANNEL_FD),
                              (os.POSIX_SPAWN_DUP2, self._wakeup.write_fd, WAKE_FD)],
                setsid=True, setsigdef=RESET_SIGNALS, setsigmask=())
        finally:
            theirs.close()
        self._channel = ours
        return ours

    @property
    def pid(self) -> int | None:
        """The launcher's pid while one runs (the containment spares it: not a stray)."""
        return self._pid if self._channel is not None else None

    def spawn(self, argv: list[str], env: dict[str, str], out_path: str) -> int:
        """Fork a shim running ``shim._main(argv)`` with ``env``, its stdout and stderr
        appending to ``out_path``; its pid. A launcher found dead is started again once;
        raises ``LaunchFailed`` if no shim could be started."""
        request = encode_request(out_path, argv, env)
        for _ in range(2):
            channel = self._channel or self._start()
            try:
                channel.sendall(request)
                answer = _read_line(channel)
            except OSError:
                answer = b""
            if answer.startswith(b"!"):
                raise LaunchFailed(answer[1:].decode(errors="replace").strip())
            if answer.strip().isdigit():
                return int(answer)
            self.close()  # dead or garbled: a new launcher for the next attempt
        raise LaunchFailed("the shim launcher died twice while starting a command")

    def close(self) -> None:
        """Close the channel (the launcher then exits) and reap it if it is our child."""
        if self._channel is not None:
            self._channel.close()
            self._channel = None
        if self._pid is not None:
            with contextlib.suppress(ChildProcessError):  # SIGCHLD ignored: the kernel reaped
                os.waitpid(self._pid, 0)
            self._pid = None
