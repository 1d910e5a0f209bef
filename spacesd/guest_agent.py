"""``python -m spacesd.guest_agent``: the host's hand inside a microVM Space.

A container's host reaches inside with ``docker exec``; a microVM's host has only what the
machine gives it. The agent answers one line at a time on a virtio-serial port (named
``cua.control``; only the host, through the QEMU character device it owns, is at the other
end) so the host can do to the guest what a campaign and a provider need, without going
through spacesd (which may be down, or the thing being injured):

    ping                 nothing: the host learns the channel is up (it pings first)
    time NS              set the guest's clock to the host's (unix time in ns): after a
                         boot (the RTC has whole seconds) and a restore (back in time)
    sync                 flush every filesystem (``sync(2)``): what a clean shutdown does
    kill-daemon          SIGKILL spacesd and wait for the supervisor's next one
    signal-daemon SIG    SIGSTOP (``STOP``) or SIGCONT (``CONT``) spacesd alone; answers
                         0 (signalled) or 1 (no daemon was running)
    signal-commands SIG  the same to every process of spacesd's commands, not spacesd;
                         answers 1 (no command was running), or 0 and the keys whose
                         shims it signalled
    kill PID             SIGKILL one process of the guest (by the pid the guest sees)
    fill-disk LEAVE      take every free block of the guest's one disk (its workspace's and
                         its daemon's) but LEAVE bytes, with a file of the agent's beside
                         the daemon's state (never in the workspace), fsynced: a disk that
                         fills up, which a power cut keeps full
    free-disk            remove that file: the disk has its room again
    state                the daemon's audit files (``protocol.is_audit_file``), as a
                         base64 tar on the answer line

Each request is ``<id> <command> [args]``; each answer ``<id> ok [data]`` or ``<id> error
<message>``. Standard library only: it is copied into the guest's disk.
"""

from __future__ import annotations

import base64
import contextlib
import errno
import io
import os
import signal
import sys
import tarfile
import time

from . import protocol
from .fsio import fsync_dir
from .supervisor import kill_daemon, signal_commands, signal_daemon

#: How long ``kill-daemon`` waits for the supervisor's next daemon.
KILL_DAEMON_WAIT_S = 150.0

PORT_NAME = "cua.control"
#: The filler of ``fill-disk``, beside the daemon's state directory.
FILLER_NAME = "cua-disk-filler"
#: ``fill-disk`` allocates in this many tries at most (each takes what the last left, and
#: a refused size is halved: the filesystem's own metadata takes blocks as the file grows).
FILL_TRIES = 64


def find_port(name: str = PORT_NAME, timeout: float = 30.0) -> str:
    """The device of the virtio-serial port called ``name`` (``/dev/vportNpM``)."""
    base = "/sys/class/virtio-ports"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for port in sorted(os.listdir(base)) if os.path.isdir(base) else []:
            try:
                with open(f"{base}/{port}/name") as f:
                    if f.read().strip() == name:
                        return f"/dev/{port}"
            except OSError:
                continue
        time.sleep(0.1)
    raise SystemExit(f"spacesd.guest_agent: no virtio-serial port named {name!r} within "
                     f"{timeout:.0f} s; start the guest with the port (backends.microvm)")


