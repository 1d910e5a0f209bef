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
from collections.abc import Sequence
from typing import IO, Protocol, Self


class Driver(Protocol):
    """A driver as the nemesis kills it: one the runner owns (``OwnedProcess``) or one a
    coordinator launched (``chaos.redrive.LaunchedDriver``)."""

    def poll(self) -> int | None: ...

    def kill_group(self) -> None: ...


class Owned(Protocol):
    """A driver the runner owns: spawned (``OwnedProcess``) or forked by the driver server
    (``chaos.driver_forks.ForkedDriver``)."""

    pid: int
    killed: bool

    def poll(self) -> int | None: ...

    def wait(self, timeout: float | None = None) -> int: ...

    def kill_group(self) -> None: ...

    def close(self, grace: float = 3.0) -> None: ...


class OwnedProcess:
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

    def kill_group(self) -> None:
        """SIGKILL the whole process group (idempotent; the child is reaped by ``wait``)."""
        with self._lock:
            if self.proc.poll() is not None and self.killed:
                return
            self.killed = True
            try:
                os.killpg(self.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def wait(self, timeout: float | None = None) -> int:
        return self.proc.wait(timeout)

    def poll(self) -> int | None:
        return self.proc.poll()

    def close(self, grace: float = 3.0) -> None:
        try:
            if self.proc.poll() is None:
                try:
                    os.killpg(self.pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
                try:
                    self.proc.wait(grace)
                except subprocess.TimeoutExpired:
                    warnings.warn(f"process {self.pid} ({self.argv[:3]}) ignored SIGTERM; "
                                  "killing it", RuntimeWarning, stacklevel=2)
                    self.kill_group()
            else:
                # The leader is gone; its group may not be (a tool's background child).
                try:
                    os.killpg(self.pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
        finally:
            self.proc.wait()
            for stream in (self.proc.stdout, self.proc.stderr):
                if stream is not None:
                    stream.close()


def python_argv(module: str, *args: str) -> list[str]:
    """argv that runs ``python -m module args`` with this interpreter."""
    return [sys.executable, "-m", module, *args]

