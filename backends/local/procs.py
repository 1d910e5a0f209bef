"""Processes of a local Space, seen from the host: the daemon and what it started.

The daemon is named by ``<pid> <start time>`` in its pid file (or, without one, found as the
holder of its state's lock), and is killed only if that pair still matches (a pid alone may
belong to an unrelated process by now). The commands
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
from contextlib import suppress

import psutil

# spacesd.containment is standard library only, like all of spacesd: importable here.
from spacesd import containment
from spacesd.procfs import start_time
from spacesd.protocol import ENV_SPACE_STATE, STATE_DAEMON_LOCK


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


def _fd_links(pid: int) -> list[str]:
    """``/proc/<pid>/fd/<fd>`` of each descriptor ``pid`` holds; empty when it is gone or not
    ours to read."""
    try:
        return [f"/proc/{pid}/fd/{fd}" for fd in os.listdir(f"/proc/{pid}/fd")]
    except OSError:
        return []


def _open_files(pid: int) -> set[str]:
    """The paths of the files ``pid`` holds open (as the kernel names them, a removed one's
    without its `` (deleted)``)."""
    paths: set[str] = set()
    for link in _fd_links(pid):
        try:
            paths.add(os.readlink(link).removesuffix(" (deleted)"))
        except OSError:
            continue
    return paths


def _holds(pid: int, file: os.stat_result) -> bool:
    """Whether ``pid`` holds ``file`` open (the same device and inode, whatever its path)."""
    for link in _fd_links(pid):
        try:
            held = os.stat(link)
        except OSError:
            continue
        if (held.st_dev, held.st_ino) == (file.st_dev, file.st_ino):
            return True
    return False


def find_daemon(state_dir: str) -> tuple[int, int] | None:
    """``(pid, start time)`` of a live spacesd serving ``state_dir``, found without its pid
    file: the process its state's lock names (``STATE_DAEMON_LOCK``: spacesd takes it before
    anything else and writes its pid in it), if that process holds the lock file open. Not
    by its command line or environment, which a daemon forked by ``spacesd.fork_server`` has
    from the server. Asked whenever no daemon runs (after a kill, before a start, at a
    delete), so it reads one file and one process's descriptors."""
    try:
        with open(os.path.join(state_dir, STATE_DAEMON_LOCK), "rb") as f:
            lock = os.fstat(f.fileno())
            pid = int(f.read(32).split()[0])
    except (OSError, ValueError, IndexError):
        return None
    if not _holds(pid, lock):
        return None
    started = start_time(pid)
    return None if started is None else (pid, started)


def daemons_under(roots: list[str]) -> list[tuple[int, int]]:
    """``(pid, start time)`` of every live spacesd whose state is under one of ``roots``,
    even after its directory was removed: the processes that hold a state's lock (in
    ``/proc/locks``) and have one under a root open."""
    prefixes = tuple(os.path.join(os.path.realpath(r), "") for r in roots)
    holders = set()
    try:
        with open("/proc/locks") as f:
            for line in f:  # "1: FLOCK  ADVISORY  WRITE <pid> <dev>:<inode> 0 EOF"
                fields = line.split()
                if len(fields) > 4 and fields[1] == "FLOCK" and fields[4].isdigit():
                    holders.add(int(fields[4]))
    except OSError:
        return []
    found = []
    for pid in sorted(holders):
        if any(path.startswith(prefixes) and os.path.basename(path) == STATE_DAEMON_LOCK
               for path in _open_files(pid)):
            started = start_time(pid)
            if started is not None:
                found.append((pid, started))
    return found


def _running(proc: psutil.Process) -> bool:
    try:
        return proc.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def space_processes(state_dir: str) -> list[psutil.Process]:
    """Live processes of the Space of ``state_dir``: its daemon, the processes with its
    marker, their descendants, and the members of the Space's cgroup (see the module
    docstring)."""
    marker = os.path.realpath(state_dir)
    found: dict[int, psutil.Process] = {}
    daemon = find_daemon(state_dir)  # a forked one's environment is its server's
    if daemon is not None:
        with suppress(psutil.NoSuchProcess):
            found[daemon[0]] = psutil.Process(daemon[0])
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
