"""What is at a log's path before a storage opens it, checked the same way by both."""

from __future__ import annotations

import os
from pathlib import Path

from ..errors import StorageError


def stat_existing(path: Path) -> os.stat_result | None:
    """The stat of what is at ``path`` (following links), None when nothing is; a dangling
    symlink is a ``StorageError``: the log it points to may be missing, never a new one."""
    try:
        return path.stat()
    except FileNotFoundError:
        if path.is_symlink():
            raise StorageError(
                f"{path} is a symlink to {os.readlink(path)}, which does not exist; restore "
                "the log it points to, or remove the link to start a new log there"
            ) from None
        return None
