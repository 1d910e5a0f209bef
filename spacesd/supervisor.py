"""``python -m spacesd.supervisor``: keep one spacesd running, as a Space's PID 1.

    python -m spacesd.supervisor run [--pid-file F] [--port-file F] -- SPACESD_ARGS...
    python -m spacesd.supervisor kill-daemon --pid-file F [--timeout S]
    python -m spacesd.supervisor signal-daemon --pid-file F --signal STOP|CONT
    python -m spacesd.supervisor signal-commands --state D --pid-file F --signal STOP|CONT

Why a supervisor: a Space has two different faults that must stay different. When only the
daemon dies (a crash, an OOM kill, the campaign's ``kill_daemon``), the commands it started
keep running and a new daemon must come back to reattach to them through the exec ledger.
When the whole machine restarts, everything is gone and only the disk is kept. Without a
supervisor the first fault would leave the Space without a daemon until someone restarts
the container, which turns it into the second.

``run`` starts ``python -m spacesd SPACESD_ARGS --pid-file F --port-file F`` as its child
and starts it again whenever it exits: at once after a daemon that ran for a while, with a
growing delay (up to ``--max-delay``) after one that keeps dying at start, so a broken
configuration logs one line a few seconds instead of spinning. Before each start the old pid
and port files are removed, so nobody finds a dead daemon's pid or port in them.

As PID 1 of a container it also does PID 1's two jobs: it reaps every orphan (the daemon's
shims are reparented to it when the daemon dies) and it ends on SIGTERM/SIGINT/SIGHUP by
passing the signal to the daemon and exiting once the daemon is gone (the kernel then kills
the rest of the container). It works the same outside a container (tests run it there),
where orphans go to the real init instead.

``kill-daemon`` is the fault ``kill_daemon`` in a Space: SIGKILL the daemon named by the
pid file (``<pid> <start time>``, checked against ``/proc`` so a reused pid is never hit),
then wait until the supervisor has started a new one that listens (a new pid file), and
print the new pid. Exit 0 when killed and back, 1 when no daemon was running (nothing
killed), 2 when the new daemon did not come up within ``--timeout``.

``signal-daemon`` freezes the daemon alone (``STOP``: its commands run on, its requests
wait in their sockets) or thaws it (``CONT``): the fault ``pause_daemon``. The same pid
check; exit 0 when signalled, 1 when no daemon was running.

``signal-commands`` is its mirror, the fault ``pause_commands``: every process of the
daemon's commands (its marker's, and their descendants; not the daemon, not its shim
launcher) frozen or thawed while the daemon answers. It prints the keys whose shim it
signalled, one per line (a campaign then knows which commands were alive, held, whatever
the daemon says of them). Exit 0 when one was signalled, 1 when no command runs.

Standard library only, and nothing outside ``spacesd``: it is copied into Space images.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from types import FrameType

from . import exec_files, journal, procfs
from .exec_ledger import replay
from .protocol import ENV_SPACE_STATE, STATE_EXEC_DIR, STATE_LEDGER

#: A daemon that ran at least this long before dying is restarted at once.
MIN_UPTIME_S = 2.0


def _log(message: str) -> None:
    print(f"spacesd.supervisor[{os.getpid()}]: {message}", file=sys.stderr, flush=True)


def _read_pid_file(path: str) -> tuple[int, int] | None:
    """``(pid, start time)`` from ``path``, or None if it is missing or unreadable."""
    try:
        with open(path) as f:
            pid, started = map(int, f.read().split())
    except (FileNotFoundError, ValueError):
        return None
    return pid, started


# ------------------------------------------------------------------ run


class _Stop(Exception):
    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


class Supervisor:
    """Runs ``argv`` (a spacesd command line) and starts it again whenever it exits."""

    def __init__(self, argv: list[str], *, stale_files: list[str], min_uptime: float,
                 max_delay: float) -> None:
        self.argv = argv
        self.stale_files = stale_files
        self.min_uptime = min_uptime
        self.max_delay = max_delay
        self.child: int | None = None

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        raise _Stop(signum)

    def _spawn(self) -> int:
        for path in self.stale_files:
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass
        pid = os.fork()
        if pid == 0:  # the child: default signals, its own process group, then spacesd
            try:
                for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
                    signal.signal(sig, signal.SIG_DFL)
                os.setpgid(0, 0)
                os.execv(sys.executable, [sys.executable, "-m", "spacesd", *self.argv])
            finally:
                os._exit(127)
        return pid

    def _reap_until(self, child: int) -> int:
        """Reap every child (orphans included) until ``child`` exits; its wait status."""
        while True:
            pid, status = os.waitpid(-1, 0)
            if pid == child:
                return status

    def _reap_orphans(self) -> None:
        while True:
            try:
                pid, _ = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return

    def run(self) -> int:
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(sig, self._on_signal)
        delay = 0.0
        try:
            while True:
                started = time.monotonic()
                self.child = self._spawn()
                _log(f"started spacesd (pid {self.child})")
                status = self._reap_until(self.child)
                self.child = None
                uptime = time.monotonic() - started
                if os.WIFSIGNALED(status):
                    how = f"was killed by signal {os.WTERMSIG(status)}"
                else:
                    how = f"exited with status {os.waitstatus_to_exitcode(status)}"
                delay = 0.0 if uptime >= self.min_uptime else min(self.max_delay,
                                                                  max(0.1, delay * 2))
                _log(f"spacesd {how} after {uptime:.1f}s; starting it again"
                     + (f" in {delay:.1f}s" if delay else ""))
                end = time.monotonic() + delay
                while (left := end - time.monotonic()) > 0:
                    self._reap_orphans()
                    time.sleep(min(left, 0.1))
        except _Stop as stop:
            return self._stop(stop.signum)

    def _stop(self, signum: int) -> int:
        """Pass ``signum`` on to the daemon and wait (5 s, then SIGKILL) for it to end."""
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(sig, signal.SIG_IGN)
        child = self.child
        try:  # the signal may have come just after the daemon was reaped
            running = child is not None and os.waitpid(child, os.WNOHANG)[0] == 0
        except ChildProcessError:
            running = False
        if running:
            assert child is not None
            os.kill(child, signum)
            deadline = time.monotonic() + 5.0
            while time.monotonic() < deadline:
                try:
                    pid, _ = os.waitpid(child, os.WNOHANG)
                except ChildProcessError:
                    break
                if pid:
                    break
                time.sleep(0.05)
            else:
                os.kill(child, signal.SIGKILL)
                os.waitpid(child, 0)
        _log(f"stopped by signal {signum}")
        return 0


# ------------------------------------------------------------------ kill-daemon


def kill_daemon(pid_file: str, *, timeout: float) -> int:
    """SIGKILL the daemon named by ``pid_file`` and wait for its successor (see the module
    docstring for the exit codes)."""
    old = _read_pid_file(pid_file)
    if old is None or not procfs.is_alive(*old):
        print(f"kill-daemon: no running daemon in {pid_file}", file=sys.stderr)
        return 1
    try:
        os.kill(old[0], signal.SIGKILL)
    except ProcessLookupError:
        pass
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        new = _read_pid_file(pid_file)
        if new is not None and new != old and procfs.is_alive(*new):
            print(new[0])
            return 0
        time.sleep(0.02)
    print(f"kill-daemon: killed {old[0]}, but no new daemon listened within {timeout}s",
          file=sys.stderr)
    return 2


#: The signals ``signal-daemon`` sends.
DAEMON_SIGNALS = {"STOP": signal.SIGSTOP, "CONT": signal.SIGCONT}


def signal_daemon(pid_file: str, name: str) -> int:
    """Send ``name`` (``DAEMON_SIGNALS``) to the daemon named by ``pid_file`` (see the
    module docstring for the exit codes)."""
    if name not in DAEMON_SIGNALS:
        raise ValueError(f"signal-daemon sends {' or '.join(DAEMON_SIGNALS)}, not {name!r}")
    daemon = _read_pid_file(pid_file)
    if daemon is None or not procfs.is_alive(*daemon):
        print(f"signal-daemon: no running daemon in {pid_file}", file=sys.stderr)
        return 1
    try:
        os.kill(daemon[0], DAEMON_SIGNALS[name])
    except ProcessLookupError:
        return 1
    return 0


def _reads(path: str) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError:  # gone, or not ours to read
        return b""


def command_processes(state_dir: str, pid_file: str) -> set[int]:
    """The processes of the commands the daemon of ``state_dir`` started: every process
    that carries its marker (``SPACESD_STATE``, which its shims and commands inherit) and
    their descendants, but not the daemon itself nor its shim launcher (a command's own
    shim is one of them: its command's output stops with it)."""
    marker = f"{ENV_SPACE_STATE}={os.path.realpath(state_dir)}".encode()
    daemon = _read_pid_file(pid_file)
    table = procfs.snapshot()
    kids: dict[int, list[int]] = {}
    for proc in table.values():
        kids.setdefault(proc.ppid, []).append(proc.pid)
    found = {pid for pid in table
             if marker in _reads(f"/proc/{pid}/environ").split(b"\0")}
    todo = list(found)
    while todo:
        for kid in kids.get(todo.pop(), []):
            if kid not in found:
                found.add(kid)
                todo.append(kid)
    spared = {os.getpid()}
    if daemon is not None:
        spared.add(daemon[0])
        spared.update(pid for pid in kids.get(daemon[0], [])
                      if b"--serve" in _reads(f"/proc/{pid}/cmdline").split(b"\0"))
    return found - spared


def signal_commands(state_dir: str, pid_file: str, name: str) -> list[str] | None:
    """Send ``name`` (``DAEMON_SIGNALS``) to every process of the daemon's commands
    (``command_processes``), twice over for what forked meanwhile: the fault
    ``pause_commands``. Returns the keys whose shim (the claimed process) was signalled,
    or None when no process was."""
    if name not in DAEMON_SIGNALS:
        raise ValueError(f"signal-commands sends {' or '.join(DAEMON_SIGNALS)}, not {name!r}")
    signalled: dict[int, int] = {}
    for _ in range(2):
        for pid in command_processes(state_dir, pid_file) - signalled.keys():
            started = procfs.start_time(pid)
            try:
                os.kill(pid, DAEMON_SIGNALS[name])
            except ProcessLookupError:
                continue
            if started is not None:
                signalled[pid] = started
    if not signalled:
        return None
    return _claimed_by(state_dir, signalled)


def _claimed_by(state_dir: str, processes: dict[int, int]) -> list[str]:
    """The ledger's keys whose claim names one of ``processes`` (pid: start time)."""
    exec_dir = os.path.join(state_dir, STATE_EXEC_DIR)
    records = replay(journal.load(os.path.join(state_dir, STATE_LEDGER)).records)
    keys = []
    for rec in records.values():
        claim = exec_files.read_claim(rec.file(exec_dir, ".claim"))
        if isinstance(claim, exec_files.Claim) and processes.get(claim.pid) == claim.started:
            keys.append(rec.key)
    return keys


# ------------------------------------------------------------------ CLI


def _args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m spacesd.supervisor", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run spacesd and start it again whenever it exits")
    run.add_argument("--pid-file", help="passed to spacesd; removed before each start")
    run.add_argument("--port-file", help="passed to spacesd; removed before each start")
    run.add_argument("--min-uptime", type=float, default=MIN_UPTIME_S,
                     help="a daemon that died sooner is restarted after a growing delay")
    run.add_argument("--max-delay", type=float, default=5.0,
                     help="the longest delay between two starts")
    run.add_argument("spacesd_args", nargs=argparse.REMAINDER,
                     help="-- then the arguments of python -m spacesd")
    kill = sub.add_parser("kill-daemon", help="SIGKILL the daemon; wait for the next one")
    kill.add_argument("--pid-file", required=True)
    kill.add_argument("--timeout", type=float, default=30.0)
    sig = sub.add_parser("signal-daemon", help="SIGSTOP or SIGCONT the daemon alone")
    sig.add_argument("--pid-file", required=True)
    sig.add_argument("--signal", required=True, choices=tuple(DAEMON_SIGNALS))
    cmds = sub.add_parser("signal-commands",
                          help="SIGSTOP or SIGCONT the daemon's commands, not the daemon")
    cmds.add_argument("--state", required=True, help="the daemon's state directory")
    cmds.add_argument("--pid-file", required=True)
    cmds.add_argument("--signal", required=True, choices=tuple(DAEMON_SIGNALS))
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = _args(argv)
    if args.command == "kill-daemon":
        return kill_daemon(args.pid_file, timeout=args.timeout)
    if args.command == "signal-daemon":
        return signal_daemon(args.pid_file, args.signal)
    if args.command == "signal-commands":
        keys = signal_commands(args.state, args.pid_file, args.signal)
        print("".join(f"{key}\n" for key in keys or ()), end="", flush=True)
        return 1 if keys is None else 0
    spacesd_args = list(args.spacesd_args)
    if spacesd_args[:1] == ["--"]:
        spacesd_args = spacesd_args[1:]
    if "--daemonize" in spacesd_args:
        raise SystemExit("spacesd.supervisor: do not pass --daemonize; the supervisor "
                         "must stay the daemon's parent to see it die")
    stale = []
    for flag, path in (("--pid-file", args.pid_file), ("--port-file", args.port_file)):
        if path:
            spacesd_args += [flag, path]
            stale.append(path)
    return Supervisor(spacesd_args, stale_files=stale, min_uptime=args.min_uptime,
                      max_delay=args.max_delay).run()


if __name__ == "__main__":
    sys.exit(main())
