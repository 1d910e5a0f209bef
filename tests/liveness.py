"""Whether a process still runs, and whether a command got somewhere, as the tests must ask
it.

A killed process whose parent died is reparented to this machine's PID 1, which may reap it
late (here: seconds under load), so it lingers as a zombie: dead, its files closed, unable to
write anything, but ``psutil.pid_exists`` still says it exists. A test that asks whether a
process was ended asks ``running``."""

from __future__ import annotations

import time
from pathlib import Path

import psutil


def running(pid: int) -> bool:
    """Whether ``pid`` is a live process (a zombie is not: it runs nothing)."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def made_by_the_command(mark: Path) -> None:
    """Until a running command made ``mark``, so it has decided what it does before a test
    stops its driver (a driver stopped first, on a busy machine, let the next driver's fence
    kill bash before the command's own ``mkdir``, and its rerun then took the first run's
    path). A deadline only a hang reaches."""
    deadline = time.monotonic() + 300
    while not mark.exists():
        assert time.monotonic() < deadline, f"the command never made {mark}"
        time.sleep(0.01)
