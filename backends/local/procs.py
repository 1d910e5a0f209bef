"""Processes of a local Space, seen from the host: the daemon and what it started.

The daemon is named by ``<pid> <start time>`` in its pid file, and is killed only if that
pair still matches (a pid alone may belong to an unrelated process by now). The commands
are found by the ``SPACESD_STATE=<state dir>`` variable the daemon puts in their
environment: unlike a list kept by the daemon, that finds them even after the daemon died,
and also their children that moved to a group of their own.
"""

from __future__ import annotations

import os
import signal
import time

import psutil

from spacesd.protocol import ENV_SPACE_STATE


def start_time(pid: int) -> int | None:
    """Start time (clock ticks since boot) of a live, non-zombie ``pid``; None if gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
    except (FileNotFoundError, ProcessLookupError):
        return None
    return None if fields[0] in (b"Z", b"X") else int(fields[19])


def kill_process(pid: int, started: int, *, timeout: float = 10.0) -> None:
    """SIGKILL the process ``(pid, started)`` if it still runs, and wait until it is gone."""
    if start_time(pid) != started:
        return
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + timeout
    while start_time(pid) == started:
        if time.monotonic() > deadline:
            raise TimeoutError(f"process {pid} survived SIGKILL for {timeout} s")
        time.sleep(0.005)


def space_processes(state_dir: str) -> list[psutil.Process]:
    """Live processes started by the daemon of ``state_dir`` (and their descendants)."""
    marker = os.path.realpath(state_dir)
    found = []
    for proc in psutil.process_iter(["environ", "status"]):
        env = proc.info["environ"]
        if env and env.get(ENV_SPACE_STATE) == marker and \
                proc.info["status"] != psutil.STATUS_ZOMBIE and proc.pid != os.getpid():
            found.append(proc)
    return found


def kill_space_processes(state_dir: str, *, timeout: float = 10.0) -> None:
    """SIGKILL every process of the Space (their whole groups) and wait until none runs.

    Several passes, because a process may fork while its group is being killed."""
    own_group = os.getpgrp()
    deadline = time.monotonic() + timeout
    while procs := space_processes(state_dir):
        if time.monotonic() > deadline:
            raise TimeoutError(f"processes of {state_dir} survived SIGKILL: "
                               f"{[p.pid for p in procs]}")
        for proc in procs:
            try:
                pgid = os.getpgid(proc.pid)
                if pgid != own_group:
                    os.killpg(pgid, signal.SIGKILL)
                os.kill(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                continue
        time.sleep(0.01)
