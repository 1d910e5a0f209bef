"""The daemon's side of the shim's files: reading its claim and exit (``shim_launcher``
starts shims).

See ``shim`` for why the files exist and how the claim race is settled.
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass

from .shim import LOST, publish


@dataclass(frozen=True)
class Claim:
    """The shim's identity: its pid is also the command's process group id."""

    pid: int
    started: int


@dataclass(frozen=True)
class ExitStatus:
    exit_code: int | None
    signal: int | None
    ended_ms: int


def find_bash(env: dict[str, str]) -> str:
    """The absolute path of ``bash`` on the commands' PATH."""
    found = shutil.which("bash", path=env.get("PATH", os.defpath))
    if found is None:
        raise SystemExit("spacesd: no bash on PATH; commands run with 'bash -c'")
    return os.path.abspath(found)


#: What ``read_claim`` answers for a claim file it cannot read (empty or garbage: a power
#: cut before the data reached the disk). Somebody claimed the key, the shim or the daemon,
#: so the command may have run: the key is lost, never unclaimed.
DAMAGED = "damaged"


def read_claim(path: str) -> Claim | str | None:
    """The shim's claim, ``"lost"`` if the daemon claimed the key lost, ``DAMAGED`` if the
    file cannot be read, None if unclaimed."""
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except FileNotFoundError:
        return None
    if raw == LOST.encode():
        return "lost"
    try:
        pid, started = (int(field) for field in raw.decode("ascii").split())
    except (ValueError, UnicodeDecodeError):
        return DAMAGED
    return Claim(pid, started)


def claim_lost(path: str) -> Claim | str:
    """Claim the key lost so that a shim that has not started yet never runs it; returns
    what the claim is afterwards (the shim's, if it got there first)."""
    if publish(path, LOST):
        return "lost"
    claim = read_claim(path)
    assert claim is not None  # link() said the path exists, and claims are never removed
    return claim


def read_exit(path: str) -> ExitStatus | None:
    """The shim's exit record, or None if there is none *or it is damaged*: written
    atomically and fsynced, a damaged one is the disk's doing, and its status cannot be
    trusted; without one a dead command reads as ``lost`` (outcome unknown), never as an
    exit status it may not have had."""
    try:
        with open(path, "rb") as f:
            raw = json.loads(f.read())
        status = ExitStatus(raw["exit_code"], raw["signal"], raw["ended_ms"])
    except FileNotFoundError:
        return None
    except (ValueError, KeyError, TypeError, UnicodeDecodeError):
        return None
    if not all(isinstance(v, int | None) and not isinstance(v, bool)
               for v in (status.exit_code, status.signal)) or \
            not isinstance(status.ended_ms, int) or isinstance(status.ended_ms, bool):
        return None
    return status
