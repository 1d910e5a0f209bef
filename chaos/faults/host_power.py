"""The drivers' host losing power: the run's log on a disk that keeps only what reached it.

SIGKILL never loses a write: the killed driver's writes sit in the kernel's page cache and
the next driver reads them, whether or not the log synced them. A power cut loses every
write the disk did not get, so only a log that syncs its commits keeps them. To attack the
log's durability settings (SQLite's ``synchronous``, the JSONL log's ``fdatasync``, the
file fence's), a run's state directory is an ext4 filesystem in an image file on a loop
device (``HostDisk``), mounted with a long journal commit interval (``commit=600``, as a
laptop mode would), so that nothing but a sync, or the kernel's writeback of old dirty
pages, carries a write to the image. A cut (``HostDisk.cut``) copies the image (what the
disk holds at that instant: the loop device writes through to it, the filesystem's dirty
pages do not), reads the log the dead driver left in the page cache, swaps the copy in and
mounts it, as the host boots again: ext4 replays its journal, the log its own. Needs root
(a loop mount); the campaign's ``--cut-host-power``.

This is LazyFS's idea (a layer that drops unsynced writes at a simulated power cut) with
the kernel's own page cache as the layer.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Protocol

from backends.local.own_disks import unmount
from chaos.run.processes import Driver
from durable.errors import StorageError
from durable.session_log import LOG_NAMES, open_for_audit
from durable.storage.records import encode_json

#: ``mount``'s options: ``commit=600`` keeps ext4 from committing its journal (and, with
#: ``data=ordered``, flushing data) every 5 s, so a write reaches the disk by a sync.
MOUNT_OPTIONS = "loop,commit=600"
#: The longest what a power cut SIGKILLed takes to die; only a hang reaches it.
DEATH_S = 120.0


def commits(state_dir: Path) -> list[str]:
    """What the log in ``state_dir`` holds, one line per committed record (conversation,
    entry, slot state, document write, request), each with a digest of its content: the
    lines of two logs are equal where they hold the same commits. Empty when there is no
    log yet (a cut before the first driver opened it); a log that cannot be read raises
    (``StorageError``: ``CorruptLog`` for a damaged one). Opening a log may change it (a
    torn tail truncated, a WAL checkpointed): read a copy of one a driver will open."""
    if not any((state_dir / name).exists() for name in LOG_NAMES.values()):
        return []
    storage = open_for_audit(state_dir)
    try:
        snap = storage.load()
    finally:
        storage.close()

    def digest(value: object) -> str:
        return hashlib.sha256(encode_json(value).encode("utf-8", "surrogatepass")
                              ).hexdigest()[:12]

    return [
        *(f"conversation {c.id}" for c in snap.conversations),
        *(f"entry {e.id} {e.kind} {digest(e.data)}" for e in snap.entries),
        *(f"slot {s.conversation}/{s.call_id} {s.state} result {s.result_entry}"
          for s in snap.slots),
        *(f"doc {d.conversation}/{d.kind} v{d.version} r{d.revision} {digest(d.value)}"
          for d in snap.docs),
        *(f"request {r.request_id}" for r in snap.requests),
    ]


def _read(state_dir: Path) -> tuple[list[str], str | None]:
    """``commits`` of ``state_dir``, read from a copy of it (so that the next driver opens
    the log exactly as the cut left it), and why it could not be read (else None)."""
    copy = Path(tempfile.mkdtemp(prefix=".audit-", dir=state_dir.parent))
    try:
        shutil.copytree(state_dir, copy, dirs_exist_ok=True,
                        ignore=shutil.ignore_patterns("lost+found"))
        return commits(copy), None
    except (StorageError, OSError) as exc:
        return [], f"{type(exc).__name__}: {exc}"
    finally:
        shutil.rmtree(copy, ignore_errors=True)


class HostDiskBroken(RuntimeError):
    """A power cut could not bring the host back: the run's log is no longer testable."""


class HostProcesses(Protocol):
    """What a campaign mode runs on the drivers' host besides the runner's own drivers (a
    stale run's parked older driver; a redrive run's coordinators and the drivers they
    launch): a power cut ends them all, and the host's boot starts again what it runs by
    itself (the coordinators)."""

    def unfit(self) -> str | None:
        """Why a cut now could not be judged (a driver may be inside a commit, which G7
        would count as returned), or None: the cut is then skipped, and says so."""

    def power_off(self) -> None:
        """Every one of them killed at once, and gone (its files closed) on return."""

    def power_on(self, booted: bool) -> None:
        """Those ``power_off`` killed started again, if the host ``booted`` (else nothing
        starts: the host is down for good). Called after every cut, whether or not it got
        to ``power_off``."""


def wait_dead(drivers: Sequence[Driver], what: str) -> None:
    """Return once every one of ``drivers``, SIGKILLed, has died (its files closed: the log
    is then what the page cache holds); ``RuntimeError`` naming them after ``DEATH_S``."""
    deadline = time.monotonic() + DEATH_S
    while alive := [d.pid for d in drivers if d.poll() is None]:
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what} {alive} were SIGKILLed and still ran after "
                               f"{DEATH_S:.0f} s")
        time.sleep(0.01)


