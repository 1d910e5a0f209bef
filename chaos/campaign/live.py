"""What a running campaign owns outside its results directory, so that nothing outlives it.

A campaign notes, in a file of its own under ``live_dir()`` (the system's temp directory,
per user; ``CHAOS_LIVE_DIR`` moves it), every driver it launches (pid and start time), every
Spaces directory its runs use and every temp directory it makes, and removes the file when
it ends. If it is SIGKILLed instead:

- its drivers die with it: each asks the kernel for SIGKILL when its parent dies
  (``die_with_parent``, called first thing by ``chaos.driver``);
- ``chaos clean`` finds the file of a campaign whose process is gone (by pid *and* start
  time: a reused pid is a different process) and ends what it noted: drivers still alive,
  the local Spaces in its Spaces directories (their daemons and commands, even when the
  results directory was deleted: found by the ``--state`` argument of a daemon and the
  ``SPACESD_STATE`` marker of a command under the noted directory, never by a name), its
  temp directories, the disks of their own its runs' logs were mounted on (unmounted, what
  they held moved into the directory beneath, for ``chaos repro``), and then its file.

Docker Spaces need no note: their containers carry the campaign's labels (``chaos clean``
removes them already).
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from backends.local import own_disks
from durable.lifetime import die_with
from spacesd import procfs
from spacesd.protocol import ENV_SPACE_STATE

LIVE_DIR_ENV = "CHAOS_LIVE_DIR"
#: Set by the runner for its drivers: the pid they must not outlive.
RUNNER_PID_ENV = "CHAOS_RUNNER_PID"


def live_dir() -> Path:
    base = os.environ.get(LIVE_DIR_ENV) or tempfile.gettempdir()
    return Path(base) / f"chaos-live-{os.getuid()}"


def die_with_parent() -> None:
    """In a driver: be SIGKILLed when the runner that launched it dies (even by SIGKILL),
    and exit at once if it is already gone."""
    die_with(os.environ.get(RUNNER_PID_ENV))


@dataclass
class Campaign:
    """This process's note of what it owns; ``close`` removes it."""

    path: Path
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @classmethod
    def open(cls) -> Campaign:
        directory = live_dir()
        directory.mkdir(parents=True, exist_ok=True, mode=0o700)
        pid = os.getpid()
        note = cls(directory / f"{pid}-{procfs.start_time(pid)}.jsonl")
        note.path.write_text("")
        return note

    def _add(self, entry: dict[str, Any]) -> None:
        with self._lock, open(self.path, "a") as f:
            f.write(json.dumps(entry) + "\n")

    def driver(self, pid: int) -> None:
        self._add({"driver": pid, "started": procfs.start_time(pid)})

    def spaces(self, directory: Path) -> None:
        self._add({"spaces": str(Path(directory).resolve())})

    def temp(self, directory: str) -> None:
        self._add({"temp": directory})

    def mount(self, directory: Path) -> None:
        """A disk of its own mounted on ``directory`` (a run's log's)."""
        self._add({"mount": str(Path(directory).resolve())})

    def close(self) -> None:
        self.path.unlink(missing_ok=True)


def _owner_alive(note: Path) -> bool:
    try:
        pid, started = (int(part) for part in note.stem.split("-", 1))
    except ValueError:
        return False  # not a note of ours: only ever read, never acted on
    return procfs.is_alive(pid, started)


def dead_campaigns() -> Iterator[tuple[Path, list[dict[str, Any]]]]:
    """The notes of campaigns whose process is gone, with their entries."""
    directory = live_dir()
    if not directory.is_dir():
        return
    for note in sorted(directory.glob("*.jsonl")):
        if _owner_alive(note):
            continue
        entries = []
        for line in note.read_text().splitlines():
            try:
                entries.append(json.loads(line))
            except ValueError:
                continue  # a line torn by the SIGKILL: nothing was noted there
        yield note, entries


def _under(path: str, roots: list[str]) -> bool:
    return any(path == root or path.startswith(root + os.sep) for root in roots)


def orphans_of(roots: list[str]) -> list[tuple[int, int]]:
    """Daemons (``--state`` under a root, or a state's lock under a root held open: a forked
    one's command line is its fork server's) and commands (``SPACESD_STATE`` under a root)
    of local Spaces, and QEMUs (a disk under a root) of microVM Spaces, whose directories
    may be gone."""
    from backends.local.procs import daemons_under

    found = daemons_under(roots)
    for pid in procfs.snapshot():
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        states = [os.fsdecode(argv[i + 1]) for i, arg in enumerate(argv[:-1])
                  if arg == b"--state"]
        marker = ENV_SPACE_STATE.encode() + b"="
        states += [os.fsdecode(v[len(marker):]) for v in env if v.startswith(marker)]
        # a microVM's QEMU names its disk under the Space's directory: -drive ...,file=PATH
        states += [seg[len("file="):] for arg in argv for seg in os.fsdecode(arg).split(",")
                   if seg.startswith("file=")]
        started = procfs.start_time(pid)
        if started is not None and any(_under(s, roots) for s in states) and \
                (pid, started) not in found:
            found.append((pid, started))
    return found


def clean_dead(under: list[str] | None = None) -> tuple[int, int]:
    """End what every dead campaign noted (``under``: only those whose Spaces directories
    are under one of these roots); (campaigns cleaned, processes killed)."""
    from backends.local import LocalSpaces

    campaigns = killed = 0
    for note, entries in dead_campaigns():
        if under is not None and not any(_under(e["spaces"], under)
                                         for e in entries if "spaces" in e):
            continue
        for e in entries:
            if "driver" in e and e.get("started") is not None and \
                    procfs.is_alive(e["driver"], e["started"]):
                procfs.kill_exact(e["driver"], e["started"])
                killed += 1
        roots = [e["spaces"] for e in entries if "spaces" in e]
        # Before and after the Spaces' deletion: a daemon still starting when its campaign
        # died writes into its Space while it is removed; one whose directory is gone
        # already is found only by what it names.
        for pid, started in orphans_of(roots):
            procfs.kill_exact(pid, started)
            killed += 1
        for root in roots:
            if Path(root).is_dir():
                LocalSpaces(Path(root)).delete_all()
        for pid, started in orphans_of(roots):
            procfs.kill_exact(pid, started)
            killed += 1
        for e in entries:
            if "temp" in e:
                shutil.rmtree(e["temp"], ignore_errors=True)
            if "mount" in e and os.path.ismount(e["mount"]):
                own_disks.unmount(Path(e["mount"]), keep=True)
        note.unlink(missing_ok=True)
        campaigns += 1
    return campaigns, killed
