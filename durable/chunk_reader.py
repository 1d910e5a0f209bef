"""``ChunkReader``: an iterator of byte chunks (an HTTP body, an engine's archive stream) as
a readable file, for ``tarfile``'s stream mode."""

from __future__ import annotations

import io
from collections.abc import Iterable
from typing import Any


class ChunkReader(io.RawIOBase):
    def __init__(self, chunks: Iterable[bytes]) -> None:
        self._chunks = iter(chunks)
        self._left = b""

    def readable(self) -> bool:
        return True

    def readinto(self, buf: Any) -> int:
        while not self._left:
            chunk = next(self._chunks, None)
            if chunk is None:
                return 0
            self._left = chunk
        n = min(len(buf), len(self._left))
        buf[:n] = self._left[:n]
        self._left = self._left[n:]
        return n
