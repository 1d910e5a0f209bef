"""``python -m spacesd``: serve one workspace.

    python -m spacesd --root DIR --state DIR [--host 127.0.0.1] [--port 0]
                      (--token-file F | --token-env VAR) [--port-file F] [--pid-file F]
                      [--max-body BYTES] [--body-budget BYTES] [--max-requests N]
                      [--max-connections N] [--header-timeout SECONDS]
                      [--busy-wait SECONDS] [--daemonize] [--verbose]
                      [--containment {auto,cgroup,sandbox,subreaper}] [--cgroup-root DIR]

Once listening it writes the bound port to ``--port-file`` and ``<pid> <start time>`` to
``--pid-file`` (each atomically), so a supervisor can find it and tell it from a later
process that reuses its pid. ``--daemonize`` forks into a new session first: the caller's
process returns once the daemon listens (exit 0) or failed to start (exit 1), and the
daemon outlives it and is not killed with its group.
The token given by ``--token-env`` is removed from the environment, so the commands the
daemon runs never see it. So is ``CUA_FAILPOINTS``: when set, the daemon reports its
failpoints (``spacesd.failpoints.POINTS``) over that channel, and its commands never see it.

``--containment`` chooses how the processes of commands are tracked and killed, however they
detach (``spacesd.containment``); ``auto`` (the default) takes the strongest available and
logs its choice. An explicit choice that cannot work here refuses to start, with one line
naming what is missing. ``--cgroup-root``: where the Space's cgroup goes (default: the first
writable cgroup hierarchy).

One daemon per state directory: it holds an exclusive lock on ``<state>/daemon.lock`` for
its life (not inherited by commands), and a second daemon on the same state refuses to
start, naming the first one's pid: two would each run a key's command.

The umask is set to 022 at start-up, whoever started the daemon: the files and directories
commands create are 0644 and 0755 (unless they ask otherwise), the same in every Space.
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import signal
import sys

from . import procfs
from .containment import MODES, Unavailable, select
from .daemon import Daemon
from .epoch_fence import DamagedFloor
from .failpoints import ENV_VAR as FAILPOINTS_ENV
from .journal import DamagedJournal
from .protocol import DEFAULT_MAX_CONNECTIONS, DEFAULT_MAX_REQUESTS, STATE_DAEMON_LOCK
from .server import SpacesServer
from .space_identity import DamagedIdentity


def _args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="spacesd", description="The daemon inside a Space.")
    p.add_argument("--root", required=True, help="the workspace directory served")
    p.add_argument("--state", required=True, help="the daemon's own directory (outside root)")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=0, help="0 picks a free port")
    tok = p.add_mutually_exclusive_group(required=True)
    tok.add_argument("--token-file", help="file holding the bearer token")
    tok.add_argument("--token-env", help="environment variable holding the bearer token")
    p.add_argument("--port-file", help="where to write the bound port once listening")
    p.add_argument("--pid-file", help="where to write '<pid> <start time>' once listening")
    p.add_argument("--max-body", type=int, default=None, help="request body limit in bytes")
    p.add_argument("--body-budget", type=int, default=None,
                   help="bytes of JSON bodies held at once (default: 2 x the body limit)")
    p.add_argument("--max-requests", type=int, default=None,
                   help=f"requests handled at once (default: {DEFAULT_MAX_REQUESTS})")
    p.add_argument("--max-connections", type=int, default=None,
                   help=f"connections open at once (default: {DEFAULT_MAX_CONNECTIONS})")
    p.add_argument("--header-timeout", type=float, default=None,
                   help="seconds a connection has to send its request line and headers")
    p.add_argument("--busy-wait", type=float, default=None,
                   help="seconds a request waits for room before its 503")
    p.add_argument("--daemonize", action="store_true", help="fork into a new session")
    p.add_argument("--sync-exits", action="store_true",
                   help="flush the filesystems before a command's exit is recorded, so that "
                        "a recorded exit survives a power loss with the command's writes "
                        "(a Space that can lose power: a microVM)")
    p.add_argument("--verbose", action="store_true", help="log every request to stderr")
    p.add_argument("--containment", choices=MODES, default="auto",
                   help="how commands' processes are tracked and killed (default: auto)")
    p.add_argument("--cgroup-root", help="the cgroup under which the Space's cgroup goes")
    return p.parse_args(argv)


def _token(args: argparse.Namespace) -> str:
    if args.token_file:
        with open(args.token_file) as f:
            token = f.read().strip()
    else:
        token = os.environ.pop(args.token_env, "").strip()
    if not token:
        raise SystemExit("spacesd: the token is empty; give a non-empty token")
    return token


def _daemonize() -> int:
    """Fork into a new session. The parent exits once the daemon is listening (0) or has
    died trying (1), so a supervisor learns of a failed start at once; the daemon gets the
    write end of the pipe that tells it (close-on-exec: commands never inherit it)."""
    read_end, write_end = os.pipe()
    if os.fork():
        os.close(write_end)
        os._exit(0 if os.read(read_end, 1) == b"1" else 1)
    os.close(read_end)
    os.setsid()
    return write_end


def _lock_state(state: str) -> int:
    """Hold ``<state>/daemon.lock`` (see the module docstring); returns its descriptor,
    close-on-exec, kept open for the daemon's life."""
    os.makedirs(state, exist_ok=True)
    fd = os.open(os.path.join(state, STATE_DAEMON_LOCK), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC,
                 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 32, 0).decode("ascii", "replace").strip() or "unknown"
        raise SystemExit(f"spacesd: another daemon (pid {holder}) serves {state}, and two "
                         "would each run a command; stop that one first, or give this one "
                         "another --state") from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    return fd


