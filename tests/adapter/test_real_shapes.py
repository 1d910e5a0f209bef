"""What real programs leave in a workspace survives every recovery, through the adapter.

A first call makes, with real bash, every shape of ``tests.odd_shapes`` (git's empty refs
directories, a FIFO, an absolute symlink, hardlinks, a sparse file, set mtimes, set-id and
sticky bits, mode 000, names with a newline, a backslash or bytes that are not UTF-8); a
later write is cut where its file operation begins (the next driver reverts, or restores
and reruns it), or the Space is lost between two drivers (the next driver rebuilds it from
the log's image or the checkpoint store). Each then checks the real workspace with
``os.stat``: every shape is there, as bash made it, and the session finished.

Each case here failed before the workspace state contract: a newline in a name wedged
checkpoint mode (every driver exited 1), a transactional revert deleted git's empty
directories, a FIFO refused every later call, a rebuild refused the absolute link, split
the hardlinks, wrote the sparse file dense, reset the mtimes and dropped the set-id bits,
and every restore stripped them from files it did not need to touch.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from backends.local import LocalSpaces
from tests.adapter.test_failpoint_order import SPACE, Case, Driver, Stop, observe
from tests.odd_shapes import ODD_SHAPES

MAKE = ("bash", {"command": ODD_SHAPES})
LATER = ("write", {"path": "later.txt", "content": "written after the shapes\n"})
THEN = ("bash", {"command": "git --version >/dev/null 2>&1; ls .git/refs/heads empty "
                             "&& test -p pipe && echo fine"})


def check_shapes(work: Path) -> None:
    """Every shape ``ODD_SHAPES`` makes, as bash made it."""
    assert sorted(os.listdir(work / "empty")) == [] and (work / "deep/a/b/c/d").is_dir()
    assert (work / ".git/refs/heads").is_dir() and (work / ".git/objects/pack").is_dir()
    assert stat.S_ISFIFO(os.lstat(work / "pipe").st_mode)
    assert os.readlink(work / "py") == "/usr/bin/python3"
    assert os.readlink(work / "dangling") == "missing/target"
    assert os.readlink(work / "loop1") == "loop2"
    h1, h2, h3 = (os.stat(work / p) for p in ("h1", "h2", "sub/h3"))
    assert h1.st_ino == h2.st_ino == h3.st_ino and h1.st_nlink == 3, "hardlinks split"
    sparse = os.stat(work / "sparse")
    assert sparse.st_size == 1 << 20 and sparse.st_blocks * 512 < 64 * 1024, "written dense"
    assert os.stat(work / "dated").st_mtime_ns == 981173106123456789, "mtime reset"
    assert os.lstat(work / "py").st_mtime_ns == 946684799 * 10**9, "the link's mtime reset"
    assert os.stat(work / "deep").st_mtime_ns == 1012608000 * 10**9, "a directory's mtime"
    assert stat.S_IMODE(os.stat(work / "suid").st_mode) == 0o4755, "set-user-id dropped"
    assert stat.S_IMODE(os.stat(work / "shared").st_mode) == 0o1777, "sticky bit dropped"
    assert stat.S_IMODE(os.stat(work / "locked").st_mode) == 0
    assert stat.S_IMODE(os.stat(work / "closed").st_mode) == 0
    for name in ("C:\\temp\\report.txt", "new\nline", "-rf", os.fsdecode(b"latin1-caf\xe9"),
                 "n" * 255):
        assert (work / name).is_file(), name


def _cases(mode: str) -> list[Case]:
    return [
        # the write's file operation (the first one) is cut: revert, or restore and rerun
        Case(f"{mode}-cut-write", mode, (MAKE, LATER, THEN),
             (Driver(Stop("space.file_op", 1)), Driver())),
        # the shapes' result is committed, then the Space is lost: rebuilt from the log
        Case(f"{mode}-lost-space", mode, (MAKE, LATER, THEN),
             (Driver(Stop("call.result", 1), then_lose_space=True), Driver())),
    ]


@pytest.mark.parametrize("case", [c for m in ("transactional", "checkpoint", "auto")
                                  for c in _cases(m)], ids=lambda c: c.id)
def test_every_shape_survives_the_recovery(case: Case, tmp_path: Path,
                                           local_spaces: LocalSpaces,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    observed = observe(case, tmp_path, local_spaces, monkeypatch)
    assert [d["ended"] for d in observed] == ["Crash", "done"], observed
    assert observed[1]["events"], f"the second driver recovered nothing: {observed}"
    work = local_spaces.get(SPACE).work
    check_shapes(work)
    assert (work / "later.txt").read_text() == "written after the shapes\n"
