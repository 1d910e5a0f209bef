"""The local provider against commands that escape their process group and session, and
drop the ``SPACESD_STATE`` marker of their environment: ``restart``, ``delete`` and
``kill_process`` still find and kill them, by the Space's cgroup (cgroup mode) or by descent
from a process that kept the marker (subreaper mode: the shim outlives its command's
descendants). Real daemons, real SIGKILL; liveness by (pid, start time) from /proc. Every
escapee is SIGKILLed by pid and start time when its test ends, every Space deleted."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from backends.local import LocalSpace, LocalSpaces
from spacesd import containment, procfs
from tests.escapes import (
    ESCAPES,
    check_the_fence_kills_every_escape,
    gone,
    has_marker,
    read_pid,
    start_escapes,
)


def cgroup_v2_root() -> str | None:
    with open("/proc/self/mounts") as f:
        for line in f:
            _, point, fstype = line.split()[:3]
            if fstype == "cgroup2" and os.access(point, os.W_OK):
                return point
    return None


@pytest.fixture(params=["cgroup", "subreaper"])
def mode(request) -> str:
    if request.param == "cgroup" and cgroup_v2_root() is None:
        pytest.skip("no writable cgroup v2 hierarchy here (root needed)")
    return request.param


@pytest.fixture
def cgroup_spaces(tmp_path: Path) -> Iterator[LocalSpaces]:
    """A provider whose daemons run in cgroup mode on the writable cgroup v2 hierarchy."""
    root = cgroup_v2_root()
    if root is None:
        pytest.skip("no writable cgroup v2 hierarchy here (root needed)")
    provider = LocalSpaces(tmp_path / "spaces",
                           daemon_args=["--containment", "cgroup", "--cgroup-root", root])
    yield provider
    provider.delete_all()


@pytest.fixture
def spaces(tmp_path: Path, mode: str) -> Iterator[LocalSpaces]:
    args = ["--containment", mode]
    if mode == "cgroup":
        args += ["--cgroup-root", str(cgroup_v2_root())]
    provider = LocalSpaces(tmp_path / "spaces", daemon_args=args)
    yield provider
    provider.delete_all()


def test_no_escape_survives_the_fence(spaces: LocalSpaces) -> None:
    spaces.create("s")
    check_the_fence_kills_every_escape(spaces.connect("s", epoch=1))


def test_restart_kills_escapees(spaces: LocalSpaces, escapees: list) -> None:
    spaces.create("s")
    space = spaces.get("s")
    procs = start_escapes(spaces.connect("s", epoch=1), space, escapees)
    spaces.restart("s")
    assert all(gone(p, timeout=0) for p in procs.values())  # restart returns once they are dead
    assert not spaces.connect("s", epoch=1).scan().running


def test_delete_kills_escapees_and_removes_the_spaces_cgroup(
        spaces: LocalSpaces, mode: str, escapees: list) -> None:
    spaces.create("s")
    space = spaces.get("s")
    procs = start_escapes(spaces.connect("s", epoch=1), space, escapees)
    cgroup = containment.space_cgroup(str(space.state))
    assert (cgroup is not None) == (mode == "cgroup")
    spaces.delete("s")
    assert all(gone(p, timeout=0) for p in procs.values())
    assert cgroup is None or not os.path.exists(cgroup)


def test_kill_process_accepts_an_escapee_without_the_marker(spaces: LocalSpaces,
                                                            escapees: list) -> None:
    spaces.create("s")
    space = spaces.get("s")
    client = spaces.connect("s", epoch=1)
    client.exec_start("k", ESCAPES["env-i"].format(f="k.pid"))
    pid = read_pid(space.work / "k.pid")
    started = procfs.start_time(pid)
    assert started is not None
    escapees.append((pid, started))
    spaces.kill_process("s", pid)
    assert gone((pid, started), timeout=0)


#: What a power cut or a hand may leave of ``containment.json`` while the daemon is down.
DAMAGE = {
    "empty": b"",
    "garbage": b"\x00\x17{not json",
    "another": b'{"mode": "cgroup", "cgroup": "/sys/fs/cgroup/spacesd-another-0123456789abcdef"}',
}


@pytest.mark.parametrize("damage", [None, *DAMAGE])
def test_the_cgroup_finds_an_escapee_whose_every_ancestor_died(
        cgroup_spaces: LocalSpaces, escapees: list, damage: str | None) -> None:
    """Shim killed, daemon killed: nothing with the marker is left above the ``env -i``
    escapee (init adopted it); only the Space's cgroup still finds it, for ``restart`` and
    then for ``delete``, also when the dead daemon's ``containment.json`` is damaged (the
    provider then finds the cgroup by its name)."""
    spaces = cgroup_spaces
    spaces.create("s")
    space = spaces.get("s")
    client = spaces.connect("s", epoch=1)
    for n in range(2):
        key = f"k{n}"
        shim = client.exec_start(key, f"echo $$ > {key}.sh; until [ -f {key}.go ]; do "
                                      f"sleep 0.02; done; {ESCAPES['env-i']}"
                                      .format(f=f"{key}.pid")).pid
        assert shim is not None
        read_pid(space.work / f"{key}.sh")
        spaces.kill_process("s", shim)
        spaces.kill_daemon("s")
        if damage is not None:
            (space.state / containment.STATE_FILE).write_bytes(DAMAGE[damage])
        (space.work / f"{key}.go").touch()
        pid = read_pid(space.work / f"{key}.pid")
        started = procfs.start_time(pid)
        assert started is not None
        escapees.append((pid, started))
        wait_for_a_parent_without_the_marker(pid, space)
        if n == 0:
            spaces.restart("s")
        else:
            spaces.delete("s")
        assert gone((pid, started), timeout=0)


def wait_for_a_parent_without_the_marker(pid: int, space: LocalSpace,
                                         timeout: float = 120.0) -> None:
    """Until the shell that started ``pid`` has exited and ``pid`` was adopted by a process
    that is not the Space's."""
    marker = f"SPACESD_STATE={os.path.realpath(space.state)}".encode()
    deadline = time.monotonic() + timeout
    while True:
        try:
            with open(f"/proc/{procfs.snapshot()[pid].ppid}/environ", "rb") as f:
                if marker not in f.read().split(b"\0"):
                    return
        except PermissionError:  # init, say: not a process of the Space's
            return
        assert time.monotonic() < deadline, f"{pid} kept a parent of the Space"
        time.sleep(0.01)


