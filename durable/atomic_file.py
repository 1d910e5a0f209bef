"""Write a file so that a crash leaves either the old content or the new, never a mix:
a temporary file in the same directory, fsynced, renamed over the target, and the directory
fsynced so the rename itself survives a power loss."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterable
from pathlib import Path


def write_atomic(path: Path, chunks: Iterable[bytes] | bytes | str) -> None:
    if isinstance(chunks, str):
        chunks = [chunks.encode("utf-8")]
    elif isinstance(chunks, bytes):
        chunks = [chunks]
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "wb") as f:
            for chunk in chunks:
                f.write(chunk)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    fsync_dir(path.parent)


def fsync_dir(directory: Path) -> None:
    """Make the directory's entries (a created or renamed file) durable."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
