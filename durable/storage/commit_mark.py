"""The commit high-water mark both file storages keep beside their log.

One line: ``<id> <count> <crc32>``, the count zero-padded to 20 digits and the CRC-32 over
``<id> <count>``. The JSONL storage writes ``<bytes committed> <lines committed>`` into its
``log.lock``; the SQLite storage writes ``<log id> <commits>`` into ``<log>-commits``. Each
storage decides when to write it and what a loss means; this module only encodes the line and
refuses a damaged one.
"""

from __future__ import annotations

import re
import zlib
from pathlib import Path

from ..errors import CorruptLog

_LINE = re.compile(rb"([0-9a-f]{1,64}) (\d{20}) ([0-9a-f]{8})\n")


def encode(ident: str, count: int) -> bytes:
    """The mark line for ``ident`` and ``count``."""
    body = b"%s %020d" % (ident.encode(), count)
    return body + b" %08x\n" % zlib.crc32(body)


#: The most NUL bytes a power cut leaves of a mark or an epoch marker (each one short line):
#: more is damage.
MAX_UNWRITTEN = 128


def unwritten(data: bytes) -> bool:
    """Whether ``data`` (a mark or record file's bytes) holds nothing: empty, or only NUL
    bytes, which is what a power cut leaves of a file whose size reached the disk before
    its unsynced data did (ext4's delayed allocation). Such a file says nothing, rather than
    something damaged."""
    return len(data) <= MAX_UNWRITTEN and not data.strip(b"\0")


def parse(data: bytes) -> tuple[str, int] | None:
    """(ident, count) of a well-formed mark line, or None when it is damaged."""
    m = _LINE.fullmatch(data)
    if m is None or int(m[3], 16) != zlib.crc32(m[1] + b" " + m[2]):
        return None
    return m[1].decode(), int(m[2])


def decode(data: bytes, *, mark: Path, log: Path, unseen: str, remedy: str) -> tuple[str, int]:
    """(ident, count) of ``data``, read from ``mark`` beside ``log``; a damaged mark raises
    ``CorruptLog`` saying what can no longer be ruled out (``unseen``) and how to accept the
    log as it is (``remedy``)."""
    parsed = parse(data)
    if parsed is None:
        raise CorruptLog(
            f"{mark}, the commit high-water mark of {log}, is damaged, so {unseen} cannot be "
            f"ruled out. {remedy} (it is rewritten on the next commit); nothing was modified"
        )
    return parsed
