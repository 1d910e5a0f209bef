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
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from backends.local import LocalSpaces
from tests.durable.adapter.test_failpoint_order import SPACE, Case, Driver, Stop, observe
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


@dataclass(frozen=True)
class Bug:
    """One numbered bug of the real-programs issue as it was reproduced: ``make`` (real bash)
    commits, then a later write is cut where its file operation begins (``cut``) or the
    Space is lost between two drivers (``lost``); ``check`` then looks at the real workspace."""

    id: str
    mode: str
    make: str
    fault: str
    check: Callable[[Path], None]
    plan_after: tuple[tuple[str, dict[str, Any]], ...] = ()


def _git(work: Path, *args: str) -> str:
    out = subprocess.run(["git", "-C", str(work / "repo"), *args], capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, f"git {' '.join(args)}: exit {out.returncode}: {out.stderr}"
    return out.stdout


def _odd_names_kept(work: Path) -> None:
    for name in ("new\nline", "C:\\temp\\report.txt", "carriage\rreturn"):
        assert (work / name).read_text() == "kept\n", name


def _git_repo_kept(work: Path) -> None:
    for empty in (".git/refs/heads", ".git/refs/tags", ".git/objects/info", ".git/objects/pack"):
        assert (work / "repo" / empty).is_dir(), f"{empty} was deleted"
    _git(work, "status", "--short")


def _packed_git_repo_kept(work: Path) -> None:
    assert (work / "repo/.git/refs/heads").is_dir(), "git gc's empty refs/heads was deleted"
    assert _git(work, "log", "--format=%s") == "first\n"


def _absolute_link_kept(work: Path) -> None:
    assert os.readlink(work / "py") == "/usr/bin/python3"
    assert (work / "kept.txt").read_text() == "committed before the loss\n"


def _rebuild_is_the_same_workspace(work: Path) -> None:
    out = subprocess.run(["bash", "-c", "printf more >> h1; cat sub/h3"], cwd=work,
                         capture_output=True, text=True, timeout=60)
    assert out.stdout == "sharedmore", f"hardlinks split: {out.stdout!r}"
    sparse = os.stat(work / "sparse")
    assert sparse.st_size == 1 << 20 and sparse.st_blocks * 512 < 64 * 1024, "written dense"
    assert os.stat(work / "dated").st_mtime_ns == 981173106 * 10**9, "mtime reset"
    assert stat.S_IMODE(os.stat(work / "closed").st_mode) == 0, "a 000 directory opened"
    assert stat.S_IMODE(os.stat(work / "suid").st_mode) == 0o4755, "set-user-id dropped"


def _restore_keeps_setid_and_sticky(work: Path) -> None:
    assert stat.S_IMODE(os.stat(work / "suid").st_mode) == 0o4755, "set-user-id stripped"
    assert stat.S_IMODE(os.stat(work / "shared").st_mode) == 0o1777, "sticky bit stripped"


def _fifo_does_not_block_later_calls(work: Path) -> None:
    assert not os.path.lexists(work / "pipe"), "the rm of the FIFO was refused"
    assert (work / "later.txt").read_text() == "written after the shapes\n"


REBUILT = ("printf shared > h1 && mkdir sub && ln h1 sub/h3 && truncate -s 1M sparse && "
           "printf d > dated && touch -d '2001-02-03 04:05:06' dated && "
           "mkdir closed && chmod 000 closed && printf x > suid && chmod 4755 suid")
BUGS = (
    Bug("1-odd-names-wedge-checkpoint", "checkpoint",
        "printf 'kept\\n' | tee $'new\\nline' 'C:\\temp\\report.txt' $'carriage\\rreturn'",
        "cut", _odd_names_kept),
    Bug("2-revert-deletes-git-empty-dirs", "transactional", "git init -q repo", "cut",
        _git_repo_kept),
    Bug("2-rebuild-deletes-packed-refs-dir", "transactional",
        "git init -q repo && cd repo && git -c user.name=a -c user.email=a@b commit -q "
        "--allow-empty -m first && git gc -q", "lost", _packed_git_repo_kept),
    *(Bug(f"3-absolute-link-blocks-rebuild-{mode}", mode,
          "ln -s /usr/bin/python3 py && printf 'committed before the loss\\n' > kept.txt",
          "lost", _absolute_link_kept) for mode in ("transactional", "checkpoint")),
    *(Bug(f"4-rebuild-differs-{mode}", mode, REBUILT, "lost", _rebuild_is_the_same_workspace)
      for mode in ("transactional", "checkpoint")),
    Bug("5-restore-strips-setid", "checkpoint",
        "printf x > suid && chmod 4755 suid && mkdir shared && chmod 1777 shared", "cut",
        _restore_keeps_setid_and_sticky),
    Bug("6-fifo-refuses-later-calls", "transactional", "mkfifo pipe", "cut",
        _fifo_does_not_block_later_calls, (("bash", {"command": "rm pipe"}),)),
)


@pytest.mark.parametrize("bug", BUGS, ids=lambda b: b.id)
def test_each_bug_real_programs_showed_stays_fixed(bug: Bug, tmp_path: Path,
                                                   local_spaces: LocalSpaces,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """Each numbered bug of the real-programs issue, alone, as it was first reproduced;
    every one failed before the workspace state contract (the combined test above finds
    only the first)."""
    first = (Driver(Stop("space.file_op", 1)) if bug.fault == "cut"
             else Driver(Stop("call.result", 1), then_lose_space=True))
    case = Case(bug.id, bug.mode, (("bash", {"command": bug.make}), LATER, *bug.plan_after),
                (first, Driver()))
    observed = observe(case, tmp_path, local_spaces, monkeypatch)
    assert [d["ended"] for d in observed] == ["Crash", "done"], observed
    bug.check(local_spaces.get(SPACE).work)
    assert (local_spaces.get(SPACE).work / "later.txt").is_file()
