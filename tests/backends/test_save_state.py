"""``save_state`` of the local provider and ``spacesd.audit.read_state`` on the copy: the
copy says what the live daemon says, with the daemon up or down, and holds only the files
an audit reads."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from backends.local import LocalSpaces
from backends.local.procs import kill_process
from durable.errors import SpaceNotFound
from spacesd import audit
from tests.backends.loss_contract import check_a_loss_is_one_instant


def files_under(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*") if p.is_file()}


def started(client, work: Path, key: str, command: str) -> None:
    """Start ``command`` under ``key`` and wait until it runs (its shim claimed the key)."""
    client.exec_start(key, f"touch {key}.started; {command}")
    deadline = time.monotonic() + 30
    while not (work / f"{key}.started").exists():
        assert time.monotonic() < deadline, f"{key} never started"
        time.sleep(0.01)


def test_the_saved_state_reads_as_exec_status_says(spaces: LocalSpaces,
                                                   tmp_path: Path) -> None:
    spaces.create("s")
    space = spaces.get("s")
    old = spaces.connect("s", epoch=1)
    old.mkdir("sub")
    old.exec_start("ok", "echo hi", cwd="sub")
    old.exec_start("fail", "exit 3")
    for key in ("ok", "fail"):
        old.exec_wait(key, timeout=60)
    started(old, space.work, "killed", "sleep 300")
    old.exec_kill("killed")
    started(old, space.work, "lost", "sleep 300")
    spaces.restart("s")
    started(old, space.work, "fenced", "sleep 300")
    new = old.with_epoch(2)
    new.advance_epoch(2)
    started(new, space.work, "running", "sleep 300")
    new.checkpoint_create("cp")

    keys = ["ok", "fail", "killed", "lost", "fenced", "running"]
    spaces.save_state("s", tmp_path / "saved")
    saved = audit.read_state(str(tmp_path / "saved"))
    assert saved == audit.read_state(str(space.state))
    assert [k.key for k in saved.keys] == keys and saved.floor == 2
    for key in keys:
        live, got = new.exec_status(key), saved.key(key)
        assert (got.epoch, got.started_ms, got.exit_code, got.signal, got.fenced_by,
                got.ended_ms) == (live.epoch, live.started_ms, live.exit_code, live.signal,
                                  live.fenced_by, live.ended_ms), key
        assert got.spawned, key
    assert [new.exec_status(k).state for k in keys] == \
        ["exited", "exited", "exited", "lost", "exited", "running"]
    assert saved.key("ok").command == "echo hi"
    assert saved.key("ok").cwd == str(space.work.resolve() / "sub")
    assert [f["t"] for f in saved.fences] == ["sweep", "sweep", "advance"]
    assert saved.to_json()["keys"][1] == {
        "key": "fail", "command": "exit 3", "cwd": str(space.work.resolve()), "epoch": 1,
        "started_ms": saved.key("fail").started_ms, "spawned": True, "exit_code": 3,
        "signal": None, "ended_ms": saved.key("fail").ended_ms, "fenced_by": None,
        "starts": 1}

    copied = files_under(tmp_path / "saved")
    top = {"ledger.jsonl", "fences.jsonl", "epoch", "space_id"}
    assert top <= copied
    assert {os.path.splitext(f)[1] for f in copied - top} == {".claim", ".exit"}
    assert saved.space_id == new.describe()["space_id"]
    assert all(f.startswith("exec/") for f in copied if f.endswith((".claim", ".exit")))

    kill_process(*space.daemon())  # with no daemon: the same files, the same audit
    spaces.save_state("s", tmp_path / "again")
    assert audit.read_state(str(tmp_path / "again")) == saved


def test_saving_a_missing_space_says_so(spaces: LocalSpaces, tmp_path: Path) -> None:
    with pytest.raises(SpaceNotFound):
        spaces.save_state("nope", tmp_path / "saved")
    assert not (tmp_path / "saved").exists()
    with pytest.raises(FileNotFoundError, match="save_state"):
        audit.read_state(str(tmp_path / "saved"))


def test_a_loss_saves_the_state_of_its_instant(spaces: LocalSpaces, tmp_path: Path) -> None:
    check_a_loss_is_one_instant(spaces, "s", tmp_path / "lost")
    with pytest.raises(SpaceNotFound):
        spaces.lose("nope", tmp_path / "none")
