"""``MicroVMSpaces``: Spaces that are QEMU ``microvm`` guests running spacesd.

``<base_dir>/<name>/`` holds the Space: its qcow2 overlay on the base disk, token, forwarded
port, QEMU's pid file, console log and ``machine.json`` (memory, vCPUs, accelerator, the
artifacts it boots); ``save_machine`` and ``load_machine`` save its whole state into a
directory and start it from one (``machine_state``). The sockets
(QMP, the guest agent) live in a short private directory of their own (a unix socket path
has at most 107 bytes), named by a hash of the Space's directory. Nothing lives in memory:
any process finds a Space by name; Spaces outlive the process that made them.

Faults a microVM can have that a container cannot: ``power_off`` (SIGKILL of QEMU: the
guest's unsynced writes are lost; ``create`` boots it again) beside ``restart`` (a clean
reboot: a sync through the guest agent, then a reset; processes gone, every write kept).
The guest's daemon runs with ``--sync-exits``, so a recorded exit survives a power loss
with the command's writes. The daemon's own failpoints are not reported from inside a guest (no
channel crosses the machine's boundary); the driver's are.

The accelerator: ``auto`` probes once per host (cached beside the artifacts) whether KVM
boots a guest here, and falls back to TCG; ``kvm`` or ``tcg`` choose.
"""

from __future__ import annotations

import base64
import fcntl
import hashlib
import io
import json
import os
import re
import secrets
import shlex
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from backends.descriptor import DiskName
from backends.space_client import (
    REQUEST_TIMEOUT_S,
    Endpoint,
    HttpSpaceClient,
    Resolver,
    Via,
    routed,
)
from durable.errors import SpaceError, SpaceNotFound, SpaceUnavailable
from spacesd import procfs
from spacesd.guest_agent import KILL_DAEMON_WAIT_S

from . import machine_state
from .artifacts import Artifacts, cache_dir, ensure
from .machine import QMP, Agent, MachineSpec, free_port, qemu_argv, read_pid, start

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}")
BOOT_TIMEOUT_S = 180.0
#: How long a machine started from a saved state may take to serve before it is started from
#: that state once more (a load serves within seconds; rarely, under TCG, one never did).
LOAD_SERVE_S = 60.0
ACCELS = ("auto", "kvm", "tcg")


class NotServing(SpaceUnavailable):
    """A machine that runs but whose daemon did not serve in time."""


