"""The guest agent's answers (``spacesd.guest_agent``), on this machine: the microVM tests
run it inside real guests."""

from __future__ import annotations

import base64
import errno
import io
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from spacesd.guest_agent import Agent


def test_the_agent_answers_each_request_by_its_id(tmp_path: Path) -> None:
    state = tmp_path / "state"
    (state / "exec").mkdir(parents=True)
    for rel in ("ledger.jsonl", "fences.jsonl", "epoch", "exec/k.claim", "exec/k.exit",
                "exec/k.out", "token"):
        (state / rel).write_text(rel)
    agent = Agent(str(state), str(state / "daemon.pid"))
    assert agent.answer("a1 ping") == "a1 ok"
    assert agent.answer("a2 sync") == "a2 ok"
    rid, ok, data = agent.answer("a3 state").split(" ")
    assert (rid, ok) == ("a3", "ok")
    with tarfile.open(fileobj=io.BytesIO(base64.b64decode(data))) as tar:
        names = sorted(tar.getnames())
    assert names == ["epoch", "exec/k.claim", "exec/k.exit", "fences.jsonl", "ledger.jsonl"]
    assert agent.answer("a4 dance").startswith("a4 error ValueError: unknown command 'dance'")
    assert agent.answer("a5 kill-daemon").startswith("a5 error RuntimeError: kill-daemon")
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        assert agent.answer(f"a6 kill {sleeper.pid}") == "a6 ok"
        assert sleeper.wait(timeout=120) == -9
    finally:
        sleeper.kill()
        sleeper.wait()


def test_fill_disk_leaves_what_it_is_told_and_free_disk_gives_the_room_back(
        tmp_path: Path) -> None:
    """On a real filesystem of its own (a 4 MiB tmpfs): after ``fill-disk 8192`` at most two
    pages are free, for root too; a bigger write meets ENOSPC; ``free-disk`` undoes it."""
    if os.geteuid() != 0:
        pytest.skip("a disk of its own is a tmpfs mount, which needs root")
    disk = tmp_path / "disk"
    disk.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(disk)], check=True)
    try:
        state = disk / "spacesd"
        state.mkdir()
        agent = Agent(str(state), str(state / "daemon.pid"))
        rid, ok, free = agent.answer("f1 fill-disk 8192").split(" ")
        assert (rid, ok) == ("f1", "ok")
        assert 0 <= int(free) <= 8192 + 4096
        assert sorted(os.listdir(disk)) == ["cua-disk-filler", "spacesd"]  # beside the state
        with pytest.raises(OSError) as full:
            (disk / "big").write_bytes(b"x" * 64 * 1024)
        assert full.value.errno == errno.ENOSPC
        assert agent.answer("f2 fill-disk 0").startswith("f2 ok")  # again: no harm
        assert agent.answer("f3 free-disk") == "f3 ok"
        assert agent.answer("f4 free-disk") == "f4 ok"  # nothing to free is no error
        (disk / "big").write_bytes(b"x" * 64 * 1024)
        assert sorted(os.listdir(disk)) == ["big", "spacesd"]
    finally:
        subprocess.run(["umount", str(disk)], check=True)
