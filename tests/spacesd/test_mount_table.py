"""The mount table and its watch (``spacesd.mount_table``): parsed again only after the
kernel reported a change, and every odd mount point spelled as the file system has it."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from spacesd.mount_table import MountWatch, read_mounts

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="mounting a tmpfs needs root")


def test_the_watch_parses_again_only_after_a_mount_or_an_unmount(tmp_path: Path) -> None:
    # A space, a newline, a backslash and a byte that is not UTF-8: mountinfo escapes the
    # first three in octal.
    point = tmp_path / os.fsdecode(b"odd name\nwith\\ \xff")
    point.mkdir()
    watch = MountWatch()
    try:
        before = watch.mounts()
        assert watch.mounts() is before  # nothing changed: not parsed again
        subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(point)],
                       check=True)
        try:
            mounted = watch.mounts()
            assert mounted is not before and mounted == read_mounts()
            ours = [m for m in mounted if m.point == str(point)]
            assert [(m.fstype, "rw" in m.options) for m in ours] == [("tmpfs", True)]
            assert watch.mounts() is mounted
        finally:
            subprocess.run(["umount", str(point)], check=True)
        assert [m.point for m in watch.mounts()] == [m.point for m in before]
    finally:
        watch.close()
    assert watch.mounts() == read_mounts()  # closed: opened again on the next call
    watch.close()
