"""Process containment with real processes: a command's processes that leave its group and
session (``setsid ... &``, a double fork into a new session, ``env -i setsid``) die at
``advance_epoch`` and with ``exec_kill`` of their key, in every mechanism this machine has
(cgroup v2, cgroup v1 freezer, subreaper; sandbox in a PID namespace of our own), and an
explicit choice that cannot work here refuses to start.

Liveness is (pid, start time) from /proc, polled with a timeout. Every escapee a test makes
is SIGKILLed (by pid and start time) when it ends, and every Space deleted, which kills its
processes and removes its cgroup."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from backends.local import LocalSpace, LocalSpaces
from backends.space_client import Endpoint, HttpSpaceClient
from spacesd import audit, containment, procfs
from tests.escapes import ESCAPES, gone, read_pid, start_escapes, wait_pid

ROOT = str(Path(__file__).resolve().parents[2])

GATE = "until [ -f go ]; do sleep 0.02; done"


def cgroup_mounts() -> dict[str, str]:
    """``{"cgroup-v2": mount point, "cgroup-v1": freezer mount point}``, those mounted."""
    found: dict[str, str] = {}
    with open("/proc/self/mounts") as f:
        for line in f:
            _, point, fstype, options = line.split()[:4]
            if fstype == "cgroup2":
                found.setdefault("cgroup-v2", point)
            elif fstype == "cgroup" and "freezer" in options.split(","):
                found.setdefault("cgroup-v1", point)
    return found


def daemon_args(mode: str) -> list[str]:
    """The spacesd arguments of ``mode``; skips the test when this machine lacks it."""
    if mode == "subreaper":
        return ["--containment", "subreaper"]
    root = cgroup_mounts().get(mode)
    if root is None or not os.access(root, os.W_OK):
        pytest.skip(f"{mode}: no writable hierarchy here (root needed)")
    return ["--containment", "cgroup", "--cgroup-root", root]


MODES = ["cgroup-v2", "cgroup-v1", "subreaper"]


@pytest.fixture(params=MODES)
def mode(request) -> str:
    return request.param


@pytest.fixture
def contained(tmp_path: Path, mode: str) -> Iterator[LocalSpaces]:
    provider = LocalSpaces(tmp_path / "spaces", daemon_args=daemon_args(mode))
    yield provider
    provider.delete_all()


@pytest.fixture
def space(contained: LocalSpaces) -> LocalSpace:
    contained.create("s")
    return contained.get("s")


def test_escapees_of_older_epochs_die_at_advance_epoch(
        mode: str, contained: LocalSpaces, space: LocalSpace, escapees: list) -> None:
    client = contained.connect(space.name, epoch=1)
    assert client._call("capabilities")["containment"] == mode.split("-")[0]
    procs = start_escapes(client, space, escapees)
    assert sorted(client.scan().running_keys) == sorted(procs)  # escapees count as running
    answer = client.with_epoch(2).advance_epoch(2)
    assert sorted(answer["killed"]) == sorted(procs)
    assert all(gone(proc) for proc in procs.values())
    last = audit.read_state(str(space.state)).fences[-1]
    assert (last["t"], last["alive_after"]) == ("advance", [])
    assert not client.with_epoch(2).scan().running


def test_exec_kill_kills_the_escapees_of_its_key_only(
        contained: LocalSpaces, space: LocalSpace, escapees: list) -> None:
    client = contained.connect(space.name, epoch=1)
    mine = start_escapes(client, space, escapees, prefix="a-")
    others = start_escapes(client, space, escapees, prefix="b-")
    for key, proc in mine.items():
        assert client.exec_kill(key).state == "exited"
        assert gone(proc), f"exec_kill({key}) left its escapee alive"
    assert all(procfs.is_alive(*proc) for proc in others.values())
    assert sorted(client.scan().running_keys) == sorted(others)


def test_a_current_epoch_command_survives_an_idempotent_advance(
        contained: LocalSpaces, space: LocalSpace, escapees: list) -> None:
    client = contained.connect(space.name, epoch=2)
    client.advance_epoch(2)
    client.exec_start("k", f"{ESCAPES['double-fork'].format(f='k.pid')}; {GATE}")
    proc = wait_pid(space.work / "k.pid", escapees)
    assert client.advance_epoch(2) == {"floor": 2, "round": 0, "killed": []}
    assert procfs.is_alive(*proc) and client.exec_status("k").state == "running"
    assert client.with_epoch(3).advance_epoch(3)["killed"] == ["k"]
    assert gone(proc)


def test_an_escapee_that_detached_after_its_shim_died_dies_at_the_next_fence(
        contained: LocalSpaces, space: LocalSpace, escapees: list) -> None:
    """The shim is SIGKILLed first; then the command double-forks into a new session. Its
    cgroup holds the escapee, or (subreaper) the daemon adopts it as a stray."""
    client = contained.connect(space.name, epoch=1)
    command = f"echo $$ > sh.pid; {GATE}; {ESCAPES['double-fork'].format(f='k.pid')}"
    shim = client.exec_start("k", command).pid
    assert shim is not None
    read_pid(space.work / "sh.pid")  # the command runs: the shim has forked it
    contained.kill_process(space.name, shim)
    (space.work / "go").touch()
    proc = wait_pid(space.work / "k.pid", escapees)
    client.with_epoch(2).advance_epoch(2)
    assert gone(proc)
    assert audit.read_state(str(space.state)).fences[-1]["alive_after"] == []


# ------------------------------------------------------------------ refusing to start


def run_spacesd(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    (tmp_path / "work").mkdir(exist_ok=True)
    return subprocess.run(
        [sys.executable, "-m", "spacesd", "--root", str(tmp_path / "work"),
         "--state", str(tmp_path / "state"), "--token-env", "T", *args],
        env={**os.environ, "PYTHONPATH": ROOT, "T": "token"}, capture_output=True, text=True,
        timeout=60, check=False)


@pytest.mark.parametrize("root", ["/nonexistent/cgroup", "{tmp}"])
def test_cgroup_without_a_writable_hierarchy_refuses_to_start(tmp_path: Path,
                                                              root: str) -> None:
    """A cgroup root that does not exist, or that is no cgroup hierarchy (a plain
    directory), stands for a machine without a writable hierarchy."""
    root = root.format(tmp=tmp_path)
    out = run_spacesd(tmp_path, "--containment", "cgroup", "--cgroup-root", root)
    assert out.returncode == 1
    assert len(out.stderr.splitlines()) == 1, out.stderr
    assert out.stderr.startswith("spacesd: --containment cgroup needs a writable cgroup "
                                 "hierarchy")
    assert f"{root} is not in a cgroup v2 or v1 freezer hierarchy" in out.stderr
    assert "--cgroup-root" in out.stderr and "--containment subreaper" in out.stderr
    assert not (tmp_path / "state" / "port").exists()


def test_sandbox_outside_a_sandbox_refuses_to_start(tmp_path: Path) -> None:
    out = run_spacesd(tmp_path, "--containment", "sandbox")
    assert out.returncode == 1
    assert len(out.stderr.splitlines()) == 1, out.stderr
    assert "needs spacesd to be the child of spacesd.supervisor running as PID 1" in out.stderr
    assert f"its parent is pid {os.getpid()}, not PID 1" in out.stderr


# ------------------------------------------------------------------ sandbox


def host_pid(namespace: str, inner: int, timeout: float = 120.0) -> int:
    """The pid, here, of the process ``inner`` of the PID namespace ``namespace`` (the
    ``NSpid`` line of /proc/<pid>/status)."""
    deadline = time.monotonic() + timeout
    while True:
        for name in filter(str.isdigit, os.listdir("/proc")):
            try:
                if os.readlink(f"/proc/{name}/ns/pid") != namespace:
                    continue
                with open(f"/proc/{name}/status") as f:
                    nspid = next(line for line in f if line.startswith("NSpid:")).split()
            except (OSError, StopIteration):
                continue
            if int(nspid[-1]) == inner:
                return int(name)
        assert time.monotonic() < deadline, f"no process {inner} in {namespace}"
        time.sleep(0.01)


@pytest.fixture
def sandbox(tmp_path: Path) -> Iterator[tuple[HttpSpaceClient, Path, str]]:
    """spacesd under spacesd.supervisor as PID 1 of a new PID namespace (``unshare``), with
    no cgroup hierarchy to use: ``auto`` must pick sandbox. Killing PID 1 ends the test:
    the kernel kills every process of the namespace."""
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        pytest.skip("needs root and unshare(1) for a PID namespace")
    for d in ("work", "state"):
        (tmp_path / d).mkdir()
    argv = ["unshare", "--pid", "--fork", "--mount-proc", sys.executable, "-m",
            "spacesd.supervisor", "run", "--port-file", str(tmp_path / "state/port"), "--",
            "--root", str(tmp_path / "work"), "--state", str(tmp_path / "state"),
            "--token-env", "T", "--cgroup-root", "/nonexistent"]
    with open(tmp_path / "sandbox.log", "ab") as log:
        proc = subprocess.Popen(argv, env={**os.environ, "PYTHONPATH": ROOT, "T": "token"},
                                stdout=log, stderr=log, start_new_session=True)
    try:
        deadline = time.monotonic() + 30
        while not (tmp_path / "state/port").exists():
            assert time.monotonic() < deadline, (tmp_path / "sandbox.log").read_text()
            time.sleep(0.02)
        pid1 = next(p.pid for p in procfs.snapshot().values() if p.ppid == proc.pid)
        namespace = os.readlink(f"/proc/{pid1}/ns/pid")
        client = HttpSpaceClient("sandbox", 1, lambda: Endpoint(
            "127.0.0.1", int((tmp_path / "state/port").read_text()), "token"), retry_for=30)
        yield client, tmp_path / "work", namespace
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)


def test_sandbox_kills_strays_and_spares_what_came_from_outside(
        sandbox: tuple[HttpSpaceClient, Path, str], escapees: list) -> None:
    client, work, namespace = sandbox
    assert client._call("capabilities")["containment"] == "sandbox"

    def escapee(path: Path) -> tuple[int, int]:
        """(pid, start time) here of the escapee that wrote its pid (in the sandbox) to
        ``path``."""
        pid = host_pid(namespace, read_pid(path))
        started = procfs.start_time(pid)
        assert started is not None
        escapees.append((pid, started))
        return pid, started

    # A tree escapee, and a stray: it detaches after its shim was killed, so PID 1 adopts it.
    client.exec_start("tree", ESCAPES["double-fork"].format(f="tree.pid"))
    tree = escapee(work / "tree.pid")
    command = f"echo $$ > sh.pid; {GATE}; {ESCAPES['double-fork'].format(f='s.pid')}"
    shim = client.exec_start("stray", command)
    assert shim.pid is not None
    read_pid(work / "sh.pid")  # the command runs: the shim has forked it
    os.kill(host_pid(namespace, shim.pid), signal.SIGKILL)
    (work / "go").touch()
    stray = escapee(work / "s.pid")
    # One entered from outside, as with docker exec: no descendant of PID 1.
    outside = subprocess.Popen(["nsenter", "--target", str(host_pid(namespace, 1)), "--pid",
                                "--", "sleep", "1000"], start_new_session=True)
    try:
        client.with_epoch(2).advance_epoch(2)
        assert gone(tree) and gone(stray)
        assert outside.poll() is None
        # A command of the current epoch survives an idempotent advance.
        client.with_epoch(2).exec_start("now", ESCAPES["setsid"].format(f="now.pid"))
        now = escapee(work / "now.pid")
        assert client.with_epoch(2).advance_epoch(2)["killed"] == []
        assert procfs.is_alive(*now)
    finally:
        outside.kill()
        outside.wait(timeout=30)


def test_a_cgroup_removed_while_its_members_are_read_holds_none(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Regression, found by a campaign pausing Spaces on the JSONL log (`chaos run --mode
    checkpoint --log jsonl --pause-spaces`, seed 29): the provider read the members of a
    Space's cgroup while its daemon removed it, and the read failed (ENODEV) instead of
    finding none. Here the cgroup is removed between the open and the read, as it was."""
    root = cgroup_mounts().get("cgroup-v2")
    if root is None or not os.access(root, os.W_OK):
        pytest.skip("no writable cgroup v2 hierarchy here (root needed)")
    path = os.path.join(root, f"spacesd-test-gone-{os.getpid()}")
    os.mkdir(path)
    real_open = open

    def open_then_removed(file: str, *args: object, **kwargs: object) -> object:
        f = real_open(file, *args, **kwargs)  # type: ignore[call-overload]  # open's own
        if file == os.path.join(path, "cgroup.procs"):
            os.rmdir(path)
        return f

    monkeypatch.setattr(containment, "open", open_then_removed, raising=False)
    try:
        assert containment.cgroup_pids(path) == []
    finally:
        if os.path.isdir(path):
            os.rmdir(path)