@contextlib.contextmanager
def hosting(disk: HostDisk | None, processes: HostProcesses) -> Iterator[None]:
    """``processes`` run on the drivers' host, beside the runner's drivers, while the block
    runs (a power cut of ``disk`` then ends them too); nothing when the run's host keeps
    its power (``disk`` None). After it, the runner's next driver is its own again."""
    if disk is None:
        yield
        return
    disk.processes = processes
    try:
        yield
    finally:
        disk.processes = None


class HostDisk:
    """``directory`` (a run's ``state``) on an ext4 image of ``size`` bytes of its own.

    ``cut`` loses power; ``up`` is clear from the cut until the host is back, and a driver
    is launched only inside ``staying_up``, so no driver opens the log mid-swap, and none
    starts between a cut's instant and its kills, where the kills would miss it.
    ``cuts`` records each cut's commits before and after (``commits``), for the durability
    check (G7). Shared by the threads that fire faults and the runner's (its lock)."""

    def __init__(self, directory: Path, size: int) -> None:
        self.directory = directory
        self.image = directory.parent / f".{directory.name}.ext4"
        self.size = size
        self.up = threading.Event()
        self.up.set()
        #: A cut's copy of the image, until it is swapped in.
        self._kept = self.image.with_name(self.image.name + ".cut")
        self.cuts: list[dict[str, object]] = []
        #: Why a cut could not bring the host back (None: it always could).
        self.broken: str | None = None
        #: What else runs on the host (set by the mode that runs it); None: only drivers.
        self.processes: HostProcesses | None = None
        self._lock = threading.Lock()

    def mount(self) -> None:
        """Make the image and mount it on the (empty) directory. Raises ``OSError`` with
        what to do when that cannot be done (a loop mount needs root)."""
        with open(self.image, "wb") as f:
            f.truncate(self.size)
        self._run(["mkfs.ext4", "-q", "-F", "-E", "nodiscard", str(self.image)], "make")
        self._mount()

    def _mount(self) -> None:
        self._run(["mount", "-o", MOUNT_OPTIONS, str(self.image), str(self.directory)],
                  "mount")
        os.chmod(self.directory, 0o755)

    def _run(self, argv: list[str], what: str) -> None:
        done = subprocess.run(argv, capture_output=True, text=True)
        if done.returncode:
            raise OSError(f"cannot {what} the disk of {self.directory} ({argv[0]}: "
                          f"{done.stderr.strip() or f'exit {done.returncode}'}); a host "
                          "power cut needs root and a loop device: run as root, or leave "
                          "--cut-host-power off")

    def cut(self, fault: str, before_boot: Callable[[], None] = lambda: None,
            after_boot: Callable[[bool], None] = lambda booted: None,
            unfit: Callable[[], str | None] = lambda: None) -> str | None:
        """The power goes out now: the disk keeps what reached it. ``before_boot`` runs
        while the host is down (the nemesis makes sure the drivers are dead there); then
        the host boots on what the disk kept, and ``after_boot(booted)`` runs (one cut at a
        time: both under the disk's lock). A cut that fails part-way leaves the host down
        for good (``wait_up`` raises ``HostDiskBroken``; ``booted`` is False) and its image
        kept. ``unfit`` is asked first, under the lock (no driver is being launched then):
        what it answers is why the cut did not happen, and returned; None when it did."""
        with self._lock:
            if (why := unfit()) is not None:
                return why
            self.up.clear()
            try:
                shutil.copyfile(self.image, self._kept)  # the instant of the cut
                before_boot()
                before, before_error = _read(self.directory)  # what the drivers committed
                unmount(self.directory)
                os.replace(self._kept, self.image)
                self._mount()
                after, after_error = _read(self.directory)
                self.cuts.append({"fault": fault, "before": before, "after": after,
                                  "before_error": before_error, "after_error": after_error})
            except BaseException as exc:
                self.broken = f"{type(exc).__name__}: {exc}"
                raise
            finally:
                try:
                    after_boot(self.broken is None)
                finally:
                    self.up.set()
        return None

    @contextlib.contextmanager
    def staying_up(self) -> Iterator[None]:
        """The host up, and no cut beginning until the body ends: a driver is launched in
        it. A cut waits for the launch (and asks its ``unfit`` after it: the driver is
        then among those it judges and kills) and a launch waits for a cut to end; a
        launch that only waited for the host to come up could otherwise start its driver
        after the next cut's instant, among none of its kills, with the log's directory
        being swapped under it. ``HostDiskBroken`` when a cut could not bring the host
        back."""
        with self._lock:  # a cut holds it from its instant until the host is up again
            self.wait_up()
            yield

    def wait_up(self) -> None:
        """Return once the host is up (at once, but during a cut); ``HostDiskBroken`` when
        a cut could not bring it back."""
        self.up.wait()
        if self.broken is not None:
            raise HostDiskBroken(f"the drivers' host did not come back from its power cut "
                                 f"({self.broken}); its image is kept in {self.image}")

    def close(self) -> None:
        """Keep what the disk holds in the directory itself (``chaos repro`` reads it) and
        delete the image (kept, with a cut's copy, when a cut broke: the evidence)."""
        with self._lock:
            if os.path.ismount(self.directory):
                with contextlib.suppress(OSError):  # ext4's own, empty: not the log's
                    (self.directory / "lost+found").rmdir()
                unmount(self.directory, keep=True)
            if self.broken is None:
                self.image.unlink(missing_ok=True)
                self._kept.unlink(missing_ok=True)
