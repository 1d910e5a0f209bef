"""Atomic replacement (``spacesd.fsio.AtomicWriter``) on a workspace whose filesystem is not
the daemon's: the temp file then lives next to its target, inside the workspace, and a
daemon killed while it exists must not leave it there for a scan to count."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from spacesd.fsio import AtomicWriter

#: A child that writes ``target`` through an AtomicWriter on ``tmp`` and SIGKILLs itself in
#: the middle of the content, the temp file half written next to the target.
DIES_MID_WRITE = """
import os, signal, sys
from spacesd.fsio import AtomicWriter

def chunks():
    yield b"half of it"
    os.kill(os.getpid(), signal.SIGKILL)
    yield b"never"

tmp, target = sys.argv[1:]
writer = AtomicWriter(tmp)
writer.write(target, chunks(), mode=0o644)
"""


@pytest.mark.parametrize("name", ["doc.txt", "odd\nname \\ with 'quotes'"])
def test_a_temp_file_a_killed_writer_left_in_the_workspace_is_removed_by_the_next(
        tmp_path: Path, disk: Path, name: str) -> None:
    tmp = tmp_path / "state" / "tmp"
    target = disk / "sub" / name
    target.parent.mkdir()
    target.write_bytes(b"before")
    died = subprocess.run([sys.executable, "-c", DIES_MID_WRITE, str(tmp), str(target)],
                          cwd=Path(__file__).resolve().parents[2], capture_output=True)
    assert died.returncode == -signal.SIGKILL, died.stderr.decode()
    left = [p.name for p in target.parent.iterdir() if p.name != name]
    assert len(left) == 1 and ".spacesd-" in left[0], left  # the half-written temp file
    AtomicWriter(str(tmp))  # the next daemon's
    assert sorted(p.name for p in target.parent.iterdir()) == [name]
    assert target.read_bytes() == b"before"
    assert os.listdir(tmp) == []


def test_a_finished_write_outside_leaves_no_record(tmp_path: Path, disk: Path) -> None:
    tmp = tmp_path / "state" / "tmp"
    writer = AtomicWriter(str(tmp))
    writer.write(str(disk / "a.txt"), [b"one"], mode=0o600)
    writer.symlink(str(disk / "l"), "a.txt")
    assert sorted(p.name for p in disk.iterdir()) == ["a.txt", "l"]
    assert (disk / "a.txt").read_bytes() == b"one"
    assert os.listdir(tmp) == []
