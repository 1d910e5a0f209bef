"""The fence journal (``fences.jsonl``): every sweep, advance and restore is recorded with
what was alive of an older epoch, checked afresh in /proc, and recording changes nothing
the operations do or answer."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from backends.local import LocalSpace, LocalSpaces
from backends.space_client import HttpSpaceClient
from durable.errors import StaleEpochError
from spacesd import audit, procfs
from spacesd.daemon import Daemon


def fences(state: Path) -> list[dict]:
    """The records without their times."""
    return [{k: v for k, v in f.items() if k != "ms"}
            for f in audit.read_state(str(state)).fences]


def test_advances_and_restores_are_recorded(spaces: LocalSpaces, space: LocalSpace,
                                            client: HttpSpaceClient) -> None:
    client.write_file("a.txt", b"one")
    client.checkpoint_create("cp")
    client.exec_start("k", "sleep 300")
    before = int(time.time() * 1000)
    assert client.with_epoch(2).advance_epoch(2) == {"floor": 2, "round": 0, "killed": ["k"]}
    assert client.with_epoch(2).advance_epoch(2) == {"floor": 2, "round": 0, "killed": []}
    with pytest.raises(StaleEpochError):
        client.advance_epoch(1)
    # its owner's own fence: what epoch 2 itself started dies too
    client.with_epoch(2).exec_start("k2", "sleep 300")
    assert client.with_epoch(2).advance_epoch(2, own=True) == {"floor": 2, "round": 1,
                                                                "killed": ["k2"]}
    client.with_epoch(3).checkpoint_restore("cp")
    assert fences(space.state) == [
        {"t": "sweep", "floor": 0, "killed": [], "alive_after": []},
        {"t": "advance", "epoch": 2, "floor_before": 0, "raised": True, "killed": ["k"],
         "alive_after": [], "own": False},
        {"t": "advance", "epoch": 2, "floor_before": 2, "raised": False, "killed": [],
         "alive_after": [], "own": False},
        {"t": "advance", "epoch": 2, "floor_before": 2, "raised": False, "killed": ["k2"],
         "alive_after": [], "own": True},
        {"t": "restore", "id": "cp", "epoch": 3, "floor": 2, "alive_after": []},
    ]
    assert all(f["ms"] >= before for f in audit.read_state(str(space.state)).fences[1:])
    spaces.restart(space.name)
    assert fences(space.state)[-1] == {"t": "sweep", "floor": 2, "killed": [],
                                       "alive_after": []}


def test_alive_is_checked_in_proc_not_taken_from_memory(tmp_path: Path, monkeypatch) -> None:
    """In-process, with group kills that do nothing (a process stuck in the kernel): the
    ledger does not pretend the command ended, and the journal says it is alive."""
    (tmp_path / "work").mkdir()
    state = tmp_path / "state"
    daemon = Daemon(str(tmp_path / "work"), str(state))
    pgid = daemon.call("exec_start", {"epoch": 1, "key": "k",
                                      "command": "touch started; sleep 300"})["pid"]
    try:
        deadline = time.monotonic() + 30
        while not (tmp_path / "work" / "started").exists():  # the shim claimed the key
            assert time.monotonic() < deadline, "the command never started"
            time.sleep(0.01)
        monkeypatch.setattr(procfs, "kill_groups", lambda pgids, **_: set(pgids))
        assert daemon.call("advance_epoch", {"epoch": 2})["killed"] == []
        assert daemon.ledger.running_keys() == ["k"]
        assert daemon.call("exec_status", {"epoch": 2, "key": "k"})["state"] == "running"
        daemon.call("checkpoint_create", {"epoch": 2, "id": "cp"})
        daemon.call("checkpoint_restore", {"epoch": 2, "id": "cp"})
        Daemon(str(tmp_path / "work"), str(state)).close()  # a start-up sweep
        assert [(f["t"], f.get("alive_after", f.get("alive_older"))) for f in fences(state)] \
            == [("sweep", []), ("advance", ["k"]), ("restore", ["k"]), ("sweep", ["k"])]
    finally:
        daemon.close()
        os.killpg(pgid, signal.SIGKILL)
    deadline = time.monotonic() + 30  # the launcher's child, which the kernel reaps
    while procfs.group_members([pgid]):
        assert time.monotonic() < deadline, f"group {pgid} outlived its SIGKILL"
        time.sleep(0.01)


def test_a_key_of_an_earlier_life_names_no_process_of_this_one(tmp_path: Path) -> None:
    """After a container restart (or a reboot) pids begin again: found by the docker
    campaign, a new process (the shim launcher) got the pid an old command's shim had
    claimed, and the fence took it for that command's group, reported it alive and would
    kill it. A key started in another ``procfs.life`` has no live process: an innocent
    group leader with the claimed pid and start time is neither counted nor killed."""
    (tmp_path / "work").mkdir()
    state = tmp_path / "state"
    innocent = subprocess.Popen(["sleep", "300"], start_new_session=True)
    try:
        started = procfs.start_time(innocent.pid)
        assert started is not None
        Daemon(str(tmp_path / "work"), str(state)).close()  # the state directory's layout
        key_id = "0" * 32
        with open(state / "ledger.jsonl", "a") as f:  # as an earlier life left it
            f.write(json.dumps({"t": "start", "key": "old", "id": key_id, "command": "sleep 1",
                                "cwd": str(tmp_path / "work"), "epoch": 1, "ms": 1,
                                "life": "another-boot:1"}) + "\n")
        (state / "exec" / f"{key_id}.claim").write_text(f"{innocent.pid} {started}\n")
        daemon = Daemon(str(tmp_path / "work"), str(state))
        try:
            assert daemon.call("exec_status", {"epoch": 1, "key": "old"})["state"] == "lost"
            assert daemon.call("advance_epoch", {"epoch": 2})["killed"] == []
            assert fences(state)[-1] == {"t": "advance", "epoch": 2, "floor_before": 0,
                                         "raised": True, "killed": [], "alive_after": [],
                                         "own": False}
        finally:
            daemon.close()
        assert innocent.poll() is None, "the fence killed a process of this life"
    finally:
        innocent.kill()
        innocent.wait()
