"""Changes to a workspace as real tools make them, for property tests of what keeps the
workspace state (``spacesd.watched_scan``, ``spacesd.checkpoints``): odd names, hardlinks
(one reaching outside), FIFOs, holes, set times, modes, ``cp -a`` of a tree."""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator

from hypothesis import strategies as st

#: Names real tools make: a space, a newline, a backslash, non-ASCII and non-UTF-8 bytes.
NAMES = ["a", "b", "x y", "n\nl", "b\\s", "é", os.fsdecode(b"\xff")]
PATHS = st.lists(st.sampled_from(NAMES), min_size=1, max_size=3).map("/".join)
def change(root: str, outside: str, op: tuple) -> None:
    """One change, as a tool would make it; a change the file system refuses (a rename
    into its own subtree, a file where a directory is needed) is simply not made."""
    kind, path, *args = op
    full = os.path.join(root, path)
    with contextlib.suppress(OSError):
        if kind in ("write", "append"):
            os.makedirs(os.path.dirname(full), exist_ok=True)
            # Not blocking: a FIFO without a reader refuses (ENXIO) instead of waiting.
            how = os.O_APPEND if kind == "append" else os.O_TRUNC
            fd = os.open(full, os.O_WRONLY | os.O_CREAT | os.O_NONBLOCK | how, 0o644)
            try:
                os.write(fd, args[0])
            finally:
                os.close(fd)
        elif kind == "mkdir":
            os.makedirs(full, exist_ok=True)
        elif kind == "remove":
            if os.path.isdir(full) and not os.path.islink(full):
                shutil.rmtree(full)
            else:
                os.unlink(full)
        elif kind == "rename":
            os.replace(full, os.path.join(root, args[0]))
        elif kind == "chmod":
            if not os.path.islink(full):  # Linux has no lchmod
                os.chmod(full, args[0])
        elif kind == "symlink":
            os.symlink(args[0], full)
        elif kind == "hardlink":
            os.link(full, os.path.join(root, args[0]), follow_symlinks=False)
        elif kind == "link_outside":  # a name outside the workspace, written through
            other = os.path.join(outside, "x")
            with contextlib.suppress(FileNotFoundError):
                os.unlink(other)
            os.link(full, other, follow_symlinks=False)
            fd = os.open(other, os.O_WRONLY | os.O_APPEND | os.O_NONBLOCK)
            try:
                os.write(fd, args[0])
            finally:
                os.close(fd)
        elif kind == "utime":
            os.utime(full, ns=(args[0], args[0]), follow_symlinks=False)
        elif kind == "mkfifo":
            os.mkfifo(full, 0o640)
        elif kind == "truncate":  # grows with a hole, or cuts
            os.truncate(full, args[0])
        elif kind == "copy_tree":  # cp -a of a directory, its modes and times kept
            dest = os.path.join(root, args[0])
            if (dest + "/").startswith(full + "/"):
                return  # cp refuses to copy a directory into itself (copytree recurses on)
            shutil.copytree(full, dest, symlinks=True)


OPS = st.one_of(
    st.tuples(st.sampled_from(["write", "append"]), PATHS, st.binary(max_size=8)),
    st.tuples(st.just("mkdir"), PATHS),
    st.tuples(st.just("remove"), PATHS),
    st.tuples(st.just("rename"), PATHS, PATHS),
    st.tuples(st.just("chmod"), PATHS, st.sampled_from([0o600, 0o755, 0o4755, 0o1777])),
    st.tuples(st.just("symlink"), PATHS, st.sampled_from(["a", "/etc/hostname", "../gone"])),
    st.tuples(st.just("hardlink"), PATHS, PATHS),
    st.tuples(st.just("link_outside"), PATHS, st.binary(min_size=1, max_size=4)),
    st.tuples(st.just("utime"), PATHS, st.integers(0, 2**40)),
    st.tuples(st.just("mkfifo"), PATHS),
    st.tuples(st.just("truncate"), PATHS, st.sampled_from([0, 1, 1 << 20])),
    st.tuples(st.just("copy_tree"), PATHS, PATHS),
    st.just(("scan",)),
    st.just(("restart",)),  # the daemon restarts: its tokens are unknown to the next
)


@contextlib.contextmanager
def dirs() -> Iterator[tuple[str, str]]:
    with tempfile.TemporaryDirectory() as root, tempfile.TemporaryDirectory() as outside:
        yield root, outside
