"""Processes that escape their command's process group and session, for the containment
tests of spacesd and of the local provider: how to start them and how to watch them die."""

from __future__ import annotations

import time
from pathlib import Path

from backends.local import LocalSpace
from backends.space_client import HttpSpaceClient
from durable.errors import SpaceError
from scenarios.steps import CGROUP_ESCAPE
from spacesd import procfs

#: Commands that each leave one escapee writing its pid to the file ``{f}``; the last also
#: moves itself to the root cgroup of each hierarchy first, where it can (root).
ESCAPES = {
    "setsid": "setsid sh -c 'echo $$ > {f}; exec sleep 1000' &",
    "double-fork": "( ( setsid sh -c 'echo $$ > {f}; exec sleep 1000' & ) & )",
    "env-i": "env -i setsid sh -c 'echo $$ > {f}; exec sleep 1000' &",
    "cgroup-move": f"sh -c '{CGROUP_ESCAPE} exec env -i setsid sh -c "
                   "\"echo \\$\\$ > {f}; exec sleep 1000\"' &",
}


def read_pid(path: Path, timeout: float = 30.0) -> int:
    """The pid a process wrote to ``path``, once it is there."""
    deadline = time.monotonic() + timeout
    while not (path.exists() and path.read_text().strip()):
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.01)
    return int(path.read_text())


def wait_pid(path: Path, found: list[tuple[int, int]]) -> tuple[int, int]:
    """``(pid, start time)`` of the process that wrote its pid to ``path``, added to
    ``found``."""
    pid = read_pid(path)
    started = procfs.start_time(pid)
    assert started is not None, f"escapee {pid} died on its own"
    found.append((pid, started))
    return pid, started


def gone(proc: tuple[int, int], timeout: float = 120.0) -> bool:
    """Whether ``proc`` is dead within ``timeout``."""
    deadline = time.monotonic() + timeout
    while procfs.is_alive(*proc):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def stat_ids(pid: int) -> tuple[int, int]:
    """(process group, session) of ``pid``."""
    table = procfs.snapshot()
    return table[pid].pgid, table[pid].sid


def has_marker(pid: int) -> bool:
    with open(f"/proc/{pid}/environ", "rb") as f:
        return b"SPACESD_STATE=" in f.read()


def start_escapes(client: HttpSpaceClient, space: LocalSpace, found: list[tuple[int, int]],
                  prefix: str = "") -> dict[str, tuple[int, int]]:
    """One key per way of escaping (``<prefix><kind>``), each leaving one escapee that
    really left its command's group and session (the ``env -i`` one its marker too); the
    escapees by key, also added to ``found``."""
    out = {}
    for kind, command in ESCAPES.items():
        key = prefix + kind
        pgid = client.exec_start(key, command.format(f=f"{key}.pid")).pid
        assert client.exec_wait(key, timeout=60).exit_code == 0
        out[key] = proc = wait_pid(space.work / f"{key}.pid", found)
        assert pgid not in stat_ids(proc[0]), f"{kind}: the escapee stayed in group {pgid}"
    assert not has_marker(out[prefix + "env-i"][0])
    return out


def check_the_fence_kills_every_escape(client: HttpSpaceClient,
                                       timeout: float = 120.0) -> None:
    """In any Space (local, docker, microvm): one escapee of each of ``ESCAPES`` started at
    ``client``'s epoch; ``advance_epoch`` one above must leave none of them alive, as the
    Space itself sees (``kill -0`` from a command of the newer epoch)."""
    pids = {}
    for kind, command in ESCAPES.items():
        key = f"escape-{kind}"
        client.exec_start(key, command.format(f=f"{key}.pid"))
        deadline = time.monotonic() + timeout
        while True:
            try:
                text = client.read_file(f"{key}.pid").decode().strip()
            except SpaceError:
                text = ""
            if text:
                pids[kind] = int(text)
                break
            assert time.monotonic() < deadline, f"{kind}: no escapee wrote {key}.pid"
            time.sleep(0.05)
    newer = client.with_epoch(client.epoch + 1)
    newer.advance_epoch(newer.epoch)
    probe = "; ".join(f"kill -0 {pid} 2>/dev/null && echo {kind}"
                      for kind, pid in pids.items())
    newer.exec_start("escape-probe", f"{probe}; true")
    info = newer.exec_wait("escape-probe", timeout=timeout)
    assert info.exit_code == 0 and info.output.split() == [], \
        f"alive after advance_epoch: {info.output.split()}"
