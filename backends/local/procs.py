"""Processes of a local Space, seen from the host: the daemon and what it started.

The daemon is named by ``<pid> <start time>`` in its pid file, and is killed only if that
pair still matches (a pid alone may belong to an unrelated process by now). The commands
are found by the ``SPACESD_STATE=<state dir>`` variable the daemon puts in their
environment: unlike a list kept by the daemon, that finds them even after the daemon died,
and also their children that moved to a group of their own. A process that dropped the
marker (``env -i``) is found by descent from one that has it, and, when the daemon runs in
cgroup mode, by the Space's cgroup, which nothing leaves (``spacesd.containment``).
"""

from __future__ import annotations

import os
import signal
import time

import psutil

# spacesd.containment is standard library only, like all of spacesd: importable here.
from spacesd import containment
from spacesd.procfs import start_time
from spacesd.protocol import ENV_SPACE_STATE


def kill_process(pid: int, started: int, *, timeout: float = 10.0) -> None:
    """SIGKILL the process ``(pid, started)`` if it still runs, and wait until it is gone:
    every thread of it exited, so that what it held (the daemon's lock on its state) is
    free when this returns."""
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


def _read_proc(pid: str, name: str) -> bytes:
    """``/proc/<pid>/<name>``, empty when the process is gone or not ours to read."""
    try:
        with open(f"/proc/{pid}/{name}", "rb") as f:
            return f.read()
    except OSError:
        return b""


def find_daemon(state_dir: str) -> tuple[int, int] | None:
    """``(pid, start time)`` of a live spacesd serving ``state_dir``, found without its pid
    file: a process with the Space's marker whose command line is ``-m spacesd ... --state
    <state_dir>`` (the provider starts it that way). Asked whenever no daemon runs (after
    a kill, before a start, at a delete), so it reads every process's command line, and
    the environment only of a spacesd's: reading both of every process, through psutil,
    was a seventh of a campaign's own time."""
    marker = os.path.realpath(state_dir)
    want = os.fsencode(f"{ENV_SPACE_STATE}={marker}")
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        argv = _read_proc(pid, "cmdline").rstrip(b"\0").split(b"\0")
        if argv[1:3] != [b"-m", b"spacesd"] or b"--state" not in argv[:-1]:
            continue
        state = os.fsdecode(argv[argv.index(b"--state") + 1])
        if os.path.realpath(state) != marker or \
                want not in _read_proc(pid, "environ").split(b"\0"):
            continue
        started = start_time(int(pid))
        if started is not None:
            return int(pid), started
    return None


def _running(proc: psutil.Process) -> bool:
    try:
        return proc.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def space_processes(state_dir: str) -> list[psutil.Process]:
    """Live processes started by the daemon of ``state_dir``: those with its marker, their
    descendants, and the members of the Space's cgroup (see the module docstring)."""
    marker = os.path.realpath(state_dir)
    found: dict[int, psutil.Process] = {}
    for proc in psutil.process_iter(["environ"]):
        env = proc.info["environ"]
        if env and env.get(ENV_SPACE_STATE) == marker:
            found[proc.pid] = proc
    for proc in list(found.values()):
        try:
            found.update((child.pid, child) for child in proc.children(recursive=True))
        except psutil.NoSuchProcess:
            continue
    cgroup = containment.space_cgroup(state_dir)
    for pid in containment.cgroup_pids(cgroup) if cgroup else []:
        try:
            found.setdefault(pid, psutil.Process(pid))
        except psutil.NoSuchProcess:
            continue
    return [p for pid, p in found.items() if pid != os.getpid() and _running(p)]


def kill_space_processes(state_dir: str, *, timeout: float = 10.0) -> None:
    """SIGKILL every process of the Space (their whole groups) and wait until none runs,
    then remove the Space's cgroup, if any (its daemon must be dead: the next one makes a
    new one).

    Several passes over all of them, the cgroup's members and the marked processes'
    descendants alike, because a process may fork while its group is being killed; the
    cgroup last (``cgroup.kill`` or frozen), for a fork that raced the passes. Not the
    cgroup first: a root command that moved itself out of the cgroup is found only as a
    descendant of its shim, which the cgroup's kill would end first."""
    cgroup = containment.space_cgroup(state_dir)
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
    if cgroup and (left := containment.kill_cgroup(cgroup, timeout=timeout)):
        raise TimeoutError(f"processes of {state_dir} in cgroup {cgroup} survived SIGKILL: "
                           f"{left}")
    if cgroup:
        containment.remove_cgroup(cgroup)