class MicroVMSpaces:
    kind = "microvm"

    def __init__(self, base_dir: str | os.PathLike[str], *, memory_mb: int = 512,
                 vcpus: int = 1, accel: str = "auto", failpoints: str | None = None,
                 request_timeout: float = REQUEST_TIMEOUT_S, via: Via | None = None) -> None:
        if accel not in ACCELS:
            raise ValueError(f"accel must be one of {ACCELS}, got {accel!r}")
        if not 128 <= memory_mb <= 65536 or not 1 <= vcpus <= 64:
            raise ValueError(f"memory_mb is from 128 to 65536 and vcpus from 1 to 64, got "
                             f"{memory_mb} and {vcpus}")
        self.base_dir = Path(base_dir).resolve()
        self.base_dir.mkdir(parents=True, exist_ok=True)
        self.memory_mb, self.vcpus, self.accel = memory_mb, vcpus, accel
        #: Accepted for the campaign's providers' signature: a guest's daemon cannot
        #: report to a channel on the host (see the module docstring).
        self.failpoints = failpoints
        #: How long its clients wait for an answer before the outcome is unknown.
        self.request_timeout = request_timeout
        #: Where its clients' endpoints are routed (the campaign's link proxies), if anywhere.
        self.via = via

    # ---------------------------------------------------------------- paths

    def space_dir(self, name: str) -> Path:
        if not _NAME.fullmatch(name):
            raise SpaceError(f"bad Space name {name!r}: 1-100 letters, digits, '.', '_' or "
                             "'-', starting with a letter or digit")
        return self.base_dir / name

    def _sockets(self, name: str) -> Path:
        digest = hashlib.sha256(str(self.space_dir(name)).encode()).hexdigest()[:16]
        path = Path(tempfile.gettempdir()) / f"cua-vm-{os.getuid()}" / digest
        path.mkdir(parents=True, exist_ok=True, mode=0o700)
        os.chmod(path.parent, 0o700)
        return path

    def qmp(self, name: str, timeout: float = 60.0) -> QMP:
        return QMP(self._sockets(name) / "qmp.sock", timeout)

    def agent(self, name: str, timeout: float = 60.0) -> Agent:
        return Agent(self._sockets(name) / "ctl.sock", timeout)

    @contextmanager
    def _locked(self, name: str) -> Iterator[None]:
        locks = self.base_dir / ".locks"
        locks.mkdir(exist_ok=True)
        with open(locks / name, "w") as f:
            fcntl.flock(f, fcntl.LOCK_EX)
            yield

    # ---------------------------------------------------------------- the protocol

    def exists(self, name: str) -> bool:
        return (self.space_dir(name) / "token").is_file()

    def names(self) -> list[str]:
        return sorted(p.name for p in self.base_dir.iterdir()
                      if p.is_dir() and (p / "token").is_file())

    def running(self, name: str) -> bool:
        return read_pid(self.space_dir(name) / "qemu.pid") is not None

    def create(self, name: str) -> None:
        """Make the Space (idempotent) and boot it unless it runs; back when it serves."""
        with self._locked(name):
            d = self.space_dir(name)
            if not self.exists(name):
                self._make(d)
            if not self.running(name):
                self._boot(name)
        self._wait_healthy(name)

    def _make(self, d: Path) -> None:
        art = ensure()
        tmp = d.with_name(f".{d.name}.new")
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
        subprocess.run(["qemu-img", "create", "-q", "-f", "qcow2", "-F", "qcow2", "-b",
                        str(art.disk), str(tmp / "overlay.qcow2")], check=True,
                       capture_output=True)
        spec = MachineSpec(self.memory_mb, self.vcpus, self._accel())
        (tmp / "machine.json").write_text(json.dumps({**spec.to_json(), "artifacts": {
            "kernel": str(art.kernel), "initrd": str(art.initrd), "disk": str(art.disk),
            "key": art.key}}) + "\n")
        fd = os.open(tmp / "token", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(secrets.token_hex(32) + "\n")
        os.rename(tmp, d)  # the token last: a Space exists once it is all there

    def _machine(self, name: str) -> tuple[MachineSpec, Artifacts]:
        raw = json.loads((self.space_dir(name) / "machine.json").read_text())
        a = raw["artifacts"]
        art = Artifacts(Path(a["kernel"]), Path(a["initrd"]), Path(a["disk"]), a["key"])
        return MachineSpec(raw["memory_mb"], raw["vcpus"], raw["accel"]), art

    def _boot(self, name: str, *, incoming: Path | None = None) -> None:
        d = self.space_dir(name)
        spec, art = self._machine(name)
        socks = self._sockets(name)
        for sock in ("qmp.sock", "ctl.sock"):
            (socks / sock).unlink(missing_ok=True)
        for stale in ("qemu.pid", "qemu.start"):
            (d / stale).unlink(missing_ok=True)
        token = (d / "token").read_text().strip()
        for attempt in range(5):  # a forwarded port taken meanwhile: another one
            port = free_port()
            try:
                start(qemu_argv(art, spec, overlay=d / "overlay.qcow2", sockets=socks,
                                port=port, token=token, console=d / "console.log",
                                pid_file=d / "qemu.pid", incoming=incoming))
                break
            except SpaceUnavailable as exc:
                if "host forwarding" not in str(exc) or attempt == 4:
                    raise
        (d / "port").write_text(f"{port}\n")
        read_pid(d / "qemu.pid")  # records its start time now

    def _wait_healthy(self, name: str, *, after_ms: int = 0,
                      within: float = BOOT_TIMEOUT_S) -> None:
        """Back when the daemon of ``name`` (one started after ``after_ms``) serves and the
        guest's clock is set; ``NotServing`` after ``within`` s, with what failed last."""
        deadline = time.monotonic() + within
        client = self.connect(name, epoch=0)
        last = "its daemon never answered"
        while time.monotonic() < deadline:
            if not self.running(name):
                raise SpaceUnavailable(f"the microVM of Space {name} stopped while booting; "
                                       f"its console ends: {self._console_tail(name)}")
            try:
                started_ms = client.health()["started_ms"]
            except SpaceError as exc:
                last = f"its daemon's health: {exc}"
            else:
                if started_ms <= after_ms:
                    last = f"its daemon is still the one started at {started_ms} ms"
                else:
                    try:
                        self.set_clock(name)
                        return
                    except SpaceError as exc:
                        last = f"its daemon serves, but setting its clock failed: {exc}"
            time.sleep(0.1)
        raise NotServing(f"Space {name} did not serve within {within:.0f} s (last: {last}); "
                         f"its console ends: {self._console_tail(name)}")

    def _console_tail(self, name: str) -> str:
        try:
            return (self.space_dir(name) / "console.log").read_text(errors="replace")[-400:]
        except OSError:
            return "(no console log)"

    def _endpoint(self, name: str) -> Endpoint:
        d = self.space_dir(name)
        if not self.exists(name):
            raise SpaceNotFound(f"no Space {name!r} in {self.base_dir}; create it first")
        if not self.running(name):
            raise SpaceUnavailable(f"the microVM of Space {name} is not running")
        try:
            port = int((d / "port").read_text())
        except (OSError, ValueError):
            raise SpaceUnavailable(f"Space {name} has no forwarded port yet") from None
        # No kept connections: a restored machine's TCP state is older (see Endpoint).
        return Endpoint("127.0.0.1", port, (d / "token").read_text().strip(),
                        keep_alive=False)

    def connect(self, name: str, *, epoch: int) -> HttpSpaceClient:
        if not self.exists(name):
            raise SpaceNotFound(f"no Space {name!r} in {self.base_dir}; create it first")
        return HttpSpaceClient(name, epoch, routed(name, self.endpoint(name), self.via),
                               timeout=self.request_timeout)

    def endpoint(self, name: str) -> Resolver:
        """How to find the daemon of ``name`` as it is when asked (port and token)."""
        return lambda: self._endpoint(name)

    def delete(self, name: str) -> None:
        with self._locked(name):
            self._remove(name)

    def _remove(self, name: str) -> None:
        self._kill(name)
        shutil.rmtree(self.space_dir(name), ignore_errors=True)
        shutil.rmtree(self._sockets(name), ignore_errors=True)

    def lose(self, name: str, keep: Path) -> None:
        """The Space is lost at one instant (a campaign fault): under its lock, so that no
        ``create`` boots it meanwhile, its network link is cut (the daemon answers nothing
        more; a stopped machine is booted with its link cut before its daemon can serve),
        its audit files as that instant left them are read through the guest agent into
        ``keep`` (as ``save_state``), with those kept before each machine restore
        (``keep/audit-history``), and the machine is killed and removed. Raises
        ``SpaceNotFound``."""
        with self._locked(name):
            if not self.exists(name):
                raise SpaceNotFound(f"no Space {name!r}")
            try:
                if not self.running(name):
                    self._boot(name)
                self.qmp(name).command("set_link", name="n0", up=False)
                self._read_state(name, keep, timeout=BOOT_TIMEOUT_S)
                history = self.space_dir(name) / "audit-history"
                if history.is_dir():
                    shutil.move(history, keep / "audit-history")
            finally:
                self._remove(name)

    def _kill(self, name: str) -> None:
        found = read_pid(self.space_dir(name) / "qemu.pid")
        if found is None:
            return
        procfs.kill_exact(*found)
        deadline = time.monotonic() + 10
        while procfs.is_alive(*found) and time.monotonic() < deadline:
            time.sleep(0.02)

    # ---------------------------------------------------------------- saved states

    def save_machine(self, name: str, dest: Path) -> None:
        """The machine of ``name`` as it is now (memory, devices, disk) into the new
        directory ``dest``, fsynced (``machine_state`` says what is there); a paused
        machine is saved as it is and left paused, a running one goes on. Callers that must
        not leave the machine stopped if they die run it as a job (``machine_state.
        run_job``)."""
        zstd = machine_state.zstd()
        d = self.space_dir(name)
        with self._locked(name):
            if not self.running(name):
                raise SpaceUnavailable(f"the microVM of Space {name} is not running; its "
                                       "state cannot be saved")
            dest.mkdir(parents=True)
            qmp = self.qmp(name)
            was_running = qmp.status() == "running"
            qmp.command("migrate-set-parameters", **{"max-bandwidth": 1 << 40})
            qmp.command("migrate", uri=f"exec:{zstd} -q -1 -c > "
                                       f"{shlex.quote(str(dest / machine_state.MEMORY))}")
            try:
                qmp.migration(machine_state.JOB_TIMEOUT_S)  # QEMU stopped it at the end
                subprocess.run([zstd, "-q", "-1", str(d / "overlay.qcow2"), "-o",
                                str(dest / machine_state.DISK)], check=True,
                               capture_output=True)
            finally:
                if was_running:
                    qmp.command("cont")
            for f in (machine_state.SPEC, machine_state.TOKEN):
                shutil.copyfile(d / f, dest / f)
        machine_state.fsync_state(dest)

    def load_machine(self, name: str, src: Path) -> None:
        """The Space ``name`` (made if there is none: a fork, a lost Space) started from
        the state saved in ``src``: its QEMU killed if it runs, the saved disk, spec and
        token put in place, and QEMU started from the saved memory; back when it serves (a
        machine that does not within ``LOAD_SERVE_S`` is started from the state again)."""
        machine_state.check_state(src)
        try:
            self._load(name, src, serve_within=LOAD_SERVE_S)
        except NotServing as exc:
            # Seen once in about a thousand loads (CI, TCG): the cause is not known yet, so
            # what failed is said where the job's caller shows it, and the load done again.
            print(f"microvm: {exc}; starting it from {src} once more", file=sys.stderr)
            self._load(name, src, serve_within=BOOT_TIMEOUT_S)

    def _load(self, name: str, src: Path, *, serve_within: float) -> None:
        zstd = machine_state.zstd()
        d = self.space_dir(name)
        with self._locked(name):
            self._kill(name)
            tmp = d.with_name(f".{name}.load")
            shutil.rmtree(tmp, ignore_errors=True)
            tmp.mkdir()
            subprocess.run([zstd, "-q", "-d", str(src / machine_state.DISK), "-o",
                            str(tmp / "overlay.qcow2")], check=True, capture_output=True)
            for f in (machine_state.SPEC, machine_state.TOKEN):
                shutil.copyfile(src / f, tmp / f)
            if self.exists(name):
                for f in ("overlay.qcow2", machine_state.SPEC, machine_state.TOKEN):
                    os.replace(tmp / f, d / f)
                shutil.rmtree(tmp)
            else:
                shutil.rmtree(d, ignore_errors=True)  # a creation cut short
                os.rename(tmp, d)  # the token with it: a Space exists once it is all there
            self._boot(name, incoming=src / machine_state.MEMORY)
            qmp = self.qmp(name)
            qmp.migration(machine_state.JOB_TIMEOUT_S)
            if qmp.status() != "running":  # it was saved paused
                qmp.command("cont")
        self._wait_healthy(name, within=serve_within)

    # ---------------------------------------------------------------- faults

    def power_off(self, name: str) -> None:
        """As a power cut: QEMU SIGKILLed, the guest's unsynced writes lost. The Space
        stays; ``create`` boots it again."""
        if not self.exists(name):
            raise SpaceNotFound(f"no Space {name!r}")
        with self._locked(name):
            self._kill(name)

    def power_loss(self, name: str) -> None:
        """A power cut and the machine back on (booted, serving) before this returns."""
        self.power_off(name)
        self.create(name)

    def pause(self, name: str) -> None:
        """The machine stopped where it stands (QMP ``stop``: no vCPU runs, its memory and
        every connection kept); ``resume`` goes on."""
        if not self.exists(name):
            raise SpaceNotFound(f"no Space {name!r}")
        if not self.running(name):
            raise SpaceUnavailable(f"the microVM of Space {name} is not running; nothing to "
                                   "pause")
        self.qmp(name).command("stop")

    def resume(self, name: str) -> None:
        """QMP ``cont``, then the guest's clock set to the host's (it stood still, under
        TCG, for as long as the machine did). A machine that runs, or is off, is left as it
        is."""
        if not self.exists(name):
            raise SpaceNotFound(f"no Space {name!r}")
        if not self.running(name):
            return
        self.qmp(name).command("cont")
        self.set_clock(name)

    def pause_daemon(self, name: str) -> None:
        """spacesd alone frozen (SIGSTOP, through the guest agent): its commands run on.
        Raises ``SpaceUnavailable`` when no daemon runs."""
        if self.agent(name).call("signal-daemon STOP").strip() != "0":
            raise SpaceUnavailable(f"Space {name!r} has no daemon running to freeze")

    def resume_daemon(self, name: str) -> None:
        """SIGCONT to spacesd; none running, or the machine off, is nothing to thaw."""
        if self.exists(name) and self.running(name):
            self.agent(name).call("signal-daemon CONT")

    def pause_commands(self, name: str) -> list[str]:
        """Every process of spacesd's commands frozen (SIGSTOP, through the guest agent)
        while spacesd answers; the keys whose shim it froze. Raises ``SpaceError`` when no
        command runs."""
        code, *keys = self.agent(name).call("signal-commands STOP").split()
        if code != "0":
            raise SpaceError(f"Space {name!r} has no command running to freeze")
        return keys

    def resume_commands(self, name: str) -> None:
        """SIGCONT to every process of spacesd's commands; the machine off has none."""
        if self.exists(name) and self.running(name):
            self.agent(name).call("signal-commands CONT")

    def fill_disk(self, name: str, disk: DiskName, leave: int = 0) -> None:
        """Fill the machine's one disk but ``leave`` bytes (the guest agent's ``fill-disk``:
        a file beside the daemon's state, fsynced), until ``free_disk``. The workspace
        shares it with the daemon's state, which meets ``ENOSPC`` too, as on any machine
        with one disk; a reboot or a power cut keeps it full."""
        if disk != "work":
            raise SpaceError(f"a microVM Space has no {disk} disk of its own to fill: it "
                             "keeps its workspace and its daemon's state on its one disk "
                             "(fill that: 'work')")
        self.agent(name).call(f"fill-disk {int(leave)}")

    def free_disk(self, name: str, disk: DiskName) -> None:
        """Its room back. A machine that is off (a power cut's, before the next driver boots
        it) raises ``SpaceUnavailable``, so that the fill's end is tried again; one that was
        deleted took its disk with it."""
        if disk != "work" or not self.exists(name):
            return
        if not self.running(name):
            raise SpaceUnavailable(f"Space {name!r} is off: its disk is freed once it runs")
        self.agent(name).call("free-disk")

    def restart(self, name: str) -> None:
        """A clean reboot: the guest flushes its filesystems (through the agent), then the
        machine is reset (QMP ``system_reset``: every process gone, the synced disk kept);
        back, serving, before this returns."""
        before = self.connect(name, epoch=0).health()["started_ms"]
        self.sync(name)
        self.qmp(name).command("system_reset")
        self._wait_healthy(name, after_ms=before)

    def kill_daemon(self, name: str) -> None:
        # The agent waits up to KILL_DAEMON_WAIT_S for the next daemon: wait longer for it.
        self.agent(name, timeout=KILL_DAEMON_WAIT_S + 30.0).call("kill-daemon")

    def kill_process(self, name: str, pid: int) -> None:
        self.agent(name).call(f"kill {int(pid)}")

    def set_clock(self, name: str, offset: float = 0.0) -> None:
        """The guest's clock set to the host's, as a guest kept in time (NTP) would be: a
        booted guest has the RTC's whole seconds, a restored one the checkpoint's time. No
        check depends on it (G3 orders a Space's fences by its journal, never by its
        clock), but new files' mtimes and the daemon's records then read in host time.
        ``offset``: that many seconds from the host's instead (back if negative: a clock
        jump). A Space gone raises ``SpaceNotFound``, as every operation on one does. A
        machine that is off keeps no time: its next boot sets its clock to the host's
        (``_wait_healthy``), so setting it back to the host's is done already, and a jump
        raises ``SpaceUnavailable``."""
        if not self.exists(name):
            raise SpaceNotFound(f"no Space {name!r}")
        if not self.running(name):
            if offset:
                raise SpaceUnavailable(f"the microVM of Space {name} is off: it keeps no "
                                       "time to step; boot it (create) first")
            return
        self.agent(name).call(f"time {time.time_ns() + int(offset * 1e9)}")

    def sync(self, name: str) -> None:
        self.agent(name).call("sync")

    def save_state(self, name: str, dest: Path) -> None:
        """The daemon's audit files, read through the guest agent (booting a stopped
        machine first)."""
        if not self.exists(name):
            raise SpaceNotFound(f"no Space {name!r}")
        if not self.running(name):
            self.create(name)
        self._read_state(name, dest)

    def _read_state(self, name: str, dest: Path, *, timeout: float = 60.0) -> None:
        data = base64.b64decode(self.agent(name, timeout=timeout).call("state"))
        dest.mkdir(parents=True, exist_ok=True)
        with tarfile.open(fileobj=io.BytesIO(data)) as tar:
            tar.extractall(dest, filter="data")

    def keep_audit(self, name: str) -> Path:
        """Save the daemon's audit files now, on the host, under the Space (before a machine
        restore takes them back in time); where they went."""
        history = self.space_dir(name) / "audit-history"
        history.mkdir(exist_ok=True)
        dest = history / f"{len(list(history.iterdir())):04d}"
        self.save_state(name, dest)
        return dest

    def audit_history(self, name: str) -> list[Path]:
        """The audit files kept before each machine restore, oldest first."""
        history = self.space_dir(name) / "audit-history"
        return sorted(history.iterdir()) if history.is_dir() else []

    def _accel(self) -> str:
        if self.accel != "auto":
            return self.accel
        return probe_accel()


def probe_accel() -> str:
    """``kvm`` when a guest boots under KVM here (a short probe boot, cached per host),
    else ``tcg``. Nested virtualisation often offers /dev/kvm and then hangs the guest."""
    if not os.access("/dev/kvm", os.R_OK | os.W_OK):
        return "tcg"
    art = ensure()
    version = subprocess.run(["qemu-system-x86_64", "--version"], capture_output=True,
                             text=True).stdout.split("\n")[0]
    kernel = hashlib.sha256(art.kernel.read_bytes() + version.encode()).hexdigest()[:16]
    cached = cache_dir() / f"accel-{kernel}"  # per kernel and QEMU, not per recipe
    if cached.is_file():
        return cached.read_text().strip()
    with tempfile.TemporaryDirectory(prefix="cua-probe-") as tmp:
        console = Path(tmp) / "console.log"
        argv = qemu_argv(art, MachineSpec(256, 1, "kvm"), overlay=Path(tmp) / "none",
                         sockets=Path(tmp), port=0, token="probe", console=console,
                         pid_file=Path(tmp) / "pid", probe=True)
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGKILL)
            proc.wait()
        ok = console.exists() and "cua-probe: booted" in console.read_text(errors="replace")
    accel = "kvm" if ok else "tcg"
    cached.write_text(accel + "\n")
    return accel
