"""How a local Space's daemon process starts: ``python -m spacesd ... --daemonize`` spawned,
or forked by a ``spacesd.fork_server`` that a process starting many daemons owns (a
campaign: see that module for why).

A provider directory names its fork server in a marker file (``marker``), written by the
process that owns the server, so that every process making Spaces there (a campaign's
drivers and coordinators too) has their daemons forked by it. When no server answers there
(its owner ended, or never was), daemons are spawned: the two give the same daemon, serving
the same Space, and the same answer: the start's exit status.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import select
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

import spacesd.protocol
from durable.errors import SpaceUnavailable

#: Where ``python -m spacesd`` is importable from (the parent of the spacesd package).
SPACESD_PATH = str(Path(spacesd.protocol.__file__).resolve().parent.parent)
#: The variables of the creator's environment that a Space's daemon (and so its commands)
#: gets; everything else stays out (a driver's own failpoint channel among them).
KEPT_ENV = frozenset({"PATH", "HOME", "USER", "LOGNAME", "SHELL", "LANG", "LC_ALL",
                      "LC_CTYPE", "TZ", "TMPDIR", "TERM"})
#: ``CHAOS_FORK_DAEMONS=0``: a campaign spawns every daemon (to rule the server out).
FORK_ENV = "CHAOS_FORK_DAEMONS"
#: How long the server may take to listen (its imports) before its owner gives up on it.
SERVER_START_TIMEOUT_S = 60.0
#: The longest path a unix socket may have (``sun_path``: 108 bytes with its NUL).
SOCKET_PATH_MAX = 107


def _socket_dir() -> Path:
    """A new private directory for a server's socket: in the temp directory, or in /tmp
    when that one's path would make the socket's too long to bind (a deep ``TMPDIR``)."""
    for where in (None, "/tmp"):
        made = Path(tempfile.mkdtemp(prefix="spacesd-forks-", dir=where))
        if len(os.fsencode(made / "socket")) <= SOCKET_PATH_MAX:
            return made
        made.rmdir()
    raise OSError(f"no directory for the daemon fork server's socket: {made}/socket is over "
                  f"the {SOCKET_PATH_MAX} bytes a unix socket's path may have; set TMPDIR to "
                  "a shorter path")


def daemon_env() -> dict[str, str]:
    """The environment a daemon starts from: the kept part of this process's, and the path
    to spacesd."""
    env = {k: v for k, v in os.environ.items() if k in KEPT_ENV}
    env["PYTHONPATH"] = SPACESD_PATH
    return env


def marker(base_dir: Path) -> Path:
    """The file in a provider's directory that names the fork server its daemons come from."""
    return base_dir / ".daemon-fork-server"


def start(argv: list[str], *, env: dict[str, str], cwd: Path, log: Path, timeout: float,
          base_dir: Path, held: int | None = None) -> int:
    """Start ``python -m spacesd ARGV`` (``--daemonize`` among them) in a session of its own,
    in ``cwd`` with ``env``, its output appended to ``log``; returns once the daemon listens
    (0) or failed to start (not 0). Raises ``subprocess.TimeoutExpired`` after ``timeout``
    (the start is killed), ``SpaceUnavailable`` if a fork server failed it. ``held``: a
    descriptor of a lock the caller holds, which a fork server holds too until the start
    ended, should the caller die first."""
    with open(log, "ab") as out:
        server = ""
        if os.environ.get(FORK_ENV, "1") != "0":
            try:
                server = marker(base_dir).read_text()
            except FileNotFoundError:
                pass
        if server:
            fds = [out.fileno()] if held is None else [out.fileno(), held]
            code = _forked(server, argv, env=env, cwd=cwd, fds=fds, timeout=timeout)
            if code is not None:
                return code
        # --daemonize forks: this returns once the daemon listens (or failed to), and the
        # daemon itself is no child of ours (nothing to reap, ever).
        return subprocess.run([sys.executable, "-m", "spacesd", *argv],
                              stdin=subprocess.DEVNULL, stdout=out, stderr=out, env=env,
                              cwd=cwd, start_new_session=True, timeout=timeout).returncode


