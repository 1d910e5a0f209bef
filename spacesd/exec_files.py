"""The daemon's side of the shim's files: starting a shim, reading its claim and exit.

See ``shim`` for why the files exist and how the claim race is settled.
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass

from .shim import LOST, RESET_SIGNALS, SHIM_PATH, publish


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


def spawn(python: str, bash: str, claim: str, exit_path: str, out_path: str, cwd: str,
          command: str, env: dict[str, str], contain: str) -> int:
    """Start the shim in a new session (so its pid is the group id) and return its pid.
    ``contain``: the containment the shim enters before the command runs
    (``Containment.shim_arg``).

    stdin is /dev/null; stdout and stderr both append to ``out_path``. Every other
    descriptor of the daemon is close-on-exec (Python's default), so none leaks.
    """
    return os.posix_spawn(
        python,
        [python, "-I", "-S", SHIM_PATH, bash, claim, exit_path, cwd, command, contain],
        env,
        file_actions=[
            (os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0),
            (os.POSIX_SPAWN_OPEN, 1, out_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600),
            (os.POSIX_SPAWN_DUP2, 1, 2),
        ],
        setsid=True,
        setsigdef=RESET_SIGNALS,
        setsigmask=(),
    )


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