#: A root command that moves itself out of its record's cgroup into the hierarchy's root
#: (writing its pid into ``{root}/cgroup.procs``), then leaves its group, session and marker.
CGROUP_MOVE = ("echo $$ > {root}/cgroup.procs && exec env -i setsid sh -c "
               "'echo $$ > {f}; exec sleep 1000'")


@pytest.mark.parametrize("end", ["advance_epoch", "restart", "delete"])
def test_a_root_command_that_left_the_cgroup_is_still_killed(
        cgroup_spaces: LocalSpaces, escapees: list, end: str) -> None:
    """The cgroup alone misses it: the shim's descent finds it (the shims adopt orphans in
    cgroup mode too), for the fence and for the provider (found by a hostile-command test:
    it survived ``advance_epoch`` and ``delete``)."""
    spaces = cgroup_spaces
    spaces.create("s")
    space = spaces.get("s")
    client = spaces.connect("s", epoch=1)
    client.exec_start("k", CGROUP_MOVE.format(root=cgroup_v2_root(), f="k.pid"))
    pid = read_pid(space.work / "k.pid")
    started = procfs.start_time(pid)
    assert started is not None
    escapees.append((pid, started))
    with open(f"/proc/{pid}/cgroup") as f:
        assert "spacesd-" not in f.read(), "the command did not leave the Space's cgroup"
    assert not has_marker(pid)
    if end == "advance_epoch":
        client.with_epoch(2).advance_epoch(2)
        assert client.with_epoch(2).exec_status("k").state == "exited"
    else:
        getattr(spaces, end)("s")
    assert gone((pid, started), timeout=0)