class Agent:
    def __init__(self, state_dir: str, pid_file: str) -> None:
        self.state_dir, self.pid_file = state_dir, pid_file

    def answer(self, line: str) -> str:
        """The answer line to one request line."""
        rid, _, rest = line.strip().partition(" ")
        command, _, arg = rest.partition(" ")
        try:
            data = self._do(command, arg.strip())
        except Exception as exc:  # noqa: BLE001 - every failure is an answer, never a crash
            return f"{rid} error {type(exc).__name__}: {exc}".replace("\n", " ")
        return f"{rid} ok{'' if not data else ' ' + data}"

    def _do(self, command: str, arg: str) -> str:
        if command == "ping":
            return ""
        if command == "time":
            time.clock_settime_ns(time.CLOCK_REALTIME, int(arg))
            return ""
        if command == "sync":
            os.sync()
            return ""
        if command == "kill-daemon":
            # Minutes, not seconds: a guest under TCG on a busy host took over 30 s to start
            # the next daemon; only a daemon that never comes back should reach this.
            code = kill_daemon(self.pid_file, timeout=KILL_DAEMON_WAIT_S)
            if code:
                raise RuntimeError(f"kill-daemon exited {code}")
            return ""
        if command == "kill":
            os.kill(int(arg), signal.SIGKILL)
            return ""
        if command == "signal-daemon":  # answers 0 (signalled) or 1 (no daemon running)
            return str(signal_daemon(self.pid_file, arg))
        if command == "signal-commands":  # answers 1 (no command running), or 0 and the
            keys = signal_commands(self.state_dir, self.pid_file, arg)  # keys signalled
            return "1" if keys is None else " ".join(["0", *keys])
        if command == "state":
            return self._state()
        if command == "fill-disk":
            return str(self._fill(int(arg)))
        if command == "free-disk":
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self._filler)
            fsync_dir(os.path.dirname(self._filler))  # freed for good, a power cut or not
            return ""
        raise ValueError(f"unknown command {command!r}; known: ping, time NS, sync, "
                         "kill-daemon, signal-daemon SIG, signal-commands SIG, kill PID, "
                         "fill-disk LEAVE, free-disk, state")

    @property
    def _filler(self) -> str:
        return os.path.join(os.path.dirname(os.path.abspath(self.state_dir)), FILLER_NAME)

    def _fill(self, leave: int) -> int:
        """Grow the filler until at most ``leave`` bytes (and less than a block more) are
        free for anyone, root included; the bytes left free."""
        directory = os.path.dirname(self._filler)
        fd = os.open(self._filler, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            size = os.fstat(fd).st_size
            for _ in range(FILL_TRIES):
                st = os.statvfs(directory)
                room = st.f_bfree * st.f_frsize - leave
                while room >= st.f_frsize:
                    try:
                        os.posix_fallocate(fd, size, room)
                        break
                    except OSError as exc:
                        if exc.errno != errno.ENOSPC:
                            raise
                        room //= 2
                    finally:  # a refused allocation may still have grown it
                        size = os.fstat(fd).st_size
                else:
                    break
            os.fsync(fd)
        finally:
            os.close(fd)
        fsync_dir(directory)
        st = os.statvfs(directory)
        return st.f_bfree * st.f_frsize

    def _state(self) -> str:
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w") as tar:
            for top, _dirs, files in os.walk(self.state_dir):
                for name in files:
                    path = os.path.join(top, name)
                    rel = os.path.relpath(path, self.state_dir)
                    if protocol.is_audit_file(rel):
                        try:
                            tar.add(path, arcname=rel)
                        except FileNotFoundError:
                            continue  # removed while we walked
        return base64.b64encode(buf.getvalue()).decode("ascii")


def serve(port: str, agent: Agent) -> None:
    """Answer requests on ``port`` forever. The port stays open: while no host end is
    connected a read finds nothing (end of file), and what a host sends once it connects
    is queued for it (closing the port in between would drop that)."""
    fd = os.open(port, os.O_RDWR)
    pending = b""
    while True:
        chunk = os.read(fd, 65536)
        if not chunk:
            time.sleep(0.05)
            continue
        pending += chunk
        while b"\n" in pending:
            line, pending = pending.split(b"\n", 1)
            out = memoryview(agent.answer(line.decode("utf-8", "replace")).encode() + b"\n")
            try:
                while out:  # a port takes a long answer in parts
                    out = out[os.write(fd, out):]
            except OSError:
                pass  # the host went away before the answer: it asks again


def main(argv: list[str] | None = None) -> int:
    import argparse

    p = argparse.ArgumentParser(prog="python -m spacesd.guest_agent", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--state", required=True, help="spacesd's state directory")
    p.add_argument("--pid-file", required=True, help="the supervisor's daemon pid file")
    p.add_argument("--port", default=None, help=f"the device (default: the port named "
                                                f"{PORT_NAME})")
    args = p.parse_args(argv)
    serve(args.port or find_port(), Agent(args.state, args.pid_file))
    return 0


if __name__ == "__main__":
    sys.exit(main())
