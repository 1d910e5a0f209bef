"""Child processes the runner owns: started in their own process group, always ended and
always waited for.

A driver is SIGKILLed as a group (``kill_group``), so a tool's child that the driver started
dies with it, exactly as a crashed worker's would. ``close`` ends whatever is still running
the Trio way: SIGTERM, a grace period, then SIGKILL with a warning, and it always reaps.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import warnings
from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import IO, Protocol, Self


class Driver(Protocol):
    """A driver as the nemesis kills it: one the runner owns (``OwnedProcess``) or one a
    coordinator launched (``chaos.modes.redrive.LaunchedDriver``)."""

    pid: int

    def poll(self) -> int | None: ...

    def kill_group(self) -> None: ...

    def pause_group(self) -> bool:
        """SIGSTOP its process group; False when it had already exited."""
        ...


class Owned(ABC):
    """A driver the runner owns, in a session of its own (its pid is its process group):
    spawned (``OwnedProcess``) or forked by the driver server
    (``chaos.run.driver_forks.ForkedDriver``). Subclasses say how to ``poll`` and ``wait`` for
    it (set ``pid``, ``argv``, ``killed`` and ``_lock``); killing and ending are the same."""

    pid: int
    argv: list[str]
    killed: bool
    _lock: threading.Lock

    @abstractmethod
    def poll(self) -> int | None: ...

    @abstractmethod
    def wait(self, timeout: float | None = None) -> int:
        """Its exit code; ``subprocess.TimeoutExpired`` at ``timeout``."""

    @abstractmethod
    def close(self, grace: float = 3.0) -> None:
        """``_end`` it, and wait until it is reaped."""

    def kill_group(self) -> None:
        """SIGKILL the whole process group (idempotent; the child is reaped by ``wait``)."""
        with self._lock:
            if self.poll() is not None and self.killed:
                return
            self.killed = True
            try:
                os.killpg(self.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def pause_group(self) -> bool:
        """SIGSTOP the whole process group wherever each process is (a pause, not an end:
        ``resume_group`` wakes it); False when the driver has already exited."""
        return self._signal_live(signal.SIGSTOP)

    def resume_group(self) -> None:
        """SIGCONT the process group ``pause_group`` stopped."""
        self._signal_live(signal.SIGCONT)

    def _signal_live(self, signum: int) -> bool:
        """Send ``signum`` to the group while its leader is not reaped (so the id is still
        this driver's); whether it was sent."""
        with self._lock:
            if self.poll() is not None:
                return False
            try:
                os.killpg(self.pid, signum)
            except ProcessLookupError:
                return False
            return True

    def _end(self, grace: float) -> None:
        """The Trio way: SIGTERM to the group (and SIGCONT, so that a paused one can act
        on it), ``grace`` seconds, then SIGKILL with a warning; a group whose leader is gone
        (a tool's background child) is SIGKILLed."""
        if self.poll() is None:
            try:
                os.killpg(self.pid, signal.SIGTERM)
                os.killpg(self.pid, signal.SIGCONT)
            except ProcessLookupError:
                pass
            try:
                self.wait(grace)
            except subprocess.TimeoutExpired:
                warnings.warn(f"process {self.pid} ({self.argv[:3]}) ignored SIGTERM; "
                              "killing it", RuntimeWarning, stacklevel=3)
                self.kill_group()
        else:
            try:
                os.killpg(self.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass


class OwnedProcess(Owned):
    """A child in a new session (its own process group) that is ended on ``close``."""

    def __init__(
        self,
        argv: Sequence[str],
        *,
        env: dict[str, str] | None = None,
        cwd: str | None = None,
        stdout: IO[bytes] | int | None = subprocess.PIPE,
        stderr: IO[bytes] | int | None = subprocess.STDOUT,
    ) -> None:
        self.argv = list(argv)
        self.proc = subprocess.Popen(
            self.argv, env=env, cwd=cwd, stdout=stdout, stderr=stderr,
            stdin=subprocess.DEVNULL, start_new_session=True,
        )
        self.pid = self.proc.pid
        self.killed = False
        self._lock = threading.Lock()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def wait(self, timeout: float | None = None) -> int:
        return self.proc.wait(timeout)

    def poll(self) -> int | None:
        return self.proc.poll()

    def close(self, grace: float = 3.0) -> None:
        try:
            self._end(grace)
        finally:
            self.proc.wait()
            for stream in (self.proc.stdout, self.proc.stderr):
                if stream is not None:
                    stream.close()


def python_argv(module: str, *args: str) -> list[str]:
    """argv that runs ``python -m module args`` with this interpreter."""
    return [sys.executable, "-m", module, *args]

