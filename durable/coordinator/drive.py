"""One drive: a session's driver process, started in a process group of its own, its output
copied to a log file, watched for silence, and ended by its process group's id (never by a
name).

A driver prints ``CUA-HEARTBEAT <epoch> <unix_ms>`` on a timer thread of its own while it
runs, so its output grows even while a long command runs: output that stops growing for
``stall_secs`` means the driver hangs (or its heartbeat thread is blocked), and the drive
ends it. Its last line is ``CUA-EXIT <code> <reason>``; the reason is kept.
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import psutil


@dataclass(frozen=True)
class DriveResult:
    #: The driver's exit status (a negative number: the signal that ended it).
    exit_code: int
    #: The reason of its ``CUA-EXIT`` line, if it printed one.
    reason: str
    #: Ended by the drive because its output stopped growing for ``stall_secs``.
    stalled: bool
    #: Ended by the drive because the coordinator asked (``stop``): the reason, else None.
    stopped: str | None
    heartbeats: int
    #: Seconds from the start to the driver's first output, None if it printed nothing.
    first_output: float | None
    seconds: float


class DriverProcess:
    """The driver of one drive. ``start`` launches it; ``watch`` waits for its end."""

    def __init__(self, argv: list[str], env: dict[str, str], log_path: Path, *,
                 stall_secs: float) -> None:
        self.argv, self.env, self.log_path, self.stall_secs = argv, env, log_path, stall_secs
        self.proc: subprocess.Popen[bytes] | None = None
        self.started_at = 0.0
        self._last_output = 0.0
        self._first_output: float | None = None
        self._reason = ""
        self._heartbeats = 0
        self._reader: threading.Thread | None = None

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def create_time(self) -> float | None:
        try:
            return psutil.Process(self.pid).create_time()
        except psutil.Error:
            return None

    def start(self) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self.started_at = self._last_output = time.monotonic()
        self.proc = subprocess.Popen(self.argv, env=self.env, stdin=subprocess.DEVNULL,
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     start_new_session=True)
        self._reader = threading.Thread(target=self._read, name=f"drive-{self.pid}",
                                        daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        pending = b""
        with open(self.log_path, "ab") as log:
            while True:
                chunk = os.read(fd, 65536)
                if not chunk:
                    break
                now = time.monotonic()
                self._last_output = now
                if self._first_output is None:
                    self._first_output = now - self.started_at
                log.write(chunk)
                log.flush()
                pending += chunk
                *lines, pending = pending.split(b"\n")
                for line in lines:
                    self._parse(line)
            if pending:
                self._parse(pending)

    def _parse(self, line: bytes) -> None:
        if line.startswith(b"CUA-HEARTBEAT "):
            self._heartbeats += 1
        elif line.startswith(b"CUA-EXIT "):
            parts = line.decode("utf-8", "replace").split(" ", 2)
            self._reason = parts[2].strip() if len(parts) > 2 else ""

    def kill_group(self) -> None:
        """SIGKILL the driver's process group (its id is the driver's pid: the driver leads
        it). Only while the driver is not reaped, so the id cannot belong to anyone else."""
        if self.proc is not None and self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def watch(self, stop: Callable[[], str | None], *, tick: float = 0.1) -> DriveResult:
        """Wait for the driver's end; end it when it falls silent or ``stop()`` names a
        reason."""
        assert self.proc is not None
        stalled, stopped = False, None
        while True:
            try:
                code = self.proc.wait(timeout=tick)
                break
            except subprocess.TimeoutExpired:
                pass
            stopped = stop()
            if stopped is None and time.monotonic() - self._last_output > self.stall_secs:
                stalled = True
            if stopped is not None or stalled:
                self.kill_group()
                code = self.proc.wait()
                break
        if self._reader is not None:
            self._reader.join(timeout=10)
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        return DriveResult(code, self._reason, stalled, stopped, self._heartbeats,
                           None if self._first_output is None else round(self._first_output, 3),
                           round(time.monotonic() - self.started_at, 3))


def end_orphan(pid: int, started: float) -> bool | None:
    """SIGKILL the process group of a driver a dead coordinator left, if ``pid`` is still
    that process (same start time: a reused pid is someone else). True: it was alive and is
    ended; False: it was gone already (it died with its coordinator, or its host lost
    power); None: it may run on (this process may not look at it or signal it)."""
    try:
        proc = psutil.Process(pid)
        if abs(proc.create_time() - started) > 0.01 or proc.status() == psutil.STATUS_ZOMBIE:
            return False  # someone else, or dead already (a zombie its new parent never reaped)
        try:
            os.killpg(pid, signal.SIGKILL)
        except ProcessLookupError:  # alive, but it leads no group: it alone
            os.kill(pid, signal.SIGKILL)
    except (psutil.NoSuchProcess, ProcessLookupError):
        return False
    except (psutil.Error, PermissionError):
        return None
    try:
        proc.wait(timeout=10)
    except psutil.TimeoutExpired:
        return None  # SIGKILLed and still there: it may run on
    except psutil.Error:
        pass
    return True
