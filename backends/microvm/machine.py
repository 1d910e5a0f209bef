"""One QEMU ``microvm`` guest: its command line, its start, and the two channels to it.

- QMP (``qmp.sock``): QEMU's own control, for resets, pauses and the migration streams that
  whole-machine checkpoints are (``machine_state``);
- the guest agent (``ctl.sock``, a virtio-serial port named ``cua.control``,
  ``spacesd.guest_agent``): sync, kill the daemon, kill a process, read the daemon's state.

QEMU runs daemonized (``-daemonize -pidfile``): it outlives the process that started it,
as a machine does, and is found again from its pid file (pid and start time, so a reused
pid is never taken for it). Networking is QEMU's user mode, restricted (the guest reaches
nothing), with one port of 127.0.0.1 forwarded to spacesd in the guest.
"""

from __future__ import annotations

import itertools
import json
import os
import shlex
import socket
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from durable.errors import SpaceUnavailable
from durable.record_codec import JsonRecord
from spacesd import procfs

from .artifacts import Artifacts

GUEST_PORT = 3211
def host_tsc_khz() -> int:
    """The host's TSC frequency (TCG hands the guest the host's TSC), from /proc/cpuinfo."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("cpu MHz"):
                return int(float(line.split(":")[1]) * 1000)
    except (OSError, ValueError, IndexError):
        pass
    return 2_000_000


@dataclass(frozen=True)
class MachineSpec(JsonRecord):
    memory_mb: int = 512
    vcpus: int = 1
    #: ``tcg`` or ``kvm``.
    accel: str = "tcg"


def qemu_argv(art: Artifacts, spec: MachineSpec, *, overlay: Path, sockets: Path, port: int,
              token: str, console: Path, pid_file: Path, incoming: Path | None = None,
              probe: bool = False) -> list[str]:
    """QEMU's command line; with ``incoming``, a machine that starts from that saved state
    (a zstd-compressed migration stream) instead of booting."""
    append = ["console=ttyS0", "root=/dev/vda", "rw", "quiet", "panic=-1", f"cua.token={token}"]
    if spec.accel == "tcg":
        # No PIT or HPET in microvm's reduced ACPI: under TCG the guest cannot measure its
        # TSC; it is told the frequency (the host's) and trusts the TSC as its clock.
        append += [f"tsc_early_khz={host_tsc_khz()}", "tsc=reliable"]
    if probe:
        append.append("cua.probe")
    argv = ["qemu-system-x86_64", "-M", "microvm,isa-serial=on,rtc=on", "-accel", spec.accel,
            "-cpu", "host" if spec.accel == "kvm" else "max", "-m", str(spec.memory_mb),
            "-smp", str(spec.vcpus), "-no-user-config", "-display", "none", "-monitor", "none",
            "-serial", f"file:{console}", "-kernel", str(art.kernel), "-initrd", str(art.initrd),
            "-append", " ".join(append)]
    if probe:
        return argv + ["-no-reboot"]
    return argv + [
        "-drive", f"id=d0,file={overlay},format=qcow2,if=none",
        "-device", "virtio-blk-device,drive=d0",
        "-netdev", f"user,id=n0,restrict=on,hostfwd=tcp:127.0.0.1:{port}-:{GUEST_PORT}",
        "-device", "virtio-net-device,netdev=n0",
        "-device", "virtio-serial-device",
        "-chardev", f"socket,id=ctl,path={sockets / 'ctl.sock'},server=on,wait=off",
        "-device", "virtserialport,chardev=ctl,name=cua.control",
        "-qmp", f"unix:{sockets / 'qmp.sock'},server=on,wait=off",
        "-daemonize", "-pidfile", str(pid_file),
        *(["-incoming", f"exec:zstd -dcq {shlex.quote(str(incoming))}"] if incoming else [])]


def start(argv: list[str]) -> None:
    """Start QEMU; it daemonizes once its devices are up (errors come before that)."""
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120,
                          stdin=subprocess.DEVNULL)
    if done.returncode != 0:
        raise SpaceUnavailable(f"qemu-system-x86_64 exited {done.returncode}: "
                               f"{done.stderr.strip()[-500:]}")


def read_pid(pid_file: Path) -> tuple[int, int] | None:
    """``(pid, start time)`` of a QEMU that is running now, from its pid file, else None."""
    try:
        pid = int(pid_file.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    started = procfs.start_time(pid)
    if started is None:
        return None
    recorded = pid_file.with_suffix(".start")
    try:
        if int(recorded.read_text()) != started:
            return None  # the pid was reused: not our QEMU
    except (OSError, ValueError):
        recorded.write_text(f"{started}\n")  # first look since QEMU wrote its pid file
    return pid, started


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class LineChannel:
    """Request/answer lines over a unix socket (one request at a time per channel)."""

    def __init__(self, path: Path, timeout: float) -> None:
        self.path, self.timeout = path, timeout
        self._lock = threading.Lock()

    def _connect(self) -> socket.socket:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(self.timeout)
        try:
            s.connect(str(self.path))
        except OSError as exc:
            s.close()
            raise SpaceUnavailable(f"cannot reach {self.path.name} of the microVM: {exc}") \
                from None
        return s


class QMP(LineChannel):
    """QEMU's machine protocol: one connection per command (QEMU takes one client)."""

    def command(self, name: str, /, **arguments: Any) -> Any:
        """Run one QMP command; its ``return``. A machine that goes away meanwhile (power
        cut, deleted) raises ``SpaceUnavailable``: whether the command took effect is
        unknown, as for any request to a Space that broke off."""
        try:
            with self._lock, self._connect() as s, s.makefile("rw", encoding="utf-8") as f:
                self._line(f, name)  # the greeting
                for cmd in ({"execute": "qmp_capabilities"},
                            {"execute": name, **({"arguments": arguments} if arguments else {})}):
                    f.write(json.dumps(cmd) + "\n")
                    f.flush()
                    while "event" in (reply := self._line(f, name)):
                        continue
                    if "error" in reply:
                        raise SpaceUnavailable(f"QMP {cmd['execute']}: {reply['error']}")
                return reply.get("return")
        except (OSError, ValueError) as exc:  # reset, cut short, or garbage mid-answer
            raise SpaceUnavailable(f"QMP {name}: the machine's channel broke ({exc!r}); "
                                   "whether it took effect is unknown") from exc

    @staticmethod
    def _line(f: Any, name: str) -> dict[str, Any]:
        line = f.readline()
        if not line:
            raise SpaceUnavailable(f"QMP {name}: QEMU closed the channel (the machine is "
                                   "gone or stopping)")
        reply: dict[str, Any] = json.loads(line)
        return reply

    def status(self) -> str:
        """The machine's run state: ``running``, ``paused``, ``postmigrate``, ``inmigrate``..."""
        return str(self.command("query-status")["status"])

    def migration(self, timeout: float) -> dict[str, Any]:
        """Wait until the machine's migration (out or in) ends; ``query-migrate``'s answer.
        A migration that failed, or did not end within ``timeout`` s, raises
        ``SpaceUnavailable``."""
        deadline = time.monotonic() + timeout
        while True:
            info: dict[str, Any] = self.command("query-migrate")
            if info.get("status") == "completed":
                return info
            if info.get("status") in ("failed", "cancelled"):
                raise SpaceUnavailable(f"the machine's state could not be moved: "
                                       f"{info.get('error-desc', info.get('status'))}")
            if time.monotonic() > deadline:
                raise SpaceUnavailable(f"the machine's state was not moved within "
                                       f"{timeout:.0f} s (migration {info.get('status')})")
            time.sleep(0.01)


