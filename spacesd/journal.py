"""An append-only file of JSON lines, each append fsynced before it returns.

After a crash the last record may be torn: a write cut short (a prefix of the line, no
newline) or a block the disk never wrote (it reads as zeros: a run of NUL bytes, or one at
a block boundary; a record never holds a NUL, since JSON escapes them). Opening drops it,
truncating the file to the last complete line, so the next append starts on a clean line.
A torn record is one record: a line of NULs that holds more than one record's checksum is
damage (a block that also held earlier, synced records).

Everything else that does not read back is damage (a failing disk, a flipped bit, a person),
and skipping it could forget a key and run its command twice; so a complete line that is
unreadable or fails its checksum (``"c"``, CRC-32 of the record without it), wherever it is,
the last one included, makes loading raise ``DamagedJournal`` naming the record, and the
file is left untouched for a person to look at. A record that is whole but lost only its
newline (the tear fell just before it, or in the newline's own block, which reads as a NUL)
passes its checksum: it is kept, and the newline written back; one whose newline became
another byte is damage. Records written before checksums existed (no
``"c"``) are read as they are, but only before the first checksummed one (a flip of the
``"c"`` key's name must not pass for an old record). ``load`` reads a journal without
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

from .shim import write_whole

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
    torn tail starts at ``end`` when ``end < size``; ``unterminated``: the last record is
    whole but lost its newline, and ends at ``end``)."""

    records: list[dict[str, Any]]
    end: int
    size: int
    unterminated: bool = False


def load(path: str) -> Loaded:
    """Read the journal at ``path`` without changing it (a missing file holds nothing).

    A torn last record is left out, with a warning on stderr; any other unreadable record
    raises ``DamagedJournal``. Readers of a live journal (an audit) may see a torn tail too:
    an append in progress.
    """
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except FileNotFoundError:
        return Loaded([], 0, 0)
    end = raw.rfind(b"\n") + 1
    lines = raw[:end].split(b"\n")[:-1]
    unterminated = False
    if end < len(raw):
        tail = raw[end:]
        body = tail.rstrip(b"\0")  # NULs after it: the newline's block was never written
        if _whole(body):
            lines.append(body)
            end, unterminated = end + len(body), True
        elif body == tail and _whole(body[:-1]):
            raise DamagedJournal(
                f"{path}: the last record's newline is damaged ({tail[-1:]!r}); the file was "
                "damaged. Refusing to guess what it held: look at the file, or remove the "
                "Space")
        else:
            print(f"spacesd: ignoring a torn last record of {path} ({len(raw) - end} bytes)",
                  file=sys.stderr)
    records: list[dict[str, Any]] = []
    checksummed = False
    for n, line in enumerate(lines, 1):
        try:
            rec = json.loads(line)
            if not isinstance(rec, dict):
                raise ValueError("not an object")
        except ValueError as exc:
            if n == len(lines) and not unterminated and line.count(b'"c":"') <= 1 and \
                    _unwritten(line, end - len(line) - 1):
                end -= len(line) + 1  # a block of the last record the disk never wrote
                print(f"spacesd: ignoring a torn last record of {path}", file=sys.stderr)
                continue
            raise DamagedJournal(
                f"{path}: record {n} of {len(lines)} is unreadable ({exc}); only a record "
                "cut short is a torn write, so the file was damaged. Refusing to guess what "
                "it held (a forgotten key could run twice): look at the file, or remove the "
                "Space") from None
        if (CHECKSUM in rec and rec[CHECKSUM] != _checksum(rec)) or \
                (checksummed and CHECKSUM not in rec):
            raise DamagedJournal(
                f"{path}: record {n} of {len(lines)} fails its checksum ({line[:80]!r}); the "
                "file was damaged. Refusing to guess what it held (a forgotten key could run "
                "twice): look at the file, or remove the Space")
        checksummed = checksummed or CHECKSUM in rec
        rec.pop(CHECKSUM, None)
        records.append(rec)
    return Loaded(records, end, len(raw), unterminated)


def _unwritten(line: bytes, offset: int) -> bool:
    """Whether ``line`` (at ``offset`` in its file) holds what an unwritten block reads as:
    a run of NULs longer than one byte (one flipped bit makes at most one NUL), or one that
    starts or ends at a block boundary (512 bytes, the smallest a disk writes)."""
    at = line.find(b"\0")
    while at != -1:
        stop = at
        while stop < len(line) and line[stop] == 0:
            stop += 1
        if stop - at > 1 or (offset + at) % 512 == 0 or (offset + stop) % 512 == 0:
            return True
        at = line.find(b"\0", stop)
    return False


def _whole(tail: bytes) -> bool:
    """Whether ``tail`` (a last line without its newline) is a whole checksummed record."""
    try:
        rec = json.loads(tail)
    except ValueError:
        return False
    return isinstance(rec, dict) and rec.get(CHECKSUM) == _checksum(rec)


class Journal:
    def __init__(self, path: str) -> None:
        self.path = path
        self._lock = threading.Lock()
        loaded = load(path)
        if loaded.end < loaded.size:
            os.truncate(path, loaded.end)  # the next append starts on a clean line
        self.records = loaded.records
        self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)
        if loaded.unterminated:  # a whole last record that lost its newline gets it back
            os.write(self._fd, b"\n")
            os.fsync(self._fd)

    def append(self, record: dict[str, Any]) -> None:
        """Write one record and fsync it: when this returns, the record survives a crash."""
        line = json.dumps({**record, CHECKSUM: _checksum(record)},
                          separators=(",", ":")).encode() + b"\n"
        with self._lock:
            start = os.lseek(self._fd, 0, os.SEEK_END)
            try:
                write_whole(self._fd, line)
                os.fdatasync(self._fd)
            except BaseException:
                # A record a full disk cut short must not stay: the next append would
                # follow it, and a torn record in the middle reads as damage (the Space
                # would refuse to start). Not recorded, then, and the caller is told so.
                os.ftruncate(self._fd, start)
                raise

    def close(self) -> None:
        os.close(self._fd)
