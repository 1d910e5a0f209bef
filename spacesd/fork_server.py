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
log's descriptor (``SCM_RIGHTS``), answered by one packet ``{"code": N}`` or ``{"error":
TEXT}``. A client that hangs up before its answer gets its start killed, as ``subprocess``
kills a child whose wait timed out. It writes ``1`` to ``READY_FD`` once it listens, and
exits when ``OWNER_FD`` (the read end of a pipe its owner holds) reaches its end: the
daemons it started live on, as spawned ones do.
"""

from __future__ import annotations

import json
import os
import select
import signal
import socket
import struct
import sys
import traceback
from typing import Any

from spacesd import __main__ as spacesd_main

#: Largest request packet (argv and environment).
MAX_REQUEST = 1 << 20
_PEERCRED = struct.Struct("3i")


def _become_daemon(request: dict[str, Any], log: int) -> None:
    """In the forked child: run ``python -m spacesd ARGV`` as the request says; never
    returns. ``--daemonize`` makes the child exit 0 once its own child (the daemon) serves."""
    code = 1
    try:
        os.setsid()
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(log, 1)
        os.dup2(log, 2)
        os.closerange(3, os.sysconf("SC_OPEN_MAX"))  # the server's socket, pipe and pidfds
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        sys.argv = ["spacesd", *request["argv"]]
        code = spacesd_main.main(request["argv"])
    except SystemExit as exc:  # what ``sys.exit`` in a fresh interpreter would give
        if exc.code is None or isinstance(exc.code, int):
            code = exc.code or 0
        else:
            print(exc.code, file=sys.stderr)
            code = 1
    except BaseException:  # noqa: BLE001 - a fresh interpreter prints it and exits 1
        traceback.print_exc()
        code = 1
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):
                pass
        os._exit(code if 0 <= code <= 255 else 1)


def _request(conn: socket.socket) -> tuple[dict[str, Any], int]:
    """The request of ``conn`` and its log's descriptor; ``ValueError`` saying what is wrong."""
    _pid, uid, _gid = _PEERCRED.unpack(
        conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _PEERCRED.size))
    data, fds, flags, _ = socket.recv_fds(conn, MAX_REQUEST, 1)
    if uid != os.getuid():
        for fd in fds:
            os.close(fd)
        raise ValueError(f"user {uid} may not start daemons here; this server serves user "
                         f"{os.getuid()} only")
    if len(fds) != 1 or flags & socket.MSG_TRUNC:
        for fd in fds:
            os.close(fd)
        raise ValueError("a request is one packet of at most "
                         f"{MAX_REQUEST} bytes that carries one descriptor (the log)")
    try:
        request = json.loads(data)
        if not (isinstance(request.get("argv"), list) and isinstance(request.get("env"), dict)
                and isinstance(request.get("cwd"), str)):
            raise ValueError("the request needs argv (a list), env (an object) and cwd")
        if "--daemonize" not in request["argv"]:
            raise ValueError("only --daemonize starts are served: the answer is the start's "
                             "outcome, not the daemon's end")
    except ValueError:
        os.close(fds[0])
        raise
    return request, fds[0]


def _answer(conn: socket.socket, message: dict[str, Any]) -> None:
    try:
        conn.send(json.dumps(message).encode())
    except OSError:
        pass  # the client is gone: nobody to tell
    conn.close()


def serve(path: str, owner: int, ready: int) -> None:
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    old = os.umask(0o177)
    try:
        listener.bind(path)
    finally:
        os.umask(old)
    listener.listen(64)
    os.write(ready, b"1")
    os.close(ready)
    poller = select.poll()
    poller.register(owner, select.POLLIN)
    poller.register(listener, select.POLLIN)
    waiting: dict[int, socket.socket] = {}  # fd -> a connection yet to send its request
    starts: dict[int, tuple[int, socket.socket]] = {}  # pidfd -> (pid, its client)
    clients: dict[int, int] = {}  # a client's fd, while it waits -> the pidfd of its start
    while True:
        for fd, _ in poller.poll():
            if fd == owner:  # the owner is done (or gone)
                listener.close()
                os.unlink(path)
                return
            if fd == listener.fileno():
                conn, _ = listener.accept()
                waiting[conn.fileno()] = conn
                poller.register(conn, select.POLLIN)
            elif fd in starts:
                pid, conn = starts.pop(fd)
                poller.unregister(fd)
                os.close(fd)
                _, status = os.waitpid(pid, 0)
                if clients.pop(conn.fileno(), None) is not None:
                    poller.unregister(conn)
                _answer(conn, {"code": os.waitstatus_to_exitcode(status)})
            elif fd in clients:  # it hung up before its answer: end its start
                pid = starts[clients.pop(fd)][0]
                os.kill(pid, signal.SIGKILL)  # reaped when its pidfd says so
                poller.unregister(fd)
            elif fd in waiting:
                conn = waiting.pop(fd)
                poller.unregister(fd)
                try:
                    request, log = _request(conn)
                except (OSError, ValueError) as exc:
                    _answer(conn, {"error": f"spacesd.fork_server: {exc}"})
                    continue
                sys.stdout.flush()
                sys.stderr.flush()
                try:
                    pid = os.fork()
                except OSError as exc:
                    os.close(log)
                    _answer(conn, {"error": f"spacesd.fork_server: cannot fork: {exc}"})
                    continue
                if pid == 0:
                    _become_daemon(request, log)
                os.close(log)
                pidfd = os.pidfd_open(pid)
                starts[pidfd] = (pid, conn)
                clients[conn.fileno()] = pidfd
                poller.register(pidfd, select.POLLIN)
                poller.register(conn, select.POLLIN)  # readable now means hung up


if __name__ == "__main__":
    serve(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]))
