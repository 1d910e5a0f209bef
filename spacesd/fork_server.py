"""``python -m spacesd.fork_server SOCKET OWNER_FD READY_FD``: daemons forked from a process
that has imported spacesd, for a host that starts many of them (a local crash campaign).

Why: ``python -m spacesd`` spends about 100 ms starting an interpreter and importing the
daemon (``http.server`` alone a fifth of it) before it serves, and a campaign starts one
for every Space it makes, restarts or rebuilds: a quarter of a local campaign's time. This
server imports spacesd once; each daemon is a fork of it that runs ``spacesd.__main__.main``
from the beginning, as ``python -m spacesd ARGS`` would, in the session, directory and
environment the request names, its output to the log it passes. Only ``--daemonize``
starts are served, and the answer is what that start's exit status would be: 0 once the
daemon listens, 1 if it could not start (its log says why).

What differs from a spawned daemon: its command line and its first environment in
``/proc`` are the server's. So the host finds a daemon by the lock it holds on its state
(``<state>/daemon.lock``, which spacesd holds for its whole life and names its pid in), not
by its command line (``backends.local.procs``); its commands are spawned with the
environment it was given, as before.

Protocol, over the unix ``SOCK_SEQPACKET`` socket ``SOCKET`` (made 0600; only the server's
own user is served): one packet ``{"argv": [...], "env": {...}, "cwd": DIR}`` carrying the
log's descriptor (``SCM_RIGHTS``) and, if the client holds the Space's lock while it starts
the daemon, that lock's (the server holds it until the start ended, so that the client's
death frees it only then), answered by one packet ``{"code": N}`` or ``{"error": TEXT}``.
A waiting client whose own timeout passed sends ``cancel``: its start is killed, as
``subprocess.run`` kills a child whose wait timed out; one that merely hangs up (killed, as
a campaign kills drivers) leaves its start to finish, as a spawned daemon would. The server
writes ``1`` to ``READY_FD`` once it listens, and exits when ``OWNER_FD`` (the read end of a
pipe its owner holds) reaches its end, removing its socket: the daemons it started live on,
as spawned ones do.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import socket
import struct
import sys
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NoReturn

from spacesd import __main__ as spacesd_main
from spacesd.forked_main import exit_as_main

#: Largest request packet (argv and environment).
MAX_REQUEST = 1 << 20
#: What a waiting client sends when its own timeout passed: its start is killed.
CANCEL = b"cancel"
#: How long a poll waits at most while a start without a pidfd runs (then it is looked at).
UNWATCHED_POLL_MS = 20
_PEERCRED = struct.Struct("3i")


def _become_daemon(request: dict[str, Any], log: int) -> NoReturn:
    """In the forked child: run ``python -m spacesd ARGV`` as the request says; never
    returns. ``--daemonize`` makes the child exit 0 once its own child (the daemon) serves."""

    def main() -> int:
        os.setsid()
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(log, 1)
        os.dup2(log, 2)
        os.closerange(3, os.sysconf("SC_OPEN_MAX"))  # the server's socket, pipe and pidfds
        os.chdir(request["cwd"])
        sys.path[0] = os.getcwd()  # what ``python -m`` run there has first on its path
        os.environ.clear()
        os.environ.update(request["env"])
        sys.argv = ["spacesd", *request["argv"]]
        return spacesd_main.main(request["argv"])

    exit_as_main(main)


def _request(conn: socket.socket) -> tuple[dict[str, Any], int, int | None]:
    """The request of ``conn``, its log's descriptor and the lock it hands over, if any;
    ``ValueError`` saying what is wrong."""
    _pid, uid, _gid = _PEERCRED.unpack(
        conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _PEERCRED.size))
    data, fds, flags, _ = socket.recv_fds(conn, MAX_REQUEST, 2)
    try:
        if uid != os.getuid():
            raise ValueError(f"user {uid} may not start daemons here; this server serves "
                             f"user {os.getuid()} only")
        if not 1 <= len(fds) <= 2 or flags & (socket.MSG_TRUNC | socket.MSG_CTRUNC):
            raise ValueError(f"a request is one packet of at most {MAX_REQUEST} bytes that "
                             "carries the log's descriptor, and a held lock's if any")
        request = json.loads(data)
        if not (isinstance(request, dict) and isinstance(request.get("argv"), list)
                and all(isinstance(a, str) for a in request["argv"])
                and isinstance(request.get("env"), dict)
                and isinstance(request.get("cwd"), str)):
            raise ValueError("a request is a JSON object with argv (strings), env (an object) "
                             "and cwd (a directory)")
        if "--daemonize" not in request["argv"]:
            raise ValueError("only --daemonize starts are served: the answer is the start's "
                             "outcome, not the daemon's end")
    except ValueError:
        for fd in fds:
            os.close(fd)
        raise
    return request, fds[0], fds[1] if len(fds) == 2 else None


def _answer(conn: socket.socket, message: dict[str, Any]) -> None:
    try:
        conn.send(json.dumps(message).encode())
    except OSError:
        pass  # the client is gone: nobody to tell
    conn.close()


@dataclass
class _Start:
    """A start under way: the forked child (whose exit is the answer) and its client."""

    pid: int
    #: Its pidfd, -1 when none could be opened (``_Loop.unwatched``).
    pidfd: int
    conn: socket.socket
    #: The lock the client handed over, held until the start ended (``-1``: none).
    held: int
    #: Whether the client's connection is still watched (for a cancel, or its hang-up).
    watched: bool = True


class _Loop:
    """One thread, no blocking call but ``poll``: every start is a child watched through its
    pidfd (or, when none could be opened, looked at after each poll, which then waits at
    most ``UNWATCHED_POLL_MS``), every client through its connection. A descriptor dropped
    while a batch of events is handled has its later events in that batch ignored: its
    number may already belong to a new connection or child."""

    def __init__(self, path: str, listener: socket.socket, owner: int) -> None:
        self.path = path
        self.listener = listener
        self.poller = select.poll()
        self.handlers: dict[int, Callable[[], None]] = {}
        self.dropped: set[int] = set()
        #: Starts no pidfd could be opened for: looked at after every poll.
        self.unwatched: list[_Start] = []
        self.done = False
        self._watch(owner, self._owner_ended)
        self._watch(listener.fileno(), self._accept)

    def _watch(self, fd: int, handler: Callable[[], None]) -> None:
        self.handlers[fd] = handler
        self.poller.register(fd, select.POLLIN)

    def _drop(self, fd: int) -> None:
        del self.handlers[fd]
        self.poller.unregister(fd)
        self.dropped.add(fd)

    def run(self) -> None:
        while not self.done:
            self.dropped = set()
            for fd, _ in self.poller.poll(UNWATCHED_POLL_MS if self.unwatched else None):
                handler = self.handlers.get(fd)
                if handler is None or fd in self.dropped:
                    continue
                try:
                    handler()
                except Exception:  # noqa: BLE001 - one start's trouble never ends the server
                    traceback.print_exc()
            if self.unwatched:
                self._look_at_unwatched()

    def _owner_ended(self) -> None:
        """The owner is done (or gone): no new start; the daemons started live on."""
        self.listener.close()
        with contextlib.suppress(OSError):
            os.unlink(self.path)
            os.rmdir(os.path.dirname(self.path))  # its owner's temp directory, if now empty
        self.done = True

    def _accept(self) -> None:
        conn, _ = self.listener.accept()
        self._watch(conn.fileno(), lambda: self._requested(conn))

    def _requested(self, conn: socket.socket) -> None:
        self._drop(conn.fileno())
        try:
            request, log, held = _request(conn)
        except (OSError, ValueError) as exc:
            _answer(conn, {"error": f"spacesd.fork_server: {exc}"})
            return
        sys.stdout.flush()
        sys.stderr.flush()
        try:
            pid = os.fork()
        except OSError as exc:
            for fd in (log, held):
                if fd is not None:
                    os.close(fd)
            _answer(conn, {"error": f"spacesd.fork_server: cannot fork: {exc}"})
            return
        if pid == 0:
            _become_daemon(request, log)  # the held lock closed there, with the rest
        os.close(log)
        try:
            pidfd = os.pidfd_open(pid)
        except OSError:  # no descriptor for it (the server's limit, no memory): looked at
            pidfd = -1   # after each poll, which then waits at most UNWATCHED_POLL_MS
        start = _Start(pid, pidfd, conn, -1 if held is None else held)
        if pidfd < 0:
            self.unwatched.append(start)
        else:
            self._watch(start.pidfd, lambda: self._ended(start))
        self._watch(conn.fileno(), lambda: self._client_spoke(start))

    def _client_spoke(self, start: _Start) -> None:
        """A waiting client spoke: ``cancel`` (its own timeout: end the start, as
        ``subprocess.run`` kills a child whose wait timed out) or a hang-up (it was killed:
        the start goes on, as a spawned one would)."""
        start.watched = False
        self._drop(start.conn.fileno())
        try:
            said = start.conn.recv(64)
        except OSError:
            said = b""
        if said == CANCEL:
            os.kill(start.pid, signal.SIGKILL)  # reaped when its pidfd says so

    def _ended(self, start: _Start) -> None:
        self._drop(start.pidfd)
        os.close(start.pidfd)
        status = os.waitpid(start.pid, 0)[1]
        self._answer_end(start, {"code": os.waitstatus_to_exitcode(status)})

    def _look_at_unwatched(self) -> None:
        for start in list(self.unwatched):
            try:
                pid, status = os.waitpid(start.pid, os.WNOHANG)
            except ChildProcessError:  # gone without a status: its outcome is unknown
                self.unwatched.remove(start)
                self._answer_end(start, {"error": f"spacesd.fork_server: start {start.pid} "
                                                  "ended unseen; its outcome is unknown"})
                continue
            if pid:
                self.unwatched.remove(start)
                self._answer_end(start, {"code": os.waitstatus_to_exitcode(status)})

    def _answer_end(self, start: _Start, answer: dict[str, Any]) -> None:
        if start.held >= 0:
            os.close(start.held)
        if start.watched:
            self._drop(start.conn.fileno())
        _answer(start.conn, answer)


def serve(path: str, owner: int, ready: int) -> None:
    try:  # each start is watched through its pidfd: refuse to serve where there are none
        os.close(os.pidfd_open(os.getpid()))
    except OSError as exc:
        raise SystemExit(f"spacesd.fork_server: no pidfd here ({exc}); daemons are spawned "
                         "instead") from None
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    old = os.umask(0o177)
    try:
        listener.bind(path)
    finally:
        os.umask(old)
    listener.listen(64)
    os.write(ready, b"1")
    os.close(ready)
    _Loop(path, listener, owner).run()


if __name__ == "__main__":
    serve(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]))
