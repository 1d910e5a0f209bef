"""Processes that escape their command's process group and session, for the containment
tests of spacesd and of the local provider: how to start them and how to watch them die."""

from __future__ import annotations

import time
from pathlib import Path

from backends.local import LocalSpace
from backends.space_client import HttpSpaceClient
from spacesd import procfs

#: Commands that each leave one escapee writing its pid to the file ``{f}``.
ESCAPES = {
    "setsid": "setsid sh -c 'echo $$ > {f}; exec sleep 1000' &",
    "double-fork": "( ( setsid sh -c 'echo $$ > {f}; exec sleep 1000' & ) & )",
    "env-i": "env -i setsid sh -c 'echo $$ > {f}; exec sleep 1000' &",
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


def gone(proc: tuple[int, int], timeout: float = 10.0) -> bool:
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
