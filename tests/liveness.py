"""Whether a process still runs, as the tests must ask it.

A killed process whose parent died is reparented to this machine's PID 1, which may reap it
late (here: seconds under load), so it lingers as a zombie: dead, its files closed, unable to
write anything, but ``psutil.pid_exists`` still says it exists. A test that asks whether a
process was ended asks ``running``."""

from __future__ import annotations

import psutil


def running(pid: int) -> bool:
    """Whether ``pid`` is a live process (a zombie is not: it runs nothing)."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False
