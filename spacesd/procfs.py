"""What the daemon learns about processes from ``/proc``, and how it kills process groups.

A pid alone does not name a process: after the daemon restarts, a recorded pid may belong to
someone else. ``(pid, start time)`` does: the start time (field 22 of ``/proc/<pid>/stat``,
in clock ticks since boot) never changes for a process and two processes with the same pid
cannot share it. Zombies count as gone: they run nothing and only wait to be reaped. A
zombie thread-group leader whose other threads still exit does not: a SIGKILLed
multi-threaded process shows ``Z`` as soon as its first thread is done, while the others
still hold its files (a lock on the Space's state among them) until the last one exits.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Iterable
from dataclasses import dataclass


def _stat_fields(pid: int) -> list[str] | None:
    """Fields 3.. of ``/proc/<pid>/stat`` (after the command name), or None if gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            raw = f.read()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    # The command name (field 2) is in parentheses and may itself hold ") ".
    return raw[raw.rfind(b")") + 2 :].decode("ascii", "replace").split()


def start_time(pid: int) -> int | None:
    """The start time of a live ``pid``, or None if it is gone (see the module docstring)."""
    fields = _stat_fields(pid)
    return None if fields is None or _exited(fields) else int(fields[19])


def _exited(fields: list[str]) -> bool:
    """A zombie (or a dying task) with no thread left: field 20 of ``stat``, the thread
    count, back to the leader's own 1."""
    return fields[0] in ("Z", "X") and int(fields[17]) <= 1


def life() -> str:
    """What names this life of the Space's processes: the boot and the start of PID 1 of
    this PID namespace. A container restarted, or a machine rebooted, has a new one, and
    every process of an earlier life is gone, while pids (and, after a reboot, start times)
    begin again and are handed to new processes: a recorded pid or process group of an
    earlier life names nobody of this one."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot = f.read().strip()
    except OSError:
        boot = "unknown-boot"
    return f"{boot}:{start_time(1)}"


def is_alive(pid: int, started: int) -> bool:
    """Whether the process ``pid`` that started at ``started`` still runs."""
    return start_time(pid) == started


def group_members(pgids: Iterable[int], table: dict[int, Proc] | None = None
                  ) -> dict[int, list[int]]:
    """For each of ``pgids`` that still has live members: their pids (one pass over /proc,
    or ``table``: a ``snapshot`` the caller took for more questions of the same instant)."""
    wanted = set(pgids)
    found: dict[int, list[int]] = {}
    if not wanted:
        return found
    for proc in (snapshot() if table is None else table).values():
        if proc.pgid in wanted:
            found.setdefault(proc.pgid, []).append(proc.pid)
    return found


def kill_groups(pgids: Iterable[int], *, timeout: float = 5.0) -> set[int]:
    """SIGKILL every process in ``pgids`` and wait until none of them runs; returns the
    groups that still had members at ``timeout`` (a process stuck in the kernel).

    Waiting matters: callers promise that the processes are gone when they return (an
    ``advance_epoch`` that returned while an old command could still write would break the
    fence). SIGKILL cannot be caught, so the wait is short; members that appear meanwhile
    (a fork racing the kill) are killed on the next pass.
    """
    pending = set(pgids)
    deadline = time.monotonic() + timeout
    while pending:
        for pgid in pending:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pgid, signal.SIGKILL)
        pending = set(group_members(pending))
        if not pending or time.monotonic() > deadline:
            return pending
        time.sleep(0.005)
    return pending


@dataclass(frozen=True)
class Proc:
    """One live process, as ``/proc/<pid>/stat`` shows it."""

    pid: int
    ppid: int
    pgid: int
    sid: int
    started: int


def snapshot() -> dict[int, Proc]:
    """Every live process of this PID namespace (see the module docstring), by pid (one
    pass)."""
    found: dict[int, Proc] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        fields = _stat_fields(int(name))
        if fields is None or _exited(fields):
            continue
        found[int(name)] = Proc(int(name), int(fields[1]), int(fields[2]), int(fields[3]),
                                int(fields[19]))
    return found


def kill_exact(pid: int, started: int) -> None:
    """SIGKILL ``pid`` only if it is still the process that started at ``started``: a pidfd
    pins the process between the check and the signal, so a reused pid is never hit. Where
    pidfds are refused (Linux before 5.3, a seccomp profile), the check and ``kill`` only."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return
    except OSError:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            if start_time(pid) == started:
                os.kill(pid, signal.SIGKILL)
        return
    try:
        if start_time(pid) == started:
            signal.pidfd_send_signal(fd, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass  # gone, or not ours to kill: the caller sees it still alive
    finally:
        os.close(fd)