def main(argv: list[str] | None = None) -> int:
    args = _args(argv)
    os.umask(0o022)
    token = _token(args)
    failpoints = os.environ.pop(FAILPOINTS_ENV, None)
    ready = _daemonize() if args.daemonize else None
    # Commands are reaped by their shims, and shims need no reaping by us: the exit status
    # travels through files. Ignoring SIGCHLD makes the kernel reap our children (and any
    # orphans when we run as PID 1 in a container), so no zombie ever lingers.
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)
    state = os.path.abspath(args.state)
    _lock_state(state)
    try:  # after the fork: a subreaper is one process, not its parent
        containment = select(args.containment, state, cgroup_root=args.cgroup_root)
    except Unavailable as exc:
        raise SystemExit(f"spacesd: {exc}") from None
    print(f"spacesd: containment: {json.dumps(containment.describe())}", file=sys.stderr,
          flush=True)
    try:
        daemon = Daemon(os.path.abspath(args.root), state, failpoints=failpoints,
                        containment=containment, sync_exits=args.sync_exits)
    except (DamagedFloor, DamagedJournal, DamagedIdentity) as exc:
        raise SystemExit(f"spacesd: damaged state: {exc}") from None
    limits = {"max_body": args.max_body, "body_budget": args.body_budget,
              "max_requests": args.max_requests, "max_connections": args.max_connections,
              "header_timeout": args.header_timeout, "busy_wait": args.busy_wait}
    kwargs = {k: v for k, v in limits.items() if v}
    server = SpacesServer((args.host, args.port), daemon, token, verbose=args.verbose, **kwargs)
    port = server.server_address[1]
    for path, text in ((args.port_file, f"{port}\n"),
                       (args.pid_file, f"{os.getpid()} {procfs.start_time(os.getpid())}\n")):
        if path:
            daemon.writer.write(os.path.abspath(path), [text.encode()], mode=0o644)
    print(f"spacesd: serving {daemon.workspace.root} on {args.host}:{port}", file=sys.stderr,
          flush=True)
    if ready is not None:
        os.write(ready, b"1")
        os.close(ready)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
        daemon.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
