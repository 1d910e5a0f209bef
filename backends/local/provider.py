"""``LocalSpaces``: Spaces as directories on this machine, each served by its own spacesd.

``<base_dir>/<name>/work`` is the workspace, ``<base_dir>/<name>/state`` the daemon's state
(token, port and pid files, exec ledger, checkpoints, ``daemon.log``). Nothing lives in
memory: any process can find a Space by name, and Spaces outlive the process that created
them (the daemon runs in a session of its own, so it is not killed with its creator's
process group). Operations that start or kill a daemon take a per-name lock file under
``<base_dir>/.locks`` (never deleted), so parallel processes cannot start two daemons.

``daemon_args`` are added to the command line of every daemon the provider starts (e.g.
``["--containment", "subreaper"]``; see ``python -m spacesd``). ``failpoints`` (a channel, as
in ``CUA_FAILPOINTS``) is given to every daemon the provider starts, so a test or a campaign
can stop a daemon or a shim at the daemon's failpoints (``spacesd.failpoints.POINTS``); the
daemon keeps it from its commands. ``save_state`` copies what an audit reads
(``spacesd.audit.read_state``) out of a Space.
"""

from __future__ import annotations

import errno
import fcntl
import os
import re
import secrets
import shutil
import signal
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path

from backends.descriptor import DiskName
from backends.local import daemon_start, own_disks, procs
from backends.space_client import (
    REQUEST_TIMEOUT_S,
    Endpoint,
    HttpSpaceClient,
    Resolver,
    Via,
    routed,
)
from durable.errors import SpaceError, SpaceNotFound, SpaceUnavailable
from spacesd.failpoints import ENV_VAR as FAILPOINTS_ENV
from spacesd.procfs import start_time
from spacesd.protocol import (
    ENV_SPACE_STATE,
    ERR_BAD_REQUEST,
    STATE_EXEC_DIR,
    STATE_LEDGER,
    is_audit_file,
)
from spacesd.supervisor import signal_commands

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}")
#: What a token file holds (``_ensure_token`` writes a new one over anything else).
_TOKEN = re.compile(r"[0-9a-f]{64}\n?")


def _copy_present(src: Path, dest: Path) -> None:
    """Copy ``src`` to ``dest`` unless it does not exist (a torn start's leftover files are
    removed by the daemon, and a Space whose daemon never started has no ledger)."""
    try:
        shutil.copyfile(src, dest)
    except FileNotFoundError:
        pass


@dataclass(frozen=True)
class LocalSpace:
    """Where a local Space lives on disk."""

    name: str
    dir: Path

    @property
    def work(self) -> Path:
        return self.dir / "work"

    @property
    def state(self) -> Path:
        return self.dir / "state"

    def disk(self, which: DiskName) -> Path:
        """The directory that ``which`` disk of its own is mounted on, if it has one."""
        return self.state if which == "state" else self.work

    @property
    def token_file(self) -> Path:
        return self.state / "token"

    @property
    def port_file(self) -> Path:
        return self.state / "port"

    @property
    def pid_file(self) -> Path:
        return self.state / "daemon.pid"

    @property
    def log_file(self) -> Path:
        return self.state / "daemon.log"

    def daemon(self) -> tuple[int, int] | None:
        """``(pid, start time)`` of the running daemon, or None. From its pid file; when
        that is missing or damaged, found by the lock it holds on its state, so a damaged
        pid file never hides a live daemon (and a second one is never started
        beside it: spacesd would refuse, see ``spacesd.__main__``)."""
        try:
            pid, started = map(int, self.pid_file.read_text().split())
            if start_time(pid) == started:
                return pid, started
        except (FileNotFoundError, ValueError):
            pass
        return procs.find_daemon(str(self.state))

    def endpoint(self) -> Endpoint:
        if not self.token_file.exists():
            raise SpaceNotFound(f"no Space {self.name!r} in {self.dir.parent}")
        try:
            port = int(self.port_file.read_text())
            token = self.token_file.read_text().strip()
        except (FileNotFoundError, ValueError):
            raise SpaceUnavailable(f"Space {self.name!r}: its daemon is not up (its port or "
                                   f"token file is missing or unreadable; see {self.log_file}"
                                   "; restart the Space)") from None
        return Endpoint("127.0.0.1", port, token)