# ------------------------------------------------------------------ the freezer of cgroup v2


def test_kill_cgroup_returns_once_what_it_killed_is_gone_not_once_the_cgroup_is_empty(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A killed process leaves ``cgroup.procs`` while it exits, before it is a zombie: a
    kill that returned when the cgroup read empty let a caller see it still run (a flake of
    the cgroup escapee test under load). Here the cgroup reads empty at once, and the
    process it held dies only later: ``kill_cgroup`` must wait for that death."""
    proc = subprocess.Popen(["sleep", "1000"])
    try:
        (tmp_path / "cgroup.kill").write_text("")
        reads = iter([[proc.pid]])
        monkeypatch.setattr(containment, "cgroup_pids", lambda _path: next(reads, []))
        dying = threading.Timer(0.3, proc.kill)  # its exit, slower than the cgroup's
        dying.start()
        try:
            assert containment.kill_cgroup(str(tmp_path), timeout=120) == []
            assert procfs.start_time(proc.pid) is None, "returned while it still ran"
        finally:
            dying.join()
    finally:
        proc.kill()
        proc.wait()


def test_freezing_kills_a_v2_cgroup_without_cgroup_kill(escapees: list) -> None:
    """The path taken where ``cgroup.kill`` is missing (Linux before 5.14): freeze, SIGKILL
    every member, thaw; escapees in new sessions included."""
    root = cgroup_mounts().get("cgroup-v2")
    if root is None or not os.access(root, os.W_OK):
        pytest.skip("no writable cgroup v2 hierarchy here (root needed)")
    path = os.path.join(root, f"spacesd-test-freeze-{os.getpid()}")
    os.mkdir(path)
    try:
        child = subprocess.Popen(
            ["sh", "-c", (f"echo $$ > {path}/cgroup.procs; "
                          "for n in 1 2 3; do setsid sleep 1000 & done; exec sleep 1000")])
        deadline = time.monotonic() + 30
        while len(containment.cgroup_pids(path)) < 4:
            assert time.monotonic() < deadline, "the processes never joined"
            time.sleep(0.01)
        escapees.extend((p, t) for p in containment.cgroup_pids(path)
                        if (t := procfs.start_time(p)) is not None)
        while containment.cgroup_pids(path):
            assert time.monotonic() < deadline, "the frozen cgroup never emptied"
            containment._kill_frozen(path, time.monotonic() + 5)
            time.sleep(0.01)
        child.wait(timeout=30)
        assert not any(procfs.is_alive(*p) for p in escapees)
    finally:
        containment.kill_cgroup(path)
        containment.remove_cgroup(path)
    assert not os.path.exists(path)
