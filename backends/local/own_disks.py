"""A directory on a disk of its own: a tmpfs of a fixed size mounted on it (which needs
root), as a Space whose workspace is a volume or whose ``/var`` is a partition of its own
has (a local Space's ``state`` and ``work``), or a campaign run's log on the host's disk. A
campaign fills it to make the next writes there meet ``ENOSPC`` where they stand, and frees
it again.

Filling shrinks the tmpfs to what it holds (a remount with a smaller ``size=``) rather than
writing a ballast file into it: nothing appears in the directory, so a workspace's scan and
a daemon's state see only their own files, full.
"""

from __future__ import annotations

import errno
import os
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import get_args

from backends.descriptor import DiskName as Disk
from durable.errors import SpaceError

DISKS: tuple[Disk, ...] = get_args(Disk)
#: The page a tmpfs counts its size in; a size of 0 would mean no limit, so a full disk
#: keeps at least one.
PAGE = 4096
#: How many times a fill looks again when the directory grew between its look and its
#: remount (the daemon writes meanwhile).
_FILL_TRIES = 50


def marker(base_dir: Path, disk: Disk) -> Path:
    """The file in a provider's directory that holds the size (bytes) of the ``disk`` every
    Space made there gets, whichever process makes it."""
    return base_dir / f".{disk}-disk"


def size_of(base_dir: Path, disk: Disk) -> int | None:
    try:
        return int(marker(base_dir, disk).read_text())
    except FileNotFoundError:
        return None


def mount(base_dir: Path, disk: Disk, directory: Path) -> None:
    """Mount the ``disk`` of its own a Space gets (if its provider's directory says so) on
    ``directory`` while that is still empty: also on the ``create`` after one whose mount
    failed, so that the Space never runs on the host's disk instead. (A directory that was
    written before the marker keeps the host's disk.)"""
    size = size_of(base_dir, disk)
    if size is None or os.path.ismount(directory) or any(directory.iterdir()):
        return
    mount_tmpfs(directory, size, f"remove {marker(base_dir, disk)}")


def mount_tmpfs(directory: Path, size: int, or_else: str) -> None:
    """A tmpfs of ``size`` bytes on ``directory``, with its mode; ``or_else``: what else to
    do when that cannot be done (it needs root)."""
    mode = os.stat(directory).st_mode & 0o7777
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size},mode={mode:o}",
                              "tmpfs", str(directory)], capture_output=True, text=True)
    if mounted.returncode:
        raise SpaceError(f"cannot give {directory} a disk of its own (mount -t tmpfs: "
                         f"{mounted.stderr.strip()}); that needs root: run as root, or "
                         f"{or_else}")


def unmount(directory: Path, *, keep: bool = False) -> None:
    """``keep``: what the disk holds is moved to the directory beneath it first."""
    if keep and os.path.ismount(directory):
        held = Path(tempfile.mkdtemp(prefix=f".{directory.name}-", dir=directory.parent))
        for entry in directory.iterdir():
            shutil.move(entry, held / entry.name)
        unmount(directory)
        for entry in held.iterdir():
            shutil.move(entry, directory / entry.name)
        held.rmdir()
        return
    if os.path.ismount(directory) and \
            subprocess.run(["umount", str(directory)], capture_output=True).returncode:
        # busy (a process of the Space still starting): detached now, freed with it
        subprocess.run(["umount", "-l", str(directory)], check=True, capture_output=True)


def fill(directory: Path, leave: int = 0) -> None:
    """Shrink the disk mounted on ``directory`` to what it holds and ``leave`` bytes more
    (at least a page), until ``free``: the next writes take what is left, and the one that
    finds it gone is cut short where it stands, as on a disk that fills up. Raises
    ``SpaceError`` when ``directory`` has no disk of its own."""
    if not os.path.ismount(directory):
        raise SpaceError(f"{directory} has no disk of its own to fill: make its provider "
                         "with a disk of that size before the Space is made")
    for _ in range(_FILL_TRIES):
        st = os.statvfs(directory)
        used = (st.f_blocks - st.f_bfree) * st.f_frsize
        size = max(PAGE, -(-(used + leave) // PAGE) * PAGE)
        if _remount(directory, size) is None:
            return
    raise SpaceError(f"could not fill the disk of {directory}: it kept growing past each "
                     f"size given in {_FILL_TRIES} tries (last: {_remount(directory, size)})")


def free(directory: Path, size: int | None) -> None:
    """Give the disk on ``directory`` its whole ``size`` again (``fill`` undone)."""
    if size is None or not os.path.ismount(directory):
        return
    failed = _remount(directory, size)
    if failed is not None:
        raise SpaceError(f"could not free the disk of {directory}: {failed}")


def _remount(directory: Path, size: int) -> str | None:
    """None once the tmpfs on ``directory`` has ``size``; else why not (tmpfs refuses a
    size below what it holds, with ``EINVAL``)."""
    done = subprocess.run(["mount", "-o", f"remount,size={size}", str(directory)],
                          capture_output=True, text=True)
    return None if done.returncode == 0 else (done.stderr.strip()
                                              or os.strerror(errno.EINVAL))
