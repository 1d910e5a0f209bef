"""The mount table and its watch (``spacesd.mount_table``): parsed again only after the
kernel reported a change, and every odd mount point spelled as the file system has it."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from spacesd import mount_table
from spacesd.mount_table import MountWatch, read_mounts

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="mounting a tmpfs needs root")


def test_the_watch_parses_again_only_after_a_mount_or_an_unmount(tmp_path: Path) -> None:
    # A space, a newline, a backslash, a carriage return (not escaped: a line must not end
    # there) and a byte that is not UTF-8.
    point = tmp_path / os.fsdecode(b"odd name\nwith\\ \r\xff")
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


def test_a_read_that_failed_is_made_again_on_the_next_call(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The poll that reported a change has used it up: if the read after it fails, the
    next call must still read the table (found by review: it kept the old one for good)."""
    watch = MountWatch()
    try:
        watch.mounts()
        subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(tmp_path)],
                       check=True)
        try:
            def unreadable() -> list:
                raise OSError(24, "Too many open files")

            monkeypatch.setattr(mount_table, "read_mounts", unreadable)
            with pytest.raises(OSError):
                watch.mounts()
            monkeypatch.undo()
            assert str(tmp_path) in [m.point for m in watch.mounts()]
        finally:
            subprocess.run(["umount", str(tmp_path)], check=True)
    finally:
        watch.close()