class LocalSpaces:
    """A ``durable.spaces.Spaces`` provider on this machine."""

    kind = "local"

    def __init__(self, base_dir: str | os.PathLike[str], *, failpoints: str | None = None,
                 start_timeout: float = 30.0, daemon_args: Sequence[str] = (),
                 request_timeout: float = REQUEST_TIMEOUT_S, via: Via | None = None,
                 state_disk: int | None = None, work_disk: int | None = None) -> None:
        """``state_disk``, ``work_disk``: every Space made under ``base_dir`` from now on,
        by any process, keeps its daemon's state (as a Space whose ``/var`` is a partition
        of its own does), its workspace (as one whose workspace is a volume), on a disk of
        its own of that many bytes (a tmpfs mount, which needs root: ``own_disks``);
        ``fill_disk`` fills it."""
        self.base_dir = Path(base_dir).resolve()
        #: Where its clients' endpoints are routed (the campaign's link proxies), if anywhere.
        self.via = via
        #: How long its clients wait for an answer before the outcome is unknown.
        self.request_timeout = request_timeout
        self.base_dir.mkdir(parents=True, exist_ok=True)
        sizes: dict[DiskName, int | None] = {"state": state_disk, "work": work_disk}
        for disk, size in sizes.items():
            if size is not None:
                own_disks.marker(self.base_dir, disk).write_text(f"{size}\n")
        self.failpoints = failpoints
        self.daemon_args = list(daemon_args)
        self.start_timeout = start_timeout

    def shell_hint(self, name: str) -> str:
        return f"cd {self.get(name).work}"  # a directory of this machine

    def get(self, name: str) -> LocalSpace:
        """The Space's paths; raises ``SpaceNotFound``."""
        space = self._space(name)
        if not space.token_file.exists():
            raise SpaceNotFound(f"no Space {name!r} in {self.base_dir}; create it first")
        return space

    def _space(self, name: str) -> LocalSpace:
        if not isinstance(name, str) or not _NAME.fullmatch(name):
            raise SpaceError(f"bad Space name {name!r}: use 1-100 of A-Z a-z 0-9 . _ -, "
                             "starting with a letter or digit (no '/')", code=ERR_BAD_REQUEST)
        return LocalSpace(name, self.base_dir / name)

    @contextmanager
    def _held(self, name: str) -> Iterator[tuple[LocalSpace, int]]:
        """The Space, its lock taken, and the lock's descriptor: a start hands it to the fork
        server, which holds it until the start ended, so that a creator killed meanwhile
        lets no other process act on the Space (and miss a daemon not yet findable)."""
        space = self._space(name)
        locks = self.base_dir / ".locks"
        locks.mkdir(exist_ok=True)
        with open(locks / f"{name}.lock", "a") as f:
            fcntl.flock(f, fcntl.LOCK_EX)
            yield space, f.fileno()

    @contextmanager
    def _locked(self, name: str) -> Iterator[LocalSpace]:
        with self._held(name) as (space, _):
            yield space

    # ---------------------------------------------------------------- the protocol

    def create(self, name: str) -> None:
        with self._held(name) as (space, held):
            if space.daemon() and self._healthy(space):
                return
            space.work.mkdir(parents=True, exist_ok=True)
            space.state.mkdir(parents=True, exist_ok=True)
            for disk in own_disks.DISKS:
                own_disks.mount(self.base_dir, disk, space.disk(disk))
            self._kill_daemon(space)  # a hung one, if any
            self._start_daemon(space, held)

    def exists(self, name: str) -> bool:
        try:
            return self._space(name).token_file.exists()
        except SpaceError:
            return False

    def delete(self, name: str) -> None:
        with self._locked(name) as space:
            if space.dir.exists():
                self._remove(space)

    def lose(self, name: str, keep: Path) -> None:
        """The Space is lost at one instant (a campaign fault): under its lock, so that no
        ``create`` brings it back meanwhile, its daemon and every process die, its audit
        files as that instant left them are copied to ``keep`` (as ``save_state``), and it
        is removed. Raises ``SpaceNotFound``."""
        with self._locked(name) as space:
            self.get(name)
            self._kill_daemon(space)
            procs.kill_space_processes(str(space.state))
            self.save_state(name, keep)
            self._remove(space)

    def _remove(self, space: LocalSpace) -> None:
        for tries_left in reversed(range(3)):
            self._kill_daemon(space)
            procs.kill_space_processes(str(space.state))
            try:
                for disk in own_disks.DISKS:
                    own_disks.unmount(space.disk(disk))
                shutil.rmtree(space.dir)
                return
            except OSError as exc:
                # A daemon that was still starting (detaching from a creator that was
                # SIGKILLed) wrote its files while the tree was being removed: kill it,
                # now that it can be found, and remove again.
                if exc.errno != errno.ENOTEMPTY or not tries_left:
                    raise

    def restart(self, name: str) -> None:
        """As a machine restart: the daemon and every process it started die (found by the
        marker in their environment and by the Space's cgroup: ``procs``), the disk stays,
        a new daemon starts."""
        with self._held(name) as (space, held):
            self.get(name)
            self._kill_daemon(space)
            procs.kill_space_processes(str(space.state))
            self._start_daemon(space, held)

    def kill_process(self, name: str, pid: int) -> None:
        """SIGKILL one process of the Space (a command's shim, say), by its pid as the Space
        sees it; refuses a pid that is not one of the Space's processes (``SpaceError``)."""
        with self._locked(name) as space:
            self.get(name)
            proc = next((p for p in procs.space_processes(str(space.state)) if p.pid == pid),
                        None)
            if proc is None:
                raise SpaceError(f"pid {pid} is not a live process of Space {name!r}; give "
                                 "the pid of one of its commands (or shims)")
            started = start_time(pid)
            if started is not None:
                procs.kill_process(pid, started)

    def kill_daemon(self, name: str) -> None:
        with self._held(name) as (space, held):
            self.get(name)
            self._kill_daemon(space)
            self._start_daemon(space, held)

    def pause(self, name: str) -> None:
        """Freeze the Space where it stands (as ``docker pause``): SIGSTOP to its daemon and
        every process it started, which stay alive and hold what they hold; a request sent
        meanwhile waits in its socket. ``resume`` thaws them. A second pass stops what forked
        during the first. Without the Space's lock, like ``resume``: a ``create`` holding it
        while it probes the frozen daemon must not keep the thaw waiting. Raises
        ``SpaceUnavailable`` when no process of the Space runs."""
        state = str(self.get(name).state)
        stopped: set[int] = set()
        for _ in range(2):
            for proc in procs.space_processes(state):
                if proc.pid not in stopped:
                    stopped.add(proc.pid)
                    with suppress(ProcessLookupError):
                        os.kill(proc.pid, signal.SIGSTOP)
        if not stopped:
            raise SpaceUnavailable(f"Space {name!r} has no process running to freeze")

    def pause_daemon(self, name: str) -> None:
        """Freeze the Space's daemon alone (SIGSTOP): its commands run on, a request sent
        meanwhile waits in its socket. Raises ``SpaceUnavailable`` when no daemon runs."""
        running = self.get(name).daemon()
        if running is None:
            raise SpaceUnavailable(f"Space {name!r} has no daemon running to freeze")
        with suppress(ProcessLookupError):
            os.kill(running[0], signal.SIGSTOP)

    def resume_daemon(self, name: str) -> None:
        """SIGCONT to the Space's daemon; none running (a ``create`` replaced the frozen
        one) is nothing to thaw."""
        running = self.get(name).daemon()
        if running is not None:
            with suppress(ProcessLookupError):
                os.kill(running[0], signal.SIGCONT)

    def pause_commands(self, name: str) -> list[str]:
        """Every process of the daemon's commands frozen (SIGSTOP), the daemon answering
        (``spacesd.supervisor.signal_commands``); the keys whose shim it froze. Raises
        ``SpaceError`` when no command runs."""
        space = self.get(name)
        keys = signal_commands(str(space.state), str(space.pid_file), "STOP")
        if keys is None:
            raise SpaceError(f"Space {name!r} has no command running to freeze")
        return keys

    def resume_commands(self, name: str) -> None:
        """SIGCONT to every process of the daemon's commands."""
        space = self.get(name)
        signal_commands(str(space.state), str(space.pid_file), "CONT")

    def resume(self, name: str) -> None:
        """SIGCONT to every process of the Space (a running one ignores it)."""
        for proc in procs.space_processes(str(self.get(name).state)):
            with suppress(ProcessLookupError):
                os.kill(proc.pid, signal.SIGCONT)

    def fill_disk(self, name: str, disk: DiskName, leave: int = 0) -> None:
        """Fill the Space's ``disk`` of its own (``state_disk``, ``work_disk``) but
        ``leave`` bytes, until ``free_disk`` (``own_disks.fill``). Raises ``SpaceError`` for
        a Space without one."""
        own_disks.fill(self.get(name).disk(disk), leave)

    def free_disk(self, name: str, disk: DiskName) -> None:
        own_disks.free(self.get(name).disk(disk), own_disks.size_of(self.base_dir, disk))

    def connect(self, name: str, *, epoch: int) -> HttpSpaceClient:
        self.get(name)
        return HttpSpaceClient(name, epoch, routed(name, self.endpoint(name), self.via),
                               timeout=self.request_timeout)

    def endpoint(self, name: str) -> Resolver:
        """How to find the daemon of ``name`` as it is when asked (port and token)."""
        return lambda: self.get(name).endpoint()

    def save_state(self, name: str, dest: Path) -> None:
        """Copy what an audit reads of the daemon's state (ledger, fence journal, epoch,
        claim and exit files: ``spacesd.protocol.is_audit_file``) into ``dest`` (created),
        for ``spacesd.audit.read_state(dest)``. Works with the daemon up or down; raises
        ``SpaceNotFound``."""
        state = self.get(name).state
        dest = Path(dest)
        (dest / STATE_EXEC_DIR).mkdir(parents=True, exist_ok=True)
        # The ledger first: every key in the copy had its start record written before the
        # claim and exit files were listed, so the copied ones are at least as recent.
        _copy_present(state / STATE_LEDGER, dest / STATE_LEDGER)
        exec_dir = state / STATE_EXEC_DIR
        listed = [p.name for p in state.iterdir()]
        if exec_dir.is_dir():
            listed += [f"{STATE_EXEC_DIR}/{n}" for n in os.listdir(exec_dir)]
        for rel in listed:
            if rel != STATE_LEDGER and is_audit_file(rel):
                _copy_present(state / rel, dest / rel)

    def names(self) -> list[str]:
        return sorted(p.name for p in self.base_dir.iterdir()
                      if _NAME.fullmatch(p.name) and (p / "state" / "token").exists())

    def delete_all(self) -> None:
        """Delete every Space under ``base_dir`` (test and benchmark cleanup)."""
        for name in self.names():
            self.delete(name)

    # ---------------------------------------------------------------- the daemon

    def _kill_daemon(self, space: LocalSpace) -> None:
        running = space.daemon()
        if running:
            procs.kill_process(*running)

    @staticmethod
    def _ensure_token(space: LocalSpace) -> None:
        """A token file holding a token: a new one if it is missing or damaged (the daemon
        about to start is the only one that uses it, and clients resolve it again)."""
        try:
            if _TOKEN.fullmatch(space.token_file.read_text()):
                return
        except (FileNotFoundError, UnicodeDecodeError):
            pass
        # 0600 from the first byte: created with that mode (O_EXCL on a fresh temp name,
        # never through a link), written, then renamed into place.
        tmp = space.state / f"token.tmp.{secrets.token_hex(8)}"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                     0o600)
        try:
            with open(fd, "w") as f:
                f.write(secrets.token_hex(32) + "\n")
                f.flush()
                os.fsync(f.fileno())
            tmp.replace(space.token_file)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise

    def _start_daemon(self, space: LocalSpace, held: int) -> None:
        """Start spacesd detached (spawned, or forked by the fork server this directory
        names: ``daemon_start``) and wait until it answers ``health``. It gives its commands
        the Space's environment marker, by which ``procs`` finds them."""
        self._ensure_token(space)
        for stale in (space.port_file, space.pid_file):
            stale.unlink(missing_ok=True)
        # A Space's commands inherit the daemon's environment: give it the basics of a
        # login, not the creator's (a driver's failpoint channel must not leak into them).
        env = daemon_start.daemon_env()
        env[ENV_SPACE_STATE] = os.path.realpath(space.state)
        if self.failpoints:
            env[FAILPOINTS_ENV] = self.failpoints
        argv = ["--root", str(space.work), "--state", str(space.state),
                "--token-file", str(space.token_file), "--port-file", str(space.port_file),
                "--pid-file", str(space.pid_file), "--daemonize", *self.daemon_args]
        code = daemon_start.start(argv, env=env, cwd=space.state, log=space.log_file,
                                  held=held, timeout=self.start_timeout,
                                  base_dir=self.base_dir)
        if code != 0 or not self._healthy(space):
            tail = space.log_file.read_text(errors="replace")[-2000:]
            raise SpaceUnavailable(f"Space {space.name!r}: spacesd failed to start; its log "
                                   f"({space.log_file}) ends with:\n{tail}")

    @staticmethod
    def _healthy(space: LocalSpace) -> bool:
        try:
            HttpSpaceClient(space.name, 0, space.endpoint, timeout=5.0, retry_for=0).health()
            return True
        except SpaceError:
            return False
