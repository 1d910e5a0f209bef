"""An append-only file of JSON lines, each append fsynced before it returns.

After a crash the last line may be torn (a partial write that never got its newline, or
garbage where the disk did not finish). Opening drops it, truncating the file to the last
complete line, so the next append starts on a clean line. Only the tail can be torn: a bad
line in the middle, or any complete record whose checksum (``"c"``, CRC-32 of the record
without it) does not match, means the disk or someone damaged the file. Skipping it could
forget a key and run its command twice, so loading raises ``DamagedJournal`` naming the
record, and the file is left untouched for a person to look at. Records written before
checksums existed (no ``"c"``) are read as they are. ``load`` reads a journal without
changing it (an audit of a copy, or of a live daemon's state).
"""

from __future__ import annotations

import json
import os
import sys
import threading
import zlib
from dataclasses import dataclass
from typing import Any

CHECKSUM = "c"


class DamagedJournal(Exception):
    """A complete record of a journal is unreadable or fails its checksum."""


def _checksum(record: dict[str, Any]) -> str:
    body = json.dumps({k: v for k, v in record.items() if k != CHECKSUM},
                      separators=(",", ":"), sort_keys=True)
    return f"{zlib.crc32(body.encode()):08x}"


@dataclass(frozen=True)
class Loaded:
    """What a journal file holds: its readable records, and where its whole lines end (a
    torn tail starts at ``end`` when ``end < size``)."""

    records: list[dict[str, Any]]
    end: int
    size: int


def load(path: str) -> Loaded:
    """Read the journal at ``path`` without changing it (a missing file holds nothing).

    A torn last record is left out, and a bad record in the middle skipped, each with a
    warning on stderr. Readers of a live journal (an audit) may see a torn tail too: an
    append in progress.
    """
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except FileNotFoundError:
        return Loaded([], 0, 0)
    end = raw.rfind(b"\n") + 1
    lines = raw[:end].split(b"\n")[:-1]
    if end < len(raw):
        print(f"spacesd: ignoring a torn last record of {path} ({len(raw) - end} bytes)",
              file=sys.stderr)
    records = []
    for n, line in enumerate(lines, 1):
        try:
            rec = json.loads(line)
            if not isinstance(rec, dict):
                raise ValueError("not an object")
        except ValueError as exc:
            if n == len(lines) and end == len(raw):
                # A torn last record that happens to end in a newline byte.
                end -= len(line) + 1
                print(f"spacesd: ignoring a torn last record of {path}", file=sys.stderr)
                continue
            raise DamagedJournal(
                f"{path}: record {n} of {len(lines)} is unreadable ({exc}); a record in the "
                "middle is never torn, so the file was damaged. Refusing to guess what it "
                "held (a forgotten key could run twice): look at the file, or remove the "
                "Space") from None
        if CHECKSUM in rec and rec[CHECKSUM] != _checksum(rec):
            raise DamagedJournal(
                f"{path}: record {n} of {len(lines)} fails its checksum ({line[:80]!r}); the "
                "file was damaged. Refusing to guess what it held (a forgotten key could run "
                "twice): look at the file, or remove the Space")
        rec.pop(CHECKSUM, None)
        records.append(rec)
    return Loaded(records, end, len(raw))


class Journal:
    def __init__(self, path: str) -> None:
        self.path = path
        self._lock = threading.Lock()
        loaded = load(path)
        if loaded.end < loaded.size:
            os.truncate(path, loaded.end)  # the next append starts on a clean line
        self.records = loaded.records
        self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)

    def append(self, record: dict[str, Any]) -> None:
        """Write one record and fsync it: when this returns, the record survives a crash."""
        line = json.dumps({**record, CHECKSUM: _checksum(record)},
                          separators=(",", ":")).encode() + b"\n"
        with self._lock:
            os.write(self._fd, line)
            os.fdatasync(self._fd)

    def close(self) -> None:
        os.close(self._fd)
