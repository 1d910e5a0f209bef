"""The daemon's failpoints with real processes: SIGKILL the daemon (or a shim) exactly at a
point, start a new daemon on the same state, and check that no key ever runs twice and that
the fence journal says what happened.

The ``failpoints`` fixture (conftest) answers every point and kills the first process that
reaches ``kill_at``; a client with ``retry_for=0`` sees its request fail at once when the
daemon dies under it, and ``spaces.create`` starts a new daemon on the same state.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest

from backends.local import LocalSpace, LocalSpaces
from backends.space_client import HttpSpaceClient
from durable.errors import SpaceUnavailable
from spacesd import audit, procfs, shim
from spacesd.failpoints import POINTS, Channel

#: Runs until the test creates the file ``go`` in the workspace.
GATE = "until [ -f go ]; do sleep 0.02; done"


def wait_for_file(path: Path, timeout: float = 30.0) -> str:
    deadline = time.monotonic() + timeout
    while not (path.exists() and path.read_text().strip()):
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.01)
    return path.read_text()


def fragile(space: LocalSpace, epoch: int) -> HttpSpaceClient:
    """A client that gives up at once when the daemon dies under a request."""
    return HttpSpaceClient(space.name, epoch, space.endpoint, retry_for=0)


@pytest.fixture
def fp_space(fp_spaces: LocalSpaces) -> LocalSpace:
    fp_spaces.create("s1")
    return fp_spaces.get("s1")


def test_killed_after_recording_a_key_it_is_lost_and_never_runs(
        fp_spaces: LocalSpaces, fp_space: LocalSpace, failpoints) -> None:
    failpoints.kill_at = "spacesd.exec.recorded"
    daemon = fp_space.daemon()
    with pytest.raises(SpaceUnavailable):
        fragile(fp_space, 1).exec_start("k", "echo ran >> runs.txt")
    [hit] = failpoints.killed
    assert hit.pid == daemon[0]
    assert hit.info == {"process": "spacesd", "space_state": str(fp_space.state.resolve()),
                        "key": "k", "epoch": 1}
    fp_spaces.create(fp_space.name)  # a new daemon on the same state
    client = fp_spaces.connect(fp_space.name, epoch=1)
    assert client.exec_status("k").state == "lost"
    assert client.exec_start("k", "echo ran >> runs.txt").state == "lost"
    # Any command started after the retry has ended: the lost key had every chance to run.
    client.exec_start("later", "echo later >> later.txt")
    assert client.exec_wait("later", timeout=60).exit_code == 0
    assert not (fp_space.work / "runs.txt").exists()
    assert audit.read_state(str(fp_space.state)).key("k").spawned is False


def test_killed_after_spawning_the_key_runs_once_and_is_reattached(
        fp_spaces: LocalSpaces, fp_space: LocalSpace, failpoints) -> None:
    failpoints.kill_at = "spacesd.exec.spawned"
    command = f"echo x >> runs.txt; {GATE}; echo done"
    with pytest.raises(SpaceUnavailable):
        fragile(fp_space, 1).exec_start("k", command)
    [hit] = failpoints.killed
    assert hit.info["key"] == "k" and hit.info["process"] == "spacesd"
    wait_for_file(fp_space.work / "runs.txt")  # the shim outlived its daemon and runs it
    fp_spaces.create(fp_space.name)
    client = fp_spaces.connect(fp_space.name, epoch=1)
    again = client.exec_start("k", command)
    assert again.state == "running" and again.pid == hit.info["shim_pid"]
    (fp_space.work / "go").touch()
    final = client.exec_wait("k", timeout=60)
    assert (final.state, final.exit_code, final.output) == ("exited", 0, "done\n")
    assert client.exec_start("k", command).state == "exited"
    assert (fp_space.work / "runs.txt").read_text() == "x\n"


def test_shim_killed_while_writing_the_exit_leaves_the_key_lost_after_one_run(
        fp_spaces: LocalSpaces, fp_space: LocalSpace, failpoints) -> None:
    failpoints.kill_at = "spacesd.exec.exit_writing"
    client = fp_spaces.connect(fp_space.name, epoch=1)
    started = client.exec_start("k", "echo x >> runs.txt")
    final = client.exec_wait("k", timeout=60)
    [hit] = failpoints.killed
    assert hit.pid == started.pid  # the shim, not the daemon
    assert hit.info == {"process": "shim", "space_state": str(fp_space.state.resolve()),
                        "key": "k"}
    assert final.state == "lost"
    assert client.exec_start("k", "echo x >> runs.txt").state == "lost"
    assert (fp_space.work / "runs.txt").read_text() == "x\n"
    key = audit.read_state(str(fp_space.state)).key("k")
    assert key.spawned and key.exit_code is None and key.signal is None


def test_killed_after_persisting_a_floor_the_next_daemon_sweeps_older_processes(
        fp_spaces: LocalSpaces, fp_space: LocalSpace, failpoints) -> None:
    old = fp_spaces.connect(fp_space.name, epoch=1)
    pgid = old.exec_start("k", "echo x >> runs.txt; sleep 300").pid
    wait_for_file(fp_space.work / "runs.txt")
    failpoints.kill_at = "spacesd.advance.persisted"
    with pytest.raises(SpaceUnavailable):
        fragile(fp_space, 2).advance_epoch(2)
    [hit] = failpoints.killed
    assert (hit.info["epoch"], hit.info["floor_before"]) == (2, 0)
    assert procfs.group_members([pgid])  # the daemon died before it killed anything
    fp_spaces.create(fp_space.name)  # its start-up sweep finishes the advance
    assert not procfs.group_members([pgid])
    info = fp_spaces.connect(fp_space.name, epoch=2).exec_status("k")
    assert (info.state, info.signal, info.fenced_by) == ("exited", 9, 2)
    fences = audit.read_state(str(fp_space.state)).fences
    assert [f["t"] for f in fences] == ["sweep", "sweep"]  # no advance was recorded
    assert {k: fences[-1][k] for k in ("floor", "killed", "alive_after")} == \
        {"floor": 2, "killed": ["k"], "alive_after": []}


def test_checkpoint_and_restore_points_name_the_checkpoint(
        fp_spaces: LocalSpaces, fp_space: LocalSpace, failpoints) -> None:
    client = fp_spaces.connect(fp_space.name, epoch=1)
    client.write_file("a.txt", b"one")
    failpoints.kill_at = "spacesd.checkpoint.objects"
    with pytest.raises(SpaceUnavailable):
        fragile(fp_space, 1).checkpoint_create("cp")
    fp_spaces.create(fp_space.name)
    assert client.checkpoint_list() == []  # objects stored, manifest never saved
    client.checkpoint_create("cp")
    client.write_file("a.txt", b"two")
    client.write_file("b.txt", b"extra")
    client.checkpoint_restore("cp")
    [partial] = failpoints.hits("spacesd.restore.partial")
    assert partial.info["id"] == "cp" and partial.pid == fp_space.daemon()[0]
    assert (fp_space.work / "a.txt").read_bytes() == b"one"
    assert not (fp_space.work / "b.txt").exists()


def test_commands_never_see_the_failpoint_channel(
        fp_spaces: LocalSpaces, fp_space: LocalSpace, failpoints) -> None:
    client = fp_spaces.connect(fp_space.name, epoch=1)
    asked = {"CUA_FAILPOINTS": "unix:/x", "SPACESD_SHIM_FAILPOINTS": "{}", "MINE": "1"}
    client.exec_start("k", "env", env=asked)
    out = client.exec_wait("k", timeout=60).output
    assert "MINE=1" in out.splitlines()
    assert "FAILPOINTS" not in out
    # ... while the shim that ran it had the channel.
    assert [h.info["key"] for h in failpoints.hits("spacesd.exec.exit_writing")] == ["k"]


def test_with_failpoints_off_nothing_connects(spaces: LocalSpaces, monkeypatch) -> None:
    """A listening socket nobody accepts from: any connection would wait in its backlog."""
    with tempfile.TemporaryDirectory(prefix="fp-") as short:
        path = os.path.join(short, "fp.sock")
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as listener:
            listener.bind(path)
            listener.listen(16)
            # In the creator's environment only: the provider does not pass it on.
            monkeypatch.setenv("CUA_FAILPOINTS", f"unix:{path}")
            spaces.create("s")
            client = spaces.connect("s", epoch=1)
            client.exec_start("k", "echo x")
            client.exec_wait("k", timeout=60)
            client.checkpoint_create("cp")
            client.checkpoint_restore("cp")
            client.with_epoch(2).advance_epoch(2)
            spaces.kill_daemon("s")
            listener.setblocking(False)
            with pytest.raises(BlockingIOError):
                listener.accept()


def test_the_shim_imports_nothing_more_when_failpoints_are_off(tmp_path: Path) -> None:
    claim, exit_path = tmp_path / "claim", tmp_path / "exit"
    out = subprocess.run(
        [sys.executable, "-I", "-S", "-X", "importtime", shim.SHIM_PATH, shutil.which("bash"),
         str(claim), str(exit_path), str(tmp_path), "true"],
        env={"PATH": os.defpath}, capture_output=True, text=True, timeout=60, check=True)
    imported = {line.split("|")[-1].strip() for line in out.stderr.splitlines()
                if line.startswith("import time:")}
    assert json.loads(exit_path.read_text())["exit_code"] == 0
    assert not imported & {"socket", "json", "spacesd.failpoints", "threading"}, imported


def test_a_broken_channel_turns_failpoints_off_and_the_daemon_goes_on(tmp_path: Path) -> None:
    spaces = LocalSpaces(tmp_path / "spaces", failpoints=f"unix:{tmp_path}/nobody.sock")
    try:
        spaces.create("s")
        client = spaces.connect("s", epoch=1)
        client.exec_start("k", "echo x")
        assert client.exec_wait("k", timeout=60).output == "x\n"
        client.checkpoint_create("cp")
        assert client.with_epoch(2).advance_epoch(2)["floor"] == 2
    finally:
        spaces.delete_all()


def test_an_unknown_point_is_refused_with_where_to_add_it() -> None:
    channel = Channel("unix:/nowhere", POINTS, registry="spacesd.failpoints.POINTS")
    with pytest.raises(ValueError, match=r"add it to spacesd\.failpoints\.POINTS"):
        channel.report("spacesd.nope", {})
    assert shim.failpoints_env(Channel(None, POINTS, registry="x").address, {"key": "k"}) == {}


def test_a_runner_that_goes_away_turns_the_channel_off_for_good(tmp_path: Path) -> None:
    """In-process: a runner that reads one report and hangs up without answering."""
    path = str(tmp_path / "fp.sock")
    reports: list[dict] = []
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as listener:
        listener.bind(path)
        listener.listen(1)

        def runner() -> None:
            conn, _ = listener.accept()
            with conn, conn.makefile("r") as lines:
                reports.append(json.loads(lines.readline()))

        thread = threading.Thread(target=runner)
        thread.start()
        try:
            channel = Channel(f"unix:{path}", POINTS, registry="spacesd.failpoints.POINTS",
                              context={"process": "spacesd"})
            channel.report("spacesd.exec.recorded", {"key": "k"})  # returns: no answer came
            assert not channel.enabled
            channel.report("spacesd.exec.spawned", {"key": "k"})  # off: nothing sent
        finally:
            thread.join(timeout=30)
    assert reports == [{"point": "spacesd.exec.recorded", "n": 1, "pid": os.getpid(),
                        "info": {"process": "spacesd", "key": "k"}}]
