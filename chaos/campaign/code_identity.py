"""Which code a campaign ran, so that a repro replays the same system.

A seed and a fault plan reproduce a failure only on the code that failed: replayed on
changed code they drive a different system, and a pass proves nothing. So ``campaign.json``
(and a ``shrunk.json``) record the code: a digest of every source file of the packages a run
executes (it decides, with or without git), and, for people, the git revision and whether
the tree had changes. ``chaos repro`` and ``chaos shrink`` compare it with the code they
run and refuse a difference unless told ``--any-code``.
"""

from __future__ import annotations

import hashlib
import subprocess
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from chaos.errors import BadArguments

ROOT = Path(__file__).resolve().parents[2]
#: The packages whose code a run executes (the system under test and the campaign).
PACKAGES = ("durable", "spacesd", "backends", "chaos", "scenarios")
#: The files of them that are code or data a run reads.
SUFFIXES = (".py", ".yaml", ".yml", ".json", ".sh")


@dataclass(frozen=True)
class CodeIdentity:
    #: sha256 over the packages' source files (relative path and content of each).
    sources: str
    #: ``git rev-parse HEAD``; None where the code is not a git checkout.
    revision: str | None = None
    #: The checkout had changes to tracked files (None without git).
    dirty: bool | None = None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, raw: Any) -> CodeIdentity | None:
        if not isinstance(raw, dict) or not isinstance(raw.get("sources"), str):
            return None
        return cls(raw["sources"], raw.get("revision"), raw.get("dirty"))

    def describe(self) -> str:
        if self.revision is None:
            return f"sources {self.sources[:12]} (no git)"
        return (f"revision {self.revision[:12]}{' with uncommitted changes' if self.dirty else ''}"
                f" (sources {self.sources[:12]})")


def current() -> CodeIdentity:
    """The code this process runs: in a git checkout, the tracked files as they are in the
    working tree (a workload file saved beside the bundled ones changes no run's code),
    else every source file of the packages."""
    revision = _git("rev-parse", "HEAD")
    tracked = _git("ls-files", "-z", "--", *PACKAGES) if revision else None
    if tracked is not None:
        paths = sorted(ROOT / name for name in tracked.split("\0") if name)
    else:
        paths = sorted(path for package in PACKAGES for path in (ROOT / package).rglob("*")
                       if "__pycache__" not in path.parts)
    digest = hashlib.sha256()
    for path in paths:
        if path.suffix in SUFFIXES and path.is_file():
            digest.update(str(path.relative_to(ROOT)).encode() + b"\0")
            digest.update(hashlib.sha256(path.read_bytes()).digest())
    status = _git("status", "--porcelain", "--untracked-files=no") if revision else None
    return CodeIdentity(digest.hexdigest(), revision, None if status is None else bool(status))


def _git(*args: str) -> str | None:
    try:
        done = subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True,
                              text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def check_same(recorded: Any, what: str, *, any_code: bool) -> str | None:
    """Refuse (``BadArguments``) to replay ``what`` (made by the code ``recorded``, a
    ``CodeIdentity`` as JSON) on other code, unless ``any_code``; returns a warning to print
    when the replay goes ahead on other or unknown code, else None."""
    made = CodeIdentity.from_json(recorded)
    if made is None:
        return (f"chaos: {what} does not record the code it ran (made before campaigns "
                "recorded it): replaying on this checkout's code")
    now = current()
    if made.sources == now.sources:
        return None
    said = f"{what} ran {made.describe()}; this checkout is {now.describe()}"
    if any_code:
        return f"chaos: warning: {said}: replaying on this code (--any-code)"
    fix = (f"check out that code (git checkout {made.revision[:12]}"
           f"{', then apply the changes it had' if made.dirty else ''})"
           if made.revision else "run it on the code that made it")
    raise BadArguments(f"{said}, so a replay would drive a different system. To reproduce, "
                       f"{fix}; or pass --any-code to replay on this code anyway")
