"""The model of a workspace that scripted steps change: files with modes, and symlinks.

The checker replays the effects of the committed calls over this model to get the state the
workspace must be in, and hashes it with the one workspace hash the Space uses too
(``spacesd.protocol.workspace_hash``: path, kind, permission bits, content or link target).
Directories are implied by the paths under them, as in that hash.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

from spacesd.protocol import workspace_hash

#: The mode of a file a command or the write tool creates (spacesd runs with umask 022).
NEW_FILE_MODE = 0o644


@dataclass
class WorkspaceModel:
    #: path → (content, permission bits)
    files: dict[str, tuple[bytes, int]] = field(default_factory=dict)
    #: path → link target (as given to ``ln -s``; may dangle)
    links: dict[str, str] = field(default_factory=dict)

    def copy(self) -> WorkspaceModel:
        return WorkspaceModel(dict(self.files), dict(self.links))

    def exists(self, path: str) -> bool:
        return path in self.files or path in self.links

    def content(self, path: str) -> bytes | None:
        entry = self.files.get(path)
        return None if entry is None else entry[0]

    def write(self, path: str, data: bytes, mode: int | None = None) -> None:
        """Replace ``path``'s content; a new file gets ``NEW_FILE_MODE``, an existing one
        keeps its mode unless ``mode`` is given (as the write tool and ``>`` do)."""
        self.links.pop(path, None)
        old = self.files.get(path)
        keep = old[1] if old is not None else NEW_FILE_MODE
        self.files[path] = (data, keep if mode is None else mode)

    def append(self, path: str, data: bytes) -> None:
        self.write(path, (self.content(path) or b"") + data)

    def remove(self, path: str) -> None:
        self.files.pop(path, None)
        self.links.pop(path, None)

    def rows(self) -> list[tuple[str, str, int, str]]:
        """(path, kind, mode, sha256 or target), the rows ``workspace_hash`` takes."""
        out = [(p, "file", mode, hashlib.sha256(data).hexdigest())
               for p, (data, mode) in self.files.items()]
        out += [(p, "symlink", 0, target) for p, target in self.links.items()]
        return sorted(out)

    def hash(self) -> str:
        return workspace_hash(self.rows())