class Agent(LineChannel):
    """The guest agent (``spacesd.guest_agent``)."""

    _ids = itertools.count(1)

    def call(self, command: str) -> str:
        """Send ``command`` and return the answer's data. A ping goes first, again every
        0.2 s until answered: the guest sees a new connection only after a moment, and what
        reaches it before then is lost (a ping is harmless twice; a command is not). A
        channel that breaks raises ``SpaceUnavailable``."""
        try:
            return self._call(command)
        except OSError as exc:
            raise SpaceUnavailable(f"the guest agent's channel broke during {command!r} "
                                   f"({exc!r}); whether it took effect is unknown") from exc

    def _call(self, command: str) -> str:
        with self._lock, self._connect() as s:
            reader = _Lines(s)
            deadline = time.monotonic() + self.timeout
            ping = self._id()
            while True:
                s.sendall(f"{ping} ping\n".encode())
                if reader.answer(ping, "ping", time.monotonic() + 0.2,
                                 missing_ok=True) is not None:
                    break
                if time.monotonic() > deadline:
                    raise SpaceUnavailable("the guest agent does not answer")
            rid = self._id()
            s.sendall(f"{rid} {command}\n".encode())
            answer = reader.answer(rid, command, deadline)
            assert answer is not None
            return answer

    def _id(self) -> str:
        return f"r{os.getpid()}-{next(self._ids)}"


class _Lines:
    """The answer lines of one connection to the guest agent."""

    def __init__(self, s: socket.socket) -> None:
        self.s, self.pending = s, b""

    def answer(self, rid: str, command: str, deadline: float, *,
               missing_ok: bool = False) -> str | None:
        """The data of the answer to ``rid``; None by ``deadline`` if ``missing_ok``."""
        while True:
            while b"\n" in self.pending:
                line, self.pending = self.pending.split(b"\n", 1)
                got_id, _, rest = line.decode("utf-8", "replace").partition(" ")
                if got_id != rid:
                    continue  # an earlier ping's answer, or a request whose client left
                status, _, payload = rest.partition(" ")
                if status != "ok":
                    raise SpaceUnavailable(f"the guest agent refused {command!r}: {payload}")
                return payload
            left = deadline - time.monotonic()
            if left <= 0:
                if missing_ok:
                    return None
                raise SpaceUnavailable(f"the guest agent did not answer {command!r}")
            self.s.settimeout(left)
            try:
                chunk = self.s.recv(1 << 20)
            except TimeoutError:
                continue
            if not chunk:
                raise SpaceUnavailable(f"the guest agent closed before answering {command!r}")
            self.pending += chunk