def _forked(server: str, argv: list[str], *, env: dict[str, str], cwd: Path, fds: list[int],
            timeout: float) -> int | None:
    """The start, by the fork server listening at ``server``; None when it took no request
    (none listens there: its owner ended), so that nothing started and spawning is safe."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as sock:
        sock.settimeout(timeout)
        request = json.dumps({"argv": argv, "env": env, "cwd": str(cwd)}).encode()
        try:
            sock.connect(server)
            socket.send_fds(sock, [request], fds)
        except (FileNotFoundError, ConnectionError):
            return None
        except TimeoutError:
            raise subprocess.TimeoutExpired(["spacesd.fork_server", *argv], timeout) from None
        try:
            answer = sock.recv(65536)
        except TimeoutError:
            # Here, not at the top: the server's module imports the whole daemon.
            from spacesd.fork_server import CANCEL

            with contextlib.suppress(OSError):  # the server kills the start, as run() would
                sock.send(CANCEL)
            raise subprocess.TimeoutExpired(["spacesd.fork_server", *argv], timeout) from None
        except ConnectionError:
            answer = b""
    if not answer:
        raise SpaceUnavailable(f"the daemon fork server at {server} ended during a start (the "
                               "daemon may be up: look again); its owner's stderr says why, "
                               f"or set {FORK_ENV}=0 to spawn daemons instead")
    message = json.loads(answer)
    if "error" in message:
        raise SpaceUnavailable(f"the daemon fork server at {server} refused a start: "
                               f"{message['error']}")
    return int(message["code"])


class ForkServer:
    """A ``spacesd.fork_server`` this process owns: ended by ``close``, or when this process
    ends (the pipe it watches closes with it)."""

    def __init__(self) -> None:
        self.dir = _socket_dir()
        self.socket = self.dir / "socket"
        owner_read, self._owner = os.pipe()
        ready_read, ready_write = os.pipe()
        try:
            self._proc = subprocess.Popen(
                [sys.executable, "-m", "spacesd.fork_server", str(self.socket),
                 str(owner_read), str(ready_write)],
                pass_fds=(owner_read, ready_write), env=daemon_env(), cwd="/",
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, start_new_session=True)
        except OSError:
            for fd in (ready_read, self._owner):
                os.close(fd)
            shutil.rmtree(self.dir, ignore_errors=True)
            raise
        finally:
            os.close(owner_read)
            os.close(ready_write)
        #: The server's pid.
        self.pid = self._proc.pid
        try:
            ready, _, _ = select.select([ready_read], [], [], SERVER_START_TIMEOUT_S)
            listening = bool(ready) and os.read(ready_read, 1) == b"1"
        finally:
            os.close(ready_read)
        if not listening:
            self.close()
            raise OSError(f"the daemon fork server did not start listening within "
                          f"{SERVER_START_TIMEOUT_S:.0f} s, or exited (its output is this "
                          f"process's stderr); set {FORK_ENV}=0 to spawn daemons instead")

    def serve(self, base_dir: Path) -> None:
        """Fork the daemons of every Space made under ``base_dir`` from now on, by any
        process, while this server lives."""
        base_dir.mkdir(parents=True, exist_ok=True)
        marker(base_dir).write_text(str(self.socket))

    def close(self) -> None:
        """End the server (the daemons it started live on); idempotent."""
        if self._owner >= 0:
            os.close(self._owner)
            self._owner = -1
        try:
            self._proc.wait(10)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()
        shutil.rmtree(self.dir, ignore_errors=True)


_server: ForkServer | None = None
_server_failed = False
_server_lock = threading.Lock()


def fork_server() -> ForkServer | None:
    """This process's fork server, started on first use and ended with the process; None
    when ``CHAOS_FORK_DAEMONS=0`` or when it could not start (said once on stderr)."""
    global _server, _server_failed
    if os.environ.get(FORK_ENV, "1") == "0":
        return None
    with _server_lock:
        if _server is None and not _server_failed:
            try:
                _server = ForkServer()
            except OSError as exc:  # the daemons are spawned: slower, and the same
                _server_failed = True
                print(f"warning: daemons are spawned, not forked: {exc}", file=sys.stderr)
                return None
            atexit.register(_server.close)
        return _server
